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
paddle_vha/transform/fleet_reference.py) and the imported model (Paddle float32) on random tokens and compares logits.
It catches what the import itself gets wrong (a transpose, a split, a name mapped to the wrong tensor, Premix / Postmix
order, a dropped tensor); it cannot catch a wrong --qkv-layout / --up-gate-order, because the reference reads the
fused tensors under the same statement. Upstream's config.json records neither, so a fused qkv_proj (with more than
one KV group) or up_gate_proj is refused unless the flag is given: take it from the code that wrote the checkpoint.
Memory: one tensor at a time (a fused one read whole: ~6 x the largest input tensor's elements x 8 B) + ~0.6 GB;
--verify adds the float64 reference's largest tensor and the imported model's layer-by-layer forward. Printed first,
refused up front in one line when /proc/meminfo's MemAvailable is lower.
A MoE-VHA checkpoint (n_routed_experts / num_experts in config.json: routed experts, per-expert or grouped-GEMM
up_gate_proj, a shared expert) imports into Qwen3-MoE-VHA; its --verify compares upstream's forward with the imported
checkpoint through this project's float64 numpy forward (there is no Paddle Qwen3-MoE model here).
Exit status: 0 done, 2 refused (one line on stderr says why), 1 --verify above tolerance.
"""
from __future__ import annotations

import sys

from paddle_vha.cli import (add_converter_options, add_verify_options, command, converter_effects, converter_parser,
                            parse_converter_args, run_transform, verify_step)
from paddle_vha.cli.options import ALWAYS, Effect
from paddle_vha.vha.fleet_config import QKV_LAYOUTS, UP_GATE_ORDERS


def build_parser():
    p = converter_parser(__doc__, "upstream VHA", "Qwen3-VHA")
    p.add_argument("--layout", default="paddle", choices=["paddle", "hf"],
                   help="Linear weights stored [in, out] (paddle, upstream's; default) or [out, in] (hf)")
    p.add_argument("--qkv-layout", default=None, choices=QKV_LAYOUTS,
                   help="a fused qkv_proj: per KV group [query heads | K | V] (grouped) or [all Q | all K | all V] "
                        "(concat); required for one (upstream's config.json does not record it), unless one KV group")
    p.add_argument("--up-gate-order", default=None, choices=UP_GATE_ORDERS,
                   help="a fused up_gate_proj: gate then up, or up then gate; required for one")
    add_converter_options(p, dtype_help="output dtype; auto = each tensor's input dtype (default)")
    add_verify_options(p, 2, 16, 1e-4, "after importing, compare upstream's forward on IN_DIR with the imported model "
                                       "on N random sequences (default 2)",
                       "max relative logit difference --verify accepts (default 1e-4; the model runs in float32)")
    return p


# --qkv-layout / --up-gate-order: what IN_DIR holds decides; the plan refuses them for a checkpoint without the fused
# tensor (paddle_vha/transform/import_fleet.py), with these words
FUSED_QKV = Effect("when IN_DIR holds a fused qkv_proj")
FUSED_UP_GATE = Effect("when IN_DIR holds a fused up_gate_proj")
TAKES_EFFECT = converter_effects(verify=True, **{"--layout": ALWAYS, "--qkv-layout": FUSED_QKV,
                                                 "--up-gate-order": FUSED_UP_GATE})


def parse_args(argv=None):
    return parse_converter_args(build_parser(), argv, TAKES_EFFECT)


def _plan(args):
    from paddle_vha.transform.import_fleet import plan_import

    return plan_import(args.in_dir, args.out_dir, layout=args.layout, qkv_layout=args.qkv_layout,
                       up_gate_order=args.up_gate_order, dtype=args.dtype, force=args.force,
                       max_shard_size=args.max_shard_size)


def _write(args, plan):
    from paddle_vha.transform.import_fleet import import_checkpoint

    import_checkpoint(plan, progress=not args.no_progress)


def _memory(args, plan):
    """(bytes, formula): the float64 math of the largest input tensor an output is computed from (a fused one is read
    whole; copies stream in row blocks), and --verify's float64 reference forward (one input tensor at a time, as
    float64 plus one product) and the imported model's layer-by-layer forward."""
    import math

    from paddle_vha.transform import memory as mem

    c = plan.cfg
    # a grouped-GEMM expert weight [E, in, out] is read one expert's block at a time
    computed = [math.prod(plan.inputs[s].shape[1 if e.how == "expert" else 0:]) for e in plan.entries
                if e.how != "copy" for s in e.sources]
    parts = {"base": mem.BASE, "tensor math": mem.tensor_bytes(max(computed or [0]))}
    if args.verify:
        tokens = args.verify * args.verify_len
        largest = max(math.prod(r.shape) for r in plan.inputs.values())
        parts[f"verify forwards of {tokens} tokens"] = mem.forward_bytes(c, tokens, args.verify_len) + \
            2 * 8 * largest
        parts["verify logits"] = mem.verify_logits_bytes(c, tokens)
    return mem.total(parts)


def _done(args, plan, seconds: float, written) -> int:
    from paddle_vha.transform.import_fleet import verify_import

    print(f"wrote {plan.out_dir}: {plan.bytes_out / 1e6:.3f} MB in {seconds:.2f} s")
    return verify_step(args, lambda: verify_import(plan, num_sequences=args.verify, seq_len=args.verify_len),
                       args.verify_tol, f"{args.verify} x {args.verify_len} random tokens, upstream forward on "
                       f"IN_DIR (float64) vs {plan.verify_how}" + _assumed(plan),
                       sides=("upstream's", "the imported model's"))


def _assumed(plan) -> str:
    """What --verify cannot check: the fused layouts it reads the input under (empty when nothing is fused)."""
    said = []
    if any("qkv_proj" in n for n in plan.inputs):
        said.append(f"--qkv-layout {plan.qkv_layout}")
    if any("up_gate_proj" in n for n in plan.inputs):
        said.append(f"--up-gate-order {plan.up_gate_order}")
    return f"; both read the fused tensors as {' and '.join(said)}, which it cannot check" if said else ""


@command
def main(argv=None) -> int:
    return run_transform(parse_args(argv), _plan, _write, "checkpoint", _done, _memory)


if __name__ == "__main__":
    sys.exit(main())
