#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: unit, integration (real Redis, real gRPC),
# e2e, faults, bad-input and access suites, plus the ruff and mypy gates.
EXTRAS=dev,embedded,report,faults,tracing source "$(dirname "$0")/venv.sh"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
