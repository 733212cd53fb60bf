"""The session-wide edge-coverage check (tests/test_zz_machine_coverage.py) under parallel
workers (pytest-xdist): each worker runs some of the turns and so takes some of the declared
edges, none takes them all. So no worker runs the check: each sends the edges it took to the
controller, which compares their union with the table once every worker has finished and
reports the verdict under the test's own id (a failure names the missing edges, as the test
does when the suite runs in one process). tests/conftest.py installs these hooks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from fsm.engine.table import edge_keys

from engine_support import TAKEN_EDGES

COVERAGE_TEST = "test_zz_machine_coverage.py::test_every_declared_edge_is_taken_by_some_test"
ENGINE_FILES = frozenset({"test_scenarios.py", "test_stream_pass.py", "test_edges.py"})
"""Without these in the session, edges go untaken for want of their tests, not of code."""
SKIP_REASON = "edge coverage needs the whole engine suite in the session"
_WORKERS = pytest.StashKey[list[dict[str, Any]]]()

Edge = tuple[str, str, str]


def missing_edges(taken: Iterable[Edge]) -> list[Edge]:
    return sorted(edge_keys() - set(taken))


def failure_text(missing: list[Edge]) -> str:
    return f"declared edges no test takes: {missing}"


def _on_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: leave the check out (after `-k`/`-m` have chosen), noting it was chosen
    and which files the session holds."""
    if not _on_worker(config):
        return
    chosen = [item for item in items if item.nodeid.endswith(COVERAGE_TEST)]
    if not chosen:
        return
    [check] = chosen
    config.workeroutput["edge_coverage"] = {
        "nodeid": check.nodeid, "location": check.location,
        "files": sorted({item.path.name for item in items})}
    items.remove(check)
    config.hook.pytest_deselected(items=[check])


@pytest.hookimpl
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if _on_worker(config):
        config.workeroutput["taken_edges"] = sorted(TAKEN_EDGES)
        return
    workers = config.stash.get(_WORKERS, [])
    checks = [w["edge_coverage"] for w in workers if "edge_coverage" in w]
    if not checks or session.shouldstop or session.shouldfail:
        return  # not chosen, or the run was cut short (as -x would leave the test unrun)
    check = checks[0]
    session.testscollected += 1  # the workers left it out of the count they sent
    taken: set[Edge] = {tuple(edge) for w in workers
                        for edge in w.get("taken_edges", [])}
    if not set(check["files"]) >= ENGINE_FILES:
        path, line, _ = check["location"]
        _report(config, check, "skipped", (path, (line or 0) + 1, f"Skipped: {SKIP_REASON}"))
        return
    missing = missing_edges(taken)
    lost = [w for w in workers if "taken_edges" not in w]
    if lost:
        missing_text = f"{len(lost)} worker(s) ended without reporting their edges; "
        _report(config, check, "failed", missing_text + failure_text(missing))
    elif missing:
        _report(config, check, "failed", failure_text(missing))
    else:
        _report(config, check, "passed", None)
    if missing or lost:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """On the controller (an xdist hook): keep what each worker sent."""
    output = getattr(node, "workeroutput", None)
    workers = node.config.stash.setdefault(_WORKERS, [])
    workers.append(dict(output) if isinstance(output, dict) else {})


def _report(config: pytest.Config, check: dict[str, Any], outcome: str,
            longrepr: Any) -> None:
    """The check's verdict as a test's reports (set-up, call, teardown)."""
    nodeid, location = check["nodeid"], tuple(check["location"])
    decided = "setup" if outcome == "skipped" else "call"
    phases = ("setup", "teardown") if outcome == "skipped" else ("setup", "call", "teardown")
    config.hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
    for when in phases:
        report = pytest.TestReport(
            nodeid=nodeid, location=location, keywords={}, when=when,
            outcome=outcome if when == decided else "passed",
            longrepr=longrepr if when == decided else None)
        config.hook.pytest_runtest_logreport(report=report)
    config.hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)
