#!/usr/bin/env bash
# Set up (idempotent) and run the main job: `tao up` on emulated replicas with embedded Redis.
EXTRAS=embedded source "$(dirname "$0")/venv.sh"
exec .venv/bin/tao up "$@"
