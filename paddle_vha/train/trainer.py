"""PaddleFormers' Trainer for any registered family: build, train, evaluate and save one run (the glue behind
tools/train.py).

The arguments come from the trainer config (paddle_vha/train/arguments.py). What the run trains is resolved once, by
build_config, into a RunModel (the family asked from the registry once: its config checked by its base's rules, its
model class and checkpoint contract, and whether paddle_vha.parallel shards it at tensor_model_parallel_size > 1) and
passed forward; nothing after it asks the registry again. The model is
written to OUTPUT_DIR/model (and each checkpoint-N/model, paddle_vha/train/callbacks.py) in the documented checkpoint
format. Guide: docs/training.md.

Errors about the user's config, inputs or a run that cannot go on are one-line TrainErrors (paddle_vha/train/errors.py);
paddle_vha/cli/train.py prints them and exits with status 2.
"""
from __future__ import annotations

import copy
import errno
import json
import math
import os
from dataclasses import dataclass

from ..checkpoint.contract import CheckpointError, read_json_object
from ..checkpoint.fsutil import MARKER, check_no_overlap
from ..families import Family, UnknownFamily, family
from .memory import refuse_raw_fields
from .arguments import tensor_parallel_degree
from .callbacks import TrainLog, nonfinite_parameter
from .errors import TrainError
from .run_lock import LOCK_FILE, hold_run_lock
from .saving import finish_saved_folder, save_trained, source_float_dtype
from .paddleformers_trainer import LlmMetaConfig, get_last_checkpoint, set_seed
from .resume import CheckpointTrainer
from .teacher import distill_plan, load_teacher

__all__ = ["run", "build_config", "RunModel", "build_data", "describe", "check_arguments"]


@dataclass(frozen=True)
class RunModel:
    """What one run trains, resolved once by build_config: the family (Qwen3-VHA, Llama-VHA, ...), its checked config,
    the tensor-parallel degree asked for, and whether paddle_vha.parallel shards the model (the family has a plan and
    tp > 1)."""

    family: Family
    config: object
    tp: int
    plan_tp: bool

    @property
    def model_cls(self):
        return self.family.model_class


def model_family(model_type: str):
    try:
        fam = family(model_type)
    except UnknownFamily as e:
        raise TrainError(str(e))
    if not fam.has_model:  # a checkpoint-level family (Qwen3-MoE): nothing to train here, said in one line
        try:
            fam.model_class
        except CheckpointError as e:
            raise TrainError(f"model_type {model_type}: {e}") from None
    return fam


def model_config_dict(model_args) -> dict:
    src = model_args.model_config
    if src is None:
        if model_args.model_name_or_path:
            src = model_args.model_name_or_path
        else:
            raise TrainError("model_config is required (the model's config.json fields, or a path to a config.json)")
    if src.lstrip().startswith("{"):
        try:
            cfg = json.loads(src)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, a 5,000-digit int, deep nesting
            raise TrainError(f"model_config: not a usable JSON object ({type(e).__name__}: {str(e)[:200]})")
    else:  # the checked reader: a device (/dev/zero), FIFO, folder or link loop, too big, not JSON: one line
        path = os.path.join(src, "config.json") if os.path.isdir(src) else src
        cfg = read_json_object(path, TrainError)
    if not isinstance(cfg, dict):
        raise TrainError("model_config must be a JSON object")
    cfg.pop("model_type", None)
    cfg.pop("architectures", None)
    return cfg


