"""Merge a tensor-parallel sharded save into one Qwen3-VHA or Qwen3-MEA checkpoint (what from_pretrained and fold.py read).

    bash tools/env.sh python tools/merge_tp_checkpoint.py SHARDS_DIR OUT_DIR [--force] [--max-shard-size 5GB]

SHARDS_DIR is what paddle_vha.parallel.save_tp_checkpoint wrote (tp_plan.json, config.json,
tp-rank-KK-of-TT.safetensors). Split tensors are concatenated in rank order along their split axis; whole
tensors come from rank 0. The result is validated against its checkpoint contract (docs/checkpoint.md, docs/mea.md)
before it replaces OUT_DIR; the save's other files (tokenizer, generation config, chat template) are copied. Memory:
one global tensor at a time, 3 x the largest tensor's bytes + ~200 MB (refused up front when MemAvailable is
lower). Then, for Qwen3-VHA:  python tools/fold.py OUT_DIR FOLDED_DIR.  See docs/tensor_parallel.md.
"""
from __future__ import annotations

import argparse
import sys
import time


from paddle_vha.cli import command, fail, quiet
from paddle_vha.cli.options import ALWAYS, PERMISSION, parse_checked


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shards_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    ap.add_argument("--max-shard-size", default="5GB", help="split the output into safetensors shards of this size")
    return ap


TAKES_EFFECT = {"shards_dir": ALWAYS, "out_dir": ALWAYS, "--force": PERMISSION, "--max-shard-size": ALWAYS}


@command
def main(argv=None) -> int:
    args, _ = parse_checked(build_parser(), argv, TAKES_EFFECT)
    quiet()
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.parallel.tp_shards import merge_need, merge_tp_checkpoint
    from paddle_vha.transform.memory import refuse_if_short

    t0 = time.perf_counter()
    try:
        refuse_if_short(merge_need(args.shards_dir), "3 x the largest tensor + 200 MB", CheckpointError, "merge",
                        hint="free memory")
        info = merge_tp_checkpoint(args.shards_dir, args.out_dir, force=args.force, max_shard_size=args.max_shard_size)
    except (CheckpointError, ValueError) as e:
        fail(str(e))
    print(f"merged {info['tensors']} tensors from {info['tensor_parallel_size']} tensor-parallel ranks "
          f"({info['bytes'] / 1e6:.2f} MB, {info['files']} file(s)) into {args.out_dir} "
          f"in {time.perf_counter() - t0:.2f} s; checkpoint contract: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
