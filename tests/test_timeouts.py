"""Every test has a time budget (pyproject.toml `timeout`, pytest-timeout): a test that hangs
fails with a traceback and the run goes on, whether it spins on the CPU (a splitter that never
advances: the traceback ends at the line it spins on) or waits for something that never comes
on the virtual clock (it ends in the idle event loop). Covers no SPEC behaviour: it keeps a
hang in any test from stalling CI (issue 29)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine_support import ROOT

HANGS = '''
import asyncio
import pytest


def test_spins_forever():
    cut = 0
    while cut < 10:
        cut = cut * 1  # never advances


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_waits_forever_on_the_virtual_clock():
    await asyncio.Event().wait()


def test_after_them():
    pass
'''


def test_the_suite_has_a_budget_the_slowest_test_fits(request: pytest.FixtureRequest) -> None:
    # the budget every test runs under, with what tests/conftest.py adds for the long tiers
    assert float(request.config.getini("timeout")) == 600.0
    assert request.node.get_closest_marker("timeout") is None


def test_a_hanging_test_fails_with_its_traceback_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "test_hangs.py").write_text(textwrap.dedent(HANGS))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
         str(tmp_path), "-p", "no:cacheprovider", "-o", "timeout=2", "-q", "-n", "0",
         str(tmp_path / "test_hangs.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert out.rstrip().splitlines()[-1].startswith("2 failed, 1 passed"), out
    # the failures section, not the summary (whose lines CI or a wide terminal leave whole)
    failures = out.split("short test summary info", 1)[0]
    assert failures.count("Failed: Timeout (>2.0s) from pytest-timeout.") == 2, out
    spun, waited = failures.split("_ test_spins_forever _", 1)[1].split(
        "_ test_waits_forever_on_the_virtual_clock _", 1)
    assert ">       while cut < 10:" in spun  # the line it spun on
    assert "event_list = self._selector.select(timeout)" in waited  # the loop, idle
