"""The checkpoint-transform pipeline: open the source -> plan -> describe -> write atomically -> verify.

Its four instances live here too: fold.py (Qwen3-VHA -> stock Qwen3 / shared-KV), convert_to_vha.py (stock Qwen3 ->
Qwen3-VHA), compress_kv.py (stock Qwen3 -> Qwen3-MEA) and import_fleet.py (+ fleet_reference.py: upstream PaddleFleet
checkpoints -> Qwen3-VHA). Each keeps its own math and its own planning; what they share lives here, once:

    plan.py      TransformPlan (source folder, OUT_DIR, the output tensors as Entry rows, their shard layout, side
                 files, the config to write, --force) and the helpers every planner runs (output folder, dtype, shards)
    dtype.py     the one --dtype choice list and how a choice becomes a safetensors dtype code
    describe.py  the one plan printer: a plan describes itself (title, header lines, a table of rows, footer, notes)
    write.py     the one write step: every entry streamed into shards inside a temporary folder renamed into place
    verify.py    logits of checkpoint folders for --verify (random tokens), and the read-only guard
    layerwise.py a model's forward one decoder layer at a time, and the blocked logit KL of two models
    text.py      calibration / KL text as the checkpoint's own token ids (its tokenizer.json; bytes for byte-level)
    memory.py    a transform's memory need and the up-front refusal when MemAvailable is below it

A new transform is a subclass of TransformPlan (its `tool`, `verb`, `error` and `describe()`), a planner that fills
it, and a `make(entry)` for the tensors it computes; its command line runs paddle_vha.cli.run_transform.
The shared modules import no model family, and nothing here imports Paddle at module level.
"""
from .describe import Description, Table, format_plan, layer_pattern
from .dtype import DTYPE_CHOICES, check_dtype, output_code
from .plan import Entry, TransformPlan
from .write import write_plan

__all__ = ["DTYPE_CHOICES", "Description", "Entry", "Table", "TransformPlan", "check_dtype", "format_plan",
           "layer_pattern", "output_code", "write_plan"]
