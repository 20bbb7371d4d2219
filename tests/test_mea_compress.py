"""tools/compress_kv.py and paddle_vha.transform.compress_kv: stock Qwen3 -> Qwen3-MEA by SVD, on a small real-shaped model."""
import glob
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM
from safetensors.numpy import load_file

import mea_oracle
from _utils import rel_err, to_numpy
from paddle_vha.checkpoint.fsutil import MARKER
from paddle_vha.transform.compress_kv import svd_compress
from paddle_vha.mea.modeling import Qwen3MEAForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "compress_kv.py")
from paddle_vha.cli import compress_kv  # the tool's command line (tools/compress_kv.py runs it)

# Qwen3's proportions shrunk: GQA (16 query heads, 4 KV heads), head_dim 16, byte vocabulary.
SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=4, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
             tie_word_embeddings=False)


def stock_checkpoint(path, **overrides):
    cfg = Qwen3Config(**{**SHAPE, **overrides})
    model = Qwen3ForCausalLM(cfg)
    for name, p in model.named_parameters():
        if name.endswith(".bias") or "norm" in name:  # non-trivial biases and norm weights
            p.set_value((1.0 if "norm" in name else 0.0) + paddle.randn(p.shape) * 0.3)
    model.save_pretrained(path)
    for f in os.listdir(path):
        if f.startswith("saved_signal"):
            os.remove(os.path.join(path, f))
    return cfg, model


def load_numpy(path):
    state = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        state.update({k: v.astype(np.float64) for k, v in load_file(f).items()})
    return state


def digest(path):
    h = hashlib.sha256()
    for f in sorted(os.listdir(path)):
        h.update(f.encode() + open(os.path.join(path, f), "rb").read())
    return h.hexdigest()


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    paddle.seed(7)
    path = str(tmp_path_factory.mktemp("stock") / "qwen3")
    cfg, model = stock_checkpoint(path)
    return path, cfg


def test_svd_matches_the_oracle_and_reports_its_error():
    """The package's SVD (eq. 23) vs the oracle's, per head count: same reconstruction, error from the spectrum."""
    H, d, h = 4, 16, 64
    w = np.random.randn(H * d, h)
    M = np.stack([w[j * d:(j + 1) * d].reshape(-1) for j in range(H)], axis=1)
    for n_p in range(1, H + 1):
        phys, _, lc, err = svd_compress(w, None, H, d, n_p)
        o_phys, o_lc = mea_oracle.svd_compress(w, H, d, n_p)
        rebuild = lambda ph, l: np.concatenate([sum(l[p, j] * ph[p * d:(p + 1) * d] for p in range(n_p))  # noqa: E731
                                                for j in range(H)])
        got, ref = rebuild(phys, lc), rebuild(o_phys, o_lc)
        independent = np.linalg.norm(np.stack([ref[j * d:(j + 1) * d].reshape(-1) for j in range(H)], 1) - M) / np.linalg.norm(M)
        print(f"n_p={n_p}: rel err {err:.4e} (independent {independent:.4e})")
        assert rel_err(got, ref, f"n_p={n_p} rebuilt W vs oracle") <= 1e-10
        assert abs(err - independent) <= 1e-10
    assert err < 1e-12  # n_p = H: exact


@pytest.mark.parametrize("k_norm", ["after", "before"])
def test_full_rank_compression(tmp_path, stock, k_norm, capsys):
    """n_p = the original KV heads: 'after' reproduces the original logits to 1e-5; 'before' cannot (k_norm on the
    physical heads is not HLC-equivariant) and the tool reports that as a non-zero KL."""
    path, cfg = stock
    before = digest(path)
    out = str(tmp_path / "mea")
    assert compress_kv.main([path, out, "--kv-heads", "4", "--k-norm", k_norm, "--no-progress", "--eval-batches", "1",
                             "--eval-len", "32"]) == 0
    printed = capsys.readouterr().out
    print(printed)
    assert digest(path) == before, "IN_DIR must not be modified"
    assert sorted(os.listdir(out)) == [MARKER, "config.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json"]
    raw = json.load(open(os.path.join(out, "config.json")))
    assert raw["model_type"] == "qwen3_mea" and raw["num_key_value_heads"] == 4 and raw["mea_kv_heads"] == 4
    assert raw["mea_k_norm_position"] == f"{k_norm}_hlc" and raw["mea_group_norm"] is False

    orig = Qwen3ForCausalLM.from_pretrained(path)
    mea = Qwen3MEAForCausalLM.from_pretrained(out)
    orig.eval(), mea.eval()
    ids = paddle.to_tensor(np.random.randint(0, 256, size=(2, 13)))
    a = to_numpy(orig(ids, return_dict=True).logits)
    b = to_numpy(mea(ids, return_dict=True).logits)
    err = rel_err(b, a, f"{k_norm}: compressed (n_p = H_kv) vs original logits")
    if k_norm == "after":
        assert err <= 1e-5
        assert "rel err W_K" in printed and "0.0000e+00" in printed
    else:
        assert err > 1e-3


