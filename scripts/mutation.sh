#!/usr/bin/env bash
# The opt-in mutation tier (CONTRIBUTING.md, RELIABILITY.md "Mutation"): every mutant of each
# module in scripts/mutation/targets.toml against that module's selected tests, one process at
# a time. Arguments: module paths (default: all), --survivors, --mutant N, --list.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/mutation/run.py "$@"
