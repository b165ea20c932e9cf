#!/usr/bin/env bash
# The main job on a fresh machine: set up, build, fetch the default model, and serve it.
#   scripts/run.sh                 serve SmolLM2-135M-Instruct on http://127.0.0.1:8000 (OpenAI API)
#   scripts/run.sh generate ...    any other stoke subcommand, e.g. generate --prompt "Hi" --chat
# Env: STOKE_MODEL (alias or path, default smollm2-135m-instruct), STOKE_PORT (default 8000).
set -euo pipefail
cd "$(dirname "$0")/.."
STOKE_SETUP_PY=0 bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build build/release -j"$(nproc)" --target stoke
BIN=build/release/apps/stoke/stoke
MODEL=${STOKE_MODEL:-smollm2-135m-instruct}
if [ $# -gt 0 ]; then
  exec "$BIN" "$@"
fi
exec "$BIN" serve --model "$MODEL" --host 127.0.0.1 --port "${STOKE_PORT:-8000}"
