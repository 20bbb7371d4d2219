"""The on-disk contract: names/shapes/layout, save/load round trip, and malformed checkpoints rejected."""
import hashlib
import json
import os

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file, save_file

from _utils import tiny_config, to_numpy
from paddle_vha import Qwen3VHAForCausalLM
from _utils import read_tensor_shapes, validate_vha_checkpoint, vha_tensor_shapes
from paddle_vha.checkpoint.contract import CheckpointError

VARIANTS = {
    "base": dict(),
    "r<d": dict(vha_q_head_dim=10, vha_postmix_rank=3),
    "gated-bias": dict(vha_gated_attention=True, attention_bias=True),
    "tied": dict(tie_word_embeddings=True),
}


def saved(tmp_path, **overrides):
    cfg = tiny_config(**overrides)
    model = Qwen3VHAForCausalLM(cfg)
    model.eval()
    path = str(tmp_path / "ckpt")
    model.save_pretrained(path)
    return cfg, model, path


@pytest.mark.parametrize("name", list(VARIANTS))
def test_saved_layout_is_the_contract(tmp_path, name):
    cfg, model, path = saved(tmp_path, **VARIANTS[name])
    shapes = read_tensor_shapes(path)
    assert shapes == vha_tensor_shapes(cfg)
    assert not [f for f in os.listdir(path) if f.startswith("saved_signal")]
    raw = json.load(open(os.path.join(path, "config.json")))
    assert raw["model_type"] == "qwen3_vha" and raw["architectures"] == ["Qwen3VHAForCausalLM"]
    assert raw["vha_q_head_dim"] == cfg.vha_q_head_dim and raw["vha_postmix_rank"] == cfg.vha_postmix_rank
    # Linear weights are [out, in] on disk: the transposed in-memory Paddle tensors
    disk = {}
    for f in {v for v in json.load(open(os.path.join(path, "model.safetensors.index.json")))["weight_map"].values()}:
        disk.update(load_file(os.path.join(path, f)))
    attn = model.model.layers[0].self_attn
    np.testing.assert_array_equal(disk["model.layers.0.self_attn.q_proj.weight"], to_numpy(attn.q_proj.weight).T)
    np.testing.assert_array_equal(disk["model.layers.0.self_attn.o_proj.weight"], to_numpy(attn.o_proj.weight).T)
    np.testing.assert_array_equal(disk["model.layers.0.self_attn.vha_premix_weight"], to_numpy(attn.vha_premix_weight))
    if cfg.vha_gated_attention:
        np.testing.assert_array_equal(disk["model.layers.0.self_attn.gate_proj.weight"], to_numpy(attn.gate_proj.weight).T)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_round_trip_is_bitwise(tmp_path, name):
    cfg, model, path = saved(tmp_path, **VARIANTS[name])
    loaded = Qwen3VHAForCausalLM.from_pretrained(path)
    loaded.eval()
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 7)))
    a = to_numpy(model(ids, return_dict=True).logits)
    b = to_numpy(loaded(ids, return_dict=True).logits)
    assert np.array_equal(a, b)


def test_loading_writes_nothing_into_a_read_only_checkpoint(tmp_path):
    """from_pretrained of a checkpoint folder made read-only: it loads (the same logits), and the folder holds exactly
    the files and bytes it held (PaddleFormers' loader left flex-ckpt.auto_generated.metadata in it; under a
    non-root user, a read-only folder failed to load)."""
    import stat

    from hostile import tree

    cfg, model, path = saved(tmp_path)
    before = tree(path)
    mode = os.stat(path).st_mode
    os.chmod(path, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    try:
        loaded = Qwen3VHAForCausalLM.from_pretrained(path)
    finally:
        os.chmod(path, mode)
    after = tree(path)
    print(sorted(set(after) - set(before)) or "nothing new in the checkpoint folder")
    assert after == before
    loaded.eval()
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(1, 5)))
    assert np.array_equal(to_numpy(model(ids, return_dict=True).logits), to_numpy(loaded(ids, return_dict=True).logits))


