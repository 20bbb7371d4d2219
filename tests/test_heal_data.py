"""tools/make_heal_data.py: healing data the original model writes itself, through its export.

A small stock Qwen3 (random weights, vocabulary 151,936) with the fixture's trained tokenizer and chat template
(tools/fixtures/qwen3_shaped.py), exported by the export code; its sampled output is noise, which is all the checks
need. Checked against independent readers: every chat document begins with the tokenizer's own encoding of the chat
template around its prompt (Hugging Face's template rendering is checked in test_generate_text.py), a text document
with its file's tokens, and an answer that stopped ends with an EOS id; PREFIX.bin / .idx read back by PaddleFormers'
reader hold the journal's documents in order; a run cut mid-round and run again writes what an uninterrupted run
writes; a larger target extends a finished run; held-out prompts never appear; other settings on resume are refused
in one line.
"""
import json
import os
import shutil

import numpy as np
import pytest

from hostile import save_stock

VOCAB = 151936
EOS = [151645, 151643]


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """(checkpoint folder with the fixture's tokenizer files, its export)."""
    from paddle_vha.export.onnx_export import export_onnx
    from tools.fixtures.qwen3_shaped import write_tokenizer

    root = tmp_path_factory.mktemp("heal")
    src = save_stock(root / "orig", vocab_size=VOCAB, tie_word_embeddings=True, max_position_embeddings=512)
    tok = root / "tok"
    tok.mkdir()
    write_tokenizer(str(tok))
    for f in os.listdir(tok):
        shutil.copyfile(os.path.join(tok, f), os.path.join(src, f))
    out = str(root / "export")
    export_onnx(src, out, decode_steps=1, log=lambda m: None)
    text = root / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40 + "A second paragraph about rivers. " * 30,
                    encoding="utf-8")
    return src, out, str(text)


def _run(original, prefix, *extra):
    from paddle_vha.cli.make_heal_data import main

    assert main(_argv(original, prefix, *extra)) == 0


def _argv(original, prefix, *extra):
    src, export, text = original
    with_text = ["--text", text, "--text-context", "16", "--text-new", "10"] if "0" != extra[extra.index(
        "--text-tokens") + 1] else []
    argv = [src, "--out", str(prefix), "--export", export, "--batch", "4", "--samples", "2", "--max-new", "12",
            "--top-k", "50", "--no-progress", "--threads", "1", *with_text, *extra]
    return argv


def _journal_docs(prefix):
    return [d for d in map(json.loads, open(str(prefix) + ".jsonl")) if "ids" in d]


def test_documents_are_the_models_own_tokens(original, tmp_path, capsys):
    from paddle_vha.serve.text import load_codec, render_chat
    from paddle_vha.train.stored_teacher import stream_of

    src, _, text = original
    _run(original, tmp_path / "d", "--chat-tokens", "400", "--text-tokens", "150")
    out = capsys.readouterr().out
    print(out)
    assert "new tokens/s" in out and "wrote" in out
    docs = _journal_docs(tmp_path / "d")
    codec = load_codec(src, VOCAB)
    kinds = {d["kind"] for d in docs}
    assert kinds == {"chat", "question", "text"}, kinds
    tokens = codec.encode(open(text, encoding="utf-8").read())
    for d in docs:
        ids = d["ids"]
        if d["kind"] in ("chat", "question"):
            prompt = codec.encode(render_chat(src, [{"role": "user", "content": d["prompt"]}]))
            assert ids[:len(prompt)] == prompt and len(ids) - len(prompt) == d["new"]
        else:
            start = int(d["prompt"].split("@")[1])
            assert ids[:16] == tokens[start:start + 16] and d["new"] <= 10
        assert d["new"] >= 1
        assert (ids[-1] in EOS) == d["eos"], "an answer that stopped ends with its EOS, one cut short does not"
    meta = json.load(open(str(tmp_path / "d") + ".json"))
    assert meta["chat"]["tokens"] + meta["question"]["tokens"] >= 400 and meta["text"]["tokens"] >= 150
    assert meta["prompt_sources"]["licence"] and meta["chat_rounds"]["new_tokens_per_second"] > 0
    stream = stream_of(str(tmp_path / "d"))
    assert stream.tolist() == [t for d in docs for t in d["ids"]], "PREFIX.bin holds the journal's documents in order"


def test_a_cut_run_resumes_to_the_same_data_and_a_larger_target_extends_it(original, tmp_path):
    _run(original, tmp_path / "whole", "--chat-tokens", "600", "--text-tokens", "0")
    whole = _journal_docs(tmp_path / "whole")
    # cut: the journal of the first rounds plus a round cut short (its documents without the closing line)
    lines = open(str(tmp_path / "whole") + ".jsonl").read().splitlines(keepends=True)
    closings = [i for i, ln in enumerate(lines) if '"round"' in ln and '"ids"' not in ln]
    assert len(closings) >= 2
    cut = lines[:closings[0] + 1] + lines[closings[0] + 1:closings[1]][:3] + ['{"kind": "chat", "ids": [1, 2']
    with open(str(tmp_path / "cut") + ".jsonl", "w") as f:
        f.writelines(cut)
    _run(original, tmp_path / "cut", "--chat-tokens", "600", "--text-tokens", "0")
    assert _journal_docs(tmp_path / "cut") == whole
    assert open(str(tmp_path / "cut") + ".bin", "rb").read() == open(str(tmp_path / "whole") + ".bin", "rb").read()
    _run(original, tmp_path / "whole", "--chat-tokens", "900", "--text-tokens", "0")
    more = _journal_docs(tmp_path / "whole")
    assert more[:len(whole)] == whole and len(more) > len(whole)


