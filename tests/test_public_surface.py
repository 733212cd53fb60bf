"""The engine's public surface is whole and the project's own adapters live on it (issue 23
item 8, docs/embedding.md): every type a public contract names — what an implementer must
raise, the literal kinds a field holds, the state a provider carries — is exported from `fsm`,
and providers/, discord_io/, turn_engine/, bench/ and examples/ import the engine only through
`fsm`, never an `fsm.engine` submodule. Covers no SPEC behaviour: it keeps the stable surface
of docs/embedding.md true."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from typing import Any

import fsm
import fsm.engine

from engine_support import ROOT

ADAPTERS = ("providers", "discord_io", "turn_engine", "bench", "examples")
PATCHES_THE_ENGINE = ("bench/whatif.py",)
"""What-if experiments replace engine internals in their own process on purpose (BENCHMARKS.md)."""
_DEFINITION = re.compile(r"^(?:class (\w+)|([A-Z]\w*)(?:: [\w\[\], ]+)? = (?:Literal|Callable))",
                         re.MULTILINE)


def _engine_types() -> set[str]:
    """The public classes and type aliases the engine's modules define."""
    names: set[str] = set()
    for module in pkgutil.iter_modules(fsm.engine.__path__):
        source = inspect.getsource(importlib.import_module(f"fsm.engine.{module.name}"))
        names |= {a or b for a, b in _DEFINITION.findall(source)}
    return {name for name in names if not name.startswith("_")}


def _what_it_tells_implementers(obj: Any) -> list[str]:
    """The docstring and public annotations of a public name and of its public members."""
    texts = [inspect.getdoc(obj) or ""]
    members = [obj]
    if inspect.isclass(obj):
        members += [m.fget if isinstance(m, property) else m for name, m in vars(obj).items()
                    if not name.startswith("_") or name == "__init__"]
        texts += [str(a) for a in getattr(obj, "__annotations__", {}).values()]
    for member in members:
        if callable(member):
            texts.append(inspect.getdoc(member) or "")
            texts += [str(a) for a in getattr(member, "__annotations__", {}).values()]
    return texts


def test_every_type_a_public_contract_names_is_exported() -> None:
    defined, exported = _engine_types(), set(fsm.__all__)
    missing = sorted({f"{name} names {word}" for name in fsm.__all__
                      for text in _what_it_tells_implementers(getattr(fsm, name))
                      for word in re.findall(r"\b([A-Z]\w+)\b", text)
                      if word in defined and word not in exported})
    assert not missing, "not exported from fsm: " + "; ".join(missing)


def test_the_checker_sees_a_contract_naming_an_unexported_type() -> None:
    class Contract:
        """Raise `StashFull` when the stash is full."""

        def put(self, kind: str) -> None: ...

    assert "StashFull" in _engine_types()
    assert any("StashFull" in text for text in _what_it_tells_implementers(Contract))


def _engine_submodule_imports(path: Any) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                   else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {m}" for m in modules
                  if m == "fsm.engine" or m.startswith("fsm.engine.")]
    return found


def test_the_adapters_use_the_public_surface() -> None:
    problems = [line for package in ADAPTERS for path in sorted((ROOT / package).rglob("*.py"))
                if str(path.relative_to(ROOT)) not in PATCHES_THE_ENGINE
                for line in _engine_submodule_imports(path)]
    assert not problems, "imports past fsm's public surface:\n" + "\n".join(problems)
