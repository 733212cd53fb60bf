"""Scripted stand-ins for everything outside the engine, played from a scenario: the
provider, the tools and an in-memory channel. They run on the loop clock, so a scenario
runs in virtual time."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

from ..engine.channel import Notice
from ..engine.flags import EnrichmentKind
from ..engine.provider import (
    AbortSignal,
    Finish,
    KeepAlive,
    PassRequest,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallRequest,
    Usage,
)
from ..engine.stash import ContextStash
from ..engine.tools import (
    AnyArgs,
    FunctionTool,
    LoopPolicy,
    ToolContext,
    ToolRegistry,
    ToolResult,
)
from .format import GuardedTool, HistoryMessage, LookupSpec, Step, ToolCallSpec, ToolOutcome

STASH_REF = "$stash:"


class ScriptedProviderError(RuntimeError):
    """The `raise` step: an unexpected exception from the provider (S15)."""


_NAMED_ERRORS: dict[tuple[type[Exception], str], type[Exception]] = {}


def named_error(base: type[Exception], name: str | None) -> type[Exception]:
    """A subclass of `base` called `name`, so a replayed exception reads as the recorded one
    did (`TypeError: …`) without the journal choosing which real class is raised."""
    if not name:
        return base
    key = (base, name)
    if key not in _NAMED_ERRORS:
        _NAMED_ERRORS[key] = type(name, (base,), {"__module__": "replayed"})
    return _NAMED_ERRORS[key]


async def _sleep_until(when: float, abort: AbortSignal) -> bool:
    """Sleep until the loop clock reaches `when`; False if the abort fired first."""
    if abort.fired:
        return False
    loop = asyncio.get_running_loop()
    if when <= loop.time():
        return True
    waiter: asyncio.Future[bool] = loop.create_future()

    def wake(value: bool) -> None:
        if not waiter.done():
            waiter.set_result(value)

    handle = loop.call_at(when, wake, True)

    def on_abort() -> None:
        wake(False)

    abort.add_callback(on_abort)
    try:
        return await waiter
    finally:
        handle.cancel()
        abort.remove_callback(on_abort)


def _call(spec: ToolCallSpec) -> ToolCallRequest:
    """A scripted call keeps its arguments as written, wrong types included, so the engine's
    argument validation is exercised as with a real provider's output."""
    return ToolCallRequest(name=spec.name or "", arguments=cast(dict[str, Any], spec.args),
                           id=spec.id, truncated=spec.truncated)