def test_compressed_model_matches_mea_oracle_and_errors(tmp_path, stock):
    """n_p = 2 of 4 on layers 1-3: the written tensors are the oracle SVD; the model equals the MEA oracle on them."""
    path, cfg = stock
    out = str(tmp_path / "mea2")
    from paddle_vha.transform.compress_kv import compress_checkpoint, plan_compress

    plan = plan_compress(path, out, 2, layers="1-3")
    compress_checkpoint(plan, progress=False)
    src, dst = load_numpy(path), load_numpy(out)
    d = cfg.head_dim
    for i in range(4):
        p = f"model.layers.{i}.self_attn."
        if i == 0:  # stock layer: untouched, original KV heads
            assert p + "mea_k_lc" not in dst
            np.testing.assert_array_equal(dst[p + "k_proj.weight"], src[p + "k_proj.weight"])
            continue
        for t in "kv":
            w = src[p + f"{t}_proj.weight"]
            o_phys, o_lc = mea_oracle.svd_compress(w, 4, d, 2)
            got = np.einsum("pv,pdh->vdh", dst[p + f"mea_{t}_lc"], dst[p + f"{t}_proj.weight"].reshape(2, d, -1))
            ref = np.einsum("pv,pdh->vdh", o_lc, o_phys.reshape(2, d, -1))
            assert rel_err(got, ref, f"layer {i} {t}: rebuilt W from the file vs oracle") <= 1e-6
            M = w.reshape(4, -1)
            expect = np.linalg.norm(ref.reshape(4, -1) - M) / np.linalg.norm(M)
            assert abs(plan.errors[i]["kv".index(t)] - expect) <= 1e-6
    mea = Qwen3MEAForCausalLM.from_pretrained(out)
    mea.eval()
    ids = np.random.randint(0, 256, size=(2, 11))
    raw = json.load(open(os.path.join(out, "config.json")))
    ref, _ = mea_oracle.causal_lm(ids, dst, raw)
    assert rel_err(to_numpy(mea(paddle.to_tensor(ids), return_dict=True).logits), ref, "compressed model vs MEA oracle") <= 1e-5
    # fewer physical heads never reconstruct better: error(n_p=1) >= error(n_p=2) >= error(n_p=3)
    errs = [svd_compress(src["model.layers.1.self_attn.k_proj.weight"], None, 4, d, n)[3] for n in (1, 2, 3)]
    assert errs[0] >= errs[1] >= errs[2] > 0


def test_attention_bias_is_compressed_exactly_at_full_rank(tmp_path):
    paddle.seed(3)
    path = str(tmp_path / "biased")
    cfg, orig = stock_checkpoint(path, attention_bias=True, num_hidden_layers=2)
    out = str(tmp_path / "mea")
    assert compress_kv.main([path, out, "--kv-heads", "4", "--no-progress", "--eval-batches", "0"]) == 0
    assert "model.layers.0.self_attn.k_proj.bias" in load_numpy(out)
    mea = Qwen3MEAForCausalLM.from_pretrained(out)
    orig.eval(), mea.eval()
    ids = paddle.to_tensor(np.random.randint(0, 256, size=(1, 7)))
    assert rel_err(to_numpy(mea(ids, return_dict=True).logits), to_numpy(orig(ids, return_dict=True).logits),
                   "biased, n_p = H_kv") <= 1e-5


