"""What each edge of the table does: the guards and callbacks its rows name (`Edge.callback`,
`Edge.guards`), kept apart from the driver that fires them.

Callbacks are short and synchronous. They write what the turn reports to its ledger and
tell the runners what happened; they never await, never fire a trigger and keep no state
of their own (everything they touch belongs to the ledger, the conversation or a runner).
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from .channel import NoticeKind, TurnChannel
from .clock import TurnClock
from .config import TurnConfig
from .conversation import Conversation
from .ledger import TurnLedger
from .locks import ChannelLock, ChannelLockRegistry
from .pass_runner import PassRunner
from .provider import CUT_OFF_FINISHES, PassRequest
from .restart_runner import RestartRunner
from .result import TurnStatus
from .table import State
from .tool_runner import ToolRunner
from .tools import ToolResult

_STATUS_BY_OUTCOME: dict[str, TurnStatus] = {
    "completed": "completed", "empty": "empty_response", "provider_error": "error",
}


class EdgeCallbacks:
    """The guards and callbacks of the table's rows, on the driver (`Turn`) they run on."""

    state: str
    channel: TurnChannel
    config: TurnConfig
    lock: ChannelLock
    locks: ChannelLockRegistry
    ledger: TurnLedger
    conversation: Conversation
    _clock: TurnClock
    _passes: PassRunner
    _tools: ToolRunner
    _restarts: RestartRunner

    @property
    def stop_requested(self) -> bool:
        return self.ledger.stop_requested_at is not None

    # ------------------------------------------------------------- guards

    def stop_pending(self, _payload: Any = None) -> bool:
        """A stop was requested for this turn or on its channel (S9)."""
        return self.stop_requested or self.lock.stop_requested

    def follow_up_may_interrupt(self, _payload: Any = None) -> bool:
        return self.lock.follow_up_interrupts < self.locks.max_follow_up_interrupts

    def calls_pending(self, _payload: Any = None) -> bool:
        return self._tools.has_queued()

    def error_cap_reached(self, payload: Any = None) -> bool:
        return self._tools.error_cap_reached(payload)

    def tool_policy_ends_turn(self, payload: Any = None) -> bool:
        return self._tools.policy_ends_turn(payload)

    def delivered_text_stands(self, _payload: Any = None) -> bool:
        """An empty pass after a tool, in a turn that already delivered text, completes
        with that text, unless the tool required the model to speak after it or a limit
        cut the pass off (a model that spent its budget thinking has not answered, T10)."""
        run = self._passes.run
        if run is not None and run.finish in CUT_OFF_FINISHES:
            return False
        return (len(self.ledger.passes) > 1 and not self._tools.follow_up_required
                and bool(self.ledger.delivered_text(self.channel).strip()))

    # ------------------------------------------------------------- callbacks
    # Each is named in its rows of the table, whose `does` says what it does and why.

    def on_begin(self, payload: Any = None) -> None:
        assert isinstance(payload, PassRequest)
        chars_left = self.ledger.begin_pass(payload.pass_index, self.config)
        self._passes.begin(payload, self._clock.now(), chars_left)

    def on_first_token(self, _payload: Any = None) -> None:
        self._passes.first_token()

    def on_stream_timeout(self, _payload: Any = None) -> None:
        if self.state == State.STOPPED.value:  # a stop was pending (S9)
            self._end("stopped_by_user")
        else:
            self._passes.timed_out(self._clock.now())  # the deadline's instant (`_on_deadline`)

    def on_settled(self, _payload: Any = None) -> None:
        self.ledger.timeout(self._passes.timeout_phase, self.config)
        self._end("timeout", include_landed=True)

    def on_settle_timeout(self, _payload: Any = None) -> None:
        self._passes.record_stall()
        self.ledger.timeout(self._passes.timeout_phase, self.config)
        self._end("timeout")

    def on_stream_end(self, payload: Any = None) -> None:
        assert isinstance(payload, ev.StreamEnded)
        if payload.error is not None:
            self.ledger.error = f"{payload.error.kind}: {payload.error.message}"
        self._end(_STATUS_BY_OUTCOME[payload.outcome])

    def on_empty_after_text(self, _payload: Any = None) -> None:
        self._end("completed", pass_status="empty_response")
        self.ledger.final_text = self.ledger.delivered_text(self.channel)

    def on_iteration_cap(self, _payload: Any = None) -> None:
        self._end("timeout", notice="max_iterations")

    def on_delivery_cap(self, _payload: Any = None) -> None:
        self._end("delivery_cap", notice="delivery_cap")

    def on_tool_call(self, _payload: Any = None) -> None:
        run = self._passes.run
        assert run is not None
        self._tools.queue(run.tool_calls, run.text)
        self._close_pass("function_call")

    def on_follow_up(self, _payload: Any = None) -> None:
        if self.state == State.DONE.value:
            self.lock.follow_up_interrupts += 1
            self._end("follow_up_interrupt")
        else:
            self.ledger.follow_up_queued = True

    def on_nameless_call(self, _payload: Any = None) -> None:
        self.ledger.error = "the provider returned a function call without a tool name"
        self._end("error")

    def on_tool_outcome(self, payload: Any = None) -> None:
        assert isinstance(payload, ToolResult)
        self._tools.record(payload, self.conversation.function_history)
        if self.state == State.DONE.value:  # the loop ended the turn (T6, T9)
            error = self._tools.loop_ended()
            if error is None:
                self._end("completed")
            else:
                self.ledger.error = error
                self._end("error", notice="tool_error_loop")

    def on_restart_requested(self, payload: Any = None) -> None:
        assert isinstance(payload, tuple)
        result, restart = payload
        call, pre_tool_text = self._tools.take_restart_call()
        self._review(self._restarts.requested(restart, call, result, pre_tool_text,
                                              self.conversation))

    def on_restart(self, payload: Any = None) -> None:
        self._review(self._restarts.apply(payload, self.conversation))
        self._tools.reset_errors()

    def on_kill(self, _payload: Any = None) -> None:
        self._tools.record_killed()
        self._end("stopped_by_user")

    def on_crash(self, payload: Any = None) -> None:
        if isinstance(payload, (ev.StreamCrashed, ev.WorkerCrashed)):
            self.ledger.crash = payload.error
            if self.ledger.error is None:
                self.ledger.error = f"{type(payload.error).__name__}: {payload.error}"
        self._end("error")

    def _end(self, status: TurnStatus, *, pass_status: TurnStatus | None = None,
             include_landed: bool = False, notice: NoticeKind | None = None) -> None:
        """The turn's status, its notice if any, and the running pass's result, frozen."""
        self.ledger.status = status
        if notice is not None:
            self.ledger.notify(notice, self.config)
        self._close_pass(pass_status or status, include_landed)

    def _close_pass(self, status: TurnStatus, include_landed: bool = False) -> None:
        result = self._passes.close(status, include_landed)
        if result is not None:
            self.ledger.close_pass(result)

    def _review(self, entry: dict[str, Any] | None) -> None:
        if entry is not None:  # with drafting on, the review log keeps it (R10)
            self.ledger.review_log.append(entry)