def build_config(model_args, data_args, training_args, tp: int) -> RunModel:
    """The run's model (RunModel: the family, its config validated by its base's rules with one line on error, and how
    it is sharded) at tensor-parallel degree tp."""
    fam = model_family(model_args.model_type)
    config_cls = fam.config_class
    plan_tp = tp > 1 and fam.tp_plan is not None
    fields = model_config_dict(model_args)
    if data_args.dataset == "stdlib":
        from .corpus import BYTE_VOCAB_SIZE

        fields.setdefault("vocab_size", BYTE_VOCAB_SIZE)
        if fields["vocab_size"] < BYTE_VOCAB_SIZE:
            raise TrainError(f"model_config vocab_size={fields['vocab_size']} is smaller than the byte corpus' "
                             f"{BYTE_VOCAB_SIZE}")
    fields.setdefault("max_position_embeddings", data_args.max_seq_len)
    if fields["max_position_embeddings"] < data_args.max_seq_len:
        raise TrainError(f"max_seq_len={data_args.max_seq_len} exceeds the model's max_position_embeddings="
                         f"{fields['max_position_embeddings']}")
    try:
        fam.base.check_fields(fields)  # the base's sizes and numbers as written, then with the class's defaults
        refuse_raw_fields(fields, TrainError)  # a memory bomb before PaddleFormers builds its per-layer lists
        config = config_cls(**fields)
        fam.base.check_config(config)
    except (ValueError, TypeError) as e:  # VHAConfigError / MEAConfigError are ValueErrors
        raise TrainError(f"model_config: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    LlmMetaConfig.set_llm_config(config, training_args)  # parallel degrees, recompute, fusions: as PaddleFormers does
    check = getattr(config, "check_runtime_support", None)
    if check is not None:  # the model's own refusals, judged on the degrees the config asks for
        saved, config.tensor_model_parallel_size = config.tensor_model_parallel_size, tp
        try:
            if plan_tp:
                from ..parallel.apply import check_plan

                check(tensor_parallel_plan=True)  # sharded by paddle_vha.parallel, not by fleet's layers
                check_plan(config, tp)
                if vocab_parallel_here(training_args):  # vocabulary-parallel embedding and head
                    check_vocab_parallel_run(config, training_args, tp)
                if getattr(training_args, "sequence_parallel", False):
                    check_sequence_parallel_run(training_args, data_args.max_seq_len, tp)
            else:
                check()
        except ValueError as e:  # VHAConfigError, MEAConfigError, TPPlanError
            raise TrainError(str(e))
        config.tensor_model_parallel_size = saved
    if tp > max(1, training_args.world_size) and not training_args.dry_run:
        raise TrainError(f"tensor_model_parallel_size={tp} needs at least {tp} processes: launch with "
                         f"python -m paddle.distributed.launch --nproc_per_node N tools/train.py ...")
    return RunModel(fam, config, tp, plan_tp)


def check_vocab_parallel_run(config, training_args, tp: int) -> None:
    """TPPlanError / TrainError (one line) for a vocabulary-parallel run the plan cannot give."""
    from ..parallel.vocab import check_vocab_split

    check_vocab_split(config.vocab_size, tp)
    if training_args.pipeline_model_parallel_size > 1 and getattr(config, "tie_word_embeddings", False):
        raise TrainError("vocab_parallel with pipeline_model_parallel_size > 1 and a tied LM head "
                         "(tie_word_embeddings) is not supported (not tested: docs/training.md); use tools/train.py "
                         "--vocab_parallel false")
    if getattr(config, "use_fused_head_and_loss_fn", False):
        raise TrainError("use_fused_head_and_loss_fn with the vocabulary-parallel LM head is not supported "
                         "(PaddleFormers' fused head and loss reads fleet's mp layers); set use_fused_head_and_loss_fn "
                         "false, or vocab_parallel false")


def check_sequence_parallel_run(training_args, seq_len: int, tp: int) -> None:
    """TPPlanError (one line) for a sequence-parallel run the plan cannot give (paddle_vha/parallel/sequence.py)."""
    from ..parallel.sequence import check_sequence_split
    from ..spec.sharding import TPPlanError

    if training_args.pipeline_model_parallel_size > 1:
        raise TPPlanError("sequence_parallel with pipeline_model_parallel_size > 1 is not built (the pipe stages "
                          "pass whole sequences); set sequence_parallel false")
    if getattr(training_args, "teacher", None):
        raise TPPlanError("sequence_parallel with a teacher is not built (the hidden-state distillation term reads "
                          "whole sequences); set sequence_parallel false")
    check_sequence_split(seq_len, tp)


def vocab_parallel_here(training_args) -> bool:
    """The plan splits the embedding and LM head by vocabulary row (`vocab_parallel`; under PP x TP the first
    stage's embedding and the last stage's head, paddle_vha/parallel/pipe_vocab.py)."""
    return bool(getattr(training_args, "vocab_parallel", True))


def check_data_fits(model_args, data_args, config) -> None:
    """TrainError (one line) for data whose token ids the model cannot take, or byte data for a model with a tokenizer
    and a larger vocabulary (paddle_vha/train/data_checks.py); before any dataset is built."""
    from .data_checks import check_stdlib_fits, check_token_ids, tokenizer_folder
    from .datasets import data_prefixes

    tokenizer = tokenizer_folder(model_args)
    if data_args.dataset == "stdlib":
        check_stdlib_fits(config.vocab_size, tokenizer)
    elif data_args.dataset == "pretrain" and data_args.input_dir:
        try:
            _, prefixes = data_prefixes(data_args.input_dir)
        except ValueError as e:
            raise TrainError(str(e))
        check_token_ids(prefixes, config.vocab_size, tokenizer)


def build_data(data_args, training_args, vocab_size=None):
    from .datasets import pretrain_datasets, stdlib_datasets

    S = data_args.max_seq_len
    if S < 1:
        raise TrainError(f"max_seq_len must be >= 1, got {S}")
    world = max(1, training_args.dataset_world_size)
    steps = training_args.max_steps if training_args.max_steps > 0 else 0
    n_train = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps * world * steps
    try:
        if data_args.dataset == "stdlib":
            train, val, info = stdlib_datasets(S, corpus_mb=data_args.corpus_mb, val_fraction=data_args.val_fraction,
                                               seed=training_args.seed, num_train_samples=max(n_train, 1) if steps else None,
                                               max_eval_samples=data_args.max_eval_samples)
            desc = (f"{info['source']}: {info['files']} files, {info['train_tokens']:,} train / "
                    f"{info['val_tokens']:,} validation byte tokens")
        elif data_args.dataset == "pretrain":
            if not data_args.input_dir:
                raise TrainError("dataset=pretrain needs input_dir (PaddleFormers pretraining data: PREFIX.bin + "
                                 "PREFIX.idx)")
            train, val = pretrain_datasets(data_args.input_dir, S, split=data_args.split, seed=training_args.seed,
                                           num_train_samples=max(n_train, 1), num_eval_samples=data_args.max_eval_samples,
                                           data_cache=data_args.data_cache, vocab_size=vocab_size)
            desc = f"PaddleFormers pretraining data {data_args.input_dir} (split {data_args.split})"
        else:
            raise TrainError(f"dataset {data_args.dataset!r} is not one of stdlib, pretrain")
    except (ValueError, FileNotFoundError) as e:
        raise TrainError(str(e))
    return train, val, desc


def describe(config, data_args, training_args) -> str:
    from ..accounting import ArchError, arch_from_config, kv_bytes_per_token, model_weights, training_flops_per_token
    from ..units import fmt_bytes

    try:
        arch = arch_from_config({**config.to_dict(), "model_type": config.model_type}, label=config.model_type)
    except ArchError as e:
        return f"model: {config.model_type} ({e})"
    S = data_args.max_seq_len
    w = model_weights(arch)["total"]
    kv = kv_bytes_per_token(arch, 2, all_layers=True)
    fl = training_flops_per_token(arch, seq_len=S, causal=True)["total"]
    return (f"model: {config.model_type}, {arch.num_layers} layers, hidden {arch.hidden_size}, {arch.num_heads} query / "
            f"{arch.num_kv_heads} KV heads x {arch.head_dim}; {w:,} weights; KV cache {fmt_bytes(kv)} per token (bf16); "
            f"{fl / 1e9:.3g} GFLOPs per training token at S={S} (causal)")


def check_arguments(model_args, data_args, training_args) -> None:
    """TrainError (one line) for arguments PaddleFormers would accept but that cannot mean what the user wants."""
    lr = training_args.learning_rate
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
        raise TrainError(f"learning_rate must be a finite number >= 0, got {lr!r}")
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        if getattr(training_args, name) < 1:
            raise TrainError(f"{name} must be >= 1, got {getattr(training_args, name)}")
    if training_args.max_steps == 0 or training_args.max_steps < -1:
        raise TrainError(f"max_steps must be > 0, or -1 to train num_train_epochs, got {training_args.max_steps}")
    epochs = training_args.num_train_epochs
    if training_args.max_steps == -1 and not (isinstance(epochs, (int, float)) and math.isfinite(epochs) and epochs > 0):
        raise TrainError(f"num_train_epochs must be a finite number > 0 (max_steps is -1), got {epochs!r}")
    for name in ("seed", "data_seed"):  # numpy's and Paddle's generators take [0, 2**32)
        v = getattr(training_args, name, None)
        if v is not None and not 0 <= v < 2**32:
            raise TrainError(f"{name} must be in [0, 2**32), got {v}")
    out = training_args.output_dir
    if os.path.lexists(out) and not os.path.isdir(out):
        raise TrainError(f"output_dir {out}: exists and is not a folder")
    inputs = [model_args.model_name_or_path, data_args.input_dir if data_args.dataset == "pretrain" else None,
              training_args.teacher]
    if model_args.model_config and not model_args.model_config.lstrip().startswith("{"):
        inputs.append(model_args.model_config)
    inputs = [p for p in inputs if p and " " not in p.strip()]  # input_dir may also be a weighted blend "w1 P1 ..."
    try:  # the rule of every tool that writes, but an existing output_dir is a run to resume
        check_no_overlap(out, inputs, input_label="the input", out_label="output_dir")
    except CheckpointError as e:
        raise TrainError(str(e))
    model_dir = os.path.join(out, "model")
    if os.path.isdir(model_dir) and not os.path.isfile(os.path.join(model_dir, MARKER)):
        raise TrainError(f"{model_dir}: exists and was not written by paddle-vha; the trained model would replace it "
                         "(move it away first)")


def run(model_args, data_args, training_args, requested: dict) -> int:
    """Build, train, evaluate and save as the arguments say; returns the exit status (TrainError, one line, for a run
    refused or stopped). A run that fails leaves no empty output folder behind."""
    out, existed = training_args.output_dir, os.path.exists(training_args.output_dir)
    try:
        return _run(model_args, data_args, training_args, requested)
    except BaseException:
        if not existed and os.path.isdir(out) and set(os.listdir(out)) <= {LOCK_FILE}:
            if os.path.exists(os.path.join(out, LOCK_FILE)):
                os.remove(os.path.join(out, LOCK_FILE))
            os.rmdir(out)
        raise


def _run(model_args, data_args, training_args, requested: dict) -> int:
    check_arguments(model_args, data_args, training_args)
    # The datasets shuffle themselves with a seeded permutation (as PaddleFormers' pretraining data does), so a
    # resumed run, which skips the batches already consumed, sees the same batches as an uninterrupted one.
    training_args.dataloader_shuffle = False
    tp = tensor_parallel_degree(requested, training_args)
    run_model = build_config(model_args, data_args, training_args, tp)  # the registry asked once, here
    config = run_model.config
    distill = distill_plan(training_args, config)  # None, or (teacher family, teacher config, settings)
    check_data_fits(model_args, data_args, config)
    train, val, data_desc = build_data(data_args, training_args, config.vocab_size)
    _print_run(run_model, data_args, training_args, (train, val, data_desc))
    if distill is not None:
        print(_distill_line(training_args.teacher, *distill))
    memory_line = check_memory(config, data_args, training_args, tp, refuse=not training_args.dry_run,
                               teacher=distill[1] if distill else None)
    print(memory_line)
    if training_args.dry_run:
        print("dry run: configuration is valid; nothing trained")
        return 0
    check_device(training_args)
    lock = hold_run_lock(training_args.output_dir)  # noqa: F841 - held until this function returns
    _quiet_checkpoint_io()
    resume = resume_point(training_args)
    set_seed(training_args.seed)
    model = build_model(run_model.model_cls, config, model_args, training_args, run_model.plan_tp)
    # With tensor / pipeline parallelism each rank holds a slice of the weights, so a rank-0 save_pretrained would
    # write a partial model: the checkpoint-N/model copies are skipped and the final model goes through the Trainer.
    sharded = max(training_args.tensor_model_parallel_size, training_args.pipeline_model_parallel_size) > 1
    save = model_saver(model, model_args)
    log = TrainLog(model, os.path.join(training_args.output_dir, "train_log.jsonl"),
                   save if training_args.save_model_in_checkpoints and not sharded else None)
    trainer = make_trainer(model, training_args, train, val, log, distill)
    if training_args.do_train:
        train_model(trainer, log, model, resume)
    if training_args.do_eval:
        evaluate(trainer, log)
    if training_args.do_train:
        save_trained_model(save, trainer, run_model, training_args, sharded)
    return 0


def _print_run(run_model: RunModel, data_args, training_args, data) -> None:
    """The model, data and parallel lines printed before training (and by a dry run)."""
    train, val, data_desc = data
    tp = run_model.tp
    print(describe(run_model.config, data_args, training_args))
    print(f"data: {data_desc}; {len(train):,} train samples of {data_args.max_seq_len} tokens, "
          f"{len(val):,} validation samples")
    if tp > 1:
        how = " (sharded by paddle_vha.parallel)" if run_model.plan_tp else ""
        print(f"parallel: tensor_model_parallel_size={tp}{how}; launch with python -m paddle.distributed.launch "
              f"--nproc_per_node N tools/train.py ..., N a multiple of {tp}")


def _distill_line(path: str, fam, cfg, settings) -> str:
    s = settings
    mix = f"{s.ce_weight:g} ce + {s.kl_weight:g} T^2 KL(teacher || student) at T={s.temperature:g}"
    if s.hidden_weight:
        mix += f" + {s.hidden_weight:g} hidden-state MSE"
    if s.attn_weight:
        mix += f" + {s.attn_weight:g} attention-output MSE"
    return (f"distill: teacher {path} ({fam.label}, {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} query / "
            f"{cfg.num_key_value_heads} KV heads; frozen, float32, replicated on every rank); loss {mix}; KD weights "
            f"{s.schedule}")


def make_trainer(model, training_args, train, val, log, distill):
    """The Trainer of the run: CheckpointTrainer, or DistillTrainer with the frozen teacher (built here, after the
    student, without touching the RNG state) when `distill` is (teacher family, config, settings)."""
    kwargs = dict(model=model, args=training_args, train_dataset=train if training_args.do_train else None,
                  eval_dataset=val if training_args.do_eval else None, callbacks=[log])
    if distill is None:
        return CheckpointTrainer(**kwargs)
    from .distill_trainer import DistillTrainer

    fam, cfg, settings = distill
    return DistillTrainer(**kwargs, teacher=load_teacher(training_args.teacher, fam, cfg), distill=settings)


def check_memory(config, data_args, training_args, tp: int, refuse: bool = True, teacher=None) -> str:
    """The run's memory line (paddle_vha/train/memory.py); TrainError, before anything is built, when the machine
    lacks it (refuse). `teacher`: the teacher's config, whose weights count in full on every process."""
    from .memory import local_process_count, refuse_if_short, train_need, weight_count

    batch = max(training_args.per_device_train_batch_size, training_args.per_device_eval_batch_size)
    need, formula = train_need(config, batch, data_args.max_seq_len,
                               model_parallel=tp * max(1, training_args.pipeline_model_parallel_size),
                               saves=training_args.do_train, local_procs=local_process_count(),
                               teacher_weights=weight_count(teacher) if teacher is not None else 0)
    if not refuse:
        from ..units import fmt_bytes

        return f"memory: needs about {fmt_bytes(need)} ({formula})"
    return refuse_if_short(need, formula, TrainError)


def check_device(training_args) -> None:
    """TrainError for a device this Paddle build cannot train on, or half precision on the CPU."""
    import paddle

    if training_args.device.startswith("gpu") and not paddle.is_compiled_with_cuda():
        raise TrainError(f"device={training_args.device}, but this Paddle build has no CUDA (docs/install.md, GPU); "
                         "pass --device cpu to train on the CPU")
    if training_args.device == "cpu" and training_args.world_size > 1 and not training_args.use_hybrid_parallel \
            and training_args.recompute_granularity is None:
        raise TrainError("data parallelism without tensor parallelism on the CPU: Paddle's DataParallel reducer does not "
                         "sum the gradients on this build (the replicas drift apart); set recompute_granularity full "
                         "(full recompute: PaddleFormers then all-reduces them itself) or tensor_model_parallel_size")
    if training_args.device == "cpu" and (training_args.bf16 or training_args.fp16):
        raise TrainError("bf16 / fp16 training needs a GPU: Paddle's CPU kernels have no half-precision matmul; "
                         "pass --bf16 false --fp16 false on the CPU")


def _quiet_checkpoint_io() -> None:
    import logging
    import warnings

    logging.getLogger("paddle.distributed.fleet.utils.log_util").setLevel(logging.WARNING)  # checkpoint I/O chatter
    warnings.filterwarnings("ignore", message="The input state dict is empty")  # no fp32 master weights without AMP


def resume_point(training_args):
    """The checkpoint to resume from: resume_from_checkpoint, else output_dir's last checkpoint-N (announced; not
    with overwrite_output_dir), else None."""
    last = None
    if training_args.resume_from_checkpoint is None and os.path.isdir(training_args.output_dir) \
            and not training_args.overwrite_output_dir:
        last = get_last_checkpoint(training_args.output_dir)
        if last is not None:
            print(f"resuming from {last} (set overwrite_output_dir to start over)")
    return training_args.resume_from_checkpoint or last


def compute_dtype(training_args) -> str:
    """The dtype the weights are trained in: bfloat16 for AMP level O2 with bf16, else float32 (also for a checkpoint
    stored in bfloat16: PaddleFormers loads it widened, and the save narrows it back, paddle_vha/train/saving.py)."""
    return "bfloat16" if training_args.bf16 and training_args.fp16_opt_level == "O2" else "float32"


def build_model(model_cls, config, model_args, training_args, plan_tp: bool):
    """The model to train: sharded by paddle_vha.parallel (plan_tp), loaded from model_name_or_path, or freshly
    initialised; in compute_dtype (bfloat16 only for AMP level O2)."""
    dtype = compute_dtype(training_args)
    config.dtype = dtype  # a checkpoint's config says bfloat16: build (and load) in the dtype training computes in
    if training_args.pipeline_model_parallel_size > 1:
        model = _build_pipeline_model(model_cls, config, model_args, training_args, plan_tp)
    elif plan_tp:
        model = _build_plan_parallel_model(model_cls, config, model_args, training_args)
    elif model_args.model_name_or_path:
        import tempfile

        from ..checkpoint.fsutil import linked_view

        with tempfile.TemporaryDirectory(prefix="paddle-vha-train-") as tmp:  # the loader's metadata lands here
            view = linked_view(model_args.model_name_or_path, os.path.join(tmp, "init"))
            try:
                model = model_cls.from_pretrained(view, config=config, dtype=dtype)
            except CheckpointError as e:  # a broken checkpoint, named as the user gave it (not the linked view)
                raise TrainError(str(e).replace(view, model_args.model_name_or_path)) from None
    else:
        model = model_cls(config)
    if dtype == "bfloat16":
        model = model.to(dtype=dtype)
    return model


def _build_pipeline_model(model_cls, config, model_args, training_args, plan_tp: bool):
    """The family's pipe model (paddle_vha/modeling/pipe.py) for fleet's pipeline parallelism, with
    model_name_or_path's weights for this stage; one-line TrainErrors for what it cannot run."""
    import paddle.distributed as dist

    from ..modeling.pipe import load_stage_weights

    pp = training_args.pipeline_model_parallel_size
    if getattr(model_cls, "pipe_class", None) is None:
        raise TrainError(f"pipeline_model_parallel_size={pp}: {model_cls.__name__} has no pipeline-parallel form")
    if not hasattr(dist.ParallelEnv(), "_device_id"):  # Paddle's CPU build (docs/training.md, Pipeline parallelism)
        raise TrainError(f"pipeline_model_parallel_size={pp} needs a GPU build of Paddle: fleet's PipelineLayer "
                         "reads ParallelEnv().device_id, which this build does not set")
    if training_args.device == "cpu" and training_args.batch_p2p_comm:
        raise TrainError(f"pipeline_model_parallel_size={pp} on the CPU needs --batch_p2p_comm false (gloo has no "
                         "send / recv on the calculation stream, which batched p2p uses)")
    try:
        if plan_tp:  # PP x TP: each stage built whole (as at TP = 1), then sharded by the family's plan
            config.check_runtime_support(tensor_parallel_plan=True)
            config = copy.deepcopy(config)
            config.tensor_model_parallel_size = 1
        model = model_cls.pipe_class(config)
        if model_args.model_name_or_path:
            load_stage_weights(model, model_args.model_name_or_path)
    except (ValueError, CheckpointError) as e:  # VHAConfigError / MEAConfigError: what the pipe refuses
        raise TrainError(str(e)) from None
    if plan_tp:
        _shard_stage(model, training_args)
    return model


def _shard_stage(model, training_args) -> None:
    """This pipeline stage's decoder layers sharded over fleet's model-parallel group (paddle_vha.parallel)."""
    from paddle.distributed import fleet

    from ..parallel.apply import parallelize_model

    if training_args.device == "cpu":  # as in _build_plan_parallel_model: every mp rank reads the same batches
        fleet.fleet._user_defined_strategy.hybrid_configs["mp_configs"].need_broadcast_data = False
    # with vocab_parallel the head keeps its rank's logits for the parallel cross-entropy (tensor_parallel_output)
    state = parallelize_model(model, fleet.get_hybrid_communicate_group().get_model_parallel_group(),
                              vocab_parallel=vocab_parallel_here(training_args))
    print(_plan_line(state))


def _build_plan_parallel_model(model_cls, config, model_args, training_args):
    from paddle.distributed import fleet

    from ..parallel.apply import build_tensor_parallel_model

    if training_args.device == "cpu":
        # fleet's TensorParallel wrapper broadcasts each batch from mp rank 0, which asserts a GPU / XPU. Every
        # mp rank reads the same deterministic batches here, so fleet's own switch turns the broadcast off.
        fleet.fleet._user_defined_strategy.hybrid_configs["mp_configs"].need_broadcast_data = False
    group = fleet.get_hybrid_communicate_group().get_model_parallel_group()
    # the embedding and LM head split by vocabulary row; the head keeps its rank's logits for the parallel
    # cross-entropy (PaddleFormers' tensor_parallel_output) unless a teacher's KL needs the whole logits
    tp_output = bool(getattr(config, "tensor_parallel_output", True)) and not getattr(training_args, "teacher", None)
    try:  # single-device layers (loaded from model_name_or_path, if given), sharded by the plan
        model = build_tensor_parallel_model(model_cls, config, group, weights_from=model_args.model_name_or_path,
                                            vocab_parallel=vocab_parallel_here(training_args),
                                            tensor_parallel_output=tp_output,
                                            sequence_parallel=bool(getattr(training_args, "sequence_parallel", False)))
    except CheckpointError as e:
        raise TrainError(str(e)) from None
    print(_plan_line(model._vha_tp_state))
    return model


def _plan_line(state) -> str:
    """What the plan applied on this rank (its log): degree, vocabulary split, sequence parallelism."""
    sp = (f"sequence-parallel ({len(state.sequence_summed)} weights used on this rank's tokens only get their "
          f"gradients summed: {', '.join(state.sequence_summed[:3])}, ...)" if state.sequence_parallel else
          "no sequence parallelism")
    return (f"tensor parallel: rank {state.rank} of {state.t}; vocabulary "
            f"{'split by row' if state.vocab_parallel else 'whole'}; {sp}")


def train_model(trainer, log: TrainLog, model, resume) -> None:
    """trainer.train (from `resume`), failures with a known cause as one-line TrainErrors, then the final NaN check,
    the Trainer's state and the last loss line."""
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except Exception as e:  # noqa: BLE001 - reported in one line where the cause is known
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise TrainError(_disk_full(trainer.args.output_dir, trainer.state.global_step, e)) from e
        why = _training_failure(e, trainer.state.global_step, log.steps_run, resume)
        if why is None:
            raise  # not a resume problem: the whole traceback is the useful report
        raise TrainError(why) from e
    if log.nonfinite is None:
        bad = nonfinite_parameter(model)  # after the last step, whether or not it was logged
        if bad is not None:
            log.nonfinite = (f"parameter {bad} holds NaN or Inf", trainer.state.global_step)
    if log.nonfinite is not None:
        what, step = log.nonfinite
        raise TrainError(f"training stopped: {what} at step {step}; nothing saved (lower learning_rate?)")
    trainer.save_state()
    if "loss" in log.last:
        step, loss = log.last["loss"]
        print(f"train: {result.global_step} steps; loss {loss:.4f} at step {step}")


def _disk_full(output_dir: str, step: int, e: OSError) -> str:
    """The one line for a disk that filled up during training; a checkpoint-N the failed save left half-written (no
    trainer_state.json, which the Trainer writes last) is removed, so that resuming never picks it."""
    import shutil

    partial = os.path.join(output_dir, f"checkpoint-{step}")
    removed = ""
    if os.path.isdir(partial) and not os.path.isfile(os.path.join(partial, "trainer_state.json")):
        shutil.rmtree(partial, ignore_errors=True)
        removed = f"; removed the half-written {partial}"
    where = f" writing {e.filename}" if e.filename else ""
    return (f"training stopped at step {step}: no space left on the device{where}{removed}; free disk space and run "
            "again (it resumes from the last complete checkpoint)")


def _training_failure(e: Exception, global_step: int, steps_run: int, resume):
    """The one line for an exception out of trainer.train whose cause is known, or None (re-raise it as it is)."""
    from .data_checks import IdRangeError

    if isinstance(e, IdRangeError):
        return f"training stopped at step {global_step + 1}: {e}; nothing saved"
    if isinstance(e, TrainError):  # already one line (a checkpoint refused at this layout, paddle_vha/train/resume.py)
        return str(e)
    if isinstance(e, ValueError) and "inf or nan" in str(e):  # PaddleFormers' loss check before each step
        return (f"training stopped: the loss is not finite at step {global_step + 1} ({str(e).split('. ')[-1]}); "
                "nothing saved (lower learning_rate?)")
    if resume is None or steps_run:
        return None
    first = (str(e).strip().splitlines() or [""])[0][:300]
    return (f"resuming from {resume} failed ({type(e).__name__}: {first}); remove that checkpoint folder or set "
            "overwrite_output_dir")


def evaluate(trainer, log: TrainLog) -> None:
    """The validation loss at the last step (evaluated now unless it was logged there); TrainError if not finite."""
    step, loss = log.last.get("eval_loss", (None, None))
    if step != trainer.state.global_step:  # not evaluated at the last step yet
        loss = trainer.evaluate().get("eval_loss")
    if loss is not None and not math.isfinite(loss):
        raise TrainError(f"validation loss is {loss} at step {trainer.state.global_step}; nothing saved")
    if loss is not None:
        print(f"validation: loss {loss:.4f} (perplexity {math.exp(min(loss, 50)):.2f} per token) "
              f"at step {trainer.state.global_step}")


def model_saver(model, model_args):
    """save(dest): the model written to `dest` with the starting checkpoint's tokenizer, generation config and chat
    template, its use_cache, and its stored dtype (paddle_vha/train/saving.py); save.finish(folder) finishes a folder
    written another way (the merged tensor-parallel save)."""
    source = model_args.model_name_or_path
    try:
        code = source_float_dtype(source)
    except CheckpointError as e:
        raise TrainError(str(e)) from None

    def save(dest: str) -> None:
        save_trained(model, dest, source, code)

    save.model, save.finish = model, (lambda folder: finish_saved_folder(folder, source, code))
    return save


def save_trained_model(save, trainer, run_model: RunModel, training_args, sharded: bool) -> None:
    """OUTPUT_DIR/model in the documented format: merged from paddle_vha.parallel's shards (run_model.plan_tp),
    gathered by the Trainer (other model parallelism), or saved and validated from rank 0."""
    dest = os.path.join(training_args.output_dir, "model")
    if training_args.pipeline_model_parallel_size > 1:  # PP, PP x TP: one shard per stage (paddle_vha.parallel)
        from ..parallel.pipe_save import save_pipeline_model

        save_pipeline_model(save.model, dest, save.finish)
        if training_args.process_index == 0:
            run_model.family.validate(dest)
    elif run_model.plan_tp:
        _save_plan_parallel(save.model, training_args.output_dir, dest, save.finish)
    elif sharded:  # stock models under fleet's model parallelism: the Trainer gathers (not run by this project)
        trainer.save_model(dest)
    elif training_args.should_save or training_args.world_size > 1:  # collective with several ranks (saving.py)
        save(dest)
        if training_args.should_save:
            run_model.family.validate(dest)  # the folder must meet its documented contract
    if training_args.should_save:
        print(f"saved the trained model to {dest}")


def _save_plan_parallel(model, output_dir: str, dest: str, finish) -> None:
    """Every rank writes its slices; rank 0 merges them into the single-device format (validated) at `dest`."""
    import paddle.distributed as dist

    from ..parallel.tp_shards import merge_tp_checkpoint, save_tp_checkpoint

    shards = os.path.join(output_dir, "model-tp-shards")
    save_tp_checkpoint(model, shards)
    dist.barrier()
    if dist.get_rank() == 0:
        merge_tp_checkpoint(shards, dest, force=True, finish=finish)
    dist.barrier()
