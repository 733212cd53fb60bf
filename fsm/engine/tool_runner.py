"""The tool half of the loop (T2-T7, T9): the calls a pass asked for, the one running, its
worker, timeout and abort, and what the outcomes add up to (the error count, the loop policy
of the batch, the calls a fallback may replay).

The runner never fires a trigger: the driver asks it what to do next and fires what it is
told (only the driver fires triggers). Its worker runs one tool under the lock's watchdog and
posts the result to the driver's mailbox.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from .channel import TurnChannel
from .clock import reading
from .config import TurnConfig
from .events import ToolFinished, TurnEvent
from .flags import TurnFlags
from .locks import ChannelLock, ChannelLockRegistry
from .mailbox import Mailbox
from .provider import AbortSignal, HistoryEntry, ToolCallRequest
from .recording import InputRecorder
from .restart import parse_restart
from .stash import ContextStash
from .tasks import Work
from .tools import ToolContext, ToolRegistry, ToolResult

log = logging.getLogger(__name__)

Verdict = tuple[str, Any]
"""A trigger for the driver to fire and its payload."""


@dataclass(frozen=True, slots=True)
class PendingCall:
    """The call being run (or refused): its number tells a late result from a current one."""

    no: int
    call: ToolCallRequest
    started_at: float


class ToolRunner:
    """Runs a pass's tool calls one at a time, each under its own timeout and the kill."""

    def __init__(
        self,
        *,
        tools: ToolRegistry,
        config: TurnConfig,
        locks: ChannelLockRegistry,
        lock: ChannelLock,
        mailbox: Mailbox[TurnEvent],
        recorder: InputRecorder | None,
        turn_id: str,
        clock: Callable[[], float],
        spawn: Callable[[Work, str], asyncio.Task[None]],
    ) -> None:
        self._registry = tools
        self._config = config
        self._locks = locks
        self._lock = lock
        self._mailbox = mailbox
        self.recorder = recorder
        self._turn_id = turn_id
        self._clock = clock
        self._spawn = spawn
        self._calls: deque[ToolCallRequest] = deque()
        self._seq = itertools.count(1)
        self._batches = itertools.count(1)
        self.batch = ""
        """The id of the model turn whose calls run now (unique across a fallback chain)."""
        self._pre_tool_text = ""
        self.current: PendingCall | None = None
        self.deadline: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._abort: AbortSignal | None = None
        self.consecutive_errors = 0
        self.replayable_calls: list[dict[str, Any]] = []
        """Successful ordinary calls, for a fallback to be told of (G1)."""
        self._batch_text = ""
        """The visible text of the pass whose tool calls run now (T9)."""
        self._end_requested = False
        """A call of this batch declared that its success ends the turn (T9)."""
        self.follow_up_required = False
        """A call of the last batch declared that the model must speak after it (T10)."""

    # ------------------------------------------------------------- the calls of a pass

    def queue(self, calls: list[ToolCallRequest], pre_tool_text: str) -> None:
        """The pass asked for `calls`; its visible text goes on the first entry (T7), unless
        it is only whitespace (Anthropic rejects whitespace-only text blocks)."""
        self._calls = deque(calls)
        self.batch = f"{self._turn_id}:{next(self._batches)}"
        self._pre_tool_text = pre_tool_text if pre_tool_text.strip() else ""
        self._batch_text = pre_tool_text
        self._end_requested = False
        self.follow_up_required = False

    @property
    def registry(self) -> ToolRegistry:
        return self._registry

    def has_queued(self) -> bool:
        return bool(self._calls)

    def busy(self) -> bool:
        """A tool worker is still running (none may outlive the turn, S14)."""
        return self._task is not None and not self._task.done()

    def drop_queued(self) -> None:
        self._calls.clear()

    def take_pre_tool_text(self) -> str:
        text, self._pre_tool_text = self._pre_tool_text, ""
        return text

    def settle_current(self) -> PendingCall:
        """The current call's outcome is recorded: no call runs until the next dispatch."""
        current = self.current
        assert current is not None
        self.current = None
        self.deadline = None
        return current

    # ------------------------------------------------------------- running one call

    def dispatch(self, channel: TurnChannel, flags: TurnFlags, stash: ContextStash,
                 context_items: list[dict[str, Any]]) -> Verdict | None:
        """Run the next queued call, or refuse it without running (T2, T4, R8). Returns what
        to fire now, or None when a worker started."""
        call = self._calls.popleft()
        pending = PendingCall(no=next(self._seq), call=call, started_at=self._clock())
        self.current = pending
        if not call.name:
            return ("nameless_call", None)
        refusal = self._refusal(call, flags)
        if refusal is not None:
            return self.verdict(ToolResult.fail(refusal))
        tool = self._registry.get(call.name)
        assert tool is not None
        args = self._registry.parse_args(tool, call.arguments)
        if isinstance(args, str):
            if self.recorder is not None:
                self.recorder.on_tool(call.name, 0.0, {"refused": args})
            return self.verdict(ToolResult.fail(args))
        abort = AbortSignal()
        self._abort = abort
        self.deadline = pending.started_at + self._config.tool_timeout_s
        ctx = ToolContext(channel=channel, flags=flags, abort=abort, stash=stash,
                          turn_id=self._turn_id, context_items=context_items)
        self._task = self._spawn(self._worker(pending, tool.run, args, ctx),
                           f"{self._turn_id}-tool-{pending.no}")
        return None

    def _refusal(self, call: ToolCallRequest, flags: TurnFlags) -> str | None:
        if call.truncated:
            return (f"the arguments of {call.name} were cut off by the provider (output limit "
                    "reached), so the call was not run; call it again with complete arguments")
        return self._registry.refusal(call.name, flags)

    async def _worker(
        self,
        pending: PendingCall,
        run: Callable[[Any, ToolContext], Coroutine[Any, Any, ToolResult]],
        args: Any,
        ctx: ToolContext,
    ) -> None:
        """Run one tool under the watchdog; its exceptions become failed results."""
        name = pending.call.name
        recorder = self.recorder
        try:
            with self._locks.watchdog(self._lock):
                result = await run(args, ctx)
            if not isinstance(result, ToolResult):
                result = ToolResult.fail(f"{name} returned {type(result).__name__}, "
                                         "not a tool result")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("tool %s raised %s", name, type(exc).__name__)
            result = ToolResult.fail(f"{name} failed: {type(exc).__name__}: {exc}")
            finished_at = reading()
            if recorder is not None:
                recorder.on_tool(name, finished_at - pending.started_at,
                                 {"raise": str(exc), "error_type": type(exc).__name__})
        else:
            finished_at = reading()
            if recorder is not None:
                recorder.on_tool(name, finished_at - pending.started_at,
                                 _recorded_outcome(result))
        self._mailbox.post(ToolFinished(pending.no, result), finished_at)

    def finished(self, event: ToolFinished) -> Verdict | None:
        """The worker's result, if it is the current call's (a late one is ignored)."""
        current = self.current
        if current is None or event.call_no != current.no:
            return None
        self._task = None
        return self.verdict(event.result)

    def verdict(self, result: ToolResult) -> Verdict:
        """A successful result asking for a restart is a restart request (R1): which
        enrichment it is, and so which flag it sets, is the tool's declared guard (R8); any
        other is an ordinary tool result."""
        current = self.current
        assert current is not None
        self._abort = None
        restart = None
        if result.success:
            tool = self._registry.get(current.call.name)
            guard = tool.guard if tool is not None else None
            restart = parse_restart(current.call.name, result.data, guard)
        if restart is not None:
            return ("restart_requested", (result, restart))
        return ("tool_result", result)

    def timed_out(self, deadline: float) -> ToolResult:
        """The tool's own timeout: a failed result the model sees (T5); the worker is
        cancelled, and the turn's task group awaits it."""
        current = self.current
        assert current is not None
        task, self._task = self._task, None
        if self._abort is not None:
            self._abort.fire("timeout")
            self._abort = None
        if task is not None:
            task.cancel()
        if self.recorder is not None:
            self.recorder.on_tool(current.call.name, deadline - current.started_at,
                                   {"hang": True})
        return ToolResult.fail(
            f"{current.call.name} timed out after {self._config.tool_timeout_s:g} s")

    # ------------------------------------------------------------- outcomes

    def error_cap_reached(self, payload: Any) -> bool:
        failed = isinstance(payload, ToolResult) and not payload.success
        errors = self.consecutive_errors + 1 if failed else 0
        return errors >= self._config.max_consecutive_tool_errors

    def policy_ends_turn(self, payload: Any) -> bool:
        """The last call of the batch is done and a call of it declared that its success
        ends the turn: it delivered the reply itself, or visible text came before it (T9).
        A failure reaching the error cap ends it as that error instead (T6)."""
        if self.has_queued() or self.error_cap_reached(payload):
            return False
        return self._end_requested or self._ends_turn(payload)

    def _ends_turn(self, payload: Any) -> bool:
        current = self.current
        if not isinstance(payload, ToolResult) or not payload.success or current is None:
            return False
        tool = self._registry.get(current.call.name)
        policy = tool.loop if tool is not None else "next_pass"
        return policy == "ends_turn" or (policy == "end_after_pre_tool_text"
                                         and bool(self._batch_text.strip()))

    def record(self, result: ToolResult, history: list[HistoryEntry]) -> None:
        """Record the current call's outcome on the history and the error count (T5-T7)."""
        self._end_requested = self._end_requested or self._ends_turn(result)
        call = self.settle_current().call
        tool = self._registry.get(call.name)
        if result.success and tool is not None and tool.loop == "requires_follow_up":
            self.follow_up_required = True
        history.append(HistoryEntry(
            tool_name=call.name,
            arguments={} if call.truncated else call.arguments,  # never shown a call not made
            result=result.for_model(),
            call_id=call.id, pre_tool_text=self.take_pre_tool_text(),
            success=result.success, batch=self.batch, reasoning=call.reasoning,
        ))
        if result.success:
            self.consecutive_errors = 0
            self.replayable_calls.append({"name": call.name, "arguments": call.arguments,
                                          "result": result.for_model()})
        else:
            self.consecutive_errors += 1

    def loop_ended(self) -> str | None:
        """The loop ended the turn after a recorded outcome: the error that ended it at the
        cap (T6), or None when a tool's loop policy ended it (T9)."""
        if self.consecutive_errors >= self._config.max_consecutive_tool_errors:
            return f"{self.consecutive_errors} consecutive tool failures"
        return None

    def reset_errors(self) -> None:
        """A restart resets the tool-error count (R9)."""
        self.consecutive_errors = 0

    def take_restart_call(self) -> tuple[ToolCallRequest, str]:
        """The current call asked for a restart: no call of its batch runs after it (R1);
        its call and the text streamed before it."""
        call = self.settle_current().call
        self.drop_queued()
        return call, self.take_pre_tool_text()

    # ------------------------------------------------------------- kill and cleanup

    def abort(self, reason: str) -> None:
        """The kill reaches a running tool through its abort signal (T5)."""
        if self._abort is not None:
            self._abort.fire(reason)

    def record_killed(self) -> None:
        """A kill while a tool runs: the journal records the tool as hanging until then."""
        current = self.current
        if current is not None and self._task is not None and self.recorder is not None:
            self.recorder.on_tool(current.call.name, self._clock() - current.started_at,
                                   {"hang": True})

    def end(self) -> None:
        """The turn ends: abort the running tool (the turn's task group cancels and awaits
        its worker)."""
        self.abort("turn ended")
        self._task = None
        self.deadline = None


def _recorded_outcome(result: ToolResult) -> dict[str, Any]:
    if result.success:
        return {"success": True, "data": result.data}
    return {"success": False, "error": result.error}
