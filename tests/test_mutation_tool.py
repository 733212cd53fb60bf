"""The mutation tier's mutator (scripts/mutation/, RELIABILITY.md "Mutation"): which swaps it
makes, what it leaves alone, and that a numbered mutant rebuilds to code that behaves
differently. Covers no SPEC behaviour; it keeps the tier's scores meaningful."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from engine_support import ROOT

sys.path.insert(0, str(ROOT / "scripts" / "mutation"))
from mutants import mutants, mutated_tree

SOURCE = '''
"""Module docstring."""
import logging
log = logging.getLogger(__name__)
LIMIT = 3
"""An attribute docstring."""

def fits(items, extra, strict):
    """Docstring."""
    if len(items) + extra <= LIMIT and not strict:
        return True
    log.warning("over the limit: %s", "detail")
    raise ValueError("too many")
'''


def _run(number: int | None, items: list[int], extra: int, strict: bool) -> object:
    tree = mutated_tree(SOURCE, number) if number is not None else compile(SOURCE, "m", "exec")
    namespace: dict[str, object] = {"__name__": "m"}
    exec(compile(tree, "m", "exec") if number is not None else tree, namespace)
    try:
        return namespace["fits"](items, extra, strict)  # type: ignore[operator]
    except ValueError:
        return "raised"


def test_operators_constants_and_keywords_are_swapped_but_no_message() -> None:
    found = {m.key for m in mutants(SOURCE)}
    assert {"<module>: 3 -> 4", "fits: len(items) + extra -> len(items) - extra",
            "fits: len(items) + extra <= LIMIT -> len(items) + extra < LIMIT",
            "fits: not strict -> strict", "fits: True -> False"} <= found
    assert any(" and " in key and " or " in key for key in found)
    text = " ".join(found)
    assert "docstring" not in text.lower() and "detail" not in text
    assert "too many" not in text and "over the limit" not in text


def test_every_mutant_rebuilds_and_some_input_tells_it_apart() -> None:
    inputs = [([], 0, False), ([1, 2, 3], 0, False), ([1, 2], 1, False), ([1], 2, False),
              ([1], 0, True), ([1, 2, 3, 4], 0, False), ([1, 2, 3], -1, False)]
    for mutant in mutants(SOURCE):
        if mutant.where == "<module>" and "logging" in mutant.before:
            continue
        original = [_run(None, *args) for args in inputs]
        assert [_run(mutant.number, *args) for args in inputs] != original, mutant.key


def test_every_module_of_the_tier_names_existing_tests() -> None:
    targets = tomllib.loads((ROOT / "scripts/mutation/targets.toml").read_text())["module"]
    for module, target in targets.items():
        assert (ROOT / module).is_file(), module
        for test in target["tests"]:
            if not test.startswith("-"):
                assert Path(ROOT / test.split("::")[0]).is_file(), test
        assert all(entry["reason"] for entry in target.get("equivalent", []))
