"""The error a turn ends with for each kind of finish reason (P6), as the operator reads it:
a documented word that is not an answer is named as a finish reason, a word no table knows
as an undocumented one (issue 29's mutation run over providers/endings.py). Each stream is
served over loopback HTTP to the real adapter."""

from __future__ import annotations

import pytest

from providers_support import run, sse

pytestmark = pytest.mark.asyncio


def finishing(reason: str) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"content": "Par"}, "finish_reason": reason}]},
               "[DONE]")


@pytest.mark.parametrize("reason", ["error", "insufficient_system_resource", "abort",
                                    "repetition"])
async def test_documented_words_that_are_not_an_answer_are_named_so(reason: str) -> None:
    """covers P6: Mistral's and OpenRouter's `error`, DeepSeek's
    `insufficient_system_resource`, vLLM's `abort` and `repetition` end the turn with a
    retryable error that calls them documented finish reasons."""
    _, summary, _ = await run("openai", finishing(reason))
    assert summary.error is not None and summary.error.retryable
    assert (summary.error.type, summary.error.message) == (
        reason, f"the model stopped with a finish reason that is not an answer ({reason})")
    assert summary.finish_reason == reason and "".join(summary.text) == "Par"


async def test_an_unknown_word_is_named_undocumented() -> None:
    """covers P6: a finish reason no table knows is an error, named as undocumented."""
    _, summary, _ = await run("openai", finishing("gremlins"))
    assert summary.error is not None
    assert summary.error.message == (
        "the model stopped with an undocumented finish reason that is not an answer "
        "(gremlins)")


async def test_a_cut_reply_without_detail_says_only_its_reason() -> None:
    """covers P6, G2: `length` without a call is a cut reply, worded with its reason alone,
    and worth another attempt."""
    _, summary, _ = await run("openai", finishing("length"))
    assert summary.error is not None and summary.error.type == "truncated"
    assert summary.error.retryable  # the fallback continues from the delivered text
    assert summary.error.message == "the reply was cut off before it ended (length)"
