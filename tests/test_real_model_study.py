"""The real-model study's pieces (tools/experiments/real_model_study.py, real_eval.py, austen.py, real_report.py) on
tiny inputs, not the real runs: R's serialization read back from bytes written here from the format's definition, the
chapter split, the held-out metrics / cloze / chat agreement against float64 computations written here, greedy
decoding with the model's KV cache against recomputing from scratch, and resumption of a killed healing run (the
small loop's LoopCheckpoint) and of the study's journal."""
import gzip
import json
import math
import struct
import zlib

import numpy as np
import pytest

from tools.experiments import austen, real_eval as ev


# --- R serialization, written from R Internals' "Serialization Formats" (XDR, version 3) --------------------------

def _i(x):
    return struct.pack(">i", x)


def _char(s):
    if s is None:
        return _i(9) + _i(-1)
    b = s.encode("utf-8")
    return _i(9 | (1 << 15)) + _i(len(b)) + b  # CHARSXP with the UTF-8 mark in its levels


def _strsxp(xs, attrs=b""):
    return _i(16 | ((1 << 9) if attrs else 0)) + _i(len(xs)) + b"".join(_char(x) for x in xs) + attrs


def _sym(name):
    return _i(1) + _char(name)


def _names_attr(names):
    # pairlist with a tag (flags: LISTSXP | has_tag), tag = symbol "names", value = STRSXP; then NULL (254)
    return _i(2 | (1 << 10)) + _sym("names") + _strsxp(names) + _i(254)


def _header(body):
    enc = b"UTF-8"
    return b"X\n" + _i(3) + _i(0x040201) + _i(0x030500) + _i(len(enc)) + enc + body


def _intsxp(xs):
    return _i(13) + _i(len(xs)) + b"".join(_i(x) for x in xs)


def test_unserialize_reads_vectors_lists_and_na():
    body = _i(19 | (1 << 9)) + _i(3) + _strsxp(["It is a truth", None, "é"]) + _intsxp([7, -(2 ** 31)]) \
        + _i(10) + _i(1) + _i(1) + _names_attr(["text", "ints", "flag"])
    out = austen.unserialize(_header(body))
    print(out)
    assert out == {"text": ["It is a truth", None, "é"], "ints": [7, None], "flag": [1]}
    with pytest.raises(austen.TextSourceError, match="XDR"):
        austen.unserialize(b"A\n" + body)
    with pytest.raises(austen.TextSourceError, match="truncated"):
        austen.unserialize(_header(body)[:-7])


def test_lazy_load_db_reads_each_variable_at_its_offset():
    books = {"emma": ["EMMA", "", "CHAPTER I", "", "Emma Woodhouse, handsome."],
             "persuasion": ["Persuasion", "Chapter 1", "Sir Walter Elliot."]}
    rdb, offsets = b"", {}
    for name, lines in books.items():
        raw = _header(_strsxp(lines))
        blob = struct.pack(">I", len(raw)) + zlib.compress(raw)
        offsets[name] = (len(rdb), len(blob))
        rdb += blob
    variables = _i(19 | (1 << 9)) + _i(2) + b"".join(_intsxp(list(offsets[n])) for n in books) \
        + _names_attr(list(books))
    index = _i(19 | (1 << 9)) + _i(1) + variables + _names_attr(["variables"])
    got = austen.read_lazy_load_db(rdb, gzip.compress(_header(index)))
    assert got == books
    with pytest.raises(austen.TextSourceError, match="past the file's end"):
        austen.read_lazy_load_db(rdb[:-3], gzip.compress(_header(index)))


def test_chapters_and_the_split_by_document():
    lines = ["TITLE", "by Someone", ""]
    for k in range(12):
        lines += [f"CHAPTER {k + 1}", "", f"First line of chapter {k}", "goes on here.", "", "VOLUME II", "",
                  f"Second paragraph {k}."]
    docs = austen.chapters({"book": lines, "other": ["Chapter 1", "Only one."]})
    assert [(d.book, d.index) for d in docs] == [("book", k) for k in range(12)] + [("other", 0)]
    assert docs[3].text == "First line of chapter 3 goes on here.\n\nSecond paragraph 3."  # no title, no volume line
    train, held = austen.split_documents(docs)
    assert [(d.book, d.index) for d in held] == [("book", 4)]
    assert len(train) + len(held) == len(docs) and not {id(d) for d in train} & {id(d) for d in held}


