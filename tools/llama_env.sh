#!/usr/bin/env bash
# Create (once) the llama.cpp side environment: llama-cpp-python built here from PyPI's source distribution, and the
# HF -> GGUF converter it vendors (vendor/llama.cpp/convert_hf_to_gguf.py) with what that converter imports.
#
#   bash tools/llama_env.sh                      # create/refresh .venv-llama, print its python
#   bash tools/llama_env.sh src                  # print the unpacked sdist (convert_hf_to_gguf.py, models/*.gguf)
#   bash tools/llama_env.sh python script.py     # run a command inside it (LLAMA_SRC set to the unpacked sdist), in
#                                                # the caller's folder: relative paths mean what the caller meant
#
# Separate from .venv (PaddlePaddle) and .venv-hf: the vendored gguf-py wants numpy >= 2.2.6, the converter imports
# torch and transformers. Pins: llama-cpp-python 0.3.36 (built from the sdist, CPU only; llama.cpp's tests, examples,
# tools, server and the multimodal library are switched off to cut the build), torch 2.13.0 (CPU build), transformers
# 4.57.6, safetensors 0.8.0, numpy 2.2.6, sentencepiece 0.2.3 (the converter imports it before it looks for a
# tokenizer.model, even for a BPE tokenizer), gguf from the sdist's vendor/llama.cpp/gguf-py.
# Build: ggml is compiled for this CPU's instruction sets, read from /proc/cpuinfo and named one by one (GGML_NATIVE
# off), with AMX off: on these VMs cpuid advertises AMX but the kernel grants no tile data (arch_prctl
# ARCH_GET_XCOMP_SUPP lacks XTILEDATA), and ggml's AMX matmul dies at its first ldtilecfg (SIGSEGV / SIGILL). The
# built wheel is kept in ~/.cache/paddle-vha/llama-wheels/<hash of the build flags>: a new venv on a machine with the
# same instruction sets installs it (~1 min), one with other sets builds its own. (pip's own wheel cache is keyed by
# the download URL alone and handed a wheel built for one CPU to another.) Cold set-up ~20+ min on 2 cores.
# Idempotent: a stamp file holding the pin list and the build flags skips set-up when nothing changed (~0.1 s).
# LLAMA_VENV overrides the location; PYTHON the interpreter used to create it (default python3); LLAMA_WHEELS the
# wheel cache.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LLAMA_VENV:-$ROOT/.venv-llama}"
PY="${PYTHON:-python3}"
LCP="llama-cpp-python==0.3.36"
PINS="$LCP torch==2.13.0 transformers==4.57.6 safetensors==0.8.0 numpy==2.2.6 sentencepiece==0.2.3 tqdm pyyaml requests"
# x86 instruction sets ggml can use, as /proc/cpuinfo names them -> ggml's CMake option (AVX512 needs all five parts)
isa_args() {
  local flags; flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  local out="" pair
  for pair in sse4_2:SSE42 f16c:F16C fma:FMA bmi2:BMI2 avx:AVX avx2:AVX2 avx_vnni:AVX_VNNI \
              "avx512f avx512cd avx512vl avx512dq avx512bw:AVX512" avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI \
              avx512_bf16:AVX512_BF16; do
    local want="${pair%%:*}" opt="${pair##*:}" on=ON f
    for f in $want; do [[ "$flags" == *" $f "* ]] || on=OFF; done
    out+=" -DGGML_$opt=$on"
  done
  echo "$out -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
}
BUILD_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF$(isa_args)"
WHEELS="${LLAMA_WHEELS:-$HOME/.cache/paddle-vha/llama-wheels}/$(echo "$LCP $BUILD_ARGS" | sha256sum | cut -c1-16)"
STAMP="$VENV/.llama_env"
SRC="$VENV/src/llama_cpp_python-0.3.36"

needs_setup() { [ ! -x "$VENV/bin/python" ] || [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$PINS $BUILD_ARGS" ]; }
if needs_setup; then
  # One set-up at a time (the test suite's workers may both ask): wait for the lock, then look again.
  mkdir -p "$(dirname "$VENV")"
  exec 9>"$VENV.lock"
  flock 9
fi
if needs_setup; then
  t0=$(date +%s)
  echo "[llama-env] setting up $VENV ($PINS; CMAKE_ARGS=$BUILD_ARGS)" >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
  "${PIP[@]}" install -q scikit-build-core cmake ninja
  # The wheel: built once per set of build flags into WHEELS (CMAKE_ARGS reach llama.cpp's CMake), then installed.
  if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "[llama-env] compiling llama-cpp-python (~20 min on 2 cores) into $WHEELS" >&2
    rm -rf "$WHEELS.tmp" && mkdir -p "$WHEELS.tmp"
    # shellcheck disable=SC2086
    CMAKE_ARGS="$BUILD_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
      "${PIP[@]}" wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python "$LCP" -w "$WHEELS.tmp"
    rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS"
  fi
  # shellcheck disable=SC2086
  "${PIP[@]}" install -q --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-*.whl  # replaces another build
  "${PIP[@]}" install -q "$WHEELS"/llama_cpp_python-*.whl ${PINS#"$LCP "}
  # The converter and the vocabularies live in the sdist only (pip's HTTP cache answers this download).
  if [ ! -f "$SRC/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
    "${PIP[@]}" download -q --no-deps --no-binary :all: "$LCP" -d "$VENV/src"
    tar xzf "$VENV/src/llama_cpp_python-0.3.36.tar.gz" -C "$VENV/src"
  fi
  "${PIP[@]}" install -q --no-deps "$SRC/vendor/llama.cpp/gguf-py"
  "$VENV/bin/python" -c "import llama_cpp, gguf, torch, transformers, numpy, sentencepiece; assert hasattr(llama_cpp, 'llama_model_quantize')" \
    || { echo "[llama-env] import check failed" >&2; exit 1; }
  echo "$PINS $BUILD_ARGS" > "$STAMP"
  echo "[llama-env] ready in $(( $(date +%s) - t0 )) s" >&2
fi

if [ "$#" -eq 0 ]; then
  echo "$VENV/bin/python"
  exit 0
fi
if [ "$1" = "src" ]; then
  echo "$SRC"
  exit 0
fi
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
export LLAMA_SRC="$SRC"
exec "$@"
