#!/usr/bin/env bash
# Run a command inside the project's pinned virtual environment, creating or refreshing it first.
#
#   bash tools/env.sh python tools/quickstart.py
#   bash tools/env.sh python -m pytest -q tests   (tools/test.sh runs the suite as CI does)
#
# Set-up (first run, ~2 min; later runs skip it unless requirements/constraints/setup.py/pyproject.toml change):
#   .venv with pip 23.2.1, the pinned requirements under constraints.txt, paddle_vha installed editable (which also
#   puts its paddle-vha-* commands on the venv's PATH), then `pip check`; then the fused prologue op is built
#   (ops/build.py, own stamp). PADDLE_VHA_VENV overrides the venv location; PYTHON the interpreter (default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PADDLE_VHA_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.paddle_vha_env"
want="$(cd "$ROOT" && cat requirements.txt constraints.txt setup.py pyproject.toml | sha256sum | cut -d' ' -f1)"

if [ ! -x "$VENV/bin/python" ] || [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  echo "[env] setting up $VENV (pinned install; this takes a few minutes the first time)" >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  # pip 23.2.1: newer pips' `pip check` rejects decord 0.6.0 (a PaddleFormers dependency) because its wheel
  # metadata declares a cp36 tag; the package itself installs and imports fine. See docs/install.md.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "pip==23.2.1" "setuptools==84.2.1" "wheel==0.48.0"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements.txt" -c "$ROOT/constraints.txt"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT"
  "$VENV/bin/python" -m pip check
  echo "$want" > "$STAMP"
  echo "[env] ready" >&2
fi

# Fused prologue operator (ops/): built when ops/ sources (or the pinned install) change; own stamp.
OPS_STAMP="$VENV/.paddle_vha_ops"
if [ -f "$ROOT/ops/build.py" ]; then
  ops_want="$( (echo "$want"; cd "$ROOT" && cat ops/build.py $(find ops/csrc -type f | LC_ALL=C sort)) | sha256sum | cut -d' ' -f1)"
  if [ ! -f "$OPS_STAMP" ] || [ "$(cat "$OPS_STAMP")" != "$ops_want" ]; then
    echo "[env] building the fused prologue operator (ops/, ~30 s)" >&2
    if "$VENV/bin/python" "$ROOT/ops/build.py" >"$VENV/.paddle_vha_ops.log" 2>&1; then
      echo "$ops_want" > "$OPS_STAMP"
    else
      echo "[env] operator build failed (log: $VENV/.paddle_vha_ops.log); layers use the composed path" >&2
    fi
  fi
fi

# onnxruntime custom-op library (ops/ort: the fused decode attention): onnxruntime's headers fetched once from Debian's
# libonnxruntime-dev (pinned SHA-256) into ~/.cache/paddle_vha, the library compiled there; own stamp.
ORT_OPS_STAMP="$VENV/.paddle_vha_ort_ops"
if [ -f "$ROOT/ops/ort/build.py" ]; then
  ort_want="$( (cd "$ROOT" && cat $(find ops/ort -type f -not -path '*__pycache__*' | LC_ALL=C sort)) | sha256sum | cut -d' ' -f1)"
  if [ ! -f "$ORT_OPS_STAMP" ] || [ "$(cat "$ORT_OPS_STAMP")" != "$ort_want" ]; then
    echo "[env] building the onnxruntime op library (ops/ort, ~10 s)" >&2
    if "$VENV/bin/python" "$ROOT/ops/ort/build.py" >"$VENV/.paddle_vha_ort_ops.log" 2>&1; then
      echo "$ort_want" > "$ORT_OPS_STAMP"
    else
      echo "[env] onnxruntime op library build failed (log: $VENV/.paddle_vha_ort_ops.log); stock exports are unaffected" >&2
    fi
  fi
fi

export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
cd "$ROOT"
exec "$@"
