"""The stored teacher (paddle_vha/train/stored_teacher.py, tools/store_teacher.py, tools/train.py --teacher STORE):
its top-K and remainder against a float64 reference written from the definitions, the stored KL and its gradient
against float64, the bound (stored KL <= full KL, equal at K = V), the store's resume and refusals, and the Trainer:
a stored-teacher run with K = V takes the same steps as the online teacher on the same windows."""
import json
import os

import numpy as np
import paddle
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")


def _log_softmax64(z):
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _topk_ref(z, k):
    """Per row: the k largest logits' ids (ties by lower id first), their log-probabilities, log(1 - their mass)."""
    lp = _log_softmax64(z)
    order = np.argsort(-np.asarray(z, np.float64), axis=-1, kind="stable")[..., :k]
    lpk = np.take_along_axis(lp, order, -1)
    return order, lpk, np.log(np.maximum(1 - np.exp(lpk).sum(-1), 1e-300))


def _stored_kl_ref(zs, ids, lpt, rest, mask):
    ls = _log_softmax64(zs)
    lsk = np.take_along_axis(ls, ids, -1)
    rs = np.log(np.maximum(1 - np.exp(lsk).sum(-1), 1e-300))
    per = (np.exp(lpt) * (lpt - lsk)).sum(-1) + np.exp(rest) * (rest - rs)
    return (per * mask).sum() / mask.sum(), per


@pytest.mark.parametrize("shape, k", [((2, 3, 101), 5), ((1, 1, 17), 1), ((3, 7, 49152), 64)])
def test_topk_matches_float64(shape, k):
    from paddle_vha.train.stored_teacher import topk_of_logits

    z = (np.random.default_rng(0).standard_normal(shape) * 4).astype(np.float32)
    ids, logp, rest = topk_of_logits(z, k)
    rid, rlp, rrest = _topk_ref(z, k)
    print(f"{shape} k={k}: ids equal {np.array_equal(ids, rid)}, logp max err {np.abs(logp - rlp).max():.2e}, "
          f"rest max err {np.abs(rest - rrest).max():.2e}")
    assert np.array_equal(ids, rid)
    assert np.abs(logp - rlp).max() < 2e-5 and np.abs(rest - rrest).max() < 2e-4


def test_stored_kl_and_gradient_match_float64_and_the_bound():
    from paddle_vha.train.stored_teacher import stored_kl, topk_of_logits

    rng = np.random.default_rng(1)
    B, S, V = 2, 5, 37
    zs, zt = rng.standard_normal((B, S, V)) * 3, rng.standard_normal((B, S, V)) * 3
    labels = rng.integers(0, V, (B, S))
    labels[0, 2] = labels[1, 0] = -100
    mask = (labels >= 0).astype(np.float64)
    lt, ls = _log_softmax64(zt), _log_softmax64(zs)
    full = ((np.exp(lt) * (lt - ls)).sum(-1) * mask).sum() / mask.sum()
    for k in (1, 4, 16, V):
        ids, lpt, rest = topk_of_logits(zt.astype(np.float32), k)
        ref, _ = _stored_kl_ref(zs, ids, lpt.astype(np.float64), rest.astype(np.float64), mask)
        x = paddle.to_tensor(zs.astype(np.float32), stop_gradient=False)
        got = stored_kl(x, paddle.to_tensor(ids.astype(np.int64)), paddle.to_tensor(lpt), paddle.to_tensor(rest),
                        paddle.to_tensor(labels))
        got.backward()
        # d/dz_s: for the coarsened KL, dKL/dz_v = p_s[v] (1 - ...) ... computed numerically in float64 instead
        eps, g_ref = 1e-6, np.zeros_like(zs)
        for idx in np.ndindex(zs.shape):
            d = np.zeros_like(zs)
            d[idx] = eps
            g_ref[idx] = (_stored_kl_ref(zs + d, ids, lpt, rest, mask)[0]
                          - _stored_kl_ref(zs - d, ids, lpt, rest, mask)[0]) / (2 * eps)
        gerr = np.abs(x.grad.numpy() - g_ref).max()
        print(f"K={k}: stored {float(got):.6f} vs float64 {ref:.6f}, full {full:.6f}; grad max |diff| {gerr:.2e}")
        assert abs(float(got) - ref) < 2e-5 * max(1, ref)
        assert gerr < 2e-5
        assert ref <= full + 1e-9, "the coarsened KL cannot exceed the full one"
        if k == V:
            assert abs(ref - full) < 1e-6


