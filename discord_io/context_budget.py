"""The history's size budgets, applied to the request items as the model will read them.

A message's cost is the length of its rendered dialogue line (`user_text.dialogue_text`:
the quoted name, the `> ` of every quoted line, the reaction counts) with its text files
inlined, so no upload, line break or long name gets past the budget. Two bounds hold: each
item within `max_item_chars`, all items together within `max_chars`. The message answered
counts first and is cut to fit; the message it replies to comes next; then the others,
newest first, each whole or not at all, and once one does not fit the older ones are
dropped too. A cut keeps the structure: the message's own text first, then as much of each
file as fits, every `<file …>` block closed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fsm import dialogue_text, quoted_name

ContextItem = dict[str, Any]
ELLIPSIS = "…"


@dataclass(slots=True)
class Draft:
    """A dialogue item before the budget: its text, and the files to inline after it."""

    item: ContextItem
    files: list[tuple[str, str]] = field(default_factory=list)

    @property
    def message_id(self) -> str:
        return str(self.item.get("message_id"))


def rendered_length(item: ContextItem) -> int:
    """How many characters the item is in the request (a user's dialogue line rendered as
    the providers render it; the bot's own messages as they are)."""
    content = str(item.get("content") or "")
    if item.get("role") == "user" and item.get("type") == "dialogue":
        return len(dialogue_text(item.get("author"), content, item.get("reactions") or ()))
    return len(content)


def file_block(name: str, text: str) -> str:
    """An inlined text file; its name is the uploader's choice, so it is quoted."""
    return f"\n<file {quoted_name(name)}>\n{text}\n</file>"


def _longest(text: str, fits: Callable[[str], bool]) -> str | None:
    """The longest `text[:k] + …` (or `text` itself) that fits, None if not even `…` does.
    The rendered length grows with `k`, so a binary search finds it."""
    if fits(text):
        return text
    lo, hi = 0, len(text) - 1  # k in [lo, hi]: lo is known to fit, once checked
    if not fits(ELLIPSIS):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(text[:mid] + ELLIPSIS):
            lo = mid
        else:
            hi = mid - 1
    return text[:lo] + ELLIPSIS


def compose(draft: Draft, limit: int) -> ContextItem:
    """The item with its files inlined, within `limit` rendered characters: the text cut
    first if it must be, then each file in order as far as there is room."""
    base = draft.item

    def fits(content: str) -> bool:
        return rendered_length({**base, "content": content}) <= limit

    text = str(base.get("content") or "")
    whole = text + "".join(file_block(name, body) for name, body in draft.files)
    if fits(whole):
        return {**base, "content": whole}
    content = _longest(text, fits)
    if content is None:
        return {**base, "content": ""}
    if content != text:
        return {**base, "content": content}
    for name, body in draft.files:
        before = content

        def file_fits(cut: str, name: str = name, before: str = before) -> bool:
            return fits(before + file_block(name, cut))

        block = _longest(body, file_fits)
        if block is None:
            break
        content += file_block(name, block)
        if block != body:
            break
    return {**base, "content": content}


def fit(drafts: Sequence[Draft], *, max_chars: int, max_item_chars: int,
        first: Sequence[str] = (), reserve: int = 0) -> list[ContextItem]:
    """The items that fit, oldest first. `first` are the ids kept before all others (the
    message answered, always kept, then the one it replies to); `reserve` characters are
    kept free for what goes with the dialogue (the images' caption)."""
    budget = max_chars - reserve
    by_id = {draft.message_id: draft for draft in drafts}
    chosen: dict[str, ContextItem] = {}
    used = 0
    for position, message_id in enumerate(first):
        draft = by_id.get(message_id)
        if draft is None or message_id in chosen:
            continue
        room = min(max_item_chars, budget - used)
        if room <= 0 and position > 0:
            continue
        item = compose(draft, max(room, 0))
        chosen[message_id] = item
        used += rendered_length(item)
    for draft in reversed(drafts):
        if draft.message_id in chosen:
            continue
        item = compose(draft, max_item_chars)
        cost = rendered_length(item)
        if used + cost > budget:
            break
        chosen[draft.message_id] = item
        used += cost
    return [chosen[d.message_id] for d in drafts if d.message_id in chosen]
