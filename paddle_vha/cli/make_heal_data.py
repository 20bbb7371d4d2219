"""Make healing data from the original model itself: its sampled chat answers to a diverse prompt set through its own
chat template, and its continuations of general text, stored as PaddleFormers pretraining data (PREFIX.bin + .idx).

The prompts are the project's own topic list x instruction templates and questions the model writes for itself about
those topics (paddle_vha/train/heal_prompts.py: nothing is downloaded, no third-party licence applies; the model's
output is under the model's licence). The model runs through its ONNX export with the KV cache, batched and sampled;
ORIGINAL is exported once (float32, the original exactly) into PREFIX.export unless --export names one. Every round
of --batch sequences is journaled in PREFIX.jsonl (prompts, ids, text), so an interrupted run continues where it
stopped when run again with the same settings; the generation speed is printed per round and kept in PREFIX.json.

    python tools/make_heal_data.py runs/smollm2 --out data/heal/smol --text austen_train.txt
    python tools/make_heal_data.py runs/smollm2 --out data/heal/smol --chat-tokens 1000000 --text-tokens 0
    python tools/store_teacher.py runs/smollm2 data/heal/smol --out data/heal/smol-top64    # then: stored KD
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from paddle_vha.cli import command, fail, quiet
from paddle_vha.cli.options import ALWAYS, Effect, parse_checked


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("original", metavar="ORIGINAL", help="the original checkpoint folder (with its tokenizer and chat "
                   "template)")
    p.add_argument("--out", required=True, metavar="PREFIX", help="writes PREFIX.bin / .idx / .json, journals in "
                   "PREFIX.jsonl")
    p.add_argument("--export", metavar="DIR", help="an ONNX export of ORIGINAL to sample with (default: made once in "
                   "PREFIX.export, float32)")
    p.add_argument("--text", nargs="+", default=[], metavar="FILE", help="UTF-8 text files to continue (general text)")
    p.add_argument("--chat-tokens", type=int, default=262_144, help="tokens of chat documents (default 262,144)")
    p.add_argument("--text-tokens", type=int, default=None, help="tokens of text continuations (default 131,072 with "
                   "--text, else 0)")
    p.add_argument("--samples", type=int, default=2, help="sampled answers per prompt (default 2)")
    p.add_argument("--question-share", type=float, default=0.5, help="share of the prompts that are questions the "
                   "model writes itself (default 0.5)")
    p.add_argument("--batch", type=int, default=16, help="sequences decoded together (default 16)")
    p.add_argument("--max-new", type=int, default=256, help="answer tokens at most (default 256)")
    p.add_argument("--text-context", type=int, default=64, help="tokens of text before a continuation (default 64)")
    p.add_argument("--text-new", type=int, default=192, help="tokens of a continuation (default 192)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exclude", metavar="FILE", help="prompts kept out of the data, one per line (an evaluation's "
                   "held-out prompts; compared without case and punctuation)")
    p.add_argument("--threads", type=int, default=0, help="onnxruntime threads (default: its own choice)")
    p.add_argument("--no-progress", action="store_true")
    return p


TAKES_EFFECT = {
    "ORIGINAL": ALWAYS, "--out": ALWAYS, "--export": ALWAYS, "--chat-tokens": ALWAYS, "--seed": ALWAYS,
    "--temperature": ALWAYS, "--top-p": ALWAYS, "--top-k": ALWAYS, "--batch": ALWAYS, "--threads": ALWAYS,
    "--no-progress": ALWAYS, "--exclude": ALWAYS,
    "--text": Effect("with --text-tokens > 0", lambda a: a.text_tokens != 0),
    "--text-tokens": ALWAYS,
    "--text-context": Effect("with text continuations (--text)", lambda a: bool(a.text)),
    "--text-new": Effect("with text continuations (--text)", lambda a: bool(a.text)),
    "--samples": Effect("with --chat-tokens > 0", lambda a: a.chat_tokens > 0),
    "--question-share": Effect("with --chat-tokens > 0", lambda a: a.chat_tokens > 0),
    "--max-new": Effect("with --chat-tokens > 0", lambda a: a.chat_tokens > 0),
}


def _check(p, args) -> None:
    if args.text_tokens is None:
        args.text_tokens = 131_072 if args.text else 0
    if not os.path.isdir(args.original):
        p.error(f"{args.original}: no such folder")
    for path in args.text:
        if not os.path.isfile(path):
            p.error(f"--text {path}: no such file")
    if args.exclude and not os.path.isfile(args.exclude):
        p.error(f"--exclude {args.exclude}: no such file")
    if args.export and not os.path.isfile(os.path.join(args.export, "export_info.json")):
        p.error(f"--export {args.export}: not an export folder (no export_info.json)")
    if args.out.endswith(("/", os.sep)) or os.path.isdir(args.out):
        p.error(f"--out {args.out}: names a folder; give a file prefix inside it")
    if args.threads < 0:
        p.error(f"--threads {args.threads}: must be >= 0")


def settings_of(args):
    from paddle_vha.train.heal_data import HealSettings

    s = HealSettings(chat_tokens=args.chat_tokens, text_tokens=args.text_tokens, samples=args.samples,
                     question_share=args.question_share, batch=args.batch, max_new=args.max_new,
                     text_context=args.text_context, text_new=args.text_new, temperature=args.temperature,
                     top_p=args.top_p, top_k=args.top_k, seed=args.seed, text_files=list(args.text))
    try:
        s.check()
    except ValueError as e:
        fail(f"--{e}")
    return s


def _export(args) -> str:
    """--export, or ORIGINAL exported once (float32) into PREFIX.export (reused when it is there)."""
    if args.export:
        return args.export
    from paddle_vha.export.float32_export import float32_export

    return _exported(lambda: float32_export(args.original, args.out + ".export", "to sample with"))


def _write_data(prefix: str, journal, vocab: int, meta: dict) -> dict:
    """PREFIX.bin / .idx from the journal's documents and PREFIX.json, each staged then renamed into place."""
    import contextlib
    import io
    import tempfile

    import numpy as np

    from paddle_vha.train.datasets import write_pretrain_data

    parent = os.path.dirname(os.path.abspath(prefix))
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(prefix)}.tmp-", dir=parent)
    try:
        staged = os.path.join(tmp, "data")
        with contextlib.redirect_stdout(io.StringIO()):  # the builder prints its own statistics
            stats = write_pretrain_data(staged, (np.asarray(d["ids"], np.int64) for d in journal.docs),
                                        vocab_size=vocab)
        with open(staged + ".json", "w", encoding="utf-8") as f:
            json.dump({**meta, **stats}, f, indent=1)
        for ext in (".bin", ".idx", ".json"):
            os.replace(staged + ext, prefix + ext)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return stats


