#!/usr/bin/env bash
# Create (once) the side environment of onnxruntime-genai's model builder (`python -m onnxruntime_genai.models.builder`),
# the int4 export a user of onnxruntime-genai would pick instead of ours; tools/bench_quant.py runs it side by side.
#
#   bash tools/genai_builder_env.sh                 # create/refresh .venv-genai-builder, print its python
#   bash tools/genai_builder_env.sh python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p int4 -e cpu
#
# Its own environment: the builder needs transformers >= 5 and onnx-ir, where .venv-hf (Optimum) pins transformers
# 4.57.6 and .venv (PaddleFormers 1.0.0) < 5. Pins: torch 2.13.0 (CPU build), transformers 5.18.0, onnxruntime
# 1.32.0, onnxruntime-genai 0.18.0, onnx 1.23.1, onnx-ir 1.0.0, safetensors 0.8.0, numpy 2.2.6.
# GENAI_BUILDER_VENV overrides the location; PYTHON the interpreter used to create it (default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GENAI_BUILDER_VENV:-$ROOT/.venv-genai-builder}"
PY="${PYTHON:-python3}"
PINS="torch==2.13.0 transformers==5.18.0 onnxruntime==1.32.0 onnxruntime-genai==0.18.0 onnx==1.23.1 onnx-ir==1.0.0 safetensors==0.8.0 numpy==2.2.6"
# shellcheck source=tools/side_env_lib.sh
. "$ROOT/tools/side_env_lib.sh"
ensure_side_env "$VENV" "$PY" "$PINS" genai_builder_env "import onnxruntime_genai.models.builder, onnx_ir, transformers"

if [ "$#" -eq 0 ]; then
  echo "$VENV/bin/python"
else
  cmd="$1"; shift
  if [ "$cmd" = "python" ]; then cmd="$VENV/bin/python"; fi
  exec "$cmd" "$@"
fi
