"""Split streamed reply text into Discord messages at natural boundaries (D1).

Pure and synchronous, so the rules are testable without Discord. Boundaries, best first: a
paragraph break or the end of a closed code block, a newline, a space, a hard cut. A code
block is only split when a message cannot hold it: the message then closes the fence and the
next one reopens it with the same language. Fences are read as Discord reads them: every
triple backtick opens or closes a block, mid-line or indented in a list item too. Lengths
are counted in UTF-16 code units, which never under-counts Discord's 2,000-character limit.

Cost is linear in the text: a cut only looks at the next message's worth of the buffer and
prices its candidate cuts without building them, so one huge delta costs what its pieces
would (the caller still feeds it in slices so that the event loop runs in between).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

MESSAGE_LIMIT = 2000
FENCE = "```"
MAX_LANG = 32
_CLOSE_RESERVE = len("\n" + FENCE)
_VISIBLE = re.compile(r"\S")
_SURROGATE = re.compile("[\ud800-\udfff]")

# How good a line end is as a cut (higher is better; a space or a hard cut is only used when
# no line end fits, by _fitting_cut)
RANK_NONE = -1  # a line end that is no place to cut (right after an opening fence)
RANK_CODE_NEWLINE = 1
RANK_NEWLINE = 3
RANK_PARAGRAPH = 4


def discord_length(text: str) -> int:
    """Length as UTF-16 code units (an emoji outside the BMP counts two; a lone surrogate,
    which a broken stream can carry, one)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _well_formed(text: str) -> str:
    """What can be sent: a lone surrogate (no encoder accepts one) becomes U+FFFD."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


@dataclass(frozen=True, slots=True)
class Chunk:
    """One message: `content` is sent; `source` is the streamed text it accounts for.

    A chunk with empty `content` is a trailer: whitespace that streamed in after the last
    message of the same stream was cut. Nothing is sent for it; its text belongs to that
    message's account.
    """

    content: str
    source: str

    @property
    def is_trailer(self) -> bool:
        return not self.content


class _Break(NamedTuple):
    pos: int
    rank: int
    lang: str | None  # the fence open at `pos`, None outside code


def _info_lang(info: str) -> str:
    """The language word of an opening fence's info string ("" when bare)."""
    info = info.strip()
    return info.split()[0][:MAX_LANG] if info else ""


def _line_fences(
    buf: str, lo: int, hi: int, lang: str | None, toggles: list[tuple[int, str | None]]
) -> tuple[str | None, bool]:
    """Apply the fences of `buf[lo:hi]` (one line) to `lang`, noting each in `toggles` as
    (position after its backticks, fence state after it). Discord opens or closes a block
    at every triple backtick, wherever it stands: mid-line, indented in a list item, or
    two on one line (```inline```). Returns the state and whether the last fence opened."""
    opened_last = False
    found = buf.find(FENCE, lo, hi)
    while found != -1:
        after = found + len(FENCE)
        if lang is None:
            following = buf.find(FENCE, after, hi)
            lang = _info_lang(buf[after : hi if following == -1 else following])
            opened_last = True
        else:
            lang, opened_last = None, False
        toggles.append((after, lang))
        found = buf.find(FENCE, after, hi)
    return lang, opened_last


class _Scan(NamedTuple):
    breaks: list[_Break]
    toggles: list[tuple[int, str | None]]
    lang: str | None  # the fence state at the end of what was scanned


def _scan(buf: str, lang: str | None, final: bool) -> _Scan:
    """Line-end break candidates, every fence, and the fence state after `buf`.

    The unfinished last line only counts (as a line) when `final`; its fences still count.
    """
    breaks: list[_Break] = []
    toggles: list[tuple[int, str | None]] = []
    fences = FENCE in buf
    opened = False
    pos = 0
    while pos < len(buf):
        newline = buf.find("\n", pos)
        if newline == -1 and not final:
            if fences:
                lang, _ = _line_fences(buf, pos, len(buf), lang, toggles)
            break
        line_end = len(buf) if newline == -1 else newline
        end = line_end if newline == -1 else newline + 1
        start_lang = lang
        if fences:
            lang, opened = _line_fences(buf, pos, line_end, lang, toggles)
        if opened:
            breaks.append(_Break(end, RANK_NONE, lang))
        elif lang is not None:
            breaks.append(_Break(end, RANK_CODE_NEWLINE, lang))
        elif start_lang is not None or not buf[pos:line_end].strip():
            breaks.append(_Break(end, RANK_PARAGRAPH, None))
        else:
            breaks.append(_Break(end, RANK_NEWLINE, None))
        pos = end
    return _Scan(breaks, toggles, lang)


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


