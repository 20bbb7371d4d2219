"""Generate text from an exported decoder with onnxruntime or Paddle Inference, using its KV cache.

    python tools/generate.py EXPORT_DIR --prompt "def fib(n):" --max-new-tokens 64
    python tools/generate.py EXPORT_DIR --chat --prompt "Write a haiku about caches."
    python tools/generate.py EXPORT_DIR --runtime paddle --prompt-ids 1,2,3 --sample --temperature 0.8 --top-p 0.9

EXPORT_DIR is what tools/export_onnx.py wrote. Text prompts are encoded with the folder's tokenizer.json (the
checkpoint's, copied by the export), or as UTF-8 bytes when the vocabulary is 256 (the byte-level models this project
trains); outputs are decoded the same way, special tokens skipped (--show-special keeps them). Each row stops at an EOS
id of generation_config.json (`eos_token_id`, one id or a list), else of config.json; finished rows of a batch are
padded while the others go on (--ignore-eos generates --max-new-tokens regardless). --chat wraps each prompt as one user
message in the folder's chat template (chat_template.jinja, else tokenizer_config.json's) with the generation prompt,
and refuses a folder that has none.

Decoding is greedy unless --sample, whatever generation_config.json's do_sample says (a note says so when it asks for
sampling): the same command gives the same tokens. With --sample, --temperature / --top-k / --top-p default to
generation_config.json's values (Qwen3: 0.6 / 20 / 0.95), else 1.0 / 0 (off) / 1.0 (off).
"""
from __future__ import annotations

import argparse
import math
import sys


