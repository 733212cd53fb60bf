"""What-if experiments: the engine with one cost removed, patched in this process only.

These are not the engine; they put numbers on the design changes proposed in BENCHMARKS.md
so the lead can judge them before changing `fsm/`. Each is a context manager that patches
and restores.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fsm.journal as journal_module
import fsm.turn as turn_module
from fsm.machine import CALLBACK_BY_TRIGGER
from fsm.table import TABLE
from fsm.tools import Tool


@contextmanager
def cached_tool_schemas() -> Iterator[None]:
    """`schema_of(tool)` computed once per tool instead of on every pass: today
    `Turn._prepare_request` calls pydantic's `model_json_schema()` for every available
    tool on every pass."""
    original = turn_module.schema_of
    cache: dict[int, tuple[Tool, dict[str, Any]]] = {}

    def cached(tool: Tool) -> dict[str, Any]:
        hit = cache.get(id(tool))
        if hit is None or hit[0] is not tool:
            hit = (tool, original(tool))
            cache[id(tool)] = hit
        return hit[1]

    turn_module.schema_of = cached  # type: ignore[assignment]
    try:
        yield
    finally:
        turn_module.schema_of = original  # type: ignore[assignment]


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
    callback. Same semantics as the `AsyncMachine` built by `fsm.machine` for what the
    turn uses (guards, unless, internal transitions, after callbacks, invalid triggers
    raise); no per-callback tasks, no `asyncio.gather`, no model decoration."""

    def __init__(self) -> None:
        rows: dict[str, dict[str, list[Any]]] = {}
        for edge in TABLE:
            per_source = rows.setdefault(edge.trigger, {})
            for source in edge.sources:
                per_source.setdefault(source.value, []).append((
                    edge.dest.value if edge.dest is not None else None,
                    edge.guards, edge.unless, CALLBACK_BY_TRIGGER[edge.trigger]))
        self.events = {name: _FastEvent(name, per) for name, per in rows.items()}

    def add_model(self, model: Any, initial: str) -> None:
        model.state = initial

    def remove_model(self, model: Any) -> None:
        return None


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
def lean_journal() -> Iterator[None]:
    """`JournalRecorder.on_text` appending a tuple to the pass's list instead of building a
    rounded dict through `_steps()` per chunk (the dicts would be built once, at the end,
    when the journal is written)."""
    original = journal_module.JournalRecorder.on_text

    def on_text(self: Any, pass_no: int, at: float, text: str, after_abort: bool) -> None:
        if after_abort:
            self._landed[pass_no] = self._landed.get(pass_no, "") + text
        elif pass_no == self.__dict__.get("_raw_no"):
            self._raw_steps.append((at, text))
        else:
            self._raw_no = pass_no
            self._raw_steps = [(at, text)]

    journal_module.JournalRecorder.on_text = on_text  # type: ignore[method-assign]
    try:
        yield
    finally:
        journal_module.JournalRecorder.on_text = original  # type: ignore[method-assign]


class _SyncEventAdapter:
    __slots__ = ("_trigger",)

    def __init__(self, event: Any) -> None:
        self._trigger = event.trigger

    async def trigger(self, model: Any, payload: Any = None) -> bool:
        return bool(self._trigger(model, payload))


class _SyncMachineAdapter:
    """`transitions.Machine` (the synchronous one) behind the interface `Turn` awaits.
    With `decorate=False` turns never join it (`add_model` only sets the initial state)."""

    def __init__(self, decorate: bool = True) -> None:
        self.decorate = decorate
        from transitions import Machine

        from fsm.machine import transition_specs
        from fsm.table import STATES, State

        self.machine = Machine(model=None, states=[s.value for s in STATES],
                               transitions=transition_specs(), initial=State.PREPARING.value,
                               auto_transitions=False, send_event=False,
                               ignore_invalid_triggers=False)
        self.events = {name: _SyncEventAdapter(event)
                       for name, event in self.machine.events.items()}

    def add_model(self, model: Any, initial: str) -> None:
        if self.decorate:
            self.machine.add_model(model, initial=initial)
        else:
            model.state = initial

    def remove_model(self, model: Any) -> None:
        if self.decorate:
            self.machine.remove_model(model)


@contextmanager
def sync_transitions_machine(decorate: bool = True) -> Iterator[None]:
    """Turns driven by the synchronous `transitions.Machine` built from the same table: the
    callbacks are already short and synchronous, so nothing needs `AsyncMachine`'s
    per-callback tasks and `asyncio.gather`."""
    original = turn_module.shared_machine
    machine = _SyncMachineAdapter(decorate)
    turn_module.shared_machine = lambda: machine  # type: ignore[assignment]
    try:
        yield
    finally:
        turn_module.shared_machine = original  # type: ignore[assignment]


@contextmanager
def undecorated_models() -> Iterator[None]:
    """The shared `AsyncMachine` kept, but turns never join it with `add_model`: the turn
    sets its own `state` and fires `machine.events[trigger].trigger(turn, payload)` as it
    does today. `add_model` binds a trigger method, a `may_<trigger>` method and an
    `is_<state>` method per trigger and state onto every turn (≈ 50 partials) and
    registers it in every state's callback lists, which is most of a parked turn's
    memory; `remove_model` walks them again."""
    machine = turn_module.shared_machine()
    original_add, original_remove = machine.add_model, machine.remove_model

    def add_model(model: Any, initial: str | None = None) -> None:
        model.state = initial

    def remove_model(model: Any) -> None:
        machine.async_tasks.pop(id(model), None)

    machine.add_model = add_model
    machine.remove_model = remove_model
    try:
        yield
    finally:
        machine.add_model = original_add
        machine.remove_model = original_remove