class _Sizes:
    """`discord_length(_content(window, start_lang, pos, end_lang))` without building the
    message: the window is measured once (running UTF-16 sums, only when it holds a
    character outside the BMP), so a candidate cut costs a strip, not a rebuild."""

    def __init__(self, window: str, start_lang: str | None) -> None:
        self.window = window
        self.start_lang = start_lang
        self.prefix = discord_length(_prefix(start_lang))
        self.units: list[int] | None = None
        if discord_length(window) != len(window):
            total, units = 0, [0]
            for char in window:
                total += 2 if ord(char) > 0xFFFF else 1
                units.append(total)
            self.units = units
        self.body_start = len(window) - len(window.lstrip()) if start_lang is None else 0

    def _units(self, end: int) -> int:
        return end if self.units is None else self.units[end]

    def size(self, pos: int, end_lang: str | None) -> int:
        start = self.body_start
        visible = len(self.window[:pos].rstrip())
        if end_lang is None:
            if self.start_lang is None:
                return self._units(visible) - self._units(start) if visible > start else 0
            if visible == 0:
                return self.prefix - 1  # the reopened fence alone, its newline stripped
            return self.prefix + self._units(visible)
        if visible <= start:
            return 0
        newline = 0 if self.window[pos - 1] == "\n" else 1
        return self.prefix + self._units(pos) - self._units(start) + newline + len(FENCE)


def _lang_at(toggles: list[tuple[int, str | None]], start_lang: str | None,
             pos: int) -> str | None:
    lang = start_lang
    for after, state in toggles:
        if after > pos:
            break
        lang = state
    return lang


def _window(buf: str, start: int, lang: str | None, limit: int) -> str:
    """The part of `buf` from `start` that the next message can draw on: leading space it
    would strip, then `limit` characters (each at least one UTF-16 unit) and one more."""
    lead = 0
    if lang is None:
        visible = _VISIBLE.search(buf, start)
        lead = (visible.start() if visible else len(buf)) - start
    return buf[start : start + lead + limit + 1]


def _cut(buf: str, start: int, lang: str | None, limit: int,
         final: bool) -> tuple[Chunk, int, str | None]:
    """The best first message of `buf[start:]`; returns it, how much of the text it takes
    and the fence state there. Only a window of about `limit` characters is looked at, so a
    cut costs the same however much text is buffered."""
    window = _window(buf, start, lang, limit)
    final = final and start + len(window) >= len(buf)
    scan = _scan(window, lang, final)
    sizes = _Sizes(window, lang)
    best: _Break | None = None
    for br in scan.breaks:
        size = sizes.size(br.pos, br.lang)
        if size > limit + 2 * _CLOSE_RESERVE:
            break  # sizes only wobble by a fence's length from here on
        if size > limit or size == 0 or br.rank == RANK_NONE:
            continue
        if best is None or br.rank >= best.rank:
            best = br
    if best is not None:
        chunk = Chunk(_content(window, lang, best.pos, best.lang), window[: best.pos])
        return chunk, best.pos, best.lang

    # No line end fits: the longest prefix that fits, cut after its last space if any.
    low, high = 1, len(window)
    while low < high:
        mid = (low + high + 1) // 2
        if sizes.size(mid, _lang_at(scan.toggles, lang, mid)) <= limit:
            low = mid
        else:
            high = mid - 1
    line_start = window.rfind("\n", 0, low) + 1
    space = window.rfind(" ", line_start, low)
    visible_before_space = space > line_start and bool(window[line_start:space].strip())
    pos, end_lang = _fitting_cut(window, scan.toggles, sizes, lang, limit,
                                 space + 1 if visible_before_space else low, low,
                                 open_end=not final)
    return Chunk(_content(window, lang, pos, end_lang), window[:pos]), pos, end_lang


def _fitting_cut(window: str, toggles: list[tuple[int, str | None]], sizes: _Sizes,
                 lang: str | None, limit: int, preferred: int,
                 longest: int, *, open_end: bool) -> tuple[int, str | None]:
    """The cut after a space (`preferred`), else at the longest prefix that fits, moved out
    of any run of backticks (`open_end`: the text may go on after the window, so a run at
    its end may be the start of a fence). Moving a cut back before a fence that closes a
    block leaves that block open, and the fence this message must then add to close it can
    cost more than the text dropped: then the cut moves back until the message fits."""
    pos, end_lang = longest, _lang_at(toggles, lang, longest)
    for candidate in (preferred, longest):
        pos = _outside_backticks(window, candidate, open_end)
        end_lang = _lang_at(toggles, lang, pos)
        if sizes.size(pos, end_lang) <= limit:
            return pos, end_lang
    while pos > 1:
        pos = _outside_backticks(window, pos - 1, open_end)
        end_lang = _lang_at(toggles, lang, pos)
        if sizes.size(pos, end_lang) <= limit:
            break
    return pos, end_lang


