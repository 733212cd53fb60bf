"""The repository's shape (issue 13): no import cycles between modules (TYPE_CHECKING
imports included), layers import only downwards, and every module says what it is for in its
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
    "fsm.scenarios": ("providers", "discord_io", "turn_engine"),
    "fsm.review": ("providers", "discord_io", "turn_engine"),
    "providers": ("discord_io", "turn_engine", "fsm.scenarios", "fsm.review"),
    "discord_io": ("turn_engine",),
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


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            # a package's __init__ importing its own submodules is not a cycle back into it
            if node.startswith(nxt + ".") or nxt.startswith(node + "."):
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
