"""Train a registered model family (Qwen3-VHA, Qwen3-MEA, stock Qwen3) with PaddleFormers' Trainer from one JSON config.

    bash tools/env.sh python tools/train.py configs/tiny-vha.json                  # ~20 s on 2 CPU cores
    bash tools/env.sh python tools/train.py configs/tiny-vha.json --max_steps 200  # command line overrides JSON
    bash tools/env.sh python tools/train.py configs/vha-1.7b.json --dry_run true   # check a config, print sizes
    python -m paddle.distributed.launch --nproc_per_node 2 tools/train.py configs/tiny-vha-tp2.json   # tensor parallel
    bash tools/env.sh python tools/train.py CONFIG.json --teacher ORIGINAL --distill_temperature 2  # distillation

The config holds model, data and training arguments in one flat object, parsed by PaddleFormers'
PdArgumentParser as its own pretraining entry point does: `model_type` (qwen3_vha, qwen3,
qwen3_mea), `model_config` (the model's config.json fields, inline or a path), the data
arguments (`dataset`: stdlib | pretrain, `input_dir`, `max_seq_len`, ...) and any PaddleFormers
TrainingArguments (`output_dir`, `max_steps`, `learning_rate`, `bf16`, `tensor_model_parallel_size`,
`recompute_granularity`, `save_steps`, ...). Re-running with the same output_dir resumes from its last
checkpoint-N. The trained model is written to OUTPUT_DIR/model (and each checkpoint-N/model) in the
documented checkpoint format (docs/checkpoint.md), which tools/fold.py reads, with the starting checkpoint's
tokenizer files, generation config and chat template; `--teacher PATH` distils from a frozen checkpoint of any
family (CE + T^2 KL + hidden-state MSE, docs/training.md "Distillation"; the teacher's float32 weights count in the
memory need); a bfloat16 checkpoint is trained in float32 on the CPU and saved
back in bfloat16. Data whose ids do not fit the model, or byte data for a model with a tokenizer, is refused: tokenize
with tools/make_pretrain_data.py --tokenizer CHECKPOINT. Guide: docs/training.md.
Installed as `paddle-vha-train`.
"""
from __future__ import annotations

import os
import sys

from . import command, fail, quiet


@command
def main(argv=None) -> int:
    quiet()
    from ..train.arguments import parse, print_help
    from ..train.errors import TrainError
    from ..train.trainer import run

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print_help(usage=__doc__)
        sys.exit(0)
    try:
        return run(*parse(argv, usage=__doc__))
    except TrainError as e:  # the library's one-line refusals: error: ..., exit status 2
        fail(str(e))


def entry() -> None:
    """Console-script entry point (also what tools/train.py runs)."""
    code = main()
    if int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1:
        # Under the launcher, skip interpreter teardown: Paddle's process-group destructors occasionally abort at exit
        # after all work is done, which the launcher would report as a failure (seen by tests/tp/tp_worker.py).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
