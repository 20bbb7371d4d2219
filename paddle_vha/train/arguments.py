"""The trainer config -> PaddleFormers' (model, data, training) arguments: what tools/train.py reads.

The config holds model, data and training arguments in one flat object, parsed by PaddleFormers'
PdArgumentParser as its own pretraining entry point does: `model_type` (a family of paddle_vha/families.py),
`model_config` (the model's config.json fields, inline or a path), the data arguments (`dataset`: stdlib | pretrain,
`input_dir`, `max_seq_len`, ...) and any PaddleFormers TrainingArguments (`output_dir`, `max_steps`, `learning_rate`,
`bf16`, `tensor_model_parallel_size`, `recompute_granularity`, `save_steps`, ...); the command line overrides it
(`--key value`). Names from PaddleNLP-era configs are renamed (LEGACY_KEYS); `sharding` / `split_param` get defaults
under which a data-parallel run trains in float32 (sharding_defaults). Guide: docs/training.md.

A config or argument that cannot be read is a one-line TrainError (paddle_vha/train/errors.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

from ..families import DEFAULT_MODEL_TYPE, FAMILIES
from .errors import TrainError
from .paddleformers_trainer import PdArgumentParser, TrainingArguments, llmmetaclass

__all__ = ["ModelArguments", "DataArguments", "VHATrainingArguments", "LEGACY_KEYS", "read_config", "parse",
           "print_help", "requested_parallelism", "sharding_defaults", "tensor_parallel_degree"]

# Names from PaddleNLP-era configs that PaddleFormers 1.0.0 spells differently.
LEGACY_KEYS = {
    "tensor_parallel_degree": "tensor_model_parallel_size",
    "pipeline_parallel_degree": "pipeline_model_parallel_size",
    "sharding_parallel_degree": "sharding_parallel_size",
    "sep_parallel_degree": "sep_parallel_size",
    "context_parallel_degree": "context_parallel_size",
    "expert_parallel_degree": "expert_model_parallel_size",
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
    teacher: Optional[str] = field(default=None, metadata={
        "help": "distil from this checkpoint folder (any registered family, same vocabulary; frozen, float32, "
                "replicated under tensor parallelism), or from a stored teacher (tools/store_teacher.py: its windows "
                "are the data, the student runs alone): the loss becomes the distill_* mix (docs/training.md, "
                "Distillation)"})
    distill_ce_weight: float = field(default=1.0, metadata={"help": "with teacher: weight of the cross-entropy"})
    distill_kl_weight: float = field(default=1.0, metadata={
        "help": "with teacher: weight of T^2 KL(teacher || student) of the logits at distill_temperature"})
    distill_temperature: float = field(default=1.0, metadata={"help": "with teacher: softmax temperature T > 0"})
    distill_hidden_weight: float = field(default=0.0, metadata={
        "help": "with teacher: weight of the decoder-layer output MSE (equal widths; equal depths or a teacher a "
                "multiple as deep)"})
    distill_attn_weight: float = field(default=0.0, metadata={
        "help": "with teacher: weight of the attention-block output MSE (each layer's o_proj output; the same width "
                "and layer map as distill_hidden_weight)"})
    distill_schedule: str = field(default="constant", metadata={
        "help": "with teacher: the KD weights over steps: constant, or linear (decaying to 0 at max_steps)"})
    train_only: str = field(default="all", metadata={
        "help": "which weights train: all, or attention (each layer's self-attention block: its projections and "
                "VHA maps; the rest frozen, no gradient computed for it)"})
    freeze_embeddings: bool = field(default=False, metadata={
        "help": "freeze the embedding table (and the LM head when it is tied to it)"})
    vocab_parallel: bool = field(default=True, metadata={
        "help": "tensor parallelism: split the embedding and LM head by vocabulary row, with the parallel "
                "cross-entropy (under PP x TP the first stage's embedding and the last stage's head; refused with "
                "a tied head under PP; docs/tensor_parallel.md); false keeps them whole on every rank"})


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
    config_args = read_config(argv[0])
    args = config_args + cmd
    if str(_last_value(args, "do_eval")).lower() in ("false", "0", "no") and _last_value(cmd, "evaluation_strategy") \
            is None:  # PaddleFormers turns evaluation back on for an evaluation_strategy other than no: do_eval false
        args += ["--evaluation_strategy", "no"]  # is honoured instead of ignored
    parsed = _common_parse(parser, sharding_defaults(args) + args, argv[0])
    model_args = parsed[0]
    if parsed[2].do_eval and str(_last_value(args, "do_eval")).lower() in ("false", "0", "no"):
        raise TrainError(f"do_eval false has no effect in this run: evaluation_strategy "
                         f"{_last_value(args, 'evaluation_strategy')} turns evaluation on (PaddleFormers); drop one")
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
    requested = requested_parallelism(args)
    _check_effects(parser, parsed, requested, config_args, cmd, argv[0])
    return (*parsed, requested)


def _common_parse(parser, args: list, source: str):
    """PdArgumentParser's parse of `args`, its errors as one-line TrainErrors."""
    try:
        return parser.common_parse(args, return_remaining_strings=False)
    except ValueError as e:
        msg = str(e)
        if "not used by the PdArgumentParser" in msg:
            import ast

            try:
                rest = ast.literal_eval(msg.split(":", 1)[1].strip())
                unknown = ", ".join(a[2:] for a in rest if a.startswith("--")) or str(rest)
            except (ValueError, SyntaxError):
                unknown = msg.split(":", 1)[1].strip()
            raise TrainError(f"{source}: unknown argument(s): {unknown} (not a model, data or PaddleFormers "
                             "training argument)")
        raise TrainError(f"{source}: {msg.splitlines()[0] if msg else type(e).__name__}")
    except (AssertionError, TypeError, NotImplementedError) as e:
        raise TrainError(f"{source}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def _check_effects(parser, parsed, requested: dict, config_args: list, cmd: list, source: str) -> None:
    """Every given argument takes effect in this run, and the parallel degrees fit the processes
    (paddle_vha/train/option_effects.py); TrainError (one line) otherwise."""
    from .option_effects import RunView, check_degrees, check_effects, check_numbers, given_keys

    def view(p, degrees):
        return RunView(p[0], p[1], p[2], degrees, processes=max(1, int(getattr(p[2], "world_size", 1) or 1)))

    run = view(parsed, requested)
    from_config, from_command = given_keys(config_args), given_keys(cmd)
    check_numbers(run, {**from_config, **from_command})
    check_degrees(run, bool(parsed[2].dry_run))
    config_run = None
    if any(k not in from_command for k in from_config):
        try:  # the config on its own: which of its parts it switches on (module docstring of option_effects)
            import contextlib
            import io

            with contextlib.redirect_stderr(io.StringIO()):
                alone = _common_parse(parser, sharding_defaults(config_args) + config_args, source)
            config_run = view(alone, requested_parallelism(config_args))
        except TrainError:
            config_run = None
    check_effects(run, from_config, from_command, source, config_run)


def _last_value(args: list, key: str):
    values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == f"--{key}"]
    return values[-1] if values else None


