"""Write text as PaddleFormers pretraining data (PREFIX.bin + PREFIX.idx) for tools/train.py (dataset=pretrain).

Inputs are .txt files (one document per file), .jsonl files (one document per line, its "text" field, or
--field), or the word `stdlib` (the embedded Python standard-library corpus, training split). Tokens come from a
tokenizer folder or name PaddleFormers' AutoTokenizer loads (e.g. a local Qwen3 checkpoint; an EOS token is
appended to every document), or --bytes for byte-level tokens (vocab 256; the tiny configs' tokenizer): a document's
UTF-8 bytes exactly, a NUL after each.

Every input is read and checked first (UTF-8 text, JSON lines with a string field), before the tokenizer loads and
before anything is created: a file that is not UTF-8 is refused in one line naming the byte, never altered. The two
files are written in a temporary folder beside PREFIX and renamed into place when complete (PREFIX's folder is
created then, if missing). PREFIX names files, not a folder (data/corpus writes data/corpus.bin and .idx).

    python tools/make_pretrain_data.py stdlib --bytes --out data/stdlib/stdlib
    python tools/make_pretrain_data.py corpus/*.jsonl --tokenizer /models/Qwen3-1.7B --out data/fineweb_edu_qwen3
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys


from paddle_vha.cli import command, fail, quiet
from paddle_vha.cli.options import ALWAYS, Effect, parse_checked


def build_parser() -> argparse.ArgumentParser:
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
    return p


TAKES_EFFECT = {
    "INPUT": ALWAYS, "--out": ALWAYS, "--tokenizer": ALWAYS, "--bytes": ALWAYS, "--no-progress": ALWAYS,
    "--force": Effect("always (a permission: overwrites PREFIX.bin / .idx when they exist)"),
    "--field": Effect("with a .jsonl input", lambda a: any(i.endswith(".jsonl") for i in a.inputs)),
    "--corpus-mb": Effect("with the stdlib input", lambda a: "stdlib" in a.inputs),
}


def _check_ranges(p, args) -> None:
    for path in args.inputs:
        if path != "stdlib" and not os.path.isfile(path):
            p.error(f"{path}: no such file")
        if path != "stdlib" and not path.endswith((".txt", ".jsonl")):
            p.error(f"{path}: expected a .txt or .jsonl file (or 'stdlib')")
    name = os.path.basename(args.out)
    if args.out.endswith(("/", os.sep)) or os.path.isdir(args.out) or name in ("", ".", ".."):
        p.error(f"--out {args.out}: names a folder; give a file prefix inside it, e.g. "
                f"{os.path.join(args.out.rstrip('/') or '.', 'corpus')} (writes corpus.bin and corpus.idx there)")
    if not args.force and any(os.path.exists(args.out + ext) for ext in (".bin", ".idx")):
        p.error(f"{args.out}.bin / .idx exist; pass --force to overwrite")
    if not (math.isfinite(args.corpus_mb) and args.corpus_mb > 0):  # NaN passed "<= 0", then int(nan) raised
        p.error(f"--corpus-mb {args.corpus_mb}: must be a finite number > 0")


def parse_args(argv=None):
    args, _ = parse_checked(build_parser(), argv, TAKES_EFFECT, _check_ranges)
    return args


def _utf8(data: bytes, where: str) -> str:
    """`data` as text; one line naming the first byte that is not UTF-8 (replacing it would alter the data)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{where}: not valid UTF-8 at byte {e.start} (0x{data[e.start]:02x}); convert it to UTF-8 first "
             "(the data would be altered otherwise)")


