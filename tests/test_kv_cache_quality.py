"""The int8 KV cache's quality at a long context, bounded: logits of the --kv-cache int8 export against the
float32-cache export of the same checkpoint over 2,048 held-out positions (paddle_vha/export/kv_quality.py: a prefill
of 256, then chunks of 256 through the cache, the last 16 one decode step each), mean KL and greedy agreement within
the export's own bounds (CACHE_BOUNDS); and the same comparison, over its first 768 positions, fails them for a
broken cache.

The checkpoint is the Qwen3-0.6B-width fixture (tools/fixtures/qwen3_shaped.py: hidden 1024, 16 query heads over 2 KV
heads of head_dim 128, vocabulary 151,936) cut to 2 layers to keep the test to minutes, float32, sharpened (final
norm x 8, q_norm / k_norm x 2: tools/bench_kv_quality.py --sharpen): random weights otherwise give flat logits and
diffuse attention, which no cache error moves. Exported with external data so a broken copy edits a small graph.

A real checkpoint: PADDLE_VHA_KV_QUALITY_CHECKPOINT=FOLDER (any servable folder, e.g. SmolLM2-135M-Instruct imported
by `python tools/import_gguf.py "$(bash tools/fetch_smollm2.sh)" runs/smollm2`) runs the same bound on it as it is
(test_a_real_checkpoint; skipped when unset).
"""
import os
import shutil

import onnx
import pytest

from _utils import break_key_scales
from paddle_vha.export.errors import ExportError
from paddle_vha.export.kv_quality import CACHE_BOUNDS, cached_logits, check_cache_quality, compare_blocks, \
    compare_exports, quality_line
from paddle_vha.export.onnx_export import export_onnx
from paddle_vha.export.quality import held_out_windows
from paddle_vha.serve.ort_session import OrtDecoder
from tools.bench_kv_quality import sharpened
from tools.fixtures.qwen3_shaped import make_checkpoint

pytestmark = pytest.mark.slow
POSITIONS, CHUNK, STEPS = 2048, 256, 16
BROKEN_BLOCKS = 3  # a broken cache is judged on positions 256-767: it fails there by orders of magnitude


@pytest.fixture(scope="module")
def long_context(tmp_path_factory):
    """The two exports, the held-out ids, and the float32 cache's logit blocks over them."""
    root = tmp_path_factory.mktemp("kvq")
    make_checkpoint(str(root / "src"), "0.6b", layers=2, dtype="float32", kv_heads=2)
    ckpt = sharpened(str(root / "src"), str(root), 8.0, 2.0, print)
    out = {}
    for kv in ("fp32", "int8"):
        out[kv] = str(root / kv)
        export_onnx(ckpt, out[kv], cache_io="buffer", kv_cache=kv, external_data=True, decode_steps=2)
    ids, text = held_out_windows(out["fp32"], 151936, batch=1, seq_len=POSITIONS)
    reference = list(cached_logits(OrtDecoder.from_dir(out["fp32"]), ids, CHUNK, STEPS))
    return dict(root=root, out=out, ids=ids, text=text, reference=reference)


def _quality(long_context, folder, blocks=None):
    """`folder`'s cache against the float32 cache's logits, over the first `blocks` blocks (default all)."""
    return compare_blocks(long_context["reference"][:blocks], OrtDecoder.from_dir(folder), long_context["ids"], CHUNK,
                          STEPS, long_context["text"])


def test_int8_cache_within_bounds_at_2048_positions(long_context):
    quality = _quality(long_context, long_context["out"]["int8"])
    print(quality_line(quality, "int8"))
    assert quality.positions == POSITIONS - CHUNK and quality.decisive >= 500
    check_cache_quality(quality, "int8")  # mean KL <= 0.01 nats, agreement >= 95% on the decisive positions
    assert quality.agreement_all >= 0.9


def _broken_copy(src, dst, how):
    """A copy of the int8 export whose keys' product drops the key scales, or reads the value scales instead."""
    os.makedirs(dst)
    for name in os.listdir(src):
        if name != "model.onnx" and os.path.isfile(os.path.join(src, name)):
            os.link(os.path.join(src, name), os.path.join(dst, name))  # onnxruntime refuses a data file linked out
    model = onnx.load(os.path.join(src, "model.onnx"), load_external_data=False)
    assert break_key_scales(model, how) == 2  # one per layer
    onnx.save(model, os.path.join(dst, "model.onnx"))
    return dst


@pytest.mark.parametrize("how", ["dropped key scale", "value scales on the keys"])
def test_a_broken_cache_fails_the_bounds(long_context, how):
    broken = _broken_copy(long_context["out"]["int8"], str(long_context["root"] / how.replace(" ", "-")), how)
    quality = _quality(long_context, broken, BROKEN_BLOCKS)
    print(how, "->", quality_line(quality, "int8"))
    assert quality.positions == (BROKEN_BLOCKS - 1) * CHUNK  # the prefill's block is not counted
    with pytest.raises(ExportError, match="quality check failed"):
        check_cache_quality(quality, "int8")
    shutil.rmtree(broken)


@pytest.mark.skipif(not os.environ.get("PADDLE_VHA_KV_QUALITY_CHECKPOINT"),
                    reason="PADDLE_VHA_KV_QUALITY_CHECKPOINT (a real servable checkpoint) not set")
def test_a_real_checkpoint(tmp_path):
    ckpt = os.environ["PADDLE_VHA_KV_QUALITY_CHECKPOINT"]
    for kv in ("fp32", "int8"):
        export_onnx(ckpt, str(tmp_path / kv), cache_io="buffer", kv_cache=kv, decode_steps=2)
    quality = compare_exports(str(tmp_path / "fp32"), str(tmp_path / "int8"), POSITIONS, CHUNK, STEPS)
    print(quality_line(quality, "int8"))
    check_cache_quality(quality, "int8", CACHE_BOUNDS["int8"])