def _fake_teacher(V, seed=3):
    """logits(ids) = a fixed table row per token plus a term of the previous token: deterministic in the ids."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((V, V)).astype(np.float32) * 2, rng.standard_normal((V, V)).astype(np.float32)

    def fn(x):
        x = np.asarray(x)
        prev = np.concatenate([x[:, :1], x[:, :-1]], axis=1)
        return a[x] + b[prev]  # (b, S, V)
    return fn


def _data(prefix, V=50, docs=9, seed=0):
    from paddle_vha.train.datasets import write_pretrain_data

    rng = np.random.default_rng(seed)
    write_pretrain_data(str(prefix), [rng.integers(0, V, rng.integers(20, 80)) for _ in range(docs)], vocab_size=V)
    return str(prefix)


def test_store_resumes_and_refuses(tmp_path):
    from paddle_vha.train.stored_teacher import StoreError, TeacherStore, read_meta, stream_of, topk_of_logits, \
        write_windows

    prefix = _data(tmp_path / "d")
    fn = _fake_teacher(50)
    whole = write_windows(str(tmp_path / "whole"), prefix, 16, 8, fn, teacher="t", batch=3)
    calls = []

    def dying(x):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return fn(x)

    with pytest.raises(KeyboardInterrupt):
        write_windows(str(tmp_path / "cut"), prefix, 16, 8, dying, teacher="t", batch=3)
    with pytest.raises(StoreError, match="incomplete"):
        read_meta(str(tmp_path / "cut.partial"))
    done = json.load(open(tmp_path / "cut.partial" / "meta.json"))["windows_done"]
    assert done == 6, done
    write_windows(str(tmp_path / "cut"), prefix, 16, 8, fn, teacher="t", batch=3)
    a, b = TeacherStore(str(tmp_path / "whole")), TeacherStore(str(tmp_path / "cut"))
    for name in ("ids", "logp", "rest"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    stream = stream_of(prefix)
    n = whole["windows"]
    assert n == (len(stream) - 1) // 16
    ids, logp, rest = topk_of_logits(fn(stream[5 * 16:6 * 16][None]), 8)
    got = a.window(5)
    assert np.array_equal(got[0], ids[0]) and np.allclose(got[1], logp[0]) and np.allclose(got[2], rest[0])
    # other data under the same prefix: refused, not mixed
    _data(tmp_path / "d", docs=10, seed=1)
    with pytest.raises(StoreError, match="changed since the store was computed"):
        a.check_data()
    with pytest.raises(StoreError, match="computed on"):
        a.check_data(str(tmp_path / "other"))


def test_stored_teacher_takes_the_online_teachers_steps(tmp_path):
    """In-process, PaddleFormers' Trainer: the same student init, the same windows in the same order, the teacher
    online (a tiny Qwen3) or stored from it with K = V: the logged losses agree at every step."""
    from test_distill import _teacher

    from paddle_vha.checkpoint.folder import CheckpointFolder
    from paddle_vha.train.arguments import parse
    from paddle_vha.train.datasets import ByteWindows
    from paddle_vha.train.distill_trainer import DistillTrainer
    from paddle_vha.train.run_model import build_config
    from paddle_vha.train.stored_teacher import TeacherStore, stream_of, write_windows
    from paddle_vha.train.teacher import distill_plan, load_teacher

    V, S = 256, 32
    prefix = _data(tmp_path / "d", V=V, docs=12)
    teacher_dir = _teacher(tmp_path / "teacher")
    m, d, args, _ = parse([os.path.join(CONFIGS, "tiny-vha.json"), "--output_dir", str(tmp_path / "o"),
                           "--max_steps", "3", "--teacher", teacher_dir, "--save_strategy", "no", "--do_eval",
                           "false", "--logging_steps", "1", "--disable_tqdm", "true", "--max_seq_len", str(S),
                           "--per_device_train_batch_size", "2", "--learning_rate", "0.01"])
    args.dataloader_shuffle = False
    run_model = build_config(m, d, args, 1)
    plan = distill_plan(args, run_model.config)
    teacher = load_teacher(teacher_dir, plan.family, plan.config)

    def teacher_fn(x):
        with paddle.no_grad():
            return teacher(input_ids=paddle.to_tensor(np.asarray(x, np.int64)), return_dict=True).logits.numpy()

    write_windows(str(tmp_path / "store"), prefix, S, V, teacher_fn, teacher=teacher_dir, vocab_size=V)
    store = TeacherStore(str(tmp_path / "store"))
    stream = stream_of(prefix)
    n = store.meta["windows"]
    from paddleformers.trainer import TrainerCallback

    class Logs(TrainerCallback):
        def __init__(self):
            self.rows = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "kd_kl" in logs:
                self.rows.append((logs["loss"], logs["kd_kl"], logs["ce"]))

    losses = {}
    for kind in ("online", "stored"):
        paddle.seed(11)
        model = run_model.model_cls(run_model.config)
        if kind == "online":
            data = ByteWindows(stream[: n * S + 1], S, seed=args.seed, num_samples=6)
            trainer = DistillTrainer(model=model, args=args, train_dataset=data, teacher=teacher,
                                     distill=plan.settings, callbacks=[logs := Logs()])
        else:
            from paddle_vha.train.datasets import TeacherWindows

            data = TeacherWindows(stream[: n * S + 1], S, store, seed=args.seed, num_samples=6)
            trainer = DistillTrainer(model=model, args=args, train_dataset=data, teacher=None, distill=plan.settings,
                                     callbacks=[logs := Logs()])
        trainer.train()
        losses[kind] = logs.rows
    a, b = np.array(losses["online"]), np.array(losses["stored"])
    print("online (loss, kd_kl, ce) per step:", a.round(5).tolist())
    print("stored (loss, kd_kl, ce) per step:", b.round(5).tolist(), f"max |diff| {np.abs(a - b).max():.2e}")
    assert a.shape == (3, 3) and np.abs(a - b).max() < 1e-4
    assert CheckpointFolder.open(teacher_dir)  # the teacher folder is untouched and still a checkpoint