@command
def main(argv=None):
    args, _ = parse_checked(build_parser(), argv, TAKES_EFFECT, _check)
    settings = settings_of(args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    from paddle_vha.train.heal_data import HealData, Journal, summary
    from paddle_vha.train.run_lock import hold_lock

    lock = hold_lock(args.out + ".lock")  # noqa: F841 - held while this process appends to the journal
    if lock is None:
        fail(f"--out {args.out}: another make_heal_data is writing {args.out}.jsonl (it holds {args.out}.lock); "
             "wait for it to finish or choose another --out")
    try:
        journal = Journal(args.out + ".jsonl")
        journal.start(settings.fixed())
    except ValueError as e:
        fail(str(e))
    excluded = []
    if args.exclude:
        with open(args.exclude, encoding="utf-8") as f:
            excluded = [line.strip() for line in f if line.strip()]
    export = _export(args)
    quiet()
    from tqdm import tqdm

    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.serve.session import ServeError, read_export_info
    from paddle_vha.serve.text import generation_defaults, load_codec, render_chat

    try:
        info = read_export_info(export)
        codec = load_codec(args.original, info["vocab_size"])
        gen = generation_defaults(args.original)
        render_chat(args.original, [{"role": "user", "content": "test"}])  # a folder without a template: one line
        session = OrtDecoder.from_dir(export, threads=args.threads)
    except ServeError as e:
        fail(str(e))
    if codec is None:
        fail(f"{args.original}: no tokenizer.json to write the prompts with")
    if not gen["eos"]:
        fail(f"{args.original}: generation_config.json names no eos_token_id (where an answer ends)")
    heal = HealData(session, codec, lambda text: render_chat(args.original, [{"role": "user", "content": text}]),
                    gen["eos"], gen["pad"], settings, journal, excluded=excluded,
                    context_length=info.get("context_length"))
    target = settings.chat_tokens + settings.text_tokens
    done = journal.tokens(("chat", "question", "text"))
    if done:
        print(f"resuming {journal.path}: {done:,} tokens in {len(journal.rounds)} rounds", file=sys.stderr)
    bar = tqdm(total=target, initial=min(done, target), unit=" tok", disable=args.no_progress, file=sys.stderr)
    try:
        for closing in heal.rounds():
            bar.update(closing["tokens"])
            bar.set_postfix_str(f"{closing['kind']} {closing['new_tokens'] / closing['seconds']:.0f} new tok/s")
    except ServeError as e:
        fail(str(e))
    except ValueError as e:
        fail(str(e))
    bar.close()
    meta = dict(original=os.path.abspath(args.original), export=os.path.abspath(export),
                settings=settings.fixed(), targets=dict(chat_tokens=settings.chat_tokens,
                                                          text_tokens=settings.text_tokens),
                held_out_prompts=len(excluded), **summary(journal))
    stats = _write_data(args.out, journal, info["vocab_size"], meta)
    for kind in ("chat", "text"):
        r = meta[kind + "_rounds"]
        if r["rounds"]:
            print(f"{kind}: {r['rounds']} rounds, {r['new_tokens_per_second']} new tokens/s over {r['seconds']} s")
    q = meta["question"]
    print(f"wrote {args.out}.bin / .idx / .json: {stats['documents']:,} documents, {stats['tokens']:,} tokens "
          f"(chat {meta['chat']['tokens']:,}, self-questions {q['tokens']:,}, text {meta['text']['tokens']:,}); "
          f"{meta['chat']['stopped']} of {meta['chat']['documents']} answers ended by the model")
    return 0


def _exported(make):
    """make() (a float32 export), its ExportError as the tool's one-line failure."""
    from paddle_vha.export.errors import ExportError

    try:
        return make()
    except ExportError as e:
        fail(str(e))


if __name__ == "__main__":
    sys.exit(main())