# --- metrics against float64 written here -----------------------------------------------------------------------

V = 11


def _bigram(seed):
    """A 'model': logits of the next token given the current one, from a fixed random table (float32 out)."""
    table = np.random.default_rng(seed).standard_normal((V, V)) * 2.0

    def fn(ids):
        return table[np.asarray(ids)].astype(np.float32)  # (B, S, V)
    return fn, table


def test_heldout_metrics_match_float64_from_the_definitions(tmp_path):
    stream = np.random.default_rng(0).integers(0, V, 503)
    windows = ev.heldout_windows(stream, 5, 37)  # prime length
    assert all(x.shape == (1, 37) for x, _ in windows) and np.array_equal(windows[1][1][0, :-1], windows[1][0][0, 1:])
    model, tm = _bigram(1)
    ref_fn, tr = _bigram(2)
    ref = ev.reference_logprobs(ref_fn, windows)
    assert ref.dtype == np.float32 and ref.shape == (5, 37, V)
    got = ev.heldout_metrics(model, windows, ref)
    nll, kl, n = 0.0, 0.0, 0
    for x, y in windows:
        for a, b in zip(x[0], y[0]):
            zm, zr = tm[a].astype(np.float32).astype(np.float64), tr[a].astype(np.float32).astype(np.float64)
            pm = np.exp(zm) / np.exp(zm).sum()
            pr = np.exp(zr) / np.exp(zr).sum()
            nll -= math.log(pm[b])
            kl += float((pr * np.log(pr / pm)).sum())
            n += 1
    print(f"nll {got['nll']:.12f} vs {nll / n:.12f}, kl {got['kl']:.12f} vs {kl / n:.12f}")
    assert got["tokens"] == n == 5 * 37
    assert abs(got["nll"] - nll / n) < 1e-9 and abs(got["ppl"] - math.exp(nll / n)) < 1e-8
    assert abs(got["kl"] - kl / n) < 1e-6  # the reference's log-probs are stored in float32
    assert ev.heldout_metrics(ref_fn, windows, ref)["kl"] < 1e-6  # the reference against itself


class _Doc:
    def __init__(self, book, index, text):
        self.book, self.index, self.text = book, index, text


def _word_codec():
    """A whitespace 'tokenizer': one id per distinct space-separated piece (punctuation stays on its word)."""
    vocab = {}

    def encode(s):
        pieces = s.split(" ")
        if pieces and pieces[0] == "":
            pieces = pieces[1:]  # the leading space of " word"
        return [vocab.setdefault(w, len(vocab)) for w in pieces]
    return encode, vocab


def test_cloze_builder_takes_the_last_word_after_enough_context():
    text = ("one two three four five six seven eight nine eleven. " * 3 + "The quick fox jumped over the lazy fence. "
            "It ran far away! Was it a cat? No it was.")
    doc = _Doc("b", 0, text)
    encode, vocab = _word_codec()
    items = ev.build_cloze([doc], encode, n_items=50, context_tokens=6)
    print([(it.word, it.context) for it in items])
    # every sentence ending in a word of >= 4 letters ("cat", "was": 3) with >= 6 tokens before it, in order
    assert [it.word for it in items] == ["eleven", "eleven", "eleven", "fence", "away"]
    for it in items:
        assert len(it.context) == 6 and it.target == [vocab[it.word]] and it.where == "b 0"
    assert [vocab_key(vocab, t) for t in items[3].context] == ["quick", "fox", "jumped", "over", "the", "lazy"]
    assert [vocab_key(vocab, t) for t in items[1].context] == ["four", "five", "six", "seven", "eight", "nine"]
    far = ev.build_cloze([doc], encode, n_items=50, context_tokens=40)  # only "away" has 40 tokens before it
    assert [it.word for it in far] == ["away"] and len(far[0].context) == 40
    assert [it.word for it in ev.build_cloze([doc], encode, n_items=2, context_tokens=6)] == ["eleven", "away"]


def vocab_key(vocab, t):
    return next(k for k, v in vocab.items() if v == t)


