#!/usr/bin/env bash
# The main job: the Discord bot when a token and a provider are configured, otherwise the
# embedded default (built-in turns through the real engine, journals left in journals/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m turn_engine "$@"
