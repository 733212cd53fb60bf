#!/usr/bin/env bash
# The test suite, on a fresh machine too: installs what it needs, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
exec .venv/bin/python -m pytest "$@"