def test_cloze_and_chat_agreement_against_counts_written_here():
    model, table = _bigram(3)
    rng = np.random.default_rng(4)
    items = []
    for k in range(23):
        ctx = list(rng.integers(0, V, 5 + (k % 3)))
        # targets: the model's own greedy chain (right) or one token off somewhere (wrong)
        tgt = [int(table[ctx[-1]].argmax())]
        for _ in range(k % 3):
            tgt.append(int(table[tgt[-1]].argmax()))
        if k % 4 == 0:
            tgt[-1] = (tgt[-1] + 1) % V
        items.append(ev.ClozeItem(ctx, tgt, "w", "x"))
    want = sum(1 for k in range(23) if k % 4 != 0) / 23
    assert abs(ev.cloze_accuracy(model, items, batch=4) - want) < 1e-12
    prompts = [list(rng.integers(0, V, 4)) for _ in range(5)]
    answers, hit, total = [], 0, 0
    for p in prompts:
        a = list(rng.integers(0, V, 6))
        prev = [p[-1]] + a[:-1]
        hit += sum(int(table[t].argmax()) == b for t, b in zip(prev, a))
        total += len(a)
        answers.append(a)
    assert abs(ev.chat_agreement(model, prompts, answers) - hit / total) < 1e-12


def _tiny_llama(seed=0):
    import paddle
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

    paddle.seed(seed)
    cfg = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=3,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=128, pad_token_id=None,
                      bos_token_id=None, eos_token_id=None, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    model.eval()
    return model


def test_greedy_answer_with_the_kv_cache_equals_recomputing_from_scratch():
    model = _tiny_llama()
    fn = ev.paddle_logits(model)
    prompt = [5, 17, 3, 88, 41, 2, 9]  # prime length
    got = ev.greedy_answer(ev.paddle_step(model), prompt, 13, eos=[])
    ids, want = list(prompt), []
    for _ in range(13):
        want.append(int(fn(np.asarray([ids]))[0, -1].argmax()))
        ids.append(want[-1])
    assert got == want
    stop = want[4]
    cut = ev.greedy_answer(ev.paddle_step(model), prompt, 13, eos=[stop])
    assert cut == want[:want.index(stop) + 1]  # stops at (and keeps) the first EOS id


# --- resumption --------------------------------------------------------------------------------------------------

class _Corpus:
    def __init__(self, fail_at=None):
        self.data = np.random.default_rng(5).integers(0, 97, 4000)
        self.calls, self.fail_at = 0, fail_at

    def batch(self, rng, b, s, count=True):
        self.calls += count
        if count and self.fail_at is not None and self.calls == self.fail_at:
            raise KeyboardInterrupt("killed")
        starts = rng.integers(0, len(self.data) - s - 1, size=b)
        w = np.stack([self.data[a:a + s + 1] for a in starts])
        return w[:, :-1], w[:, 1:]

    def val_batches(self, b, s, n):
        return [self.batch(np.random.default_rng(0), b, s, count=False)]


def test_a_killed_healing_run_resumes_to_the_same_weights(tmp_path):
    import paddle

    from paddle_vha.train.loop import LoopCheckpoint, TrainSettings, train_lm

    s = TrainSettings(steps=6, batch_size=2, seq_len=9, lr=3e-3, warmup=2, data_seed=3, eval_every=2, progress=False,
                      schedule="constant")
    straight = _tiny_llama()
    res = train_lm(straight, _Corpus(), s)
    ck = LoopCheckpoint(str(tmp_path / "run.pdstate"), every=2)
    with pytest.raises(KeyboardInterrupt):  # killed while drawing step 6's batch, after the save at step 4
        train_lm(_tiny_llama(), _Corpus(fail_at=6), s, resume=ck)
    assert (tmp_path / "run.pdstate" / "meta.json").is_file()
    paddle.nn.Linear(3, 3)  # a new process builds other layers first: Paddle's own parameter names move on
    resumed = _tiny_llama(seed=7)  # different starting weights: the saved state must replace them
    res2 = train_lm(resumed, _Corpus(), s, resume=ck)
    a = {k: v.numpy() for k, v in straight.state_dict().items()}
    b = {k: v.numpy() for k, v in resumed.state_dict().items()}
    diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    print(f"max |straight - resumed| weight {diff:.2e}; losses {res.losses} vs {res2.losses}")
    assert diff < 1e-6 and np.allclose(res.losses, res2.losses, atol=1e-6)
    assert [c[0] for c in res2.val_curve] == [c[0] for c in res.val_curve] == [2, 4, 6]
    ck.remove()
    assert not (tmp_path / "run.pdstate").exists()


