"""tools/generate.py with a real tokenizer: text in and out through the export folder's tokenizer, EOS from
generation_config.json (a list of ids, as Qwen3's), rows of a batch stopping on their own, the chat template.

The tokenizer is the fixture's (tools/fixtures/qwen3_shaped.py: a trained byte-level BPE with Qwen3's special-token
ids 151643-151645, tokenizer_config.json with a chat template, generation_config.json with EOS [151645, 151643]),
copied next to a small export made by the export code (hidden 48, vocabulary 151,936 so every tokenizer id exists).
References are independent: the `tokenizers` library's own decode, a greedy loop without stopping cut at the first
EOS by hand, and Hugging Face's apply_chat_template / decode in the side environment (tools/hf_env.sh).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from hostile import ROOT, refused, save_stock

VOCAB = 151936
EOS = [151645, 151643]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from tools.fixtures.qwen3_shaped import write_tokenizer

    d = tmp_path_factory.mktemp("tok")
    write_tokenizer(str(d))
    return str(d)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, tok_dir):
    """A small stock-Qwen3 export with the fixture's tokenizer files beside it (the export engineer's real-vocab
    export copies them itself)."""
    from paddle_vha.export.onnx_export import export_onnx

    root = tmp_path_factory.mktemp("gen-text")
    src = save_stock(root / "in", vocab_size=VOCAB, tie_word_embeddings=True, max_position_embeddings=64)
    out = str(root / "out")
    export_onnx(src, out, decode_steps=1, log=lambda m: None)
    for f in os.listdir(tok_dir):
        shutil.copyfile(os.path.join(tok_dir, f), os.path.join(out, f))
    return out


def _copy(export_dir, tmp_path, **gen_changes):
    d = str(tmp_path / "e")
    shutil.copytree(export_dir, d)
    if gen_changes:
        p = os.path.join(d, "generation_config.json")
        gen = json.load(open(p))
        gen.update(gen_changes)
        json.dump(gen, open(p, "w"))
    return d


class ScriptedSession:
    """A decoder whose greedy token at step t of row r is script[r][t]: one-hot logits, so the loop's stopping can be
    checked against the script cut at its first EOS by hand. Records the ids fed back."""

    def __init__(self, script, vocab=16):
        self.script, self.vocab, self.fed, self.t = np.asarray(script), vocab, [], 0

    def _logits(self):
        z = np.full((len(self.script), 1, self.vocab), -5.0, np.float32)
        z[np.arange(len(self.script)), 0, self.script[:, self.t]] = 5.0
        return z

    def prefill(self, ids, mask):
        return self._logits(), None

    def step(self, ids, cache, mask):
        self.fed.append(ids[:, 0].copy())
        self.t += 1
        return self._logits(), None


def test_rows_stop_at_their_own_eos_and_finished_rows_are_padded():
    from paddle_vha.serve.generate import generate

    script = [[3, 4, 9, 5, 6, 7],   # EOS 9 at step 3
              [3, 8, 4, 5, 6, 7],   # EOS 8 at step 2 (the second id of the list)
              [1, 2, 3, 4, 5, 6]]   # none: runs to max_new_tokens... unless all others stop first
    sess = ScriptedSession(script)
    res = generate(sess, np.ones((3, 2), np.int64), max_new_tokens=5, eos_token_id=[9, 8], pad_token_id=0)
    print(res.tokens, res.lengths, res.finished)
    assert res.tokens.tolist() == [[3, 4, 9, 0, 0], [3, 8, 0, 0, 0], [1, 2, 3, 4, 5]]
    assert res.lengths.tolist() == [3, 2, 5] and res.finished.tolist() == [True, True, False]
    assert [res.row(i).tolist() for i in range(3)] == [[3, 4], [3], [1, 2, 3, 4, 5]]
    assert res.row(0, keep_eos=True).tolist() == [3, 4, 9]
    assert [f.tolist() for f in sess.fed] == [[3, 3, 1], [4, 8, 2], [9, 0, 3], [0, 0, 4]]  # pads fed after EOS

    sess = ScriptedSession(script[:2])  # every row finished: the loop ends at the last EOS, not at max_new_tokens
    res = generate(sess, np.ones((2, 2), np.int64), max_new_tokens=6, eos_token_id=[9, 8])
    assert res.tokens.shape == (2, 3) and len(sess.fed) == 2 and res.tokens[1, 2] == 9  # pad: the first EOS id
    single = generate(ScriptedSession(script[:1]), np.ones((1, 2), np.int64), 6, eos_token_id=9)
    assert single.row(0).tolist() == [3, 4] and single.finished.tolist() == [True]


def _reference_cut(row, eos):
    row = list(row)
    hits = [i for i, t in enumerate(row) if t in eos]
    return row[: hits[0]] if hits else row


def test_text_prompts_stop_at_generation_config_eos_and_decode_like_the_tokenizer(export_dir, tmp_path, capsys):
    """The CLI's text: prompts encoded with tokenizer.json, rows cut at generation_config.json's EOS list, decoded as
    the tokenizers library decodes them; checked against a greedy run that does not stop."""
    from tokenizers import Tokenizer

    from paddle_vha.cli.generate import main
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.ort_session import OrtDecoder

    tok = Tokenizer.from_file(os.path.join(export_dir, "tokenizer.json"))
    prompts = ["def fib(n):", "import os"]
    ids = [tok.encode(p, add_special_tokens=False).ids for p in prompts]
    width = max(map(len, ids))
    batch = np.array([[0] * (width - len(x)) + x for x in ids])
    mask = np.array([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    free = generate(OrtDecoder.from_dir(export_dir), batch, 8, attention_mask=mask).tokens  # never stops
    print("greedy without EOS:", free.tolist())
    k = next(i for i in range(2, 8) if free[0, i] not in free[0, :i])
    eos = [int(free[0, k]), EOS[1]]  # row 0 stops after k tokens; row 1 wherever that id first appears, if at all
    d = _copy(export_dir, tmp_path, eos_token_id=eos, do_sample=False)
    capsys.readouterr()
    assert main([d, "--prompt", prompts[0], "--prompt", prompts[1], "--max-new-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    want = [_reference_cut(r, eos) for r in free.tolist()]
    assert len(want[0]) == k
    lines = out.splitlines()
    assert lines == [f"[{i}] {p}{tok.decode(w, skip_special_tokens=True)}" for i, (p, w) in enumerate(zip(prompts, want))]
    stopped = sum(len(w) < 8 for w in want)
    assert f"{stopped} of 2 stopped at EOS" in err

    assert main([d, "--prompt", prompts[0], "--max-new-tokens", "8", "--ignore-eos", "--show-special"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [f"[0] {prompts[0]}{tok.decode(free[0].tolist(), skip_special_tokens=False)}"]


def test_decode_skips_special_tokens_unless_asked(tok_dir):
    from tokenizers import Tokenizer

    from paddle_vha.serve.text import load_codec

    codec = load_codec(tok_dir, VOCAB)
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    ids = [151644] + tok.encode("user\nprint('héllo')", add_special_tokens=False).ids + [151645, 151643]
    print(repr(codec.decode(ids)), repr(codec.decode(ids, skip_special=False)))
    assert codec.decode(ids) == "user\nprint('héllo')"
    assert codec.decode(ids, skip_special=False) == "<|im_start|>user\nprint('héllo')<|im_end|><|endoftext|>"
    assert codec.encode("<|im_end|>") == [151645]  # special tokens in text are the tokens, as HF encodes them


def test_generation_defaults_come_from_generation_config(export_dir, tmp_path, capsys):
    from paddle_vha.cli.generate import _sampling, build_parser as _parser
    from paddle_vha.serve.text import generation_defaults

    gen = generation_defaults(export_dir)
    assert gen["eos"] == EOS and gen["pad"] == 151643 and gen["do_sample"] is True
    assert _sampling(_parser().parse_args([export_dir, "--prompt", "x"]), gen) == \
        dict(do_sample=False, temperature=1.0, top_k=0, top_p=1.0)
    assert "pass --sample to follow it" in capsys.readouterr().err
    got = _sampling(_parser().parse_args([export_dir, "--prompt", "x", "--sample", "--top-k", "5"]), gen)
    assert got == dict(do_sample=True, temperature=0.6, top_k=5, top_p=0.95)
    d = _copy(export_dir, tmp_path)
    os.remove(os.path.join(d, "generation_config.json"))
    assert generation_defaults(d)["eos"] == []  # the tiny export's config.json declares no eos_token_id


CHAT_TEMPLATES = {
    "fixture": None,  # the fixture's own (chat_template.jinja)
    "qwen-like": (
        "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
        "{%- endif %}\n"
        "{%- set ns = namespace(n=0) %}\n"
        "{%- for message in messages %}\n"
        "  {%- if message.role == 'system' and not loop.first %}{{ raise_exception('system must come first') }}"
        "{%- endif %}\n"
        "  {%- if message.role != 'system' %}\n"
        "    {%- set ns.n = ns.n + 1 %}\n"
        "    {{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>' + '\\n' }}\n"
        "  {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|im_start|>assistant\\n' }}{% if ns.n > 1 %}{{ {'turns': ns.n} | tojson }}{% endif %}\n"
        "{%- endif %}\n"),
}
CHATS = [[{"role": "user", "content": "Write a haiku about caches."}],
         [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  hi  "},
          {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Ünïcode ✓"}]]

HF_SCRIPT = r"""
import json, sys
from transformers import AutoTokenizer
folders, ids, chats = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
out = []
for folder in folders:
    tok = AutoTokenizer.from_pretrained(folder)
    out.append({
        "text": [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats],
        "ids": [list(tok.apply_chat_template(c, tokenize=True, add_generation_prompt=True)) for c in chats],
        "decode": [tok.decode(ids, skip_special_tokens=True), tok.decode(ids, skip_special_tokens=False)],
    })
