"""The one log line each turn ends with, for an operator reading the bot's log.

`turn end channel=… turn=… state=… status=… passes=… duration=…s tokens=in/out model=…`:
enough to find a turn's journal, see how it ended and what it cost, without any of the
conversation (that stays in the journal).
"""

from __future__ import annotations

import logging

from fsm import GenerationResult


def _tokens(result: GenerationResult) -> str:
    totals = {"input_tokens": 0, "output_tokens": 0}
    known = False
    for attempt in result.attempts:
        for one_pass in attempt.passes:
            for key in totals:
                value = (one_pass.usage or {}).get(key)
                if isinstance(value, int):
                    totals[key] += value
                    known = True
    return f"{totals['input_tokens']}/{totals['output_tokens']}" if known else "unknown"


def turn_end_line(channel_id: str, turn_id: str, result: GenerationResult | None,
                  duration_s: float, failure: str = "failed") -> str:
    """`failure` is the status of a turn that ended without a result (`cancelled`, or
    `failed:<exception>`)."""
    if result is None:
        return (f"turn end channel={channel_id} turn={turn_id} state=- status={failure} "
                f"passes=0 duration={duration_s:.1f}s tokens=unknown")
    final = result.attempts[-1]
    passes = sum(len(attempt.passes) for attempt in result.attempts)
    return (f"turn end channel={channel_id} turn={turn_id} state={final.state} "
            f"status={result.status} passes={passes} duration={duration_s:.1f}s "
            f"tokens={_tokens(result)} model={result.labels[-1]}")


def log_turn_end(log: logging.Logger, channel_id: str, turn_id: str,
                 result: GenerationResult | None, duration_s: float,
                 failure: str = "failed") -> None:
    line = turn_end_line(channel_id, turn_id, result, duration_s, failure)
    if result is None or result.status in ("error", "timeout", "empty_response"):
        log.warning(line)
    else:
        log.info(line)
