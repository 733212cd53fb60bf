"""Split streamed reply text into Discord messages at natural boundaries (D1).

Pure and synchronous, so the rules are testable without Discord. Boundaries, best first: a
paragraph break or the end of a closed code block, a newline, a space, a hard cut. A code
block is only split when a message cannot hold it: the message then closes the fence and the
next one reopens it with the same language. Lengths are counted in UTF-16 code units, which
never under-counts Discord's 2,000-character limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

MESSAGE_LIMIT = 2000
FENCE = "```"
MAX_LANG = 32
_CLOSE_RESERVE = len("\n" + FENCE)

RANK_NONE = -1  # a line end that is no place to cut (right after an opening fence)
RANK_HARD = 0
RANK_CODE_NEWLINE = 1
RANK_SPACE = 2
RANK_NEWLINE = 3
RANK_PARAGRAPH = 4


def discord_length(text: str) -> int:
    """Length as UTF-16 code units (an emoji outside the BMP counts two)."""
    return len(text.encode("utf-16-le")) // 2


@dataclass(frozen=True, slots=True)
class Chunk:
    """One message: `content` is sent; `source` is the streamed text it accounts for."""

    content: str
    source: str


class _Break(NamedTuple):
    pos: int
    rank: int
    lang: str | None  # the fence open at `pos`, None outside code


def _fence_lang(line: str) -> str | None:
    """The info word of a fence line ("" when bare), or None when `line` is no fence."""
    stripped = line.lstrip(" ")
    if len(line) - len(stripped) > 3 or not stripped.startswith(FENCE):
        return None
    info = stripped[len(FENCE) :].strip()
    if FENCE in info:
        return None  # ```inline``` on one line opens and closes itself
    return info.split()[0][:MAX_LANG] if info else ""


def _scan(buf: str, lang: str | None, final: bool) -> tuple[list[_Break], str | None]:
    """Line-end break candidates and the fence state after the last scanned line.

    The unfinished last line only counts (as a line) when `final`.
    """
    breaks: list[_Break] = []
    pos = 0
    while pos < len(buf):
        newline = buf.find("\n", pos)
        if newline == -1 and not final:
            break
        end = len(buf) if newline == -1 else newline + 1
        line = buf[pos:end].rstrip("\n")
        opened = closed = False
        fence = _fence_lang(line)
        if fence is not None:
            if lang is None:
                lang, opened = fence, True
            else:
                lang, closed = None, True
        if opened:
            breaks.append(_Break(end, RANK_NONE, lang))
        elif lang is not None:
            breaks.append(_Break(end, RANK_CODE_NEWLINE, lang))
        elif closed or not line.strip():
            breaks.append(_Break(end, RANK_PARAGRAPH, None))
        else:
            breaks.append(_Break(end, RANK_NEWLINE, None))
        pos = end
    return breaks, lang


def _prefix(lang: str | None) -> str:
    return "" if lang is None else f"{FENCE}{lang}\n"


def _content(buf: str, start_lang: str | None, pos: int, end_lang: str | None) -> str:
    """The message for `buf[:pos]`: reopen a carried fence, close one left open."""
    body = _prefix(start_lang) + buf[:pos]
    if start_lang is None:
        body = body.lstrip()
    if end_lang is None:
        return body.rstrip()
    if not body[len(_prefix(start_lang)) :].strip():
        return ""
    if not body.endswith("\n"):
        body += "\n"
    return body + FENCE


def _lang_at(breaks: list[_Break], start_lang: str | None, pos: int) -> str | None:
    lang = start_lang
    for br in breaks:
        if br.pos > pos:
            break
        lang = br.lang
    return lang


def _cut(buf: str, lang: str | None, limit: int, final: bool) -> tuple[Chunk, int, str | None]:
    """The best first message of `buf`; returns it, where it ends and the fence state there."""
    breaks, _ = _scan(buf, lang, final)
    best: _Break | None = None
    for br in breaks:
        content = _content(buf, lang, br.pos, br.lang)
        size = discord_length(content)
        if size > limit + 2 * _CLOSE_RESERVE:
            break  # sizes only wobble by a fence's length from here on
        if size > limit or not content or br.rank == RANK_NONE:
            continue
        if best is None or br.rank >= best.rank:
            best = br
    if best is not None:
        return Chunk(_content(buf, lang, best.pos, best.lang), buf[: best.pos]), best.pos, best.lang

    # No line end fits: the longest prefix that fits, cut after its last space if any.
    low, high = 1, len(buf)
    while low < high:
        mid = (low + high + 1) // 2
        mid_lang = _lang_at(breaks, lang, mid)
        if discord_length(_content(buf, lang, mid, mid_lang)) <= limit:
            low = mid
        else:
            high = mid - 1
    line_start = buf.rfind("\n", 0, low) + 1
    space = buf.rfind(" ", line_start, low)
    visible_before_space = space > line_start and bool(buf[line_start:space].strip())
    pos = space + 1 if visible_before_space else low
    end_lang = _lang_at(breaks, lang, pos)
    return Chunk(_content(buf, lang, pos, end_lang), buf[:pos]), pos, end_lang


def _overflows(buf: str, lang: str | None, limit: int) -> bool:
    return discord_length(_prefix(lang) + buf) + _CLOSE_RESERVE > limit


def _keep(chunks: list[Chunk], chunk: Chunk, carry: str) -> str:
    """Append `chunk` with the text carried so far; returns what is still carried.

    A chunk with nothing visible (whitespace) is not sent, but its text is carried into
    the next message's source so the account of delivered text stays whole.
    """
    if not chunk.content:
        return carry + chunk.source
    chunks.append(Chunk(chunk.content, carry + chunk.source))
    return ""


def _drain(buf: str, lang: str | None, limit: int, carry: str = "") -> list[Chunk]:
    """Every message for the whole of `buf`, which is complete."""
    chunks: list[Chunk] = []
    while buf.strip():
        _, end_lang = _scan(buf, lang, final=True)
        whole = _content(buf, lang, len(buf), end_lang)
        if discord_length(whole) <= limit:
            carry = _keep(chunks, Chunk(whole, buf), carry)
            buf = ""
            break
        chunk, pos, lang = _cut(buf, lang, limit, final=True)
        carry = _keep(chunks, chunk, carry)
        buf = buf[pos:]
    if chunks and carry + buf:
        last = chunks[-1]
        chunks[-1] = Chunk(last.content, last.source + carry + buf)
    return chunks


class StreamSplitter:
    """Buffers streamed text and hands out finished messages.

    `feed` returns only what must go out because the buffer can no longer fit one message;
    `flush_boundary` returns everything up to the last paragraph break or closed code block
    (for a stream that paused); `flush` returns everything (the pass ended).
    """

    def __init__(self, limit: int = MESSAGE_LIMIT) -> None:
        if limit < 64:
            raise ValueError("limit must leave room for code fences (at least 64)")
        self.limit = limit
        self._buf = ""
        self._lang: str | None = None
        self._carry = ""  # cut-off whitespace that belongs to the next message's source

    @property
    def pending(self) -> str:
        return self._carry + self._buf

    def feed(self, text: str) -> list[Chunk]:
        self._buf += text
        chunks: list[Chunk] = []
        while _overflows(self._buf, self._lang, self.limit):
            chunk, pos, self._lang = _cut(self._buf, self._lang, self.limit, final=False)
            self._buf = self._buf[pos:]
            self._carry = _keep(chunks, chunk, self._carry)
        return chunks

    def flush_boundary(self) -> list[Chunk]:
        breaks, _ = _scan(self._buf, self._lang, final=False)
        ends = [br.pos for br in breaks if br.rank == RANK_PARAGRAPH]
        if not ends:
            return []
        region, self._buf = self._buf[: ends[-1]], self._buf[ends[-1] :]
        chunks = _drain(region, self._lang, self.limit, self._carry)
        if chunks:
            self._carry = ""
        else:
            self._carry += region
        self._lang = None
        return chunks

    def flush(self) -> list[Chunk]:
        chunks = _drain(self._buf, self._lang, self.limit, self._carry)
        self._buf, self._lang, self._carry = "", None, ""
        return chunks


def split_message(text: str, limit: int = MESSAGE_LIMIT) -> list[str]:
    """The messages a complete reply becomes."""
    return [chunk.content for chunk in _drain(text, None, limit)]
