"""The engine's driver stays a driver (issue 23 items 5-6): `Turn` keeps the state, the
deadlines and the mailbox under a size bound; what the edges do lives apart
(`fsm/engine/edges.py`) and keeps no state of its own; the runners own theirs and none reaches
into another's. Covers no SPEC behaviour; it keeps docs/architecture.md's engine true so the
class cannot regrow silently (it had grown to 710 lines and 52 attributes)."""

from __future__ import annotations

import ast

from engine_support import ROOT

ENGINE = ROOT / "fsm" / "engine"
MAX_DRIVER_LINES = 400
MAX_DRIVER_ATTRIBUTES = 20
RUNNERS = {"pass_runner": "PassRunner", "tool_runner": "ToolRunner",
           "restart_runner": "RestartRunner"}


def _class(module: str, name: str) -> ast.ClassDef:
    tree = ast.parse((ENGINE / f"{module}.py").read_text(encoding="utf-8"))
    [found] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return found


def _attributes_set_on_self(cls: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        names |= {t.attr for t in targets if isinstance(t, ast.Attribute)
                  and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return names


def test_the_driver_is_under_its_size_bound() -> None:
    driver = _class("turn", "Turn")
    assert driver.end_lineno is not None
    lines = driver.end_lineno - driver.lineno + 1
    attributes = _attributes_set_on_self(driver)
    assert lines < MAX_DRIVER_LINES, f"Turn has {lines} lines"
    assert len(attributes) < MAX_DRIVER_ATTRIBUTES, sorted(attributes)


def test_the_edges_callbacks_keep_no_state_of_their_own() -> None:
    # what they write belongs to the ledger, the conversation or a runner, so the driver's
    # attribute count is the whole count
    assert _attributes_set_on_self(_class("edges", "EdgeCallbacks")) == set()


def test_no_runner_reaches_into_another_runners_state() -> None:
    for module, name in RUNNERS.items():
        cls = _class(module, name)
        tree = ast.parse((ENGINE / f"{module}.py").read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and (node.module or "") in RUNNERS for alias in node.names}
        assert not imported & set(RUNNERS.values()), (module, imported)
        reached = {node.attr for node in ast.walk(cls) if isinstance(node, ast.Attribute)
                   and node.attr in ("_passes", "_tools", "_restarts", "ledger")}
        assert not reached, (module, reached)
