# Sourced by the side-environment scripts (tools/hf_env.sh, tools/genai_builder_env.sh): create or refresh a venv
# holding exactly a pin list, one set-up at a time.
#
#   ensure_side_env VENV PYTHON "PINS" TAG [IMPORT_CHECK]
#
# A stamp file (VENV/.TAG) holding the pin list skips set-up when nothing changed (~0.1 s). Concurrent callers (the
# test suite's two workers) wait on VENV.lock and look again. IMPORT_CHECK: python code run after the install; its
# failure ends the set-up (exit 1) without writing the stamp.
ensure_side_env() {
  local venv="$1" py="$2" pins="$3" tag="$4" check="${5:-}"
  local stamp="$venv/.$tag"
  _side_env_stale() { [ ! -x "$venv/bin/python" ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$pins" ]; }
  _side_env_stale || return 0
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  _side_env_stale || return 0
  echo "[$tag] setting up $venv ($pins)" >&2
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install -q --disable-pip-version-check $pins >&2
  if [ -n "$check" ]; then
    "$venv/bin/python" -c "$check" || { echo "[$tag] import check failed" >&2; exit 1; }
  fi
  echo "$pins" > "$stamp"
  echo "[$tag] ready" >&2
}
