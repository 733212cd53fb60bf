"""The repository stands on its own (issue 13): no tracked file points outside the checkout —
not at the reference folder beside it, not at an absolute path into a developer's machine.
Covers no SPEC behaviour; it keeps every test and document runnable from a fresh clone."""

from __future__ import annotations

import re
import subprocess

from engine_support import ROOT

# Absolute paths into a machine's checkouts or homes; system and container paths (/proc,
# /opt/turn-engine in the Dockerfile) are not references outside the checkout.
SIBLING = "." + "./" + "shared"
OUTSIDE = re.compile(re.escape(SIBLING) + r"|(?<![\w.])/(?:work|home|root|Users|mnt)/")
BINARY_SUFFIXES = {".png", ".gguf", ".gif", ".jpg", ".webp", ".ico"}


def _tracked_files() -> list[str]:
    listing = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    return [name for name in listing.stdout.splitlines() if name]


def test_no_file_points_outside_the_checkout() -> None:
    offenders: list[str] = []
    for name in _tracked_files():
        path = ROOT / name
        if path.suffix in BINARY_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not offenders, "paths outside the checkout:\n" + "\n".join(offenders)


def test_the_checker_catches_both_kinds_of_path() -> None:
    assert OUTSIDE.search('FIXTURES = Path("/' + 'work/shared/fixtures")')
    assert OUTSIDE.search(f"python -m fsm run-scenario {SIBLING}/scenarios/e01.json")
    assert not OUTSIDE.search('Path("/proc/self/status")')
    assert not OUTSIDE.search("tests/fixtures/sse/openai/plain_text.sse")