from paddle_vha.cli import command, fail, quiet
from paddle_vha.cli.options import ALWAYS, Effect, parse_checked


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export_dir")
    p.add_argument("--runtime", choices=["onnxruntime", "paddle"], default="onnxruntime")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", help="prompt text (repeat for a batch)")
    src.add_argument("--prompt-ids", action="append", help="comma-separated token ids (repeat for a batch)")
    p.add_argument("--chat", action="store_true", help="apply the folder's chat template to each --prompt")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="new tokens per row (default 64); prompt + these must fit the export's context "
                        "(export_info.json's context_length), else refused")
    p.add_argument("--show-special", action="store_true", help="decode special tokens too (EOS, <|im_end|>, ...)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, help="with --sample (default: generation_config.json's, else 1.0)")
    p.add_argument("--top-k", type=int, help="with --sample (default: generation_config.json's, else 0: off)")
    p.add_argument("--top-p", type=float, help="with --sample (default: generation_config.json's, else 1.0: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="runtime threads (0: the runtime's default)")
    return p


_SAMPLING = Effect("with --sample (the sampling settings only apply with --sample; greedy decoding ignores them)",
                   lambda a: a.sample)
TAKES_EFFECT = {
    "export_dir": ALWAYS, "--runtime": ALWAYS, "--prompt": ALWAYS, "--prompt-ids": ALWAYS, "--max-new-tokens": ALWAYS,
    "--show-special": ALWAYS, "--sample": ALWAYS, "--threads": ALWAYS,
    "--chat": Effect("with --prompt text (--chat takes --prompt text: the chat template makes the ids)",
                     lambda a: bool(a.prompt)),
    "--ignore-eos": Effect("always (--max-new-tokens per row; without an EOS id in the export that happens anyway)"),
    "--temperature": _SAMPLING, "--top-k": _SAMPLING, "--top-p": _SAMPLING,
    "--seed": Effect("with --sample (greedy decoding draws nothing)", lambda a: a.sample),
}


def _check_options(p, args) -> None:
    """Option ranges, refused through p.error (one line, exit 2) before anything is loaded."""
    import math
    import os

    if args.max_new_tokens < 1:
        p.error("--max-new-tokens must be >= 1")
    if args.temperature is not None and not math.isfinite(args.temperature):
        p.error(f"--temperature {args.temperature}: must be a finite number > 0")
    if not 0 <= args.seed < 2**32:
        p.error(f"--seed {args.seed}: must be in [0, 2**32)")
    limit = 4 * (os.cpu_count() or 1)
    if not 0 <= args.threads <= limit:
        p.error(f"--threads {args.threads}: must be between 0 (the runtime's default) and {limit} (4 x this "
                f"machine's {os.cpu_count()} CPUs)")


def _check_cache_memory(shape, max_new_tokens: int, info: dict) -> None:
    """Refuse, before the runtime allocates, a generation whose KV cache (every layer, the whole batch at prompt + new
    tokens; float32, or the export's int8 cache) would not fit the memory this machine has available."""
    from paddle_vha.export.kv_cache import cache_bytes_per_position
    from paddle_vha.machine import available_memory_bytes

    per_token = cache_bytes_per_position(info["kv_cache"]["format"], info["cache_shapes"])  # keys + values
    need = shape[0] * (shape[1] + max_new_tokens) * per_token
    have = available_memory_bytes()
    if have is not None and need > have:
        fail(f"batch {shape[0]} x ({shape[1]} prompt + {max_new_tokens} new) tokens need a {need / 2**30:.1f} GiB KV "
             f"cache; this machine has {have / 2**30:.1f} GiB available: lower --max-new-tokens or the batch")


def _sampling(args, gen: dict) -> dict:
    """generate()'s sampling arguments: the command line's, else generation_config.json's, else off. A value out of
    range is refused in one line naming where it came from (generation_config.json's were refused as if typed)."""
    if not args.sample and gen.get("do_sample"):
        print("note: greedy decoding; generation_config.json asks for sampling (pass --sample to follow it)",
              file=sys.stderr)
    out, source = dict(do_sample=args.sample, temperature=1.0, top_k=0, top_p=1.0), {}
    if args.sample:
        for key, given, default in (("temperature", args.temperature, 1.0), ("top_k", args.top_k, 0),
                                    ("top_p", args.top_p, 1.0)):
            if given is not None:
                out[key], source[key] = given, f"--{key.replace('_', '-')}"
            elif key in gen:
                out[key], source[key] = gen[key], f"generation_config.json's {key}"
            else:
                out[key], source[key] = default, "the default"
    ok = dict(temperature=lambda v: isinstance(v, (int, float)) and math.isfinite(v) and v > 0,
              top_p=lambda v: isinstance(v, (int, float)) and 0 < v <= 1,
              top_k=lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
    want = dict(temperature="a finite number > 0", top_p="in (0, 1]", top_k="an integer >= 0")
    for key in ("temperature", "top_k", "top_p"):
        if not ok[key](out[key]):
            fail(f"{key} {out[key]!r} (from {source.get(key, 'the default')}) must be {want[key]}"
                 + ("; pass --" + key.replace("_", "-") + " to override it" if "generation_config" in
                    source.get(key, "") else ""))
    return out


@command
def main(argv=None):
    args, _ = parse_checked(build_parser(), argv, TAKES_EFFECT, _check_options)
    from paddle_vha.serve.session import ServeError, read_export_info
    from paddle_vha.serve.text import generation_defaults, load_codec

    try:
        info = read_export_info(args.export_dir)
        codec = load_codec(args.export_dir, info["vocab_size"])
        gen = generation_defaults(args.export_dir)
        prompts = _prompts(args, info, codec)
    except ServeError as e:
        fail(str(e))
    sampling = _sampling(args, gen)
    quiet()
    from paddle_vha.serve.generate import generate

    batch, mask = _left_padded(prompts, args.max_new_tokens, info)
    _check_cache_memory(batch.shape, args.max_new_tokens, info)
    try:
        session = _session(args)
        res = generate(session, batch, args.max_new_tokens, seed=args.seed, attention_mask=mask,
                       eos_token_id=None if args.ignore_eos else gen["eos"], pad_token_id=gen["pad"], **sampling)
    except ServeError as e:
        fail(str(e))
    for i in range(batch.shape[0]):
        toks = res.row(i, keep_eos=args.show_special)
        if args.prompt and codec is not None:
            shown = codec.decode(toks, skip_special=not args.show_special)
            print(f"[{i}] {shown}" if args.chat else f"[{i}] {args.prompt[i]}{shown}")
        else:
            print(f"[{i}] {','.join(str(int(t)) for t in toks)}")
    stopped = f", {int(res.finished.sum())} of {batch.shape[0]} stopped at EOS" if gen["eos"] and not args.ignore_eos \
        else ""
    print(f"{args.runtime}: prefill {res.prefill_seconds * 1e3:.1f} ms, decode {res.tokens_per_second:.1f} tokens/s "
          f"(batch {batch.shape[0]}, {res.tokens.shape[1]} new tokens{stopped})", file=sys.stderr)
    return 0


def _prompts(args, info: dict, codec):
    """The prompts' token ids (chat-templated with --chat); one line and exit 2 for a bad prompt, ServeError for a
    folder that cannot encode it."""
    from paddle_vha.serve.text import render_chat

    if args.prompt:
        for i, t in enumerate(args.prompt):
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as e:  # argv bytes that are not UTF-8 arrive as lone surrogates
                fail(f"--prompt {i + 1}: not valid UTF-8 text (byte {e.start} of it); give text, or --prompt-ids")
        if codec is None:
            fail(f"vocab_size {info['vocab_size']} is not byte-level and {args.export_dir} has no tokenizer.json: "
                 "use --prompt-ids")
        texts = [render_chat(args.export_dir, [{"role": "user", "content": t}]) for t in args.prompt] \
            if args.chat else args.prompt
        prompts = [codec.encode(t) for t in texts]
    else:
        try:
            prompts = [[int(x) for x in s.split(",") if x.strip()] for s in args.prompt_ids]
        except ValueError:
            fail("--prompt-ids takes comma-separated integers")
    if any(not ids for ids in prompts):
        fail("empty prompt")
    if any(not 0 <= i < info["vocab_size"] for ids in prompts for i in ids):
        fail(f"prompt token id outside [0, {info['vocab_size']})")
    return prompts


def _left_padded(prompts, max_new_tokens: int, info: dict):
    """(ids (B, W), attention_mask (B, W)) of the prompts left-padded to the longest; refused (one line, exit 2) when
    the generation would pass the export's context (export_info.json's context_length: max_position_embeddings, or
    factor x it for dynamic NTK RoPE), the positions the model was trained and validated on."""
    import numpy as np

    width = max(len(x) for x in prompts)
    limit = info.get("context_length", info.get("max_position_embeddings"))
    if isinstance(limit, int) and not isinstance(limit, bool) and width + max_new_tokens > limit:
        room = f"at most --max-new-tokens {limit - width}" if width < limit else "a shorter prompt"
        fail(f"prompt ({width} tokens) + --max-new-tokens {max_new_tokens} pass the export's context of {limit} "
             f"positions (context_length in export_info.json); ask for {room}")
    batch = np.array([[0] * (width - len(x)) + x for x in prompts], np.int64)  # left padding
    mask = np.array([[0] * (width - len(x)) + [1] * len(x) for x in prompts], np.int64)
    return batch, mask


def _session(args):
    """The decoder session of --runtime over EXPORT_DIR (ServeError, one line, if it cannot be opened)."""
    if args.runtime == "onnxruntime":
        from paddle_vha.serve.ort_session import OrtDecoder

        return OrtDecoder.from_dir(args.export_dir, threads=args.threads)
    from paddle_vha.serve.paddle_inference import PaddleInferenceDecoder

    return PaddleInferenceDecoder(args.export_dir, threads=max(args.threads, 1))


if __name__ == "__main__":
    sys.exit(main())