def _outside_backticks(text: str, pos: int, open_end: bool) -> int:
    """`pos` moved back out of a run of backticks (half a fence in each message would open
    a block in one that the other never closes) and out of a surrogate pair. With
    `open_end`, a run (or a high surrogate) that ends the text counts as going on: the next
    backtick (or the low half) may be streaming in."""
    moved = pos
    while moved > 0 and text[moved - 1] == "`" and (
            text[moved] == "`" if moved < len(text) else open_end):
        moved -= 1
    if moved > 0 and "\ud800" <= text[moved - 1] <= "\udbff" and (
            "\udc00" <= text[moved] <= "\udfff" if moved < len(text) else open_end):
        moved -= 1  # a high half that ends the text may be waiting for its low half
    return moved if moved > 0 else pos


def _overflows(buf: str, start: int, lang: str | None, limit: int) -> bool:
    """Whether `buf[start:]` with its carried fence may not fit one message: certain when
    it has more characters than the limit, else measured (at most `limit` characters)."""
    chars = len(buf) - start + len(_prefix(lang)) + _CLOSE_RESERVE
    if chars > limit:
        return True
    return discord_length(_prefix(lang) + buf[start:]) + _CLOSE_RESERVE > limit


def _keep(chunks: list[Chunk], chunk: Chunk, carry: str) -> str:
    """Append `chunk` with the text carried so far; returns what is still carried.

    A chunk with nothing visible (whitespace) is not sent, but its text is carried into
    the next message's source so the account of delivered text stays whole.
    """
    if not chunk.content:
        return carry + chunk.source
    chunks.append(Chunk(_well_formed(chunk.content), carry + chunk.source))
    return ""


def _drain(buf: str, lang: str | None, limit: int, carry: str = "") -> list[Chunk]:
    """Every message for the whole of `buf`, which is complete."""
    chunks: list[Chunk] = []
    start = 0
    while _VISIBLE.search(buf, start):
        if len(buf) - start <= 2 * limit:  # longer text cannot fit one message (unless blank)
            rest = buf[start:]
            whole = _content(rest, lang, len(rest), _scan(rest, lang, final=True).lang)
            if discord_length(whole) <= limit:
                carry = _keep(chunks, Chunk(whole, rest), carry)
                start = len(buf)
                break
        chunk, used, lang = _cut(buf, start, lang, limit, final=True)
        carry = _keep(chunks, chunk, carry)
        start += used
    if chunks and carry + buf[start:]:
        last = chunks[-1]
        chunks[-1] = Chunk(last.content, last.source + carry + buf[start:])
    return chunks


class StreamSplitter:
    """Buffers streamed text and hands out finished messages.

    `feed` returns only what must go out because the buffer can no longer fit one message;
    `flush_boundary` returns everything up to the last paragraph break or closed code block
    (for a stream that paused); `flush` returns everything (the pass ended), ending in a
    trailer when only whitespace was left.
    """

    def __init__(self, limit: int = MESSAGE_LIMIT) -> None:
        if limit < 64:
            raise ValueError("limit must leave room for code fences (at least 64)")
        self.limit = limit
        self._buf = ""
        self._lang: str | None = None
        self._carry = ""  # cut-off whitespace that belongs to the next message's source
        self._handed_out = False  # a message was cut since the last flush

    @property
    def pending(self) -> str:
        return self._carry + self._buf

    def feed(self, text: str) -> list[Chunk]:
        """Cost linear in `text`: each cut looks at one message's worth of the buffer, and
        the buffer is trimmed once, after all cuts."""
        self._buf += text
        chunks: list[Chunk] = []
        start = 0
        while _overflows(self._buf, start, self._lang, self.limit):
            chunk, used, self._lang = _cut(self._buf, start, self._lang, self.limit,
                                           final=False)
            start += used
            self._carry = _keep(chunks, chunk, self._carry)
        if start:
            self._buf = self._buf[start:]
        self._handed_out = self._handed_out or bool(chunks)
        return chunks

    def flush_boundary(self) -> list[Chunk]:
        breaks = _scan(self._buf, self._lang, final=False).breaks
        ends = [br.pos for br in breaks if br.rank == RANK_PARAGRAPH]
        if not ends:
            return []
        region, self._buf = self._buf[: ends[-1]], self._buf[ends[-1] :]
        chunks = _drain(region, self._lang, self.limit, self._carry)
        if chunks:
            self._carry = ""
            self._handed_out = True
        else:
            self._carry += region
        self._lang = None
        return chunks

    def flush(self) -> list[Chunk]:
        """Everything buffered. Whitespace left after the last message cut since the last
        flush comes back as a trailer, so the sources of the chunks handed out for a stream
        add up to its text (a stream of whitespace alone makes no message and no trailer)."""
        pending, handed_out = self.pending, self._handed_out
        chunks = _drain(self._buf, self._lang, self.limit, self._carry)
        self._buf, self._lang, self._carry = "", None, ""
        self._handed_out = False
        if not chunks and pending and handed_out:
            return [Chunk("", pending)]
        return chunks


def split_message(text: str, limit: int = MESSAGE_LIMIT) -> list[str]:
    """The messages a complete reply becomes."""
    return [chunk.content for chunk in _drain(text, None, limit)]