async def _lean_stream_worker(turn: Any, run: Any) -> None:
    """`fsm.stream_pass.stream_worker` with the per-chunk path trimmed, same events posted:
    locals bound once per pass, the idle deadline and lock touch inlined (no `partial`
    call), the journal step a `(at, text)` tuple appended to a per-pass list, `abort`'s
    flag read once per chunk."""
    import asyncio

    from fsm.events import FirstToken, StreamCrashed, StreamEnded
    from fsm.provider import (
        Finish,
        KeepAlive,
        ProviderError,
        ReasoningDelta,
        TextDelta,
        ToolCallRequest,
        Usage,
    )
    from fsm.stream_pass import _outcome, _settled

    loop = asyncio.get_running_loop()
    clock = loop.time
    post = turn.mailbox.post
    deliver = turn.channel.deliver
    recorder = turn.recorder
    abort = run.abort
    parts = run.parts
    lock = turn.lock
    idle = turn.config.idle_timeout_s
    started = run.started_at
    steps: list[tuple[float, str]] | None = None
    if recorder is not None:
        steps = []
        recorder.__dict__.setdefault("_lean_steps", {})[run.no] = steps
    try:
        with turn.locks.watchdog(lock):
            async for event in turn.provider.stream(run.request, abort):
                if isinstance(event, TextDelta):
                    text = event.text
                    if not text:
                        continue
                    now = clock()
                    if abort._fired:
                        run.landed.append(text)
                        if recorder is not None:
                            recorder.on_text(run.no, now - started, text, True)
                    else:
                        parts.append(text)
                        if run.on_progress is not None:
                            run.deadline = now + idle
                            lock.last_touch = now
                        if not run.got_token:
                            run.got_token = True
                            post(FirstToken(run.no))
                        if steps is not None:
                            steps.append((now - started, text))
                    await deliver(text)
                elif isinstance(event, KeepAlive):
                    if recorder is not None:
                        recorder.on_keepalive(run.no, clock() - started)
                elif isinstance(event, ReasoningDelta):
                    run.reasoning.append(event.text)
                elif isinstance(event, ToolCallRequest):
                    run.tool_calls.append(event)
                elif isinstance(event, Usage):
                    run.usage = event
                elif isinstance(event, Finish):
                    run.finish = event.reason
                elif isinstance(event, ProviderError):
                    run.error = event
                    break
            if not abort.fired:
                await turn.channel.finish_pass()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if abort.fired:
            _settled(turn, run, clock())
        else:
            if recorder is not None:
                recorder.on_raise(run.no, clock() - started, exc)
            post(StreamCrashed(run.no, exc))
        return
    if abort.fired:
        _settled(turn, run, clock())
        return
    outcome = _outcome(run)
    if recorder is not None:
        recorder.on_end(run.no, clock() - started, outcome, run)
    post(StreamEnded(run.no, outcome, run.error))


@contextmanager
def lean_stream_worker() -> Iterator[None]:
    """Passes run by `_lean_stream_worker` (journal steps as tuples, inlined progress)."""
    original = turn_module.stream_worker
    turn_module.stream_worker = _lean_stream_worker  # type: ignore[assignment]
    try:
        yield
    finally:
        turn_module.stream_worker = original  # type: ignore[assignment]


GC_THRESHOLDS = (10_000, 50, 100)


@contextmanager
def raised_gc_thresholds() -> Iterator[None]:
    """Not an engine change: the bot process sets `gc.set_threshold(10_000, 50, 100)`
    (CPython's default is 700, 10, 10), so young collections run 14× less often and fewer
    objects of live turns are promoted and re-scanned by full collections."""
    import gc

    original = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
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
    "lean journal": lean_journal,
    "lean stream worker": lean_stream_worker,
    "schemas cached": cached_tool_schemas,
    "models not decorated": undecorated_models,
    "schemas cached + models not decorated": _stack(cached_tool_schemas, undecorated_models),
    "schemas cached + sync transitions.Machine": _stack(cached_tool_schemas,
                                                        sync_transitions_machine),
    "schemas cached + sync Machine, models not decorated": _stack(
        cached_tool_schemas, lambda: sync_transitions_machine(decorate=False)),
    "schemas cached + dict-dispatch machine": _stack(cached_tool_schemas,
                                                     dict_dispatch_machine),
    "GC thresholds raised": raised_gc_thresholds,
    "schemas cached + sync Machine, models not decorated + GC thresholds raised": _stack(
        cached_tool_schemas, lambda: sync_transitions_machine(decorate=False),
        raised_gc_thresholds),
    "schemas cached + dict dispatch + lean journal": _stack(
        cached_tool_schemas, dict_dispatch_machine, lean_journal),
}
"""Named what-ifs, so an isolated child process can apply one by name."""


def whatif(name: str) -> Any:
    """The context manager of what-if `name` ("" for none)."""
    from contextlib import nullcontext

    return WHATIFS[name]() if name else nullcontext()
