"""Taking the model's `<details>` block out of the visible text as it streams (T8).

A model may write a `<details><summary>…</summary>…</details>` block (metadata meant for the
bot, not prose for the channel). The filter sits between the provider stream and the
channel: what is outside the block is delivered, what is inside is kept, with its
`<summary>` stripped, on the pass result. A tag may arrive split across chunks, so a chunk
ending in what could be the start of a tag holds that tail back until the next chunk says
what it is. A chunk with no `<` in it and no block open is passed through untouched: the
per-chunk path stays one substring test (BENCHMARKS.md).
"""

from __future__ import annotations

import re

_OPEN = re.compile(r"<details(?:\s[^<>]*)?>", re.IGNORECASE)
_CLOSE = re.compile(r"</details\s*>", re.IGNORECASE)
_SUMMARY = re.compile(r"<summary(?:\s[^<>]*)?>.*?</summary\s*>", re.IGNORECASE | re.DOTALL)
_OPEN_WORD = "<details"
_CLOSE_WORD = "</details"
MAX_TAG_CHARS = 200
"""An opening tag longer than this is not one: its text is delivered as it is."""


def _tag_start(tail: str, word: str) -> int:
    """Where a tag `word` that may still be arriving begins in `tail`, or -1: a suffix that
    is a prefix of `word`, or `word` and attributes with no closing `>` yet."""
    start = tail.rfind("<")
    if start < 0 or len(tail) - start > MAX_TAG_CHARS:
        return -1
    candidate = tail[start:].lower()
    if ">" in candidate:
        return -1
    if word.startswith(candidate):
        return start
    if candidate.startswith(word) and (len(candidate) == len(word)
                                       or candidate[len(word)].isspace()):
        return start
    return -1


def strip_summary(body: str) -> str:
    """A block's body as kept: its `<summary>` removed, surrounding blank space trimmed."""
    return _SUMMARY.sub("", body).strip()


class DetailsFilter:
    """Splits one pass's streamed text into what is delivered and the `<details>` bodies."""

    __slots__ = ("_body", "_held", "_inside", "blocks", "pending")

    def __init__(self) -> None:
        self.pending = False
        """A block is open or a possible tag is held back: every chunk must be fed."""
        self._held = ""
        self._inside = False
        self._body: list[str] = []
        self.blocks: list[str] = []

    @property
    def details(self) -> str:
        """The bodies of the blocks written so far (an unclosed one included), in order."""
        bodies = list(self.blocks)
        if self._inside:
            open_body = strip_summary("".join(self._body) + self._held)
            if open_body:
                bodies.append(open_body)
        return "\n\n".join(bodies)

    def feed(self, text: str) -> str:
        """The part of `text` to deliver now."""
        if not self._inside and not self._held and "<" not in text:
            return text
        buffer = self._held + text
        self._held = ""
        out: list[str] = []
        while buffer:
            if self._inside:
                close = _CLOSE.search(buffer)
                if close is None:
                    cut = _tag_start(buffer, _CLOSE_WORD)
                    if cut >= 0:
                        self._body.append(buffer[:cut])
                        self._held = buffer[cut:]
                    else:
                        self._body.append(buffer)
                    break
                self._body.append(buffer[:close.start()])
                body = strip_summary("".join(self._body))
                if body:
                    self.blocks.append(body)
                self._body = []
                self._inside = False
                buffer = buffer[close.end():]
                continue
            opened = _OPEN.search(buffer)
            if opened is None:
                cut = _tag_start(buffer, _OPEN_WORD)
                if cut >= 0:
                    out.append(buffer[:cut])
                    self._held = buffer[cut:]
                else:
                    out.append(buffer)
                break
            out.append(buffer[:opened.start()])
            self._inside = True
            buffer = buffer[opened.end():]
        self.pending = self._inside or bool(self._held)
        return "".join(out)

    def finish(self) -> str:
        """The stream ended: a held-back tail that never became an opening tag is delivered;
        an unclosed block stays kept (it was never prose)."""
        held, self._held = self._held, ""
        self.pending = self._inside
        if self._inside:
            self._body.append(held)
            return ""
        return held


def details_suffix(details: list[str]) -> str:
    """The `<details>` suffix merged into a turn's final text (T8): every pass's block
    bodies, in order, in one block."""
    bodies = [d for d in details if d]
    if not bodies:
        return ""
    joined = "\n\n".join(bodies)
    return f"\n\n<details>\n{joined}\n</details>"