def test_the_journal_resumes_and_the_plan_orders_the_best_first(tmp_path):
    from tools.experiments import real_model_study as study

    j = study.Log(str(tmp_path / "journal.jsonl"))
    key = dict(kind="step0", start="MEA", seq_len=8)
    assert j.find(key) is None
    j.add(key, dict(metrics=dict(kl=1.5)))
    again = study.Log(str(tmp_path / "journal.jsonl"))  # a new process reads what the killed one finished
    assert again.find(key)["metrics"]["kl"] == 1.5 and again.find(dict(key, seq_len=9)) is None
    args = study.parse_args(["--starts", "MEA", "VHA svd", "VHA calibrated", "--seeds", "0", "1", "--full", "1",
                             "--best", "2", "--heal-steps", "10", "--short-steps", "3"])
    s0 = {n: dict(metrics=dict(kl=k)) for n, k in (("MEA", 3.0), ("VHA svd", 2.0), ("VHA calibrated", 1.0))}
    plan = study.heal_plan(args, s0)
    print(plan)
    assert plan[:3] == [("VHA calibrated", "ce", 0, 10, "all"), ("VHA calibrated", "kd", 0, 10, "all"),
                        (study.ORIGINAL, "ce", 0, 10, "all")]
    assert ("MEA", "kd", 0, 3, "all") in plan and ("VHA svd", "ce", 1, 3, "all") in plan
    assert ("VHA calibrated", "kd", 1, 10, "all") in plan and ("MEA", "ce", 1, 3, "all") not in plan
    assert plan[-1] == ("VHA calibrated", "kd", 0, 10, "attention")


def test_study_refuses_bad_options_in_one_line(capsys):
    from tools.experiments import real_model_study as study

    for argv, what in ((["--heal-steps", "0"], "--heal-steps"), (["--lr", "-1"], "--lr"),
                       (["--model", "/nonexistent"], "no such folder"), (["--starts", "GQA-9"], "invalid choice")):
        with pytest.raises(SystemExit) as e:
            study.parse_args(argv)
        assert e.value.code == 2
        assert what in capsys.readouterr().err


def test_report_tables_seeds_and_the_partial_marker(tmp_path):
    import types

    from strict_json import strict_json

    from tools.experiments import real_model_study as study
    from tools.experiments import real_report as rep

    args = study.parse_args(["--starts", "MEA", "VHA calibrated", "--seeds", "0", "1", "--full", "1", "--best", "1",
                             "--heal-steps", "4", "--short-steps", "2", "--eval-every", "2", "--attn-only-start",
                             "none", "--out", str(tmp_path), "--cache", str(tmp_path / "cache")])
    j = study.Log(str(tmp_path / "journal.jsonl"))
    ek, tk = study.eval_key(args), study.train_key(args)

    def metrics(ppl, kl):
        return dict(ppl=ppl, nll=math.log(ppl), kl=kl, cloze=0.1, chat_agreement=0.5, chat_identical=3, seconds=1.0,
                    chat_answers=[f"answer {k} to {ppl}" for k in range(20)])
    for name, ppl, kl in ((study.ORIGINAL, 40.0, 0.0), ("MEA", 900.0, 4.0), ("VHA calibrated", 300.0, 2.0)):
        j.add(dict(kind="step0", start=name, **ek), dict(metrics=metrics(ppl, kl), kv_bytes=1))
    for seed, ppl in ((0, 60.0), (1, 64.0)):
        j.add(dict(kind="heal", start="VHA calibrated", loss="kd", seed=seed, steps=4, trainable="all", **tk),
              dict(metrics=metrics(ppl, 0.5), curve=[[2, math.log(80.0)], [4, math.log(ppl)]], seconds=10.0,
                   tokens=4096, trained_params=1, losses=[1.0]))
    # the fine-tuned control ends nearer the original than any converted start: the chat section still shows a start
    j.add(dict(kind="heal", start=study.ORIGINAL, loss="ce", seed=0, steps=4, trainable="all", **tk),
          dict(metrics=metrics(35.0, 0.1), curve=[[4, math.log(35.0)]], seconds=10.0, tokens=4096, trained_params=1,
               losses=[1.0]))
    bench = types.SimpleNamespace(windows=[0] * 12, cloze=[ev.ClozeItem([1], [2], "word", "b 1")] * 5)
    facts = dict(provenance="p", chapters=3, split="s", train_chapters=2, train_chars=10, train_tokens=5,
                 held_chapters=1, held_chars=4, held_tokens=2)
    rep.write_report(args, j, facts, bench, 1.0)
    md = (tmp_path / "real_model.md").read_text()
    print(md)
    # 2 seeds of the full-length KD run: mean ± sample std of 60 and 64; per 1,000 tokens: (62 - 300) / 4.096
    assert "| VHA calibrated | healed KD | 4,096 | 2 | 62.000 ± 2.828 |" in md
    assert f"{(62.0 - 300.0) / 4.096:+.3f}" in md
    assert "**PARTIAL RESULTS.**" in md and "VHA calibrated CE seed 0 (4 steps)" in md and "MEA KD seed 0 (2 steps)" in md
    assert "### Chat: VHA calibrated KD" in md and (tmp_path / "real_model.png").read_bytes()[:4] == b"\x89PNG"
    data = strict_json(tmp_path / "real_model.json")
    assert data["partial"] and len(data["healing"]) == 3
    (tmp_path / "real_model.md").write_text(md + "\n## Reading\n\nkept by hand\n")
    rep.write_report(args, j, facts, bench, 1.0)  # regenerated: the hand-written reading stays
    assert (tmp_path / "real_model.md").read_text().endswith("## Reading\n\nkept by hand\n")


