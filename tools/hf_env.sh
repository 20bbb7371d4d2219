#!/usr/bin/env bash
# Create (once) the Hugging Face transformers + PyTorch (CPU) environment used to check folded checkpoints.
#
#   bash tools/hf_env.sh                      # create/refresh .venv-hf, print its python
#   bash tools/hf_env.sh python script.py     # run a command inside it
#
# Separate from .venv on purpose: with PaddleFormers 1.0.0 installed, HF's PyTorch models fail to import
# (docs/install.md). Pins: torch 2.13.0 (CPU build), transformers 4.57.6, safetensors 0.8.0, numpy 1.26.4.
# Idempotent: a stamp file holding the pin list skips set-up when nothing changed (~0.1 s).
# HF_VENV overrides the location; PYTHON the interpreter used to create it (default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HF_VENV:-$ROOT/.venv-hf}"
PY="${PYTHON:-python3}"
PINS="torch==2.13.0 transformers==4.57.6 safetensors==0.8.0 numpy==1.26.4"
STAMP="$VENV/.hf_env"

if [ ! -x "$VENV/bin/python" ] || [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$PINS" ]; then
  echo "[hf-env] setting up $VENV ($PINS)" >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check $PINS
  "$VENV/bin/python" -c "import torch, transformers, safetensors, numpy; from transformers import Qwen3ForCausalLM" \
    || { echo "[hf-env] import check failed" >&2; exit 1; }
  echo "$PINS" > "$STAMP"
  echo "[hf-env] ready" >&2
fi

if [ "$#" -eq 0 ]; then
  echo "$VENV/bin/python"
  exit 0
fi
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
cd "$ROOT"
exec "$@"
