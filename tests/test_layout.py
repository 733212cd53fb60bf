"""The repository's shape (issues 13 and 23): no import cycles between modules (TYPE_CHECKING
imports included) nor between packages (a package is a directory with its `__init__.py`; a
cycle of packages is a layering knot even when no two modules import each other), layers import
only downwards, and every module says what it is for in its
first docstring line. Covers no SPEC behaviour; it keeps the architecture of
docs/architecture.md true."""

from __future__ import annotations

import ast
from pathlib import Path

from engine_support import ROOT

PACKAGES = ("fsm", "providers", "discord_io", "turn_engine")
# What each layer may not import (docs/architecture.md).
FORBIDDEN = {
    "fsm.engine": ("fsm.scenarios", "fsm.review", "fsm.cli", "providers", "discord_io",
                   "turn_engine"),
    "fsm.journal": ("fsm.scenarios", "fsm.review", "fsm.cli", "providers", "discord_io",
                    "turn_engine"),
    "fsm.local_http": ("fsm.engine", "fsm.journal", "fsm.scenarios", "fsm.review", "fsm.cli",
                       "fsm.telemetry", "providers", "discord_io", "turn_engine"),
    "fsm.scenarios": ("fsm.review", "fsm.cli", "providers", "discord_io", "turn_engine"),
    "fsm.review": ("fsm.cli", "providers", "discord_io", "turn_engine"),
    "fsm.telemetry": ("fsm.scenarios", "fsm.review", "fsm.journal", "fsm.cli", "providers",
                      "discord_io", "turn_engine"),
    # the emulator stands for Discord: it knows nothing of the bot it is talking to
    "discord_io.testing": ("fsm", "providers", "discord_io.admission", "discord_io.delivery",
                           "discord_io.redis_backend", "turn_engine"),
    "providers": ("discord_io", "turn_engine", "fsm.scenarios", "fsm.review"),
    "discord_io": ("turn_engine", "fsm.scenarios", "fsm.review", "fsm.cli"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, resolved (relative imports too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _package_graph(graph: dict[str, set[str]], paths: dict[str, Path]) -> dict[str, set[str]]:
    """Which package imports which: every module's imports, seen from the package it is in."""
    packages: dict[str, set[str]] = {}
    for name, imported in graph.items():
        here = _package_of(name, paths[name])
        packages.setdefault(here, set()).update(
            there for target in imported if (there := _package_of(target, paths[target])) != here)
    return packages


def _cycle(graph: dict[str, set[str]], *, nesting_counts: bool = False) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            # a package's __init__ importing its own submodules is not a cycle back into it;
            # between packages, a parent and its subpackage are two rooms like any others
            if not nesting_counts and (node.startswith(nxt + ".") or nxt.startswith(node + ".")):
                continue
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_package_cycles() -> None:
    modules = _modules()
    cycle = _cycle(_package_graph(_graph(), modules), nesting_counts=True)
    assert cycle is None, "package cycle: " + " -> ".join(cycle or [])


def test_the_package_cycle_finder_finds_one_no_module_cycle_shows() -> None:
    # a.x -> b.y and b.z -> a.w: no module imports one that imports it back, yet the
    # packages a and b are knotted (scenarios/demo.py and review/journal.py were, issue 23)
    paths = {name: Path(*name.split(".")).with_suffix(".py")
             for name in ("a.x", "a.w", "b.y", "b.z")}
    graph = {"a.x": {"b.y"}, "a.w": set(), "b.y": set(), "b.z": {"a.w"}}
    assert _cycle(graph) is None
    assert _cycle(_package_graph(graph, paths), nesting_counts=True) == ["a", "b", "a"]


def test_layers_import_only_downwards() -> None:
    problems = []
    for name, imported in _graph().items():
        for layer, banned in FORBIDDEN.items():
            if name == layer or name.startswith(layer + "."):
                problems += [f"{name} imports {target}" for target in sorted(imported)
                             if any(target == b or target.startswith(b + ".") for b in banned)]
    assert not problems, "\n".join(problems)


def test_every_module_says_what_it_is_for() -> None:
    missing = [name for name, path in _modules().items()
               if not (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "")
               .strip() and path.stat().st_size > 0]
    assert not missing, "modules without a docstring: " + ", ".join(sorted(missing))