def _jsonl_texts(path: str, field: str):
    """(line number, text) of a .jsonl file's documents; one line for the first line that is not UTF-8, not a JSON
    object with a string `field`, or whose string is not text (a lone surrogate escape)."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            line = _utf8(raw, f"{path}:{n}")
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                text = rec[field]
            except (json.JSONDecodeError, KeyError, TypeError):
                fail(f"{path}:{n}: not a JSON object with a {field!r} string field")
            if not isinstance(text, str):
                fail(f"{path}:{n}: field {field!r} is not a string")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                fail(f"{path}:{n}: field {field!r} holds a lone surrogate (\\u{ord(text[e.start]):04x}), not text")
            yield n, text


def check_inputs(args) -> int:
    """Every .txt / .jsonl input read and checked before anything is loaded or created; returns the documents."""
    count = 0
    for path in args.inputs:
        if path.endswith(".txt"):
            with open(path, "rb") as f:
                _utf8(f.read(), path)
            count += 1
        elif path.endswith(".jsonl"):
            count += sum(1 for _ in _jsonl_texts(path, args.field))
    return count


def documents(args, as_bytes: bool, skipped: list):
    """Yield every document: UTF-8 bytes (as_bytes) or text. stdlib files that are not UTF-8 are skipped for a
    tokenizer (counted in `skipped`); as bytes they are taken as they are."""
    for path in args.inputs:
        if path == "stdlib":
            from paddle_vha.train.corpus import load_stdlib_corpus
            from paddle_vha.train.datasets import stdlib_documents

            corpus = load_stdlib_corpus(max_bytes=int(args.corpus_mb * (1 << 20)))
            for doc in stdlib_documents(corpus.train):
                data = bytes(doc[doc != 0].astype("uint8"))
                if as_bytes:
                    yield data
                    continue
                try:
                    yield data.decode("utf-8")
                except UnicodeDecodeError:
                    skipped.append(1)
        elif path.endswith(".txt"):
            with open(path, "rb") as f:
                data = f.read()
            yield data if as_bytes else data.decode("utf-8")  # checked by check_inputs
        else:
            for _, text in _jsonl_texts(path, args.field):
                yield text.encode("utf-8") if as_bytes else text


@command
def main(argv=None):
    args = parse_args(argv)
    if check_inputs(args) == 0 and "stdlib" not in args.inputs:
        fail("no documents found in the inputs")
    quiet()
    import numpy as np
    from tqdm import tqdm

    from paddle_vha.train.datasets import write_pretrain_data

    if args.bytes:
        vocab = 256
        tokenize = lambda data: np.append(np.frombuffer(data, np.uint8).astype(np.int64), 0)  # noqa: E731
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
    skipped = []

    def stream():
        for doc in documents(args, args.bytes, skipped):
            bar.update(1)
            yield tokenize(doc)

    import contextlib
    import io
    import shutil
    import tempfile

    parent = os.path.dirname(os.path.abspath(args.out))
    # the files are built in a hidden temporary folder on PREFIX's file system, removed whatever happens (a refusal,
    # Ctrl-C, SIGTERM through `command`); PREFIX's folder is created only when they are complete
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(args.out)}.tmp-", dir=_nearest_existing(parent))
    try:
        staged = os.path.join(tmp, "data")
        with contextlib.redirect_stdout(io.StringIO()):  # the builder prints its own statistics
            stats = write_pretrain_data(staged, stream(), vocab_size=vocab)
        bar.close()
        if stats["documents"] == 0:
            fail("no documents found in the inputs")
        os.makedirs(parent, exist_ok=True)
        for ext in (".bin", ".idx"):
            os.replace(staged + ext, args.out + ext)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if skipped:
        print(f"note: skipped {len(skipped)} standard-library file(s) that are not UTF-8 text", file=sys.stderr)
    print(f"wrote {args.out}.bin / .idx: {stats['documents']:,} documents, {stats['tokens']:,} tokens "
          f"(vocab {vocab:,}); train with dataset=pretrain, input_dir={args.out}")
    return 0


def _nearest_existing(folder: str) -> str:
    """`folder`, or its nearest ancestor that exists (where the temporary folder goes: the same file system)."""
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    return folder


if __name__ == "__main__":
    sys.exit(main())