def test_held_out_prompts_never_enter(original, tmp_path):
    from paddle_vha.train.heal_prompts import TASKS, TOPICS, normalize, task_prompts

    first = task_prompts(np.random.default_rng([0, 0]))[:6]
    (tmp_path / "held.txt").write_text("\n".join(first) + "\n")
    _run(original, tmp_path / "d", "--chat-tokens", "300", "--text-tokens", "0", "--exclude",
         str(tmp_path / "held.txt"), "--question-share", "0")
    prompts = {normalize(d["prompt"]) for d in _journal_docs(tmp_path / "d")}
    assert prompts and not prompts & {normalize(p) for p in first}
    assert len(TASKS) * len(TOPICS) > 2000


def refused(main, argv, capsys, needle):
    """Exit status 2 and the last line of stderr an error naming `needle`."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    print(err[-1])
    assert e.value.code == 2 and "error:" in err[-1] and needle in err[-1]


def test_refusals(original, tmp_path, capsys):
    from paddle_vha.cli.make_heal_data import main

    src, export, text = original
    base = [src, "--out", str(tmp_path / "d"), "--export", export, "--no-progress", "--chat-tokens", "100"]
    refused(main, base + ["--text-tokens", "50"], capsys, "needs --text")
    refused(main, base + ["--samples", "8", "--batch", "4"], capsys, "samples 8 > batch 4")
    refused(main, base + ["--export", str(tmp_path)], capsys, "not an export folder")
    _run(original, tmp_path / "d", "--chat-tokens", "100", "--text-tokens", "0")
    refused(main, _argv(original, tmp_path / "d", "--chat-tokens", "100", "--text-tokens", "0", "--temperature", "0.9"),
            capsys, "written with temperature=0.7")


def test_a_second_writer_of_one_journal_is_refused(original, tmp_path, capsys):
    """Two make_heal_data runs appending to one PREFIX.jsonl would interleave their rounds: while one holds
    PREFIX.lock, another is refused in one line and the journal is left as it was."""
    from paddle_vha.cli.make_heal_data import main
    from paddle_vha.train.run_lock import hold_lock

    prefix = tmp_path / "d"
    _run(original, prefix, "--chat-tokens", "40", "--text-tokens", "0")
    before = open(str(prefix) + ".jsonl", "rb").read()
    held = hold_lock(str(prefix) + ".lock")  # another process's lock (flock: a second open file description)
    try:
        refused(main, _argv(original, prefix, "--chat-tokens", "200", "--text-tokens", "0"), capsys,
                "another make_heal_data is writing")
    finally:
        held.close()
    assert open(str(prefix) + ".jsonl", "rb").read() == before
    n = len(_journal_docs(prefix))
    _run(original, prefix, "--chat-tokens", str(40 + 4 * 12 * n), "--text-tokens", "0")  # released: it resumes
    assert len(open(str(prefix) + ".jsonl", "rb").read()) > len(before)


def test_store_teacher_command_writes_the_store_once_and_refuses_a_second_writer(original, tmp_path, capsys):
    """tools/store_teacher.py on make_heal_data's output (realistic vocabulary, 151,936): the store's top-K equals the
    export's logits' top-K on a window, the lock file is gone after, and a second writer or an existing --out is
    refused in one line."""
    from paddle_vha.cli.store_teacher import main
    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.train.run_lock import hold_lock
    from paddle_vha.train.stored_teacher import TeacherStore, stream_of

    src, export, _ = original
    prefix = tmp_path / "d"
    _run(original, prefix, "--chat-tokens", "60", "--text-tokens", "0")
    store = str(tmp_path / "store")
    argv = [src, str(prefix), "--out", store, "--export", export, "--seq-len", "16", "--top-k", "8", "--threads", "1",
            "--no-progress"]
    held = hold_lock(store + ".lock")
    try:
        refused(main, argv, capsys, "another store_teacher is writing it")
    finally:
        held.close()
    assert not os.path.exists(store) and not os.path.exists(store + ".partial")
    assert main(argv) == 0
    assert not os.path.exists(store + ".lock")
    st = TeacherStore(store)
    x = stream_of(str(prefix))[:16][None]
    sess = OrtDecoder.from_dir(export, threads=1)
    logits = np.asarray(sess.prefill(x.astype(np.int64))[0], np.float64)  # (1, 16, V)
    ids, logp, _ = st.window(0)
    lp = logits[0] - logits[0].max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    want = np.argsort(-lp, axis=-1)[:, :8]
    print(np.abs(np.take_along_axis(lp, ids, -1) - logp).max())
    assert (np.sort(ids, -1) == np.sort(want, -1)).mean() > 0.99
    assert np.allclose(np.take_along_axis(lp, ids, -1), logp, atol=1e-4)
    refused(main, argv, capsys, "exists")
