"""The thought log (T8): a reply's reasoning, with its owner, sent where the operator wants.

Reasoning is never part of the visible reply. The turn keeps it on each pass result; when
the reply ends, its log goes nowhere (`none`, the default), to the `fsm.thoughts` logger
(`log`), or to a channel (`channel`, through the channel's `post_thoughts`).
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from .config import TurnConfig

thought_log = logging.getLogger("fsm.thoughts")
log = logging.getLogger(__name__)


@runtime_checkable
class ThoughtPoster(Protocol):
    """A channel that can post a thought log to the operator's thought-log channel."""

    async def post_thoughts(self, channel_id: str, owner: str, text: str) -> None: ...


async def publish_thoughts(config: TurnConfig, owner: str, thoughts: list[str],
                           channel: object) -> str | None:
    """Send the reply's reasoning to its destination; returns where it went (None when
    nowhere: no reasoning, or the destination is `none`). A channel that cannot post it
    (or fails to) leaves it in the log instead, so it is not lost."""
    text = "\n\n".join(t for t in thoughts if t.strip())
    if not text or config.thought_log == "none":
        return None
    if config.thought_log == "channel" and config.thought_log_channel:
        if isinstance(channel, ThoughtPoster):
            try:
                await channel.post_thoughts(config.thought_log_channel, owner, text)
            except Exception as exc:
                log.warning("the thought log could not be posted: %s", type(exc).__name__)
            else:
                return "channel"
        else:
            log.warning("this channel cannot post a thought log; it goes to the log")
    thought_log.info("thoughts of %s:\n%s", owner, text)
    return "log"
