#!/usr/bin/env bash
# The test suite, as the README's second command and CI (.ci/run) run it.
# The side environments (tools/hf_env.sh: PyTorch + transformers, ~2 min to install on a clean clone;
# tools/llama_env.sh: llama-cpp-python compiled from its sdist, 5-20 min cold on 2 cores, ~1 min from its wheel kept in
# ~/.cache/paddle-vha/llama-wheels)
# are set up in the background while tools/env.sh sets up .venv, instead of inside the first test that asks for them.
# The tests' fixtures still call the same scripts: they wait on the same lock, and install or report why not if this
# background set-up failed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/hf_env.sh >/dev/null 2>&1 &
bash tools/llama_env.sh >/dev/null 2>&1 &
bash tools/env.sh python -m pytest -q -ra tests "$@"