def sharding_defaults(args: list) -> list:
    """Defaults that make a multi-rank run without tensor parallelism train as written (PaddleFormers 1.0.0 defaults
    `sharding` to stage1 with `split_param`, which refuses to run without `amp_master_grad`):

    * no `sharding` given: plain data parallelism (`sharding ""`), or stage1 when a sharding degree > 1 is asked for;
    * no `split_param` given and no `amp_master_grad`: stage1 v1 (`split_param false`), which runs in float32.
    Returned as arguments to put before the user's (which they never override)."""
    out = []
    if _last_value(args, "sharding") is None:
        degree = _last_value(args, "sharding_parallel_size") or _last_value(args, "sharding_degree") or "-1"
        try:
            out += ["--sharding", "stage1" if int(degree) > 1 else ""]
        except ValueError:
            pass  # PdArgumentParser refuses the degree in one line
    if _last_value(args, "split_param") is None and str(_last_value(args, "amp_master_grad")).lower() not in (
            "true", "1", "yes"):
        out += ["--split_param", "false"]
    return out


def requested_parallelism(args: list) -> dict:
    """Parallel degrees as the user wrote them. TrainingArguments resets them to 1 / -1 in a single process, which
    would hide that a config asks for tensor parallelism the model may not support."""
    out = {}
    from .option_effects import DEGREES

    for key in DEGREES:
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