@pytest.mark.slow
def test_cost_phase_exports_int4_and_times_each_serving_form(tmp_path, monkeypatch):
    """The cost phase on a tiny Llama (3 KV heads -> 1): the original, MEA (its export needs k_norm before HLC) and a
    folded VHA start exported to int4 with the gate measured, timed in fresh processes; the folded VHA start has the
    MQA start's graph shape and is timed once."""
    import os

    from tools.experiments import real_cost
    from tools.experiments import real_model_study as study

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM
    import paddle

    paddle.seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=3, head_dim=16, max_position_embeddings=4200, pad_token_id=None,
                      bos_token_id=None, eos_token_id=None, tie_word_embeddings=False)
    orig = str(tmp_path / "orig")
    LlamaForCausalLM(cfg).save_pretrained(orig)
    args = study.parse_args(["--cache", str(tmp_path / "cache"), "--starts", "MQA mean-pool", "MEA", "VHA svd",
                             "--bench-new", "4"])
    os.makedirs(args.cache)
    journal = study.Log(str(tmp_path / "cache" / "journal.jsonl"))
    rows = real_cost.cost_rows(args, journal, study.Starts(args, orig, None, lambda: None), print)
    by = {r["key"]["start"]: r for r in rows}
    print({n: (r["form"], r["gate"], r.get("b1"), r.get("b8")) for n, r in by.items()})
    assert by["original"]["kv_fp32"] == 2 * 2 * 3 * 16 * 4 and by["MEA"]["kv_fp32"] == 2 * 2 * 1 * 16 * 4
    assert by["VHA svd"]["form"] == by["MQA mean-pool"]["form"] == "stock, 6 query / 1 KV heads"
    assert by["MEA"]["form"].startswith("MEA") and "same graph shape as MQA mean-pool" in by["VHA svd"]["note"]
    for r in rows:
        assert r["b1"] > 0 and r["b8"] > 0 and r["gate"].startswith(("passes", "FAILS"))
        assert 0 <= r["quality"]["mean_kl"] < 1
    assert not os.path.exists(tmp_path / "cache" / "cost" / "MEA-int4")  # exports removed once measured
    again = real_cost.cost_rows(args, journal, study.Starts(args, orig, None, lambda: None), print)
    assert [r["key"] for r in again] == [r["key"] for r in rows]  # from the journal, nothing redone


def test_a_fresh_cache_starts_from_the_committed_report(tmp_path):
    from tools.experiments import real_model_study as study

    rec = dict(key=dict(kind="step0", start="MEA", seq_len=8), metrics=dict(kl=1.5), kv_bytes=3)
    heal = dict(key=dict(kind="heal", start="MEA", loss="kd"), metrics=dict(kl=0.5))
    (tmp_path / "real_model.json").write_text(json.dumps(dict(step0={"MEA": rec}, healing=[heal], cost=[])))
    j = study.Log(str(tmp_path / "journal.jsonl"))
    study.seed_journal(j, str(tmp_path / "real_model.json"))
    assert study.Log(str(tmp_path / "journal.jsonl")).find(rec["key"]) == rec
    assert j.find(heal["key"])["metrics"]["kl"] == 0.5
    study.seed_journal(j, str(tmp_path / "real_model.json"))  # a journal that has records is left alone
    assert len(study.Log(str(tmp_path / "journal.jsonl")).records) == 2
