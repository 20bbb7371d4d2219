"""PaddleFormers' Trainer for any registered family, from one JSON trainer config (the glue behind tools/train.py).

The config holds model, data and training arguments in one flat object, parsed by PaddleFormers'
PdArgumentParser as its own pretraining entry point does: `model_type` (a family of paddle_vha/families.py),
`model_config` (the model's config.json fields, inline or a path), the data arguments (`dataset`: stdlib | pretrain,
`input_dir`, `max_seq_len`, ...) and any PaddleFormers TrainingArguments (`output_dir`, `max_steps`, `learning_rate`,
`bf16`, `tensor_model_parallel_size`, `recompute_granularity`, `save_steps`, ...). The model class, its checkpoint
contract and whether paddle_vha.parallel shards it (tensor_model_parallel_size > 1) come from the registry.
Guide: docs/training.md.

Errors about the user's config, inputs or a run that cannot go on are one-line TrainErrors (paddle_vha/train/errors.py);
paddle_vha/cli/train.py prints them and exits with status 2.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

from ..checkpoint.contract import CheckpointError
from ..checkpoint.folder import save_pretrained_atomic
from ..checkpoint.fsutil import MARKER, check_no_overlap
from ..families import DEFAULT_MODEL_TYPE, FAMILIES, UnknownFamily, family
from ..qwen3.contract import check_config, check_config_fields
from .errors import TrainError


def _hf_datasets_importable() -> bool:
    """PaddleFormers' Trainer imports Hugging Face `datasets` when it is installed, only to special-case
    datasets.Dataset inputs (which this tool never passes). In the pinned environment `import datasets` fails
    (pyarrow 26.0.1 needs NumPy >= 2, numpy is pinned to 1.26.4); then that optional integration is switched off
    instead of failing the import. Once the pins agree, nothing here changes anything."""
    try:
        import datasets  # noqa: F401
    except ImportError:
        import paddleformers.utils.import_utils as iu

        iu.is_datasets_available = lambda: False
        return False
    return True


HF_DATASETS_OK = _hf_datasets_importable()

from paddleformers.trainer import (  # noqa: E402
    PdArgumentParser,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    get_last_checkpoint,
    set_seed,
)
from paddleformers.transformers.configuration_utils import LlmMetaConfig, llmmetaclass  # noqa: E402

# Names from PaddleNLP-era configs that PaddleFormers 1.0.0 spells differently.
LEGACY_KEYS = {
    "tensor_parallel_degree": "tensor_model_parallel_size",
    "pipeline_parallel_degree": "pipeline_model_parallel_size",
    "max_seq_length": "max_seq_len",
}


@dataclass
class ModelArguments:
    model_type: str = field(default=DEFAULT_MODEL_TYPE, metadata={"help": f"one of {', '.join(FAMILIES)}"})
    model_config: Optional[str] = field(
        default=None,
        metadata={"help": "the model's config.json fields: a JSON object (inline in the trainer config) or a path to "
                  "a config.json or a checkpoint folder"})
    model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "start from this checkpoint's weights (continued pretraining); default: "
                                "random initialisation from model_config"})


@dataclass
class DataArguments:
    dataset: str = field(default="stdlib", metadata={
        "help": "stdlib: the embedded Python standard-library byte corpus (vocab 256, no download); pretrain: "
                "PaddleFormers pretraining data (PREFIX.bin/.idx) named by input_dir"})
    input_dir: Optional[str] = field(default=None, metadata={
        "help": "dataset=pretrain: a data prefix, a folder of .bin/.idx pairs, or 'w1 PREFIX1 w2 PREFIX2 ...'"})
    split: str = field(default="949,50,1", metadata={"help": "dataset=pretrain: train,valid,test document split"})
    max_seq_len: int = field(default=256, metadata={"help": "tokens per training sample"})
    corpus_mb: float = field(default=8.0, metadata={"help": "dataset=stdlib: MB of standard-library source to read"})
    val_fraction: float = field(default=0.1, metadata={"help": "dataset=stdlib: fraction of files held out"})
    max_eval_samples: int = field(default=64, metadata={"help": "validation samples per evaluation"})
    data_cache: Optional[str] = field(default=None, metadata={"help": "dataset=pretrain: index cache folder"})


@dataclass
@llmmetaclass
class VHATrainingArguments(TrainingArguments):
    dry_run: bool = field(default=False, metadata={
        "help": "validate the config, print model size, KV cache and FLOPs, build the data, and exit without "
                "building the model"})
    save_model_in_checkpoints: bool = field(default=True, metadata={
        "help": "also write each checkpoint-N/model in the Qwen3-VHA checkpoint format (docs/checkpoint.md), "
                "next to the Trainer's resumable state"})


class TrainLog(TrainerCallback):
    """Prints each log record in one line and appends it to OUTPUT_DIR/train_log.jsonl (PaddleFormers 1.0.0 keeps no
    log history in trainer_state.json); on each save, writes checkpoint-N/model in the documented format.

    A NaN or Inf loss, gradient norm or validation loss, or a parameter holding one (checked at every log step: with
    NaN weights PaddleFormers' loss can still read as a finite ln(vocab)), stops training at once (`nonfinite` says
    what and when): it is written to the log as null (strict JSON) and `run` stops with a one-line TrainError, saving
    nothing."""

    KEYS = ("loss", "eval_loss", "learning_rate", "global_norm")

    def __init__(self, model, path: str, save_models: bool):
        self.model, self.path, self.save_models = model, path, save_models
        self.last = {}  # key -> (step, value) of the latest record
        self.nonfinite = None  # (what, step) of the first non-finite number seen
        self.steps_run = 0  # optimizer steps this process has run

    def on_step_end(self, args, state, control, **kwargs):
        self.steps_run += 1

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        rec = {"step": state.global_step, **{k: float(logs[k]) for k in self.KEYS if k in logs}}
        if len(rec) == 1:
            return
        for k, v in rec.items():  # on every rank: main() decides from it whether to evaluate (a collective)
            if k != "step":
                self.last[k] = (rec["step"], v)
                if not math.isfinite(v) and self.nonfinite is None:
                    self.nonfinite = (f"{k} is {v}", rec["step"])
        if self.nonfinite is None:
            bad = _nonfinite_parameter(self.model)  # every rank, at the same steps: the decision is collective
            if bad is not None:
                self.nonfinite = (f"parameter {bad} holds NaN or Inf", rec["step"])
        if self.nonfinite is not None:
            control.should_training_stop = True
            control.should_save = False
        if not state.is_world_process_zero:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        strict = {k: (v if math.isfinite(v) else None) for k, v in rec.items()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(strict, allow_nan=False) + "\n")
        print("  ".join([f"step {rec['step']}"] + [f"{k} {v:.4g}" for k, v in rec.items() if k != "step"]),
              file=sys.stderr)

    def on_save(self, args, state, control, **kwargs):
        if self.nonfinite is not None:
            return
        if self.save_models and args.should_save:
            ckpt = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(ckpt):
                save_pretrained_atomic(self.model, os.path.join(ckpt, "model"))


class _Parser(PdArgumentParser):
    def error(self, message):  # one line, not argparse's page-long usage
        raise TrainError(f"{message} (see tools/train.py --help)")


def read_config(path: str) -> list:
    """The trainer config as argv-style strings (PdArgumentParser.read_json's rules), legacy keys renamed."""
    if not path.endswith(".json"):
        raise TrainError(f"{path}: the first argument must be a JSON trainer config (configs/*.json)")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise TrainError(f"{path}: no such file")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TrainError(f"{path}: not valid JSON ({e})")
    if not isinstance(data, dict):
        raise TrainError(f"{path}: expected a JSON object of arguments")
    args = []
    for key, value in data.items():
        key = LEGACY_KEYS.get(key, key)
        if isinstance(value, list):
            args += [f"--{key}", *[str(v) for v in value]]
        elif isinstance(value, dict):
            args += [f"--{key}", json.dumps(value)]
        else:
            args += [f"--{key}", str(value)]
    return args


def _parser(usage: str) -> _Parser:
    return _Parser((ModelArguments, DataArguments, VHATrainingArguments), description=usage.split("\n\n")[0])


def print_help(usage: str = __doc__) -> None:
    """`usage`, then every model, data and training argument (what tools/train.py --help prints)."""
    print(usage)
    _parser(usage).print_help()


def parse(argv, usage: str = __doc__):
    """(model, data, training arguments, the parallel degrees the user wrote) from argv: CONFIG.json [--key value ...].
    `usage` is the parser's description. A first argument -h / --help is the caller's to answer (print_help)."""
    if not argv:
        raise TrainError("usage: tools/train.py CONFIG.json [--key value ...] (see --help)")
    parser = _parser(usage)
    cmd = []
    for a in argv[1:]:
        if a.startswith("--") and a[2:] in LEGACY_KEYS:
            a = "--" + LEGACY_KEYS[a[2:]]
        cmd.append(a)
    args = read_config(argv[0]) + cmd
    try:
        parsed = parser.common_parse(args, return_remaining_strings=False)
    except ValueError as e:
        msg = str(e)
        if "not used by the PdArgumentParser" in msg:
            import ast

            try:
                rest = ast.literal_eval(msg.split(":", 1)[1].strip())
                unknown = ", ".join(a[2:] for a in rest if a.startswith("--")) or str(rest)
            except (ValueError, SyntaxError):
                unknown = msg.split(":", 1)[1].strip()
            raise TrainError(f"{argv[0]}: unknown argument(s): {unknown} (not a model, data or PaddleFormers "
                             "training argument)")
        raise TrainError(f"{argv[0]}: {msg.splitlines()[0] if msg else type(e).__name__}")
    except (AssertionError, TypeError, NotImplementedError) as e:
        raise TrainError(f"{argv[0]}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    model_args = parsed[0]
    if "--model_name_or_path" in cmd and "--model_config" not in cmd and model_args.model_name_or_path:
        # Continued training from a checkpoint named on the command line: its config.json is the architecture (a
        # trainer config's inline model_config describes a model to build, not the one being loaded).
        model_args.model_config = None
        try:
            with open(os.path.join(model_args.model_name_or_path, "config.json"), encoding="utf-8") as f:
                checkpoint_type = json.load(f).get("model_type")
        except (OSError, ValueError, AttributeError):
            checkpoint_type = None  # model_config_dict says what is wrong with it
        if "--model_type" not in cmd and isinstance(checkpoint_type, str):
            model_args.model_type = checkpoint_type
    return (*parsed, requested_parallelism(args))


def requested_parallelism(args: list) -> dict:
    """Parallel degrees as the user wrote them. TrainingArguments resets them to 1 / -1 in a single process, which
    would hide that a config asks for tensor parallelism the model may not support."""
    out = {}
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
        for i, a in enumerate(args[:-1]):
            if a == f"--{key}":
                try:
                    out[key] = int(args[i + 1])
                except ValueError:
                    pass  # PdArgumentParser has already rejected it
    return out


def tensor_parallel_degree(requested: dict, training_args) -> int:
    """The tensor-parallel degree the run asks for: what the user wrote (a single process' TrainingArguments reset it
    to 1) or what the launcher gave."""
    return max(1, requested.get("tensor_model_parallel_size", 1), training_args.tensor_model_parallel_size)


def model_family(model_type: str):
    try:
        return family(model_type)
    except UnknownFamily as e:
        raise TrainError(str(e))


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
        except json.JSONDecodeError as e:
            raise TrainError(f"model_config: not a JSON object ({e})")
    else:
        path = os.path.join(src, "config.json") if os.path.isdir(src) else src
        try:
            with open(path, encoding="utf-8") as f:
                cfg = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise TrainError(f"model_config {src}: cannot read a config.json ({type(e).__name__}: {e})")
    if not isinstance(cfg, dict):
        raise TrainError("model_config must be a JSON object")
    cfg.pop("model_type", None)
    cfg.pop("architectures", None)
    return cfg


def build_config(model_args, data_args, training_args, tp: int):
    """The model's config (validated, one line on error) and its causal-LM class, for a run at tensor-parallel degree
    tp."""
    fam = model_family(model_args.model_type)
    config_cls, model_cls = fam.config_class, fam.model_class
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
        check_config_fields(fields)  # Qwen3's sizes and numbers as written, then with the class's defaults
        config = config_cls(**fields)
        check_config(config)
    except (ValueError, TypeError) as e:  # VHAConfigError / MEAConfigError are ValueErrors
        raise TrainError(f"model_config: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    LlmMetaConfig.set_llm_config(config, training_args)  # parallel degrees, recompute, fusions: as PaddleFormers does
    check = getattr(config, "check_runtime_support", None)
    if check is not None:  # the model's own refusals, judged on the degrees the config asks for
        saved, config.tensor_model_parallel_size = config.tensor_model_parallel_size, tp
        try:
            if uses_plan_tensor_parallel(model_args, tp):
                from ..parallel.apply import check_plan

                check(tensor_parallel_plan=True)  # sharded by paddle_vha.parallel, not by fleet's layers
                check_plan(config, tp)
            else:
                check()
        except ValueError as e:  # VHAConfigError, MEAConfigError, TPPlanError
            raise TrainError(str(e))
        config.tensor_model_parallel_size = saved
    if tp > max(1, training_args.world_size) and not training_args.dry_run:
        raise TrainError(f"tensor_model_parallel_size={tp} needs at least {tp} processes: launch with "
                         f"python -m paddle.distributed.launch --nproc_per_node N tools/train.py ...")
    return config, model_cls


def uses_plan_tensor_parallel(model_args, tp: int) -> bool:
    """Families with a plan (Qwen3-VHA, Qwen3-MEA) are built and saved through paddle_vha.parallel at t > 1
    (docs/tensor_parallel.md)."""
    return tp > 1 and model_family(model_args.model_type).tp_plan is not None


def build_data(data_args, training_args):
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
                                           data_cache=data_args.data_cache)
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
    out = training_args.output_dir
    if os.path.lexists(out) and not os.path.isdir(out):
        raise TrainError(f"output_dir {out}: exists and is not a folder")
    inputs = [model_args.model_name_or_path, data_args.input_dir if data_args.dataset == "pretrain" else None]
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


def _nonfinite_parameter(model):
    """The name of the first parameter holding a NaN or Inf (on any rank: "a parameter on another rank"), or None.
    Collective when several processes run: call it on every rank at the same step."""
    import paddle
    import paddle.distributed as dist

    bad = next((name for name, p in model.named_parameters() if not bool(paddle.isfinite(p).all())), None)
    if dist.get_world_size() > 1:
        flag = paddle.to_tensor([0 if bad is None else 1], dtype="int32")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if int(flag.numpy()[0]) and bad is None:
            bad = "on another rank"
    return bad


def run(model_args, data_args, training_args, requested: dict) -> int:
    """Build, train, evaluate and save as the arguments say; returns the exit status (TrainError, one line, for a run
    refused or stopped). A run that fails leaves no empty output folder behind."""
    out, existed = training_args.output_dir, os.path.exists(training_args.output_dir)
    try:
        return _run(model_args, data_args, training_args, requested)
    except BaseException:
        if not existed and os.path.isdir(out) and not os.listdir(out):
            os.rmdir(out)
        raise


def _run(model_args, data_args, training_args, requested: dict) -> int:
    check_arguments(model_args, data_args, training_args)
    # The datasets shuffle themselves with a seeded permutation (as PaddleFormers' pretraining data does), so a
    # resumed run, which skips the batches already consumed, sees the same batches as an uninterrupted one.
    training_args.dataloader_shuffle = False
    tp = tensor_parallel_degree(requested, training_args)
    config, model_cls = build_config(model_args, data_args, training_args, tp)
    train, val, data_desc = build_data(data_args, training_args)
    _print_run(config, model_args, data_args, training_args, tp, (train, val, data_desc))
    if training_args.dry_run:
        print("dry run: configuration is valid; nothing trained")
        return 0
    check_device(training_args)
    _quiet_checkpoint_io()
    resume = resume_point(training_args)
    plan_tp = uses_plan_tensor_parallel(model_args, tp)
    set_seed(training_args.seed)
    model = build_model(model_cls, config, model_args, training_args, plan_tp)
    # With tensor / pipeline parallelism each rank holds a slice of the weights, so a rank-0 save_pretrained would
    # write a partial model: the checkpoint-N/model copies are skipped and the final model goes through the Trainer.
    sharded = max(training_args.tensor_model_parallel_size, training_args.pipeline_model_parallel_size) > 1
    log = TrainLog(model, os.path.join(training_args.output_dir, "train_log.jsonl"),
                   training_args.save_model_in_checkpoints and not sharded)
    trainer = Trainer(model=model, args=training_args, train_dataset=train if training_args.do_train else None,
                      eval_dataset=val if training_args.do_eval else None, callbacks=[log])
    if training_args.do_train:
        train_model(trainer, log, model, resume)
    if training_args.do_eval:
        evaluate(trainer, log)
    if training_args.do_train:
        save_trained_model(model, trainer, model_args, training_args, plan_tp, sharded)
    return 0


def _print_run(config, model_args, data_args, training_args, tp: int, data) -> None:
    """The model, data and parallel lines printed before training (and by a dry run)."""
    train, val, data_desc = data
    print(describe(config, data_args, training_args))
    print(f"data: {data_desc}; {len(train):,} train samples of {data_args.max_seq_len} tokens, "
          f"{len(val):,} validation samples")
    if tp > 1:
        how = " (sharded by paddle_vha.parallel)" if uses_plan_tensor_parallel(model_args, tp) else ""
        print(f"parallel: tensor_model_parallel_size={tp}{how}; launch with python -m paddle.distributed.launch "
              f"--nproc_per_node N tools/train.py ..., N a multiple of {tp}")


def check_device(training_args) -> None:
    """TrainError for a device this Paddle build cannot train on, or half precision on the CPU."""
    import paddle

    if training_args.device.startswith("gpu") and not paddle.is_compiled_with_cuda():
        raise TrainError(f"device={training_args.device}, but this Paddle build has no CUDA (docs/install.md, GPU); "
                         "pass --device cpu to train on the CPU")
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


def build_model(model_cls, config, model_args, training_args, plan_tp: bool):
    """The model to train: sharded by paddle_vha.parallel (plan_tp), loaded from model_name_or_path, or freshly
    initialised; cast to bf16 for AMP level O2."""
    if plan_tp:
        model = _build_plan_parallel_model(model_cls, config, model_args, training_args)
    elif model_args.model_name_or_path:
        model = model_cls.from_pretrained(model_args.model_name_or_path, config=config)
    else:
        model = model_cls(config)
    if training_args.bf16 and training_args.fp16_opt_level == "O2":
        model = model.to(dtype="bfloat16")
    return model


def _build_plan_parallel_model(model_cls, config, model_args, training_args):
    from paddle.distributed import fleet

    from ..parallel.apply import build_tensor_parallel_model

    if training_args.device == "cpu":
        # fleet's TensorParallel wrapper broadcasts each batch from mp rank 0, which asserts a GPU / XPU. Every
        # mp rank reads the same deterministic batches here, so fleet's own switch turns the broadcast off.
        fleet.fleet._user_defined_strategy.hybrid_configs["mp_configs"].need_broadcast_data = False
    group = fleet.get_hybrid_communicate_group().get_model_parallel_group()
    try:  # single-device layers (loaded from model_name_or_path, if given), sharded by the plan
        return build_tensor_parallel_model(model_cls, config, group, weights_from=model_args.model_name_or_path)
    except CheckpointError as e:
        raise TrainError(str(e)) from None


def train_model(trainer, log: TrainLog, model, resume) -> None:
    """trainer.train (from `resume`), failures with a known cause as one-line TrainErrors, then the final NaN check,
    the Trainer's state and the last loss line."""
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except Exception as e:  # noqa: BLE001 - reported in one line where the cause is known
        why = _training_failure(e, trainer.state.global_step, log.steps_run, resume)
        if why is None:
            raise  # not a resume problem: the whole traceback is the useful report
        raise TrainError(why) from e
    if log.nonfinite is None:
        bad = _nonfinite_parameter(model)  # after the last step, whether or not it was logged
        if bad is not None:
            log.nonfinite = (f"parameter {bad} holds NaN or Inf", trainer.state.global_step)
    if log.nonfinite is not None:
        what, step = log.nonfinite
        raise TrainError(f"training stopped: {what} at step {step}; nothing saved (lower learning_rate?)")
    trainer.save_state()
    if "loss" in log.last:
        step, loss = log.last["loss"]
        print(f"train: {result.global_step} steps; loss {loss:.4f} at step {step}")


def _training_failure(e: Exception, global_step: int, steps_run: int, resume):
    """The one line for an exception out of trainer.train whose cause is known, or None (re-raise it as it is)."""
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


def save_trained_model(model, trainer, model_args, training_args, plan_tp: bool, sharded: bool) -> None:
    """OUTPUT_DIR/model in the documented format: merged from paddle_vha.parallel's shards (plan_tp), gathered by
    the Trainer (other model parallelism), or saved and validated from rank 0."""
    dest = os.path.join(training_args.output_dir, "model")
    if plan_tp:
        _save_plan_parallel(model, training_args.output_dir, dest)
    elif sharded:  # stock models under fleet's model parallelism: the Trainer gathers (not run by this project)
        trainer.save_model(dest)
    elif training_args.should_save:
        save_pretrained_atomic(model, dest)
        model_family(model_args.model_type).validate(dest)  # the folder must meet its documented contract
    if training_args.should_save:
        print(f"saved the trained model to {dest}")


def _save_plan_parallel(model, output_dir: str, dest: str) -> None:
    """Every rank writes its slices; rank 0 merges them into the single-device format (validated) at `dest`."""
    import paddle.distributed as dist

    from ..checkpoint.tp_shards import merge_tp_checkpoint, save_tp_checkpoint

    shards = os.path.join(output_dir, "model-tp-shards")
    save_tp_checkpoint(model, shards)
    dist.barrier()
    if dist.get_rank() == 0:
        merge_tp_checkpoint(shards, dest, force=True)
    dist.barrier()