class ScriptedProvider:
    """Plays one list of steps per provider call, in order; past the script, it stalls."""

    name = "scripted"

    def __init__(self, passes: list[list[Step]]) -> None:
        self._passes = passes
        self.calls = 0
        self.requests: list[PassRequest] = []

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        index = self.calls
        self.calls += 1
        self.requests.append(request)
        steps = self._passes[index] if index < len(self._passes) else []
        return self._play(steps, abort)

    async def _play(self, steps: list[Step], abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        start = asyncio.get_running_loop().time()
        # A recorded pass carries the provider's own finish word as a step; only a
        # hand-written one gets the word an ending step implies.
        implied_finish = not any(step.finish is not None for step in steps)
        for step in steps:
            if not await _sleep_until(start + step.at, abort):
                return
            kind = step.kind
            if kind == "text":
                yield TextDelta(step.text or "")
            elif kind == "keepalive":
                yield KeepAlive("scripted")
                if step.count > 1:
                    # A recorded run of keep-alives: the engine acts on none of them, so
                    # the last one stands for the rest.
                    if not await _sleep_until(start + (step.until or step.at), abort):
                        return
                    yield KeepAlive("scripted")
            elif kind == "reasoning":
                yield ReasoningDelta(step.reasoning or "")
            elif kind == "usage":
                yield Usage(**(step.usage.model_dump() if step.usage else {}))
            elif kind == "finish":
                yield Finish(step.finish or "")
            elif kind in ("tool_call", "tool_calls"):
                specs = [step.tool_call] if step.tool_call is not None else step.tool_calls or []
                for spec in specs:
                    if spec is not None:
                        yield _call(spec)
                if implied_finish:
                    yield Finish("tool_calls")
                return
            elif kind == "end":
                if step.end == "completed" and implied_finish:
                    yield Finish("stop")
                return
            elif kind == "error":
                error = step.error_spec
                yield ProviderError(kind=error.kind, message=error.message, type=error.type,
                                    status=error.status, retryable=error.retryable,
                                    retry_after_s=error.retry_after_s)
                return
            elif kind == "raise":
                raise named_error(ScriptedProviderError, step.error_type)(
                    step.raise_ or "scripted failure")
            elif kind == "stall":
                async for event in self._stall(abort, step.settles_after, step.lands):
                    yield event
                return
        async for event in self._stall(abort, 0.0, None):
            yield event

    @staticmethod
    async def _stall(
        abort: AbortSignal, settles_after: float, lands: str | None
    ) -> AsyncIterator[ProviderEvent]:
        """Silent until aborted; then settle, and a send that was on the wire lands."""
        await abort.wait()
        if settles_after > 0:
            await asyncio.sleep(settles_after)
        if lands:
            yield TextDelta(lands)


class ScriptedTools:
    """The scenario's tools as a registry: each call takes the tool's next outcome."""

    def __init__(self, spec: dict[str, list[ToolOutcome] | GuardedTool], stash: ContextStash,
                 stash_keys: dict[str, str]) -> None:
        self._stash_keys = stash_keys
        self._stash = stash
        self.calls: dict[str, int] = {}
        self.registry = ToolRegistry()
        for name, entry in spec.items():
            guard: EnrichmentKind | None = None
            loop: LoopPolicy = "next_pass"
            outcomes = entry
            if isinstance(entry, GuardedTool):
                guard, loop, outcomes = entry.guard, entry.loop, entry.outcomes
            assert isinstance(outcomes, list)
            self.registry.register(FunctionTool(
                name=name, description=f"scripted tool {name}", args_model=AnyArgs,
                func=self._runner(name, outcomes), guard=guard, loop=loop,
            ))

    def _runner(self, name: str, outcomes: list[ToolOutcome]) -> Any:
        async def run(_args: AnyArgs, ctx: ToolContext) -> ToolResult:
            index = self.calls.get(name, 0)
            self.calls[name] = index + 1
            if index >= len(outcomes):
                return ToolResult.fail("unknown tool")
            outcome = outcomes[index]
            if outcome.hang:
                await asyncio.Event().wait()
            if outcome.after > 0:
                await asyncio.sleep(outcome.after)
            if outcome.raise_ is not None:
                raise named_error(RuntimeError, outcome.error_type)(outcome.raise_)
            if outcome.refused is not None:
                return ToolResult.fail(outcome.refused)
            if outcome.success:
                return ToolResult.ok(self._resolve_refs(outcome.data))
            return ToolResult.fail(outcome.error or "tool failed")
        return run

    def _resolve_refs(self, data: Any) -> Any:
        """Replace `$stash:NAME` with the key the stash returned for item NAME."""
        if isinstance(data, str) and data.startswith(STASH_REF):
            name = data[len(STASH_REF):]
            return self._stash_keys.get(name) or secrets.token_urlsafe(16)
        if isinstance(data, dict):
            return {k: self._resolve_refs(v) for k, v in data.items()}
        if isinstance(data, list):
            return [self._resolve_refs(v) for v in data]
        return data


class InMemoryChannel:
    """A channel that keeps what it was sent and answers reactor look-ups: as a live channel
    answered them (`lookups`, recorded in call order, with their timing), else from history."""

    def __init__(self, history: list[HistoryMessage] | None = None,
                 flush_delays: Sequence[float] = (),
                 lookups: Sequence[LookupSpec] = ()) -> None:
        self.history = {m.id: m for m in history or []}
        self.flush_delays = list(flush_delays)
        self.recorded_lookups = list(lookups)
        self.delivered: list[str] = []
        self.notices: list[Notice] = []
        self.passes_finished = 0
        self.reactor_lookups = 0

    @property
    def text(self) -> str:
        return "".join(self.delivered)

    async def deliver(self, text: str) -> None:
        self.delivered.append(text)

    async def finish_pass(self) -> None:
        """Instant, unless a recorded flush took time (a scenario's `flush_s`)."""
        if self.passes_finished < len(self.flush_delays):
            delay = self.flush_delays[self.passes_finished]
            if delay > 0:
                await asyncio.sleep(delay)
        self.passes_finished += 1

    def discard_unsent(self) -> None:
        """Nothing to drop: every chunk is delivered as it comes."""

    async def post_notice(self, notice: Notice) -> None:
        self.notices.append(notice)

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        self.reactor_lookups += 1
        if self.reactor_lookups <= len(self.recorded_lookups):
            return await _answer(self.recorded_lookups[self.reactor_lookups - 1], limit)
        message = self.history.get(message_id)
        if message is None:
            return []
        for reaction in message.reactions:
            if reaction.emoji == emoji:
                return reaction.users[:limit]
        return []


async def _answer(lookup: LookupSpec, limit: int) -> list[str]:
    """A recorded look-up's answer, as late as it came live (or never)."""
    if lookup.hang:
        await asyncio.Event().wait()
    if lookup.after > 0:
        await asyncio.sleep(lookup.after)
    if lookup.error_type is not None:
        raise named_error(RuntimeError, lookup.error_type)("recorded look-up failure")
    return lookup.users[:limit]


def history_items(history: list[HistoryMessage]) -> list[dict[str, Any]]:
    """The channel's recent messages as dialogue context items (reaction counts only)."""
    return [
        {
            "type": "dialogue",
            "role": "user",
            "message_id": m.id,
            "author": m.author,
            "author_id": m.author_id or m.author,
            "content": m.content,
            "sent_at": m.at,
            "reply_to": m.reply_to,
            "reactions": [{"emoji": r.emoji,
                           "count": r.count if r.count is not None else len(r.users)}
                          for r in m.reactions],
        }
        for m in history
    ]
