"""One observer slot, several observers: the turn takes one, a bot wants its own plus
telemetry."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine.turn import Turn, TurnObserver

log = logging.getLogger(__name__)


class ObserverFanout:
    """Calls each observer in order; one that raises does not keep the next from seeing the
    transition, and the turn never sees the exception (an observer must not end a turn)."""

    def __init__(self, *observers: TurnObserver | None) -> None:
        self.observers = tuple(o for o in observers if o is not None)

    def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None:
        for observer in self.observers:
            try:
                observer.on_transition(turn, t, event, source, dest)
            except Exception:
                log.exception("observer %s failed on %s", type(observer).__name__, event)