def test_round_trip_bfloat16_sharded(tmp_path):
    cfg = tiny_config(num_hidden_layers=3)
    paddle.set_default_dtype("bfloat16")
    model = Qwen3VHAForCausalLM(cfg)
    paddle.set_default_dtype("float32")
    path = str(tmp_path / "bf16")
    model.save_pretrained(path, max_shard_size="20KB")
    shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    assert len(shards) > 1, shards
    assert read_tensor_shapes(path) == vha_tensor_shapes(cfg)
    loaded = Qwen3VHAForCausalLM.from_pretrained(path, dtype="bfloat16")
    for (n, p), (_, q) in zip(model.named_parameters(), loaded.named_parameters()):
        assert p.dtype == q.dtype == paddle.bfloat16, n
        assert np.array_equal(to_numpy(p), to_numpy(q)), n


# --- malformed checkpoints: one clear line, nothing modified -------------------------------------------------

def _single_shard(path):
    (shard,) = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    return os.path.join(path, shard)


def _rewrite_tensors(path, fn):
    shard = _single_shard(path)
    tensors = load_file(shard)
    fn(tensors)
    save_file(tensors, shard)
    index = os.path.join(path, "model.safetensors.index.json")
    meta = json.load(open(index))
    meta["weight_map"] = {k: os.path.basename(shard) for k in tensors}
    json.dump(meta, open(index, "w"))


def _edit_config(path, **changes):
    p = os.path.join(path, "config.json")
    cfg = json.load(open(p))
    cfg.update(changes)
    json.dump(cfg, open(p, "w"))


MALFORMED = {
    "no-config": (lambda p: os.remove(os.path.join(p, "config.json")), "config.json: missing"),
    "config-not-json": (lambda p: open(os.path.join(p, "config.json"), "w").write("{oops"), "not valid JSON"),
    "stock-qwen3": (lambda p: _edit_config(p, model_type="qwen3"), "not a Qwen3-VHA checkpoint"),
    "bad-vha-field": (lambda p: _edit_config(p, vha_q_head_dim=999), "vha_q_head_dim"),
    "indivisible-heads": (lambda p: _edit_config(p, num_attention_heads=5), "divisible"),
    "missing-tensor": (lambda p: _rewrite_tensors(p, lambda t: t.pop("model.layers.1.self_attn.vha_postmix_U")),
                       "missing tensors: model.layers.1.self_attn.vha_postmix_U"),
    "extra-tensor": (lambda p: _rewrite_tensors(p, lambda t: t.update({"model.layers.0.self_attn.bogus": np.zeros(3, np.float32)})),
                     "unexpected tensors: model.layers.0.self_attn.bogus"),
    "mis-shaped": (lambda p: _rewrite_tensors(p, lambda t: t.update(
        {"model.layers.0.self_attn.vha_premix_weight": np.zeros((2, 16, 15), np.float32)})),
        "mis-shaped tensors: model.layers.0.self_attn.vha_premix_weight [2, 16, 15] (expected [2, 16, 16])"),
    "missing-shard": (lambda p: os.remove(_single_shard(p)), "which is missing"),
    "truncated-shard": (lambda p: open(_single_shard(p), "r+b").truncate(100), "unreadable safetensors"),
    "no-weights": (lambda p: [os.remove(os.path.join(p, f)) for f in os.listdir(p) if "safetensors" in f],
                   "no model.safetensors.index.json or model.safetensors"),
}


def _digest(path):
    h = hashlib.sha256()
    for f in sorted(os.listdir(path)):
        h.update(f.encode())
        h.update(open(os.path.join(path, f), "rb").read())
    return h.hexdigest()


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_checkpoint_is_rejected(tmp_path, case):
    break_it, needle = MALFORMED[case]
    _, _, path = saved(tmp_path)
    break_it(path)
    before = _digest(path)
    with pytest.raises(CheckpointError) as e:
        validate_vha_checkpoint(path)
    msg = str(e.value)
    print(msg)
    assert needle in msg and "\n" not in msg
    with pytest.raises(CheckpointError, match="^" + __import__("re").escape(msg) + "$"):
        Qwen3VHAForCausalLM.from_pretrained(path)
    assert _digest(path) == before, "a rejected checkpoint must be left untouched"


