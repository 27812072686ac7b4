#!/usr/bin/env bash
# Set up (idempotent) and run the main job: `tao up` on emulated replicas with embedded Redis.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[embedded]'
exec .venv/bin/tao up "$@"
