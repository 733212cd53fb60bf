#!/usr/bin/env bash
# The test suite, on a fresh machine too: installs what it needs, then runs pytest with one
# worker per core (pytest-xdist; tests/edge_coverage.py keeps the session-wide edge check
# whole across them). Arguments go to pytest: `-m "not slow"` for the edit-test loop, `-n 0`
# for one process (CONTRIBUTING.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
exec .venv/bin/python -m pytest -n auto --dist worksteal "$@"