def test_not_a_directory(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        validate_vha_checkpoint(str(tmp_path / "nope"))


def _raw_safetensors(path, header: dict, data: bytes, header_text: str = None):
    import struct

    text = (header_text or json.dumps(header)).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


TYPED = {"str-offsets": ("data_offsets", ["0", "8"]), "float-offsets": ("data_offsets", [0.0, 8.0]),
         "float-shape": ("shape", [2.0]), "half-shape": ("shape", [64.5]), "bool-shape": ("shape", [True, 2]),
         "one-offset": ("data_offsets", [8]), "entry-list": (None, [0, 8])}
META = {"meta-list": ["x"], "meta-int": {"k": 1}, "meta-str": "x"}


@pytest.mark.parametrize("case", ["overlap", "gap", "trailing", "duplicate", *TYPED, *META])
def test_header_reader_is_as_strict_as_the_safetensors_library(tmp_path, case):
    """The project's one header reader (every validator, fold, compress, merge) refuses what the safetensors library
    refuses: overlapping or gapped data offsets, bytes after the data, duplicate tensor names, shapes and offsets that
    are not integers (strings, floats, booleans), __metadata__ that is not an object of strings."""
    from safetensors import safe_open

    from paddle_vha.checkpoint.safetensors_io import SafetensorsFormatError, read_header

    t = lambda a, b: {"dtype": "F32", "shape": [(b - a) // 4], "data_offsets": [a, b]}  # noqa: E731
    path, data, text = str(tmp_path / "x.safetensors"), bytes(16), None
    header = {"a": t(0, 8), "b": t(8, 16)}
    if case == "overlap":
        header = {"a": t(0, 8), "b": t(4, 12)}
        data = bytes(12)
    elif case == "gap":
        header = {"a": t(0, 4), "b": t(8, 16)}
    elif case == "trailing":
        data = bytes(20)
    elif case in TYPED:
        key, value = TYPED[case]
        header = {"a": dict(t(0, 8), **{key: value}) if key else value}
        data = bytes(8)
    elif case in META:
        header = {"__metadata__": META[case], "a": t(0, 8)}
        data = bytes(8)
    else:
        text = '{"a": %s, "a": %s}' % (json.dumps(t(0, 8)), json.dumps(t(8, 16)))
    _raw_safetensors(path, header, data, text)
    with pytest.raises(Exception):  # the reference reader
        with safe_open(path, framework="numpy") as f:
            [f.get_tensor(k) for k in f.keys()]
    with pytest.raises(SafetensorsFormatError) as e:
        read_header(path)
    print(e.value)
    assert "\n" not in str(e.value)
    _raw_safetensors(path, {"a": t(0, 8), "b": t(8, 16)}, bytes(16))  # the well-formed file reads
    assert sorted(read_header(path)[1]) == ["a", "b"]


def test_the_four_transforms_are_one_pipeline():
    """fold, convert, compress and import plan into one TransformPlan base (docs/architecture.md, transform/): the
    shared fields live there once, each subclass adds only what its own planning needs, and all print, write and
    verify through paddle_vha.transform."""
    import dataclasses

    from paddle_vha.transform.compress_kv import CompressPlan
    from paddle_vha.transform import TransformPlan
    from paddle_vha.transform.convert_to_vha import ConvertPlan
    from paddle_vha.transform.import_fleet import ImportPlan
    from paddle_vha.transform.fold import FoldPlan

    base = {f.name for f in dataclasses.fields(TransformPlan)}
    assert {"source", "out_dir", "out_config", "entries", "shards", "out_code", "copy_files", "force", "source_family",
            "target"} <= base
    own = {cls.__name__: [f.name for f in dataclasses.fields(cls) if f.name not in base]
           for cls in (FoldPlan, ConvertPlan, CompressPlan, ImportPlan)}
    assert own == {"FoldPlan": [], "ConvertPlan": ["src_cfg", "method", "seed", "errors", "regroup", "groups"],
                   "CompressPlan": ["layers", "errors"],
                   "ImportPlan": ["dialect", "layout", "qkv_layout", "up_gate_order"]}, own
    assert len({cls.tool for cls in (FoldPlan, ConvertPlan, CompressPlan, ImportPlan)}) == 4
