"""When each tools/train.py argument takes effect, and the one-line refusal of an argument given where it cannot.

tools/train.py reads ~250 arguments: the model and data arguments and this project's training ones (arguments.py),
and PaddleFormers' TrainingArguments, passed to its Trainer. TAKES_EFFECT names every one of them (tests check that a
new field of any of the three dataclasses is added here) with the condition, in words, under which it changes the
run; an argument the user gave (in the trainer config or on the command line, whatever its value) whose condition
is false in this run is refused in one line, before anything is built:

    error: distill_kl_weight has no effect in this run: it takes effect with a teacher (--teacher PATH)

An argument given on the command line is judged on the run. One given in the trainer config is refused only if its
condition is false in the config on its own too (a command line that switches a part of the config off, --do_eval
false, leaves that part's settings unused by the user's choice), and never for the parts a config may keep settings
of while switching them off (evaluation, the schedule's shape, saving: `in_config=False`), which are a template's
leftovers rather than a request; the teacher's, the data source's, the parallel layouts', AMP's and what
tools/train.py never runs are checked wherever they are set.

`parallel_degrees` refuses a parallel degree the processes cannot give (a single process' TrainingArguments reset
every degree to 1: pipeline_model_parallel_size 2 without the launcher trained the plain model, exit 0, no word).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

from .errors import TrainError

__all__ = ["TrainEffect", "RunView", "TAKES_EFFECT", "DEGREES", "check_effects", "check_degrees", "check_numbers",
           "given_keys",
           "markdown_rows"]


@dataclass(frozen=True)
class TrainEffect:
    when: str
    applies: Optional[Callable[["RunView"], bool]] = None  # None: always
    # False for a part of a run a config may switch off while keeping its settings (evaluation, the schedule's shape,
    # saving: a template's leftovers, not a request): checked when given on the command line only
    in_config: bool = True

    def holds(self, run: "RunView") -> bool:
        return self.applies is None or bool(self.applies(run))


@dataclass
class RunView:
    """What the conditions read: the parsed arguments (after PaddleFormers' own post-processing), the parallel degrees
    as written, and the processes the run has."""

    model: object
    data: object
    train: object
    degrees: Dict[str, int]
    processes: int

    def degree(self, key: str) -> int:
        return max(1, self.degrees.get(key, 1), int(getattr(self.train, key, 1) or 1))


# the parallel degrees a run may ask for, as TrainingArguments spells them
DEGREES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "sharding_parallel_size", "sharding_degree",
           "sep_parallel_size", "context_parallel_size", "expert_model_parallel_size",
           "expert_tensor_model_parallel_size")


def _teacher(r): return bool(r.train.teacher)
def _kd(r): return _teacher(r) and any(w > 0 for w in (r.train.distill_kl_weight, r.train.distill_hidden_weight,
                                                      r.train.distill_attn_weight))
def _kl(r): return _teacher(r) and r.train.distill_kl_weight > 0
def _pretrain(r): return r.data.dataset == "pretrain"
def _stdlib(r): return r.data.dataset == "stdlib"
def _amp(r): return bool(r.train.bf16 or r.train.fp16)
def _tp(r): return r.degree("tensor_model_parallel_size") > 1
def _pp(r): return r.degree("pipeline_model_parallel_size") > 1
def _multi(r): return r.processes > 1 or max(r.degrees.values(), default=1) > 1
def _sharding(r): return _multi(r) and bool(r.train.sharding)
def _evaluates(r): return bool(r.train.do_eval)
def _trains(r): return bool(r.train.do_train)
def _saves(r): return _trains(r) and str(getattr(r.train.save_strategy, "value", r.train.save_strategy)) != "no"
def _schedule(r): return str(getattr(r.train.lr_scheduler_type, "value", r.train.lr_scheduler_type))
def _eval_steps(r): return _evaluates(r) and str(getattr(r.train.evaluation_strategy, "value",
                                                         r.train.evaluation_strategy)) == "steps"
def _resumes(r): return _trains(r)  # a checkpoint-N is looked for in every training run


ALWAYS = TrainEffect("always")
PASSED = TrainEffect("always (passed to PaddleFormers' Trainer, which reads it as it documents)")
NEVER_HERE = "never in tools/train.py"


def _never(why: str) -> TrainEffect:
    return TrainEffect(f"{NEVER_HERE}: {why}", lambda r: False)


TEACHER = TrainEffect("with a teacher (--teacher PATH)", _teacher)
_OWN = {
    # ModelArguments, DataArguments
    "model_type": ALWAYS, "model_config": ALWAYS, "model_name_or_path": ALWAYS,
    "dataset": ALWAYS, "max_seq_len": ALWAYS,
    "max_eval_samples": TrainEffect("when it evaluates (do_eval)", _evaluates, in_config=False),
    "input_dir": TrainEffect("with dataset=pretrain", _pretrain),
    "split": TrainEffect("with dataset=pretrain", _pretrain),
    "data_cache": TrainEffect("with dataset=pretrain", _pretrain),
    "corpus_mb": TrainEffect("with dataset=stdlib", _stdlib),
    "val_fraction": TrainEffect("with dataset=stdlib", _stdlib),
    # VHATrainingArguments' own
    "dry_run": ALWAYS, "teacher": ALWAYS, "train_only": ALWAYS, "freeze_embeddings": ALWAYS,
    "save_model_in_checkpoints": TrainEffect("when checkpoint-N folders are saved (do_train, save_strategy not no)",
                                             _saves, in_config=False),
    "distill_ce_weight": TEACHER, "distill_hidden_weight": TEACHER, "distill_attn_weight": TEACHER,
    "distill_kl_weight": TEACHER,
    "distill_temperature": TrainEffect("with a teacher and distill_kl_weight > 0 (T scales the KL only)", _kl),
    "distill_schedule": TrainEffect("with a teacher and a KD weight > 0 (it schedules the KD weights)", _kd),
    "vocab_parallel": TrainEffect("with tensor parallelism (tensor_model_parallel_size > 1)", _tp),
}

_GROUPS = [
    (PASSED, "output_dir overwrite_output_dir do_train do_eval evaluation_strategy seed device disable_tqdm report_to "
             "run_name logging_dir log_on_each_node skip_memory_metrics dataloader_num_workers dataloader_drop_last "
             "prefetch_factor "
             "local_rank no_cuda deterministic_mode use_cache pad_token_id lazy_data_processing skip_profile_timer "
             "metrics_output_path optim recompute_granularity recompute_method recompute_modules recompute_num_layers "
             "bf16 fp16 sharding split_param save_checkpoint_format load_checkpoint_format aoa_config "
             "load_via_cpu convert_from_hf save_to_hf load_from_hf flex_ckpt_comm_method save_tokenizer "
             "save_rng_states ignore_load_lr_and_optim ignore_save_lr_and_optim use_async_save ordered_save_group_size "
             "replicate_saved_into_local save_on_each_node release_grads count_trained_tokens fa_version "
             "tensor_model_parallel_size pipeline_model_parallel_size sharding_parallel_size sharding_degree "
             "sep_parallel_size context_parallel_size"),
    (TrainEffect("when it trains (do_train)", _trains, in_config=False),
     "per_device_train_batch_size gradient_accumulation_steps learning_rate weight_decay adam_beta1 adam_beta2 "
     "adam_epsilon max_grad_norm max_steps lr_scheduler_type logging_strategy logging_first_step logging_steps "
     "save_strategy resume_from_checkpoint skip_data_intervals use_lowprecision_moment"),
    (TrainEffect("when it trains with max_steps -1 (max_steps > 0 overrides it)",
                 lambda r: _trains(r) and r.train.max_steps <= 0, in_config=False), "num_train_epochs"),
    (TrainEffect("with a warm-up schedule (lr_scheduler_type not constant)",
                 lambda r: _trains(r) and _schedule(r) != "constant", in_config=False), "warmup_steps"),
    (TrainEffect("with a warm-up schedule and warmup_steps 0 (warmup_steps > 0 overrides it)",
                 lambda r: _trains(r) and _schedule(r) != "constant" and r.train.warmup_steps <= 0, in_config=False),
     "warmup_ratio"),
    (TrainEffect("with lr_scheduler_type cosine", lambda r: _trains(r) and _schedule(r) == "cosine", in_config=False),
     "num_cycles min_lr"),
    (TrainEffect("with lr_scheduler_type polynomial", lambda r: _trains(r) and _schedule(r) == "polynomial",
                 in_config=False),
     "lr_end power"),
    (TrainEffect("when checkpoint-N folders are saved (do_train, save_strategy not no)", _saves, in_config=False),
     "save_steps save_total_limit"),
    (TrainEffect("when resuming from a checkpoint-N", _resumes, in_config=False), "ignore_data_skip"),
    (TrainEffect("when it evaluates (do_eval, or an evaluation_strategy other than no)", _evaluates,
                 in_config=False),
     "per_device_eval_batch_size max_evaluate_steps prediction_loss_only bf16_full_eval fp16_full_eval"),
    (TrainEffect("when it evaluates every eval_steps (evaluation_strategy steps)", _eval_steps, in_config=False),
     "eval_steps minimum_eval_times"),
    (TrainEffect("with bf16 or fp16 (AMP)", _amp),
     "fp16_opt_level amp_custom_black_list amp_custom_white_list"),
    (TrainEffect("with bf16 or fp16 at fp16_opt_level O2",
                 lambda r: _amp(r) and str(r.train.fp16_opt_level) == "O2"), "amp_master_grad"),
    (TrainEffect("with fp16", lambda r: bool(r.train.fp16)), "scale_loss"),
    (TrainEffect("with tensor parallelism (tensor_model_parallel_size > 1)", _tp),
     "tensor_parallel_config sequence_parallel fuse_sequence_parallel_allreduce sequence_parallel_config "
     "mp_async_allreduce mp_skip_c_identity mp_fused_linear_param_grad_add tp_delay_scale_loss tp_sync_param "
     "tp_sync_moment tp_async_allreduce sp_async_reduce_scatter partial_send_recv sp_allreduce_avg_in_gradinent_scale"),
    (TrainEffect("with pipeline parallelism (pipeline_model_parallel_size > 1)", _pp),
     "pipeline_parallel_config pp_delay_scale_loss pp_sync_param pp_sync_moment pp_release_grads batch_p2p_comm "
     "non_batch_p2p_comm overlap_p2p_comm p2p_cache_shape clear_every_step_cache variable_seq_lengths "
     "force_reshard_pp use_dualpipev forward_backward_overlap_scheduler send_recv_overlap split_backward "
     "best_unbalanced_scheduler reorder_pipeline_priority pp_sharding_comm_overlap timer"),
    (TrainEffect("with sharding over several processes (sharding stage1 / stage2 / stage3)", _sharding),
     "sharding_parallel_mesh_dimension sharding_comm_buffer_size_MB sharding_offload_opt_buffersize_GB "
     "sharding_parallel_config save_sharded_model load_sharded_model load_sharded_model_remap_parameter_name "
     "sharded_model_from_ema stage1_tensor_fusion stage1_overlap stage2_overlap stage1_broadcast_overlap "
     "stage1_allgather_overlap stage1_reduce_avg sd_release_grads sd_sharding_comm_overlap "
     "sd_shardingv1_comm_overlap save_sharding_stage1_model_include_freeze_params split_norm_comm "
     "fuse_optimizer_states optim_shard_num tensorwise_offload_optimizer offload_optim"),
    (TrainEffect("with several processes (the launcher)", _multi),
     "data_parallel_config dp_comm_overlap dp_allreduce_avg_in_gradinent_scale gradient_sync_after_accumulate "
     "ddp_find_unused_parameters hybrid_parallel_topo_order nccl_comm_group_config distributed_dataloader "
     "unified_checkpoint unified_checkpoint_config ckpt_quant_stage"),
    (TrainEffect("with report_to wandb", lambda r: "wandb" in (r.train.report_to or [])),
     "wandb_api_key wandb_http_proxy"),
    (_never("the datasets draw their own seeded order (a resumed run sees the same batches) and set it false"),
     "dataloader_shuffle"),
    (_never("there is no test set; it trains and evaluates"), "do_predict"),
    (_never("export with tools/export_onnx.py"), "do_export"),
    (_never("no family trained here has routed experts (Qwen3-MoE is checkpoint-only)"),
     "expert_model_parallel_size expert_tensor_model_parallel_size use_expert_parallel aux_loss_alpha "
     "hybrid_parallel_expert_grad_scale offload_fp8_expert_master_weight using_sonic_moe"),
    (_never("the models here have no multi-token-prediction layers"),
     "num_nextn_predict_layers mtp_loss_scaling_factor recompute_mtp_granularity recompute_mtp_method "
     "recompute_mtp_modules"),
    (_never("it trains in dynamic graph mode with fleet's hybrid parallelism, not auto-parallel / to_static"),
     "enable_auto_parallel use_intermediate_api auto_parallel_resume_form_hybrid_parallel to_static tensor_fusion "
     "overlap auto_parallel_sync_shared_params replace_with_c_embedding replace_with_parallel_cross_entropy "
     "split_inputs_sequence_dim cp_comm_type"),
    (_never("the samples are dicts of input_ids / labels, not an nlp.Dataset with columns or past states"),
     "remove_unused_columns label_names past_index eval_accumulation_steps"),
    (_never("it keeps the last model, not a best one by metric"),
     "load_best_model_at_end metric_for_best_model greater_is_better"),
    (TrainEffect("always (copied into the model's config by PaddleFormers; its Qwen3 layers and loss read it)"),
     "fuse_rms_norm fuse_swiglu fuse_attention_qkv fuse_attention_ffn use_fused_head_and_loss_fn "
     "use_filtered_label_loss loss_subbatch_sequence_length"),
    (TrainEffect("with tensor parallelism (tensor_model_parallel_size > 1): the parallel cross-entropy reads it", _tp),
     "tensor_parallel_output"),
    (TrainEffect("with pipeline parallelism (pipeline_model_parallel_size > 1): the pipe model reads it", _pp),
     "virtual_pipeline_model_parallel_size add_tail_layers recompute_use_reentrant apply_rope_fusion"),
    (TrainEffect("with tensor or pipeline parallelism", lambda r: _tp(r) or _pp(r)), "sync_grad"),
    (_never("the model's shape is model_config's (as a training argument it would be copied over it after its "
            "checks); set it in model_config"),
     "num_hidden_layers num_attention_heads num_key_value_heads hidden_size intermediate_size tie_word_embeddings "
     "use_qk_norm"),
    (_never("PaddleFormers' Qwen3 layers do not read it (PaddleFleet's GPT provider does)"),
     "use_flash_attention use_fused_linear_cross_entropy no_recompute_layers fp8 fp8_wgrad multi_latent_attention "
     "no_rope_freq position_embedding_type gated_linear_unit fp32_residual_connection softmax_scale softmax_type "
     "init_method output_layer_init_method embedding_init_method embedding_init_method_std "
     "num_empty_layers_add_in_head num_empty_layers_add_in_tail normalization"),
    (_never("no family trained here has routed experts (Qwen3-MoE is checkpoint-only)"),
     "num_experts_per_tok n_routed_experts moe_subbatch_token_num_before_dispatch using_fake_gate "
     "ep_communication_type use_unified_moe moe_deepep_num_sms moe_token_dispatcher_type moe_use_fusion_node "
     "moe_pad_expert_input_to_capacity moe_token_drop_policy moe_expert_capacity_factor router_aux_loss_coef "
     "router_z_loss_coef moe_router_force_load_balancing moe_router_load_balancing_type moe_router_bias_update_rate "
     "moe_shared_expert_overlap moe_dequant_input moe_expert_fusion moe_router_fusion "
     "moe_subbatch_token_num_after_dispatch moe_grouped_gemm moe_ep_barrier"),
    (_never("a GPU-cluster feature (zero-cost / flash-device checkpoints, PaddleCloud downloads, nsys profiling, "
            "pre-allocated GPU memory, NPU gradient flattening, Hugging Face resume) this project does not run"),
     "enable_zero_cost_checkpoint zcc_workers_num zcc_pipeline_hooks_capacity_usage zcc_save_ema_coef "
     "zcc_ema_interval zcc_ema_loss_threshold flash_device_save_steps pdc_download_ckpt pdc_download_timeout "
     "profile profile_step_start profile_step_end pre_alloc_memory flatten_param_grads offload_queue "
     "resume_from_huggingface_ckpt save_hf_steps output_signal_dir"),
]

TAKES_EFFECT: Dict[str, TrainEffect] = dict(_OWN)
for _effect, _names in _GROUPS:
    for _name in _names.split():
        assert _name not in TAKES_EFFECT, f"{_name} twice in the train options table"
        TAKES_EFFECT[_name] = _effect


def given_keys(args: list) -> Dict[str, None]:
    """The argument names an argv-style list sets (`--key value ...`), in order."""
    return {a[2:]: None for a in args if isinstance(a, str) and a.startswith("--") and len(a) > 2}


def check_effects(run: RunView, from_config: Dict[str, None], from_command: Dict[str, None], source: str,
                  config_run: Optional[RunView] = None) -> None:
    """TrainError (one line) for the first given argument whose TAKES_EFFECT condition is false in this run (a config's
    argument: false in `config_run`, the config on its own, too; see the module docstring). `source` names the
    config file."""
    for name in list(from_command) + [n for n in from_config if n not in from_command]:
        effect = TAKES_EFFECT.get(name)
        if effect is None or effect.holds(run):
            continue
        if name not in from_command:
            if not effect.in_config or (config_run is not None and effect.holds(config_run)):
                continue  # a part the config switches off keeps its settings; or the command line switched it off
            where = f" (set in {source})"
        else:
            where = ""
        if effect.when.startswith(NEVER_HERE):
            raise TrainError(f"{name}{where} has no effect in tools/train.py: {effect.when[len(NEVER_HERE) + 2:]}")
        raise TrainError(f"{name}{where} has no effect in this run: it takes effect {effect.when}")


def check_numbers(run: RunView, given) -> None:
    """TrainError (one line) for a given float argument that is NaN or infinite (NaN passes every `> 0` check and
    fails later, far from its cause), or a stdlib corpus size / validation share out of range."""
    import dataclasses
    import math

    for obj in (run.model, run.data, run.train):
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name, None)
            if f.name in ("learning_rate", "num_train_epochs"):
                continue  # run_checks.check_arguments says these with their ranges
            if f.name in given and isinstance(v, float) and not math.isfinite(v):
                raise TrainError(f"{f.name} must be a finite number, got {v}")
    if "corpus_mb" in given and not run.data.corpus_mb > 0:
        raise TrainError(f"corpus_mb must be > 0, got {run.data.corpus_mb}")
    if "val_fraction" in given and not 0 < run.data.val_fraction < 1:
        raise TrainError(f"val_fraction must be in (0, 1), got {run.data.val_fraction}")


def check_degrees(run: RunView, dry_run: bool) -> None:
    """TrainError (one line) for parallel degrees whose product the processes cannot give (not for --dry_run, which
    checks a config for the launcher)."""
    asked = {k: run.degrees[k] for k in DEGREES if run.degrees.get(k, 1) > 1}
    need = 1
    for k, v in asked.items():
        if k != "sharding_degree" or "sharding_parallel_size" not in asked:
            need *= v
    if dry_run or not asked or need <= run.processes:
        return
    said = " x ".join(f"{k}={v}" for k, v in asked.items())
    raise TrainError(f"{said} needs at least {need} processes, this run has {run.processes}: launch with "
                     f"python -m paddle.distributed.launch --nproc_per_node N tools/train.py ... (one process would "
                     "train without it)")


def markdown_rows():
    """(tool, option, when) rows of every tools/train.py argument, for docs/reliability.md's audit table."""
    return [("train", name, effect.when) for name, effect in sorted(TAKES_EFFECT.items())]
