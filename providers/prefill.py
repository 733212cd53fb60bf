"""How a provider receives a trailing assistant prefill (S1), and undoing a server's echo.

A prefill is assistant text the model must continue — the fallback continuation (G1) sends
the text already delivered. Providers disagree on how to take it:

- `native`: a final assistant turn (older Claude and Gemini models, llama.cpp, vLLM,
  Ollama). llama.cpp's server echoes that text back at the start of its stream, so a native
  prefill's exact echo is dropped from the stream (`EchoStrip`);
- `prefix-flag`: a final assistant turn marked `"prefix": true` (Mistral);
- `instruction`: no assistant turn at all — Claude 4.6, newer Gemini and OpenAI's own models
  reject or ignore one — but a request-only user notice that quotes the text already
  delivered and asks the model to continue it;
- `off`: the prefill is not sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fsm import Finish, ProviderError, ProviderEvent, TextDelta, ToolCallRequest

PrefillMode = Literal["native", "prefix-flag", "instruction", "off"]
PREFILL_NATIVE: PrefillMode = "native"
PREFILL_PREFIX_FLAG: PrefillMode = "prefix-flag"
PREFILL_INSTRUCTION: PrefillMode = "instruction"
PREFILL_OFF: PrefillMode = "off"


@dataclass(frozen=True, slots=True)
class PrefillMessage:
    """What goes last in the request: assistant text (native, prefix-flag) or a user
    instruction (instruction)."""

    mode: PrefillMode
    text: str


def continuation_instruction(delivered: str) -> str:
    """The request-only notice that stands in for a trailing assistant turn."""
    return (
        "[System: your reply to this conversation was cut off after you had already sent "
        "the user this text, which they can see:\n"
        f"<already_sent>\n{delivered}\n</already_sent>\n"
        "Continue that reply from exactly where it stops. Do not repeat any of it, do not "
        "start over and do not mention the interruption.]"
    )


def prefill_message(mode: PrefillMode, prefill: str) -> PrefillMessage | None:
    """The final message standing for `prefill` in `mode`, or None when nothing is sent."""
    if not prefill or mode == PREFILL_OFF:
        return None
    if mode == PREFILL_INSTRUCTION:
        return PrefillMessage(mode, continuation_instruction(prefill))
    return PrefillMessage(mode, prefill)


class EchoStrip:
    """Drops an exact echo of the prefill from the start of a stream.

    Text is held while everything received so far is a prefix of the prefill; once the
    whole prefill has arrived it is dropped and the rest passes. Text that stops matching,
    or a stream that moves on (a call, the finish, an error) before the echo completed, is
    released unchanged: only an exact, complete echo is removed."""

    def __init__(self, prefill: str) -> None:
        self._prefill = prefill
        self._held: list[str] = []
        self._held_len = 0
        self._settled = not prefill

    def feed(self, event: ProviderEvent) -> list[ProviderEvent]:
        if self._settled:
            return [event]
        if isinstance(event, TextDelta):
            return self._text(event.text)
        if isinstance(event, ToolCallRequest | Finish | ProviderError):
            return [*self._release(), event]
        return [event]

    def finish(self) -> list[ProviderEvent]:
        return self._release()

    def _text(self, text: str) -> list[ProviderEvent]:
        self._held.append(text)
        self._held_len += len(text)
        held = "".join(self._held)
        if self._held_len < len(self._prefill):
            if self._prefill.startswith(held):
                self._held = [held]
                return []
            return self._release()
        self._settled = True
        self._held, self._held_len = [], 0
        if held.startswith(self._prefill):
            rest = held[len(self._prefill):]
            return [TextDelta(rest)] if rest else []
        return [TextDelta(held)]

    def _release(self) -> list[ProviderEvent]:
        self._settled = True
        held = "".join(self._held)
        self._held, self._held_len = [], 0
        return [TextDelta(held)] if held else []

