"""The session-wide edge check under parallel workers (tests/edge_coverage.py): a pytest run
of its own with two workers, where each worker's tests take half of the declared edges and
the second worker's half lacks one. Only the union of both workers' edges leaves exactly
that one missing, so the verdict the controller reports under the check's own id proves it
aggregated every worker. Covers no SPEC behaviour: it keeps the check that covers S, T and R
as a whole honest when the suite runs in parallel (CONTRIBUTING.md)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from fsm.engine.table import edge_keys

from engine_support import ROOT

CONFTEST = f"""
import sys
sys.path.insert(0, {str(ROOT / "tests")!r})
from edge_coverage import (  # noqa: F401
    pytest_collection_modifyitems, pytest_sessionfinish, pytest_testnodedown)
"""
HALVES = """
import os
import pytest
from engine_support import TAKEN_EDGES
from fsm.engine.table import edge_keys

EDGES = sorted(edge_keys())
HALF = len(EDGES) // 2


@pytest.mark.parametrize("n", range(12))
def test_takes_this_workers_half(n):
    mine = EDGES[:HALF] if os.environ["PYTEST_XDIST_WORKER"] == "gw0" else EDGES[HALF + 1:]
    TAKEN_EDGES.update(mine)
"""
CHECK = f"""
import importlib.util
spec = importlib.util.spec_from_file_location(
    "the_suites_coverage_module", {str(ROOT / "tests" / "test_zz_machine_coverage.py")!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
test_every_declared_edge_is_taken_by_some_test = (
    module.test_every_declared_edge_is_taken_by_some_test)
"""


def test_the_controller_judges_the_union_of_every_workers_edges(tmp_path: Path) -> None:
    # covers the edge check (S, T, R as a whole) under pytest-xdist
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_edges.py").write_text(textwrap.dedent(HALVES))
    (tmp_path / "test_scenarios.py").write_text("def test_nothing():\n    pass\n")
    (tmp_path / "test_stream_pass.py").write_text("def test_nothing():\n    pass\n")
    (tmp_path / "test_zz_machine_coverage.py").write_text(textwrap.dedent(CHECK))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q",
         "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"})
    edges = sorted(edge_keys())
    lost = edges[len(edges) // 2]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"declared edges no test takes: [{lost!r}]" in proc.stdout, proc.stdout
    assert proc.stdout.rstrip().splitlines()[-2:] == [
        "FAILED test_zz_machine_coverage.py::test_every_declared_edge_is_taken_by_some_test",
        proc.stdout.rstrip().splitlines()[-1]]
    assert proc.stdout.rstrip().splitlines()[-1].startswith("1 failed, 14 passed")
