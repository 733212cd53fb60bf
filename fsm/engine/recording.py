"""What records a live turn's inputs as they really arrive, so it can be replayed: the
engine calls it; the journal (fsm.journal) implements it."""

from __future__ import annotations

from typing import Any, Protocol

from .pass_run import PassRun, TextSink


class InputRecorder(Protocol):
    """Records a live turn's inputs as they really arrive, so it can be replayed."""

    def on_pass_start(self, pass_no: int) -> TextSink:
        """Called as a pass begins; returns what records its content chunks."""
        ...

    def on_landed(self, pass_no: int, text: str) -> None: ...
    def on_keepalive(self, pass_no: int, at: float) -> None: ...
    def on_step(self, pass_no: int, at: float, step: dict[str, Any]) -> None:
        """A stream event the result keeps: `{"reasoning": …}`, `{"usage": …}`,
        `{"finish": …}`."""
        ...

    def on_end(self, pass_no: int, at: float, outcome: str, run: PassRun,
               flush_s: float = 0.0) -> None: ...
    def on_raise(self, pass_no: int, at: float, error: BaseException) -> None: ...
    def on_stall(self, pass_no: int, settles_after: float) -> None: ...
    def on_tool(self, name: str, after: float, outcome: dict[str, Any]) -> None: ...
    def on_event(self, at: float, event: dict[str, Any]) -> None: ...
    def on_lookup(self, lookup: dict[str, Any]) -> None:
        """A reactor look-up answered (or not) by the channel, in call order: `message_id`,
        `emoji` and `after` with `users`, or `error_type`, or `hang` (never answered)."""
        ...
