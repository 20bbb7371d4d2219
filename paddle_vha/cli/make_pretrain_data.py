"""Write text as PaddleFormers pretraining data (PREFIX.bin + PREFIX.idx) for tools/train.py (dataset=pretrain).

Inputs are .txt files (one document per file), .jsonl files (one document per line, its "text" field, or
--field), or the word `stdlib` (the embedded Python standard-library corpus, training split). Tokens come from a
tokenizer folder or name PaddleFormers' AutoTokenizer loads (e.g. a local Qwen3 checkpoint; an EOS token is
appended to every document), or --bytes for byte-level tokens (vocab 256; the tiny configs' tokenizer).

    python tools/make_pretrain_data.py stdlib --bytes --out data/stdlib/stdlib
    python tools/make_pretrain_data.py corpus/*.jsonl --tokenizer /models/Qwen3-1.7B --out data/fineweb_edu_qwen3
"""
from __future__ import annotations

import argparse
import json
import os
import sys


from paddle_vha.cli import command, fail, quiet


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("inputs", nargs="+", metavar="INPUT", help=".txt / .jsonl files, or 'stdlib'")
    p.add_argument("--out", required=True, metavar="PREFIX", help="output prefix: writes PREFIX.bin and PREFIX.idx")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokenizer", metavar="NAME_OR_PATH", help="tokenizer PaddleFormers' AutoTokenizer loads")
    g.add_argument("--bytes", action="store_true", help="byte-level tokens (vocab 256), no tokenizer")
    p.add_argument("--field", default="text", help="the text field of .jsonl lines (default: text)")
    p.add_argument("--corpus-mb", type=float, default=8.0, help="stdlib: MB of source to read (default 8)")
    p.add_argument("--force", action="store_true", help="overwrite an existing PREFIX.bin / PREFIX.idx")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    for path in args.inputs:
        if path != "stdlib" and not os.path.isfile(path):
            p.error(f"{path}: no such file")
        if path != "stdlib" and not path.endswith((".txt", ".jsonl")):
            p.error(f"{path}: expected a .txt or .jsonl file (or 'stdlib')")
    if not args.force and any(os.path.exists(args.out + ext) for ext in (".bin", ".idx")):
        p.error(f"{args.out}.bin / .idx exist; pass --force to overwrite")
    if args.corpus_mb <= 0:
        p.error("--corpus-mb must be > 0")
    return args


def documents(args):
    """Yield (source, text or token array) for every document."""
    for path in args.inputs:
        if path == "stdlib":
            from paddle_vha.train.corpus import load_stdlib_corpus
            from paddle_vha.train.datasets import stdlib_documents

            corpus = load_stdlib_corpus(max_bytes=int(args.corpus_mb * (1 << 20)))
            for doc in stdlib_documents(corpus.train):
                yield path, bytes(doc[doc != 0].astype("uint8")).decode("utf-8", errors="replace")
        elif path.endswith(".txt"):
            with open(path, encoding="utf-8", errors="replace") as f:
                yield path, f.read()
        else:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                        text = rec[args.field]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        fail(f"{path}:{n}: not a JSON object with a {args.field!r} string field")
                    if not isinstance(text, str):
                        fail(f"{path}:{n}: field {args.field!r} is not a string")
                    yield path, text


@command
def main(argv=None):
    args = parse_args(argv)
    quiet()
    import numpy as np
    from tqdm import tqdm

    from paddle_vha.train.corpus import encode
    from paddle_vha.train.datasets import write_pretrain_data

    if args.bytes:
        vocab = 256
        tokenize = lambda text: np.append(encode(text), 0)  # noqa: E731  (NUL ends a document, as in the corpus)
    else:
        from paddleformers.transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(args.tokenizer)
        except Exception as e:  # PaddleFormers raises several types for a missing / unreadable tokenizer
            fail(f"--tokenizer {args.tokenizer}: cannot load ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
        vocab = len(tok)
        eos = tok.eos_token_id

        def tokenize(text):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            return np.asarray(ids + ([eos] if eos is not None else []), dtype=np.int64)

    bar = tqdm(desc="documents", unit=" docs", disable=args.no_progress, file=sys.stderr)

    def stream():
        for _, text in documents(args):
            bar.update(1)
            yield tokenize(text)

    import contextlib
    import io

    tmp = f"{args.out}.tmp-{os.getpid()}"  # written aside, renamed into place only when complete
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the builder prints its own statistics
            stats = write_pretrain_data(tmp, stream(), vocab_size=vocab)
        bar.close()
        if stats["documents"] == 0:
            fail("no documents found in the inputs")
        for ext in (".bin", ".idx"):
            os.replace(tmp + ext, args.out + ext)
    finally:
        for ext in (".bin", ".idx"):
            if os.path.exists(tmp + ext):
                os.remove(tmp + ext)
    print(f"wrote {args.out}.bin / .idx: {stats['documents']:,} documents, {stats['tokens']:,} tokens "
          f"(vocab {vocab:,}); train with dataset=pretrain, input_dir={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
