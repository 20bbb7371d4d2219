#!/usr/bin/env bash
# The test suite, as the README's second command and CI (.ci/run) run it.
# The Hugging Face side environment (tools/hf_env.sh: PyTorch + transformers, ~2 min to install on a clean clone) is
# set up in the background while tools/env.sh sets up .venv, instead of inside the first test that asks for it. The
# tests' hf_python fixture still calls tools/hf_env.sh: it waits on the same lock, and installs it or reports why not
# if this background set-up failed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/hf_env.sh >/dev/null 2>&1 &
bash tools/env.sh python -m pytest -q -ra tests "$@"
