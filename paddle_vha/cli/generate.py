"""Generate text from an exported decoder with onnxruntime or Paddle Inference, using its KV cache.

    python tools/generate.py EXPORT_DIR --prompt "def fib(n):" --max-new-tokens 64
    python tools/generate.py EXPORT_DIR --runtime paddle --prompt-ids 1,2,3 --sample --temperature 0.8 --top-p 0.9

EXPORT_DIR is what tools/export_onnx.py wrote. Text prompts are encoded as UTF-8 bytes when the model's
vocabulary is 256 (the byte-level models this project trains); other vocabularies need a tokenizer.json in
EXPORT_DIR (copied from the checkpoint) or --prompt-ids.
"""
from __future__ import annotations

import argparse
import os
import sys


from paddle_vha.cli import command, fail, quiet


def load_codec(export_dir, vocab_size):
    """(encode, decode) for text prompts: bytes for vocab 256, else the folder's tokenizer.json."""
    from paddle_vha.train.corpus import decode, encode

    if vocab_size == 256:
        return (lambda text: encode(text).tolist()), decode
    path = os.path.join(export_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None, None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    return (lambda text: tok.encode(text).ids), (lambda ids: tok.decode([int(i) for i in ids]))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export_dir")
    p.add_argument("--runtime", choices=["onnxruntime", "paddle"], default="onnxruntime")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", help="prompt text (repeat for a batch)")
    src.add_argument("--prompt-ids", action="append", help="comma-separated token ids (repeat for a batch)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="runtime threads (0: the runtime's default)")
    return p


@command
def main(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    if args.max_new_tokens < 1:
        p.error("--max-new-tokens must be >= 1")
    if not (args.temperature > 0 and 0 < args.top_p <= 1 and args.top_k >= 0):
        p.error("need --temperature > 0, 0 < --top-p <= 1, --top-k >= 0")
    from paddle_vha.serve.session import ServeError, read_export_info

    try:
        info = read_export_info(args.export_dir)
    except ServeError as e:
        fail(str(e))
    quiet()
    from paddle_vha.serve.generate import generate

    prompts, decode = _prompts(args, info)
    batch, mask = _left_padded(prompts, args.max_new_tokens, info)
    try:
        session = _session(args)
        res = generate(session, batch, args.max_new_tokens, do_sample=args.sample, temperature=args.temperature,
                       top_k=args.top_k, top_p=args.top_p, seed=args.seed, attention_mask=mask)
    except ServeError as e:
        fail(str(e))
    for i, toks in enumerate(res.tokens):
        shown = decode(toks) if decode and args.prompt else ",".join(str(int(t)) for t in toks)
        prefix = args.prompt[i] if args.prompt else ""
        print(f"[{i}] {prefix}{shown}" if args.prompt else f"[{i}] {shown}")
    print(f"{args.runtime}: prefill {res.prefill_seconds * 1e3:.1f} ms, decode {res.tokens_per_second:.1f} tokens/s "
          f"(batch {batch.shape[0]}, {res.tokens.shape[1]} new tokens)", file=sys.stderr)
    return 0


def _prompts(args, info: dict):
    """(the prompts' token ids, the decoder of generated ids or None); one line and exit 2 for a bad prompt."""
    encode, decode = load_codec(args.export_dir, info["vocab_size"])
    if args.prompt:
        if encode is None:
            fail(f"vocab_size {info['vocab_size']} is not byte-level and {args.export_dir} has no tokenizer.json: "
                 "use --prompt-ids")
        prompts = [encode(t) for t in args.prompt]
    else:
        try:
            prompts = [[int(x) for x in s.split(",") if x.strip()] for s in args.prompt_ids]
        except ValueError:
            fail("--prompt-ids takes comma-separated integers")
    if any(not ids for ids in prompts):
        fail("empty prompt")
    if any(not 0 <= i < info["vocab_size"] for ids in prompts for i in ids):
        fail(f"prompt token id outside [0, {info['vocab_size']})")
    return prompts, decode


def _left_padded(prompts, max_new_tokens: int, info: dict):
    """(ids (B, W), attention_mask (B, W)) of the prompts left-padded to the longest; warns (stderr) when the
    generation would pass the model's max_position_embeddings."""
    import numpy as np

    width = max(len(x) for x in prompts)
    limit = info.get("max_position_embeddings")
    if isinstance(limit, int) and width + max_new_tokens > limit:
        print(f"warning: prompt ({width} tokens) + {max_new_tokens} new tokens pass max_position_embeddings="
              f"{limit}; the model was not trained on positions beyond it", file=sys.stderr)
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
