"""What-if experiments: the engine with one cost removed, patched in this process only.

These are not the engine; they put numbers on design changes that were not adopted, so a
reader can judge them. Each is a context manager that patches and restores. (F1, F2, F3 and
F5 of BENCHMARKS.md were measured this way, then adopted in `fsm/`; their what-ifs went.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fsm.engine.turn as turn_module
from fsm.engine.table import TABLE


class _FastEvent:
    __slots__ = ("name", "rows")

    def __init__(self, name: str, rows: dict[str, list[tuple[str | None, tuple[str, ...],
                                                              tuple[str, ...], str]]]) -> None:
        self.name = name
        self.rows = rows

    async def trigger(self, model: Any, payload: Any = None) -> bool:
        rows = self.rows.get(model.state)
        if rows is None:
            raise RuntimeError(f"Can't trigger event {self.name} from state {model.state}!")
        for dest, guards, unless, after in rows:
            if all(getattr(model, g)(payload) for g in guards) and \
                    not any(getattr(model, u)(payload) for u in unless):
                if dest is not None:
                    model.state = dest
                getattr(model, after)(payload)
                return True
        return False


class FastMachine:
    """A dict-dispatch runtime compiled from the same declared table (`fsm/table.py`):
    per trigger and source state, the rows in order with their guards and `after`
    callback. Same semantics as the `AsyncMachine` built by `fsm.engine.machine` for what the
    turn uses (guards, unless, internal transitions, after callbacks, invalid triggers
    raise), without `transitions`' event data, condition objects and awaits: what the
    library itself costs per transition."""

    def __init__(self) -> None:
        rows: dict[str, dict[str, list[Any]]] = {}
        for edge in TABLE:
            per_source = rows.setdefault(edge.trigger, {})
            for source in edge.sources:
                per_source.setdefault(source.value, []).append((
                    edge.dest.value if edge.dest is not None else None,
                    edge.guards, edge.unless, edge.callback))
        self.events = {name: _FastEvent(name, per) for name, per in rows.items()}


@contextmanager
def dict_dispatch_machine() -> Iterator[None]:
    """Turns driven by `FastMachine` instead of the shared `AsyncMachine`."""
    original = turn_module.shared_machine
    machine = FastMachine()
    turn_module.shared_machine = lambda: machine  # type: ignore[assignment]
    try:
        yield
    finally:
        turn_module.shared_machine = original  # type: ignore[assignment]


@contextmanager
def bot_process_gc() -> Iterator[None]:
    """Not an engine change: the collector settings the bot process applies at start-up
    (`turn_engine.gc_tuning.tune_gc` with its defaults: thresholds raised from CPython's
    (700, 10, 10) to (10,000, 50, 100), what start-up created frozen), so young collections
    run 14× less often and full ones no longer rescan start-up's objects."""
    import gc

    from turn_engine.gc_tuning import GcSettings, tune_gc

    original = gc.get_threshold()
    tune_gc(GcSettings())
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*original)


def _stack(*patches: Any) -> Any:
    @contextmanager
    def combined() -> Iterator[None]:
        from contextlib import ExitStack

        with ExitStack() as stack:
            for patch in patches:
                stack.enter_context(patch())
            yield
    return combined


WHATIFS: dict[str, Any] = {
    "dict-dispatch machine": dict_dispatch_machine,
    "bot process GC settings": bot_process_gc,
    "dict-dispatch machine + bot process GC settings": _stack(dict_dispatch_machine,
                                                              bot_process_gc),
}
"""Named what-ifs, so an isolated child process can apply one by name."""


def whatif(name: str) -> Any:
    """The context manager of what-if `name` ("" for none)."""
    from contextlib import nullcontext

    return WHATIFS[name]() if name else nullcontext()
