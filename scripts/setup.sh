#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine, then a virtualenv in .venv with
# the project and its dev dependencies. Safe to run repeatedly: only what is missing is
# installed, and a run with nothing to do prints nothing. Each step says what it installs
# before it starts (the first run takes a few minutes). Debian packages: graphviz (`dot`, the
# diagrams) always; with --tests also chromium (the review page's browser test drives it
# through Playwright, whose own browser download needs the internet) and redis-server (the
# Redis backend's tests start their own on a private socket, docs/redis.md).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup: $*" >&2; }

missing=()
command -v dot >/dev/null 2>&1 || missing+=(graphviz)
if [ "${1:-}" = "--tests" ]; then
    [ -x /usr/bin/chromium ] || missing+=(chromium)
    command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    say "installing the Debian packages ${missing[*]} (apt-get; a minute or more)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
        "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    say "creating the virtualenv .venv (python3 -m venv)"
    python3 -m venv .venv
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
    if ls .venv/.installed-* >/dev/null 2>&1; then
        say "pyproject.toml changed: updating the project's packages in .venv (pip)"
    else
        say "installing turn-engine and its Python packages into .venv (pip; about two" \
            "minutes the first time)"
    fi
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
    rm -f .venv/.installed-*
    touch "$stamp"
    say "done: .venv has turn-engine and its dependencies"
fi
