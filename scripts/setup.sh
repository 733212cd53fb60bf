#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine: Debian's graphviz (for `dot`),
# a virtualenv in .venv and the project with its dev dependencies. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v dot >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq graphviz >/dev/null
fi

# The review page's browser test drives Debian's Chromium with Playwright (Playwright's own
# browser download needs the internet).
if [ ! -x /usr/bin/chromium ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

# The Redis backend's tests start their own redis-server on a private socket (docs/redis.md).
if ! command -v redis-server >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
    rm -f .venv/.installed-*
    touch "$stamp"
fi