def test_dry_run_writes_nothing(tmp_path, stock, capsys):
    path, _ = stock
    out = str(tmp_path / "never")
    assert compress_kv.main([path, out, "--kv-heads", "2", "--layers", "deep", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    print(printed)
    assert "MEA layers (1 of 4): 3" in printed and "4 KV heads" in printed and "dry run" in printed
    # 2 (K, V) x 4 heads x 16 x 4 B x 4 layers = 2048 B; layer 3 keeps 2 heads: 3 x 512 + 256 = 1792 B
    assert "KV cache per token (float32): 2.00 KB -> 1.75 KB (87.5%)" in printed
    assert not os.path.exists(out)


def _refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        compress_kv.main(argv)
    err = capsys.readouterr().err.strip()
    print(err)
    assert e.value.code == 2 and "\n" not in err and err.startswith("error: ")
    return err


def test_refusals(tmp_path, stock, capsys):
    path, _ = stock
    before = digest(path)
    out = str(tmp_path / "out")
    cases = [
        (["--kv-heads", "0"], "--kv-heads 0: must be between 1 and the checkpoint's 4 KV heads"),
        (["--kv-heads", "5"], "--kv-heads 5: must be between 1"),
        (["--kv-heads", "2", "--layers", "2-9"], "--layers: layer spec '2-9' selects layers outside 0..3"),
        (["--kv-heads", "2", "--layers", "middle"], "must be 'all', 'deep', 'A-B'"),
    ]
    for extra, needle in cases:
        assert needle in _refused([path, out] + extra, capsys)
    assert "neither inside the other" in _refused([path, os.path.join(path, "sub"), "--kv-heads", "2"], capsys)
    os.makedirs(out)
    assert "already exists (pass --force" in _refused([path, out, "--kv-heads", "2"], capsys)
    # a Qwen3-MEA (or VHA) checkpoint is not a stock one
    mea_dir = str(tmp_path / "mea")
    compress_kv.main([path, mea_dir, "--kv-heads", "2", "--no-progress", "--eval-batches", "0"])
    assert "not a stock checkpoint this converts (config.json model_type='qwen3_mea', expected one of 'qwen3'" in _refused(
        [mea_dir, str(tmp_path / "x"), "--kv-heads", "1"], capsys)
    assert digest(path) == before


def test_truncated_input_is_refused_and_nothing_written(tmp_path, capsys):
    path = str(tmp_path / "broken")
    stock_checkpoint(path, num_hidden_layers=2)
    (shard,) = glob.glob(os.path.join(path, "*.safetensors"))
    open(shard, "r+b").truncate(200)
    before = digest(path)
    err = _refused([path, str(tmp_path / "out"), "--kv-heads", "2"], capsys)
    assert "unreadable safetensors" in err or "safetensors" in err
    assert not os.path.exists(tmp_path / "out") and digest(path) == before
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".out")]


def test_help_runs_without_loading_paddle():
    r = subprocess.run([sys.executable, TOOL, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--kv-heads" in r.stdout and "--dry-run" in r.stdout and "deep" in r.stdout


def test_bf16_sharded_input_and_force(tmp_path, capsys):
    """bfloat16, several shards in and out; --force replaces an existing OUT_DIR only with a complete one."""
    paddle.seed(5)
    cfg = Qwen3Config(**{**SHAPE, "num_hidden_layers": 2})
    paddle.set_default_dtype("bfloat16")
    model = Qwen3ForCausalLM(cfg)
    paddle.set_default_dtype("float32")
    path = str(tmp_path / "bf16")
    model.save_pretrained(path, max_shard_size="100KB")
    assert len(glob.glob(os.path.join(path, "*.safetensors"))) > 1
    out = str(tmp_path / "out")
    os.makedirs(out)
    open(os.path.join(out, "stale.txt"), "w").write("old")
    open(os.path.join(out, MARKER), "w").write("{}")  # an earlier output of this project: --force may replace it
    assert compress_kv.main([path, out, "--kv-heads", "2", "--force", "--max-shard-size", "100KB", "--no-progress",
                             "--eval-batches", "1", "--eval-len", "16"]) == 0
    assert not os.path.exists(os.path.join(out, "stale.txt"))
    shards = glob.glob(os.path.join(out, "*.safetensors"))
    assert len(shards) > 1
    from paddle_vha.checkpoint.safetensors_io import read_header
    dtypes = {r.dtype for f in shards for r in read_header(f)[1].values()}
    assert dtypes == {"BF16"}, dtypes
    assert json.load(open(os.path.join(out, "config.json")))["dtype"] == "bfloat16"
    mea = Qwen3MEAForCausalLM.from_pretrained(out, dtype="bfloat16")
    assert mea.model.layers[0].self_attn.mea_k_lc.dtype == paddle.bfloat16
    assert "logit KL" in capsys.readouterr().out
