"""tools/shrink_kv.py end to end on a small stock Qwen3 with a real tokenizer and chat template (the fixture of
test_heal_data.py): every stage runs (convert, data, teacher, heal, fold, report; the export stage is export_onnx, tested on
its own, and skipped here with --export none), the result is a stock checkpoint with the asked KV heads, the table's original row is the original against itself
(KL 0, agreement 1, every answer identical), the KV bytes follow the heads, a second run skips every stage, other
settings on the same OUT are refused in one line. The table's measures against float64 written here."""
import json
import os

import numpy as np
import pytest

from test_heal_data import original  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


def test_one_command_converts_heals_folds_exports_and_reports(original, tmp_path, capsys):  # noqa: F811
    from paddle_vha.cli.shrink_kv import main

    src, export, _ = original
    out = tmp_path / "out"
    argv = [src, str(out), "--kv-heads", "1", "--refine-steps", "1", "--chat-tokens", "600", "--tokens", "512",
            "--seq-len", "32", "--batch", "2", "--export", "none", "--threads", "1", "--original-export", export,
            "--method", "calibrated", "--max-new", "16"]
    assert main(argv) == 0
    said = capsys.readouterr()
    print(said.out[-3000:])
    cfg = json.load(open(out / "model" / "config.json"))
    assert cfg["model_type"] == "qwen3" and cfg["num_key_value_heads"] == 1
    assert not os.path.exists(out / "export")  # --export none (the export stage is export_onnx's own, tested there)
    rep = json.load(open(out / "report.json"))
    rows = rep["rows"]
    assert list(rows) == ["original", "converted (step 0)", "healed"]
    o = rows["original"]
    assert abs(o["kl"]) < 1e-6 and o["chat_agreement"] == 1.0 and o["identical_answers"] == len(rep["probes"])
    assert rows["healed"]["kv_bytes_per_token"] * 2 == o["kv_bytes_per_token"]
    assert set(json.load(open(out / "stages.json"))["done"]) == {"convert", "data", "teacher", "heal", "fold",
                                                                 "export", "report"}
    assert "| healed |" in open(out / "report.md").read()
    log = [json.loads(x) for x in open(out / "heal" / "train_log.jsonl")]
    assert any("kd_kl" in r and "tokens_per_second" in r for r in log)
    # again: every stage done earlier, nothing rerun
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("done earlier") == 7
    with pytest.raises(SystemExit) as e:
        main(argv + ["--tokens", "2048"])
    assert e.value.code == 2 and "tokens differ" in capsys.readouterr().err.strip().splitlines()[-1]


def test_report_measures_against_float64(tmp_path):
    """measure() of a model against a reference: perplexity, KL, agreement and chat KL recomputed here in float64 from
    the two models' logits."""
    import paddle
    from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

    from paddle_vha.train.heal_report import Reference, measure

    cfg = dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64, head_dim=8, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=97, max_position_embeddings=128)
    paddle.seed(1)
    a = Qwen3ForCausalLM(Qwen3Config(**cfg))
    paddle.seed(2)
    b = Qwen3ForCausalLM(Qwen3Config(**cfg))
    rng = np.random.default_rng(0)
    windows = rng.integers(0, 97, (3, 18))
    prompts = [list(rng.integers(0, 97, n)) for n in (5, 9)]
    ref = Reference(a, windows, prompts, eos=[3], max_new=7)
    row = measure(b, ref, answers=False)

    def logits(m, ids):
        with paddle.no_grad():
            return m(paddle.to_tensor(np.asarray(ids, np.int64)), return_dict=True).logits.numpy().astype(np.float64)

    def lsm(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    nll, kl = [], []
    for w in windows:
        la, lb = lsm(logits(a, w[None, :-1])[0]), lsm(logits(b, w[None, :-1])[0])
        nll += list(-lb[np.arange(17), w[1:]])
        kl += list((np.exp(la) * (la - lb)).sum(-1))
    hit = tot = 0
    ckl = []
    for p, ans in zip(ref.prompts, ref.answers):
        ids = [p + ans[:-1]]
        la, lb = lsm(logits(a, ids)[0, len(p) - 1:]), lsm(logits(b, ids)[0, len(p) - 1:])
        assert list(la.argmax(-1)) == ans, "the reference answers are the original's greedy tokens (cache = full forward)"
        hit += int((lb.argmax(-1) == np.asarray(ans)).sum())
        tot += len(ans)
        ckl += list((np.exp(la) * (la - lb)).sum(-1))
    want = dict(ppl=float(np.exp(np.mean(nll))), kl=float(np.mean(kl)), chat_agreement=hit / tot,
                chat_kl=float(np.mean(ckl)))
    print({k: (row[k], want[k]) for k in want})
    for k in want:
        assert abs(row[k] - want[k]) <= 1e-4 * max(1.0, abs(want[k])), k
