#!/usr/bin/env bash
# Set up (idempotent) and run the main job: `tao up` on emulated replicas with embedded Redis.
EXTRAS=embedded,report source "$(dirname "$0")/venv.sh"
exec .venv/bin/tao up "$@"
