"""Distillation in tools/train.py (--teacher): the loss terms against a float64 reference written from their
definitions, the frozen teacher, a toy run that learns, resume equality, TP = 2 = one process, refusals, and the
teacher's load path at Qwen3-0.6B widths."""
import glob
import hashlib
import json
import os

import numpy as np
import paddle
import pytest

import oracle
from tp.launch import launch_train, train_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
TINY_TEACHER = dict(hidden_size=64, num_hidden_layers=4, intermediate_size=176, head_dim=16, num_attention_heads=8,
                    num_key_value_heads=4, vocab_size=256, max_position_embeddings=512, tie_word_embeddings=False)


# ---- the loss terms against float64 numpy ----------------------------------------------------------------------


def _log_softmax64(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _kl_ref(zs, zt, T, mask):
    """T^2 * mean over counted positions of sum_v p_t (log p_t - log p_s), p = softmax(z / T): float64."""
    ls, lt = _log_softmax64(zs / T), _log_softmax64(zt / T)
    per = (np.exp(lt) * (lt - ls)).sum(-1)
    return T * T * (per * mask).sum() / mask.sum()


def test_kd_terms_match_float64_reference():
    from paddle_vha.train.distill import hidden_term, kd_weight, kl_term, layer_map, mix

    rng = np.random.RandomState(0)
    B, S, V, h = 2, 5, 11, 6
    zs, zt = rng.randn(B, S, V) * 3, rng.randn(B, S, V) * 3
    labels = rng.randint(0, V, size=(B, S))
    labels[0, 1] = labels[1, 4] = -100  # ignored positions
    mask = (labels >= 0).astype(np.float64)
    hs = [rng.randn(B, S, h) for _ in range(2)]
    ht = [rng.randn(B, S, h) for _ in range(4)]
    t = lambda a: paddle.to_tensor(a.astype(np.float32))  # noqa: E731
    for T in (1.0, 2.0, 0.5):
        zs_t = t(zs)
        zs_t.stop_gradient = False
        got = kl_term(zs_t, t(zt), T, paddle.to_tensor(labels))
        ref = _kl_ref(zs, zt, T, mask)
        # d/dz_s of T^2 KL = T (p_s - p_t) / N per counted position (softmax at T), 0 at ignored ones
        ps, pt = np.exp(_log_softmax64(zs / T)), np.exp(_log_softmax64(zt / T))
        gref = T * (ps - pt) * mask[..., None] / mask.sum()
        got.backward()
        gerr = np.abs(zs_t.grad.numpy() - gref).max()
        print(f"T={T}: kl {float(got):.7f} vs float64 {ref:.7f} (|diff| {abs(float(got) - ref):.2e}); "
              f"grad max |diff| {gerr:.2e}")
        assert abs(float(got) - ref) < 1e-5 * max(1, abs(ref)) and gerr < 1e-6
    assert float(kl_term(t(zt), t(zt), 2.0)) == pytest.approx(0, abs=1e-6)  # KL(p || p) = 0
    # hidden-state MSE through the layer map (2 student layers onto 4 teacher layers: 0 -> 1, 1 -> 3)
    assert layer_map(2, 4) == [1, 3] and layer_map(3, 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="multiple"):
        layer_map(3, 4)
    got = float(hidden_term([t(a) for a in hs], [t(a) for a in ht], layer_map(2, 4), paddle.to_tensor(labels)))
    ref = np.mean([(((hs[l] - ht[m]) ** 2).mean(-1) * mask).sum() / mask.sum() for l, m in enumerate([1, 3])])
    print(f"hidden mse {got:.7f} vs float64 {ref:.7f}")
    assert abs(got - ref) < 1e-5 * ref
    # the mix, and the schedule
    assert float(mix(t(np.array(2.0)), t(np.array(3.0)), t(np.array(5.0)), 0.5, 0.25, 0.1)) == pytest.approx(
        0.5 * 2 + 0.25 * 3 + 0.1 * 5, rel=1e-6)
    assert float(mix(t(np.array(2.0)), None, None, 1.0, 0.0, 0.0)) == 2.0
    assert [kd_weight(2.0, "linear", s, 4) for s in range(4)] == [2.0, 1.5, 1.0, 0.5]
    assert kd_weight(2.0, "constant", 3, 4) == 2.0


def test_distiller_attention_and_hidden_terms_match_float64_oracle(tmp_path):
    """The Distiller's hooks on real models: a stock Qwen3 student (2 KV heads) against a stock Qwen3 teacher (4 KV
    heads), 2 layers each; its attention-output term, hidden-state term and logit KL equal those computed in float64
    from the saved weights by tests/oracle.py (each layer's attention output and decoder-layer output recorded there),
    and the mix is the weighted sum at the scheduled weights."""
    from _utils import config_dict, load_checkpoint_numpy
    from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

    from paddle_vha.train.distill import DistillSettings
    from paddle_vha.train.distiller import Distiller

    small = dict(TINY_TEACHER, num_hidden_layers=2)
    models, refs = {}, {}
    for name, kv, seed in (("student", 2, 3), ("teacher", 4, 5)):
        paddle.seed(seed)
        models[name] = Qwen3ForCausalLM(Qwen3Config(**{**small, "num_key_value_heads": kv}))
        models[name].eval()  # dropout-free forward; the hooks do not depend on the mode
        models[name].save_pretrained(str(tmp_path / name))
        state, cfg = load_checkpoint_numpy(str(tmp_path / name)), config_dict(models[name].config)
        attn_out, layer_in = [], []

        def attention(x, p, c, positions, past=None, layer=None, rec=attn_out):
            out = oracle.gqa_attention(x, p, c, positions, past, layer=layer)
            rec.append(out[0])
            return out

        logits, _ = oracle.causal_lm(IDS, state, cfg, attention=attention)
        refs[name] = dict(logits=logits, attn=attn_out, hidden=_oracle_layer_outputs(state, cfg, attn_out))
    settings = DistillSettings(ce_weight=0.5, kl_weight=1.0, temperature=2.0, hidden_weight=0.25, attn_weight=2.0,
                               schedule="linear")
    d = Distiller(models["student"], models["teacher"], settings)
    ids = paddle.to_tensor(IDS)

    def run_student():
        out = models["student"](input_ids=ids, return_dict=True)
        return paddle.to_tensor(1.5), out.logits, out

    r = d.step(run_student, ids, None, step=1, max_steps=4)
    s, t = refs["student"], refs["teacher"]
    want = dict(attn=np.mean([((a - b) ** 2).mean() for a, b in zip(s["attn"], t["attn"])]),
                hidden=np.mean([((a - b) ** 2).mean() for a, b in zip(s["hidden"], t["hidden"])]),
                kl=_kl_ref(s["logits"], t["logits"], 2.0, np.ones(IDS.shape)))
    for k, ref in want.items():
        got = float(getattr(r, k))
        print(f"{k}: distiller {got:.7f} vs float64 oracle {ref:.7f} (rel {abs(got - ref) / ref:.1e})")
        assert abs(got - ref) < 1e-4 * ref
    assert r.weights == pytest.approx((0.75, 0.1875, 1.5))  # (1 - 1/4) x each weight
    total = 0.5 * 1.5 + 0.75 * want["kl"] + 0.1875 * want["hidden"] + 1.5 * want["attn"]
    assert float(r.loss) == pytest.approx(total, rel=1e-4)
    d.close()  # hooks gone: a forward keeps nothing
    models["student"](input_ids=ids)
    assert d.attn[0].outputs == {} and d.hidden[0].outputs == {}


IDS = np.random.RandomState(1).randint(0, 256, size=(2, 7)).astype("int64")


def _oracle_layer_outputs(state, cfg, attn_out):
    """Each decoder layer's output (the residual stream after its MLP), replayed in float64 from the recorded
    attention outputs."""
    eps, x, outs = cfg["rms_norm_eps"], np.asarray(state["model.embed_tokens.weight"])[IDS], []
    for i, a in enumerate(attn_out):
        g = lambda n: state[f"model.layers.{i}.{n}"]  # noqa: E731
        x = x + a
        h = oracle.rms_norm(x, g("post_attention_layernorm.weight"), eps)
        mlp = oracle.silu(oracle.linear(h, g("mlp.gate_proj.weight"))) * oracle.linear(h, g("mlp.up_proj.weight"))
        x = x + oracle.linear(mlp, g("mlp.down_proj.weight"))
        outs.append(x)
    return outs


# ---- runs ---------------------------------------------------------------------------------------------------------


def _teacher(folder, **over):
    """A stock Qwen3 saved by PaddleFormers (random weights, fixed seed): 4 layers over 4 KV heads."""
    from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

    paddle.seed(5)
    Qwen3ForCausalLM(Qwen3Config(**{**TINY_TEACHER, **over})).save_pretrained(str(folder))
    return str(folder)


def _digest(folder):
    return {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest()
            for p in sorted(glob.glob(os.path.join(str(folder), "*")))}


def read_log(run_dir):
    with open(os.path.join(run_dir, "train_log.jsonl")) as f:
        return [json.loads(line) for line in f if '"loss"' in line]


KD = ["--distill_kl_weight", "1.0", "--distill_temperature", "2.0", "--distill_hidden_weight", "0.5",
      "--distill_schedule", "linear", "--distill_ce_weight", "0.5"]


@pytest.mark.slow
def test_distillation_learns_logs_terms_and_resumes(tmp_path):
    teacher = _teacher(tmp_path / "teacher")
    before = _digest(teacher)
    common = ["--teacher", teacher, *KD, "--max_steps", "8", "--save_steps", "4", "--logging_steps", "1",
              "--evaluation_strategy", "no", "--do_eval", "false", "--disable_tqdm", "true"]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    res = train_once(os.path.join(CONFIGS, "tiny-vha.json"), "--output_dir", a, *common)
    print(res.output[-2500:])
    assert res.returncode == 0, res.output
    assert "distill: teacher" in res.output and "replicated" in res.output
    log = {r["step"]: r for r in read_log(a)}
    assert sorted(log) == list(range(1, 9))
    for step, r in log.items():  # the logged total is the mix of the logged terms at the logged weights
        w = 1.0 * (1 - (step - 1) / 8)
        assert r["kd_kl_weight"] == pytest.approx(w) and r["kd_hidden_weight"] == pytest.approx(0.5 * w)
        mixed = 0.5 * r["ce"] + r["kd_kl_weight"] * r["kd_kl"] + r["kd_hidden_weight"] * r["kd_hidden"]
        assert abs(r["loss"] - mixed) < 1e-4 * r["loss"], (step, r)
    print("step  ce  kd_kl  kd_hidden:", [(s, round(r["ce"], 4), round(r["kd_kl"], 4), round(r["kd_hidden"], 4))
                                         for s, r in log.items()])
    assert log[8]["ce"] < log[1]["ce"] - 1.0 and log[8]["loss"] < log[1]["loss"]
    assert _digest(teacher) == before  # the teacher folder is an input: untouched

    # distillation alone (no cross-entropy, constant weights) pulls the student to the teacher
    kd_only = str(tmp_path / "kd")
    res = train_once(os.path.join(CONFIGS, "tiny-vha.json"), "--output_dir", kd_only, "--teacher", teacher,
                     "--distill_ce_weight", "0", "--distill_hidden_weight", "0.5", "--max_steps", "8",
                     "--warmup_steps", "1", "--learning_rate", "0.01", "--logging_steps", "1", "--save_strategy", "no",
                     "--do_eval", "false", "--disable_tqdm", "true")
    assert res.returncode == 0, res.output
    kd = {r["step"]: r for r in read_log(kd_only)}
    print("KD only, step: kd_kl, kd_hidden:", {s: (round(r["kd_kl"], 4), round(r["kd_hidden"], 4)) for s, r in kd.items()})
    assert kd[8]["kd_kl"] < 0.75 * kd[1]["kd_kl"] and kd[8]["kd_hidden"] < 0.8 * kd[1]["kd_hidden"]
    assert all(abs(r["loss"] - r["kd_kl"] - 0.5 * r["kd_hidden"]) < 1e-4 * r["loss"] for r in kd.values())

    # checkpoints hold the student only: every saved tensor and optimizer state is a student parameter's
    from paddle_vha.train.resume import saved_global_shapes

    saved = saved_global_shapes(os.path.join(a, "checkpoint-4", "model_state"))
    assert saved and all(not k.startswith("teacher") for k in saved)
    student = json.load(open(os.path.join(a, "model", "config.json")))
    assert student["model_type"] == "qwen3_vha" and student["num_hidden_layers"] == 2
    assert not any("layers.2." in k or "layers.3." in k for k in saved)  # the 4-layer teacher's layers are not there

    # a fresh process resuming from checkpoint-4 reproduces steps 5..8, term by term
    res = train_once(os.path.join(CONFIGS, "tiny-vha.json"), "--output_dir", b, *common,
                     "--resume_from_checkpoint", os.path.join(a, "checkpoint-4"))
    assert res.returncode == 0, res.output
    resumed = {r["step"]: r for r in read_log(b)}
    assert sorted(resumed) == [5, 6, 7, 8]
    worst = max(abs(resumed[s][k] - log[s][k]) for s in resumed for k in ("loss", "ce", "kd_kl", "kd_hidden"))
    print(f"resumed vs uninterrupted, steps 5-8: max |diff| over loss and terms {worst:.2e}")
    assert worst <= 1e-6


def test_teacher_frozen_through_the_trainer(tmp_path):
    """In-process, PaddleFormers' Trainer itself: after 3 steps the teacher's weights are bitwise what they were, no
    gradient reached them, the optimizer holds state for the student's parameters only, and the student moved."""
    from paddle_vha.train.arguments import parse
    from paddle_vha.train.distill import DistillSettings
    from paddle_vha.train.distill_trainer import DistillTrainer
    from paddle_vha.train.teacher import distill_plan, load_teacher
    from paddle_vha.train.run_model import build_config
    from paddle_vha.train.run_data import build_data

    teacher_dir = _teacher(tmp_path / "teacher")
    m, d, args, req = parse([os.path.join(CONFIGS, "tiny-vha.json"), "--output_dir", str(tmp_path / "o"),
                             "--max_steps", "3", "--teacher", teacher_dir, "--distill_hidden_weight", "1.0",
                             "--save_strategy", "no", "--do_eval", "false", "--logging_steps", "1",
                             "--disable_tqdm", "true", "--corpus_mb", "0.5"])
    args.dataloader_shuffle = False
    run_model = build_config(m, d, args, 1)
    config, model_cls = run_model.config, run_model.model_cls
    plan = distill_plan(args, config)
    fam, tcfg, settings = plan.family, plan.config, plan.settings
    assert settings == DistillSettings(hidden_weight=1.0) and not plan.stored
    train, _, _ = build_data(d, args, config.vocab_size)
    model = model_cls(config)
    teacher = load_teacher(teacher_dir, fam, tcfg)
    t_before = {k: v.numpy().copy() for k, v in teacher.state_dict().items()}
    s_before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    trainer = DistillTrainer(model=model, args=args, train_dataset=train, teacher=teacher, distill=settings)
    trainer.train()
    assert not teacher.training and all(p.stop_gradient and p.grad is None for p in teacher.parameters())
    changed = [k for k, v in teacher.state_dict().items() if not np.array_equal(v.numpy(), t_before[k])]
    assert changed == [], changed
    moved = sum(not np.array_equal(v.numpy(), s_before[k]) for k, v in model.state_dict().items())
    assert moved > 0.9 * len(s_before)
    opt_params = {id(p) for g in trainer.optimizer._param_groups for p in (g["params"] if isinstance(g, dict) else [g])}
    assert opt_params == {id(p) for p in model.parameters() if not p.stop_gradient}
    assert not opt_params & {id(p) for p in teacher.parameters()}
    accum = trainer.optimizer.state_dict()
    teacher_names = {p.name for p in teacher.parameters()}
    assert accum and not any(any(t in k for t in teacher_names) for k in accum), "optimizer state for the teacher"


def test_refusals(tmp_path, capsys, monkeypatch):
    """One line, exit status 2, before anything is built or written."""
    from paddle_vha.cli import train as tool

    monkeypatch.chdir(ROOT)
    good = _teacher(tmp_path / "teacher")
    other_vocab = _teacher(tmp_path / "vocab512", vocab_size=512)
    alien = tmp_path / "alien"
    alien.mkdir()
    (alien / "config.json").write_text(json.dumps({"model_type": "gemma3", "vocab_size": 256}))
    deep3 = _teacher(tmp_path / "deep3", num_hidden_layers=3)
    cases = [
        (["--teacher", str(tmp_path / "missing")], f"teacher {tmp_path / 'missing'}: no such folder"),
        (["--teacher", other_vocab], "vocab_size 512 differs from the student's 256"),
        (["--teacher", str(alien)], "model_type 'gemma3' is not one of"),
        (["--teacher", deep3, "--distill_hidden_weight", "1"], "2 student and 3 teacher layers"),
        (["--teacher", good, "--distill_temperature", "0"], "distill_temperature must be a finite number > 0"),
        (["--teacher", good, "--distill_schedule", "cosine"], "distill_schedule 'cosine' is not one of"),
        (["--teacher", good, "--distill_hidden_weight", "1", "--recompute_granularity", "full"],
         "recomputed decoder layers"),
    ]
    for args, expect in cases:
        out = tmp_path / "o"
        with pytest.raises(SystemExit) as exc:
            tool.main(["configs/tiny-vha.json", *args, "--output_dir", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        print(err[-1] if err else "(nothing)")
        assert exc.value.code == 2 and err and err[-1].startswith("error:") and expect in err[-1], (args, err[-3:])
        assert not os.path.exists(out)
    # the dry run names the teacher and counts its weights in the memory need
    capsys.readouterr()
    assert tool.main(["configs/tiny-vha.json", "--teacher", good, "--dry_run", "true",
                      "--output_dir", str(tmp_path / "dry")]) == 0
    printed = capsys.readouterr().out
    assert "distill: teacher" in printed and "teacher " in printed.split("memory:")[1], printed


@pytest.mark.slow
@pytest.mark.multirank
def test_distillation_tp2_equals_one_process(tmp_path):
    """configs/tiny-vha-tp2.json with a teacher: TP = 2 under the launcher (teacher replicated) logs the same loss and
    terms as one process."""
    teacher = _teacher(tmp_path / "teacher")
    cfg = os.path.join(CONFIGS, "tiny-vha-tp2.json")
    one, two = str(tmp_path / "tp1"), str(tmp_path / "tp2")
    res = train_once(cfg, "--tensor_parallel_degree", "1", "--output_dir", one, "--teacher", teacher, *KD)
    assert res.returncode == 0, res.output
    res = launch_train(tmp_path / "logs", cfg, "--output_dir", two, "--teacher", teacher, *KD)
    assert res.returncode == 0, res.output
    l1, l2 = read_log(one), read_log(two)
    assert [r["step"] for r in l1] == [r["step"] for r in l2] and len(l1) >= 6
    worst = max(abs(a[k] - b[k]) for a, b in zip(l1, l2) for k in ("loss", "ce", "kd_kl", "kd_hidden"))
    print(f"TP=2 vs one process over {len(l1)} records: max |diff| over loss and terms {worst:.2e}")
    assert worst < 1e-5


@pytest.mark.slow
@pytest.mark.multirank
def test_distillation_dp2_equals_one_process(tmp_path):
    """Two data-parallel ranks (batch 4 each) with a teacher log the same loss and terms as one process with batch 8:
    every step to 1e-5 relative (measured: <= 1e-7). Data parallelism on the CPU needs recompute_granularity full (PaddleFormers then
    all-reduces the gradients itself), and recompute leaves out the per-layer terms: CE + logit KL here."""
    teacher = _teacher(tmp_path / "teacher")
    cfg = os.path.join(CONFIGS, "tiny-vha-tp2.json")
    kd = ["--teacher", teacher, "--distill_kl_weight", "1.0", "--distill_temperature", "2.0",
          "--distill_ce_weight", "0.5", "--distill_schedule", "linear", "--logging_steps", "1", "--max_steps", "6",
          "--tensor_parallel_degree", "1", "--recompute_granularity", "full"]
    one, two = str(tmp_path / "dp1"), str(tmp_path / "dp2")
    res = train_once(cfg, "--output_dir", one, "--per_device_train_batch_size", "8", *kd)
    assert res.returncode == 0, res.output
    res = launch_train(tmp_path / "logs", cfg, "--output_dir", two, "--per_device_train_batch_size", "4", *kd)
    assert res.returncode == 0, res.output
    l1, l2 = read_log(one), read_log(two)
    assert [r["step"] for r in l1] == [r["step"] for r in l2] == list(range(1, 7))
    rel = [max(abs(a[k] - b[k]) / abs(a[k]) for k in ("loss", "ce", "kd_kl")) for a, b in zip(l1, l2)]
    print("DP=2 vs one process, per step max rel |diff| over loss, ce, kd_kl:", [f"{x:.1e}" for x in rel])
    assert max(rel) <= 1e-5
    assert l2[-1]["kd_kl"] < l2[0]["kd_kl"]  # it learned from the teacher


# ---- realistic width ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_teacher_load_at_qwen3_0_6b_width(tmp_path):
    """A 2-layer Qwen3-0.6B-shaped hub checkpoint (sharded bf16, head_dim 128 != hidden / heads, tied embeddings) as
    the teacher: loaded frozen in float32, its logits those of PaddleFormers' own from_pretrained of the folder, and
    its weights counted in the memory need."""
    from paddleformers.transformers import Qwen3ForCausalLM

    from paddle_vha.train.memory import train_need, weight_count
    from paddle_vha.train.teacher import load_teacher, teacher_config
    from tools.fixtures.qwen3_shaped import make_checkpoint

    folder = str(tmp_path / "qwen3")
    make_checkpoint(folder, "0.6b", layers=2, tokenizer=False)

    class Student:  # the fields the teacher is checked against
        vocab_size, hidden_size, num_hidden_layers = 151936, 1024, 2

    fam, cfg = teacher_config(folder, Student, layer_terms=("distill_hidden_weight",))
    assert fam.model_type == "qwen3" and cfg.head_dim == 128 and cfg.num_key_value_heads == 8
    teacher = load_teacher(folder, fam, cfg)
    assert all(p.stop_gradient for p in teacher.parameters()) and not teacher.training
    assert str(teacher.lm_head.weight.dtype).endswith("float32")
    ids = paddle.to_tensor(np.random.RandomState(0).randint(0, 151936, size=(1, 12)).astype("int64"))
    with paddle.no_grad():
        got = teacher(input_ids=ids, return_dict=True).logits.numpy()
    ref_model = Qwen3ForCausalLM.from_pretrained(folder, dtype="float32")
    ref_model.eval()
    with paddle.no_grad():
        ref = ref_model(input_ids=ids, return_dict=True).logits.numpy()
    err = float(np.abs(got - ref).max())
    print(f"teacher logits vs PaddleFormers from_pretrained: max |diff| {err:.2e} (|logits| max {np.abs(ref).max():.2f})")
    assert err < 1e-4
    n = weight_count(cfg)
    assert n == sum(p.size for p in teacher.parameters()) == 187_045_376  # the tied head counted once
    with_t, _ = train_need(cfg, 1, 64, teacher_weights=n)
    without, _ = train_need(cfg, 1, 64)
    assert with_t - without == 4 * n + 32 * 64 * 151936


@pytest.mark.slow
def test_every_term_of_the_loss_is_logged_and_they_sum_to_the_loss(tmp_path):
    """With every KD term on (KL, hidden-state and attention-output MSE), each step's train_log.jsonl record and console
    line hold every term of the mix and its weight, and the logged loss is their weighted sum (the attention term was
    in the loss but logged nowhere: the log's whitelist missed it, so the logged parts did not add up)."""
    TERMS = ("ce", "kd_kl", "kd_hidden", "kd_attn")  # the loss of docs/training.md with every weight set
    TERM_WEIGHTS = ("kd_kl_weight", "kd_hidden_weight", "kd_attn_weight")
    teacher = _teacher(tmp_path / "teacher")
    run = str(tmp_path / "run")
    res = train_once(os.path.join(CONFIGS, "tiny-vha.json"), "--output_dir", run, "--teacher", teacher,
                     "--distill_ce_weight", "0.5", "--distill_kl_weight", "1.0", "--distill_hidden_weight", "0.3",
                     "--distill_attn_weight", "0.7", "--max_steps", "3", "--logging_steps", "1", "--save_strategy",
                     "no", "--do_eval", "false", "--disable_tqdm", "true")
    assert res.returncode == 0, res.output
    log = read_log(run)
    assert [r["step"] for r in log] == [1, 2, 3]
    for r in log:
        assert all(k in r for k in TERMS + TERM_WEIGHTS), sorted(r)
        parts = 0.5 * r["ce"] + sum(r[w] * r[t] for t, w in zip(TERMS[1:], TERM_WEIGHTS))
        print(f"step {r['step']}: loss {r['loss']:.6f}, weighted parts {parts:.6f}, kd_attn {r['kd_attn']:.4g}")
        assert r["kd_attn"] > 0 and abs(r["loss"] - parts) < 1e-4 * r["loss"], r
    console = [ln for ln in res.output.splitlines() if ln.startswith("step ") and " loss " in ln]
    assert len(console) == 3 and all(f" {k} " in ln for ln in console for k in TERMS), console


@pytest.mark.parametrize("terms", [["--distill_attn_weight", "0.5"], ["--distill_hidden_weight", "0.5"],
                                   ["--distill_hidden_weight", "0.5", "--distill_attn_weight", "0.5"]])
def test_a_teacher_of_another_width_names_the_weight_that_asked(tmp_path, capsys, terms):
    """A teacher with another hidden size and a per-layer term: the refusal names the weight that was set (with only
    distill_attn_weight set it said "set distill_hidden_weight 0")."""
    from hostile import refused
    from paddle_vha.cli import train

    teacher = _teacher(tmp_path / "wide", hidden_size=96)
    names = [t[2:] for t in terms[::2]]
    line = refused(train.main, [os.path.join(CONFIGS, "tiny-vha.json"), "--output_dir", str(tmp_path / "run"),
                                "--teacher", teacher, *terms, "--max_steps", "2"], capsys,
                   f"set {' and '.join(names)} 0")
    assert "hidden_size 96 differs" in line
    for n in ("distill_hidden_weight", "distill_attn_weight"):
        assert (n in line) == (n in names), (n, line)
    assert not (tmp_path / "run").exists()