print(json.dumps(out))
"""


def _template_folder(tok_dir, d, template):
    shutil.copytree(tok_dir, d)
    if template is not None:  # in tokenizer_config.json instead of chat_template.jinja
        os.remove(os.path.join(d, "chat_template.jinja"))
        p = os.path.join(d, "tokenizer_config.json")
        cfg = json.load(open(p))
        cfg["chat_template"] = template
        json.dump(cfg, open(p, "w"))
    return d


def test_chat_template_and_decode_match_hugging_face(tok_dir, tmp_path):
    """render_chat + encode equal Hugging Face's apply_chat_template (text and ids), decode equals its decode, for the
    fixture's template (chat_template.jinja) and a Qwen-like one (namespace, loop.first, trim, tojson,
    raise_exception) in tokenizer_config.json."""
    from paddle_vha.serve.text import load_codec, render_chat

    folders = [_template_folder(tok_dir, str(tmp_path / name), t) for name, t in CHAT_TEMPLATES.items()]
    codec = load_codec(folders[0], VOCAB)
    ids = [151644] + codec.encode("assistant\n  x = 1  ") + [151645, 151643]
    env = dict(os.environ, HF_VENV=os.environ.get("HF_VENV", os.path.join(ROOT, ".venv-hf")))
    r = subprocess.run(["bash", os.path.join(ROOT, "tools", "hf_env.sh"), "python", "-c", HF_SCRIPT, json.dumps(folders),
                        json.dumps(ids), json.dumps(CHATS)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    for d, hf in zip(folders, json.loads(r.stdout.strip().splitlines()[-1])):
        ours = [render_chat(d, c) for c in CHATS]
        for a, b in zip(ours, hf["text"]):
            print(repr(a), "\n", repr(b))
        assert ours == hf["text"]
        assert [codec.encode(t) for t in ours] == hf["ids"]
        assert [codec.decode(ids), codec.decode(ids, skip_special=False)] == hf["decode"]


def test_chat_end_to_end_and_refused_without_a_template(export_dir, tmp_path, capsys):
    from paddle_vha.cli.generate import _prompts, main, build_parser as _parser
    from paddle_vha.serve.session import read_export_info
    from paddle_vha.serve.text import load_codec, render_chat

    info = read_export_info(export_dir)
    args = _parser().parse_args([export_dir, "--chat", "--prompt", "hi there"])
    ids = _prompts(args, info, load_codec(export_dir, info["vocab_size"]))
    text = render_chat(export_dir, [{"role": "user", "content": "hi there"}])
    assert text == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == load_codec(export_dir, VOCAB).encode(text) and ids[0][0] == 151644 and 151645 in ids[0]
    assert main([export_dir, "--chat", "--prompt", "hi there", "--max-new-tokens", "3"]) == 0
    capsys.readouterr()

    d = _copy(export_dir, tmp_path)
    os.remove(os.path.join(d, "chat_template.jinja"))
    p = os.path.join(d, "tokenizer_config.json")
    cfg = json.load(open(p))
    del cfg["chat_template"]
    json.dump(cfg, open(p, "w"))
    refused(main, [d, "--chat", "--prompt", "hi"], capsys, "no chat template")
    refused(main, [d, "--chat", "--prompt-ids", "1,2"], capsys, "--chat takes --prompt text")
