"""Import a VHA checkpoint written by upstream PaddleFleet (or its research fork) into this project's Qwen3-VHA format.

Reads IN_DIR's config.json in upstream's names (use_vha_attention, vha_q_lora_rank, vha_postmix_rank, vha_shared_kv,
gated_attention, sliding_window, window_attn_skip_freq, swa_*; or the fork's attn_type "vha") and its safetensors
in upstream's names and Paddle's [in, out] layout (fused qkv_proj / up_gate_proj are split), and writes OUT_DIR:
a Qwen3-VHA checkpoint that Qwen3VHAForCausalLM, tools/train.py, tools/fold.py and the TP plan take as it is.
IN_DIR is never modified; OUT_DIR appears only when complete.

    bash tools/env.sh python tools/import_fleet.py FLEET_CKPT runs/imported --dry-run     # check + plan, no writes
    bash tools/env.sh python tools/import_fleet.py FLEET_CKPT runs/imported --verify      # import, then compare
    bash tools/env.sh python tools/import_fleet.py FORK_CKPT OUT --qkv-layout concat --up-gate-order up-gate

--verify runs upstream's forward pass (float64 numpy on IN_DIR's own tensors, upstream's einsum and layouts,
paddle_vha/vha/fleet_reference.py) and the imported model (Paddle float32) on random tokens and compares logits.
Exit status: 0 done, 2 refused (one line on stderr says why), 1 --verify above tolerance.
"""
from __future__ import annotations

import argparse
import sys
import time

from paddle_vha.cli import add_converter_options, command, fail, quiet, report_verify
from paddle_vha.vha.fleet_config import QKV_LAYOUTS, UP_GATE_ORDERS



def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("in_dir", metavar="IN_DIR", help="upstream VHA checkpoint folder (config.json + safetensors)")
    p.add_argument("out_dir", metavar="OUT_DIR", help="where the Qwen3-VHA checkpoint goes (must not exist)")
    p.add_argument("--layout", default="paddle", choices=["paddle", "hf"],
                   help="Linear weights stored [in, out] (paddle, upstream's; default) or [out, in] (hf)")
    p.add_argument("--qkv-layout", default="grouped", choices=QKV_LAYOUTS,
                   help="a fused qkv_proj: per KV group [query heads | K | V] (grouped, default) or [all Q | all K | "
                        "all V] (concat)")
    p.add_argument("--up-gate-order", default="gate-up", choices=UP_GATE_ORDERS,
                   help="a fused up_gate_proj: gate then up (default) or up then gate")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float64", "bfloat16", "float16"],
                   help="output dtype; auto = each tensor's input dtype (default)")
    add_converter_options(p)
    p.add_argument("--verify", type=int, nargs="?", const=2, default=None, metavar="N",
                   help="after importing, compare upstream's forward on IN_DIR with the imported model on N random "
                        "sequences (default 2)")
    p.add_argument("--verify-len", type=int, default=16, help="tokens per --verify sequence (default 16)")
    p.add_argument("--verify-tol", type=float, default=1e-4,
                   help="max relative logit difference --verify accepts (default 1e-4; the model runs in float32)")
    args = p.parse_args(argv)
    if args.verify is not None and args.verify < 1:
        p.error("--verify N must be >= 1")
    if args.verify_len < 1:
        p.error("--verify-len must be >= 1")
    return args


@command
def main(argv=None) -> int:
    args = parse_args(argv)
    quiet()
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.vha.fleet_import import format_plan, import_checkpoint, plan_import, verify_import

    try:
        plan = plan_import(args.in_dir, args.out_dir, layout=args.layout, qkv_layout=args.qkv_layout,
                           up_gate_order=args.up_gate_order, dtype=args.dtype, force=args.force,
                           max_shard_size=args.max_shard_size)
    except CheckpointError as e:
        fail(str(e))
    print(format_plan(plan))
    if args.dry_run:
        print("dry run: nothing written")
        return 0
    t0 = time.perf_counter()
    try:
        import_checkpoint(plan, progress=not args.no_progress)
    except CheckpointError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{args.out_dir}: could not write the checkpoint ({e.strerror or e})")
    print(f"wrote {plan.out_dir}: {plan.bytes_out / 1e6:.3f} MB in {time.perf_counter() - t0:.2f} s")
    if args.verify is None:
        return 0
    r = verify_import(plan, args.qkv_layout, args.up_gate_order, num_sequences=args.verify, seq_len=args.verify_len)
    return report_verify(r, args.verify_tol, f"{args.verify} x {args.verify_len} random tokens, upstream forward on "
                         "IN_DIR (float64) vs the imported Qwen3-VHA (Paddle float32)",
                         sides=("upstream's", "the imported model's"))


if __name__ == "__main__":
    sys.exit(main())
