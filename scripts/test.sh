#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: unit, integration (real Redis, real gRPC),
# e2e, faults and bad-input suites, plus ruff and mypy gates.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev,embedded]'
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
