#!/usr/bin/env bash
# Create (once) the side environment of the programs that read what this project writes: Hugging Face transformers
# + PyTorch (CPU) for folded checkpoints, Optimum and onnxruntime-genai for exports.
#
#   bash tools/hf_env.sh                      # create/refresh .venv-hf, print its python
#   bash tools/hf_env.sh python script.py     # run a command inside it
#
# Separate from .venv on purpose: with PaddleFormers 1.0.0 installed, HF's PyTorch models fail to import
# (docs/install.md), and optimum-onnx wants onnx 1.23 where paddle2onnx needs <= 1.17. Pins: torch 2.13.0 (CPU
# build), transformers 4.57.6, safetensors 0.8.0, numpy 1.26.4, optimum-onnx 0.1.0, onnxruntime 1.32.0,
# onnxruntime-genai 0.18.0.
# Idempotent: a stamp file holding the pin list skips set-up when nothing changed (~0.1 s).
# HF_VENV overrides the location; PYTHON the interpreter used to create it (default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HF_VENV:-$ROOT/.venv-hf}"
PY="${PYTHON:-python3}"
PINS="torch==2.13.0 transformers==4.57.6 safetensors==0.8.0 numpy==1.26.4 optimum-onnx==0.1.0 onnxruntime==1.32.0 onnxruntime-genai==0.18.0"
# shellcheck source=tools/side_env_lib.sh
. "$ROOT/tools/side_env_lib.sh"
ensure_side_env "$VENV" "$PY" "$PINS" hf_env \
  "import torch, transformers, safetensors, numpy, onnxruntime_genai; from transformers import Qwen3ForCausalLM; from optimum.onnxruntime import ORTModelForCausalLM"

if [ "$#" -eq 0 ]; then
  echo "$VENV/bin/python"
  exit 0
fi
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
cd "$ROOT"
exec "$@"
