"""The message-metadata reveal (R6): reactor look-ups within budgets, then annotation of the
recent dialogue with ref handles, authors, sent times, reply references and reactors."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from .user_text import neutralize, one_line, quoted_lines, quoted_name

__all__ = ["LookupBudget", "LookupProgress", "ReactorSource", "annotate", "fetch_reactors",
           "neutralize", "render_line", "tail_directive"]

log = logging.getLogger(__name__)


class ReactorSource(Protocol):
    """Who reacted with an emoji to a message: the channel (`TurnChannel.fetch_reactors`),
    or the channel with the restart runner's recording around it."""

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class LookupBudget:
    """Bounds on reactor look-ups, each one a sequential REST call."""

    per_turn: int
    per_message: int
    per_reaction: int


def _is_dialogue(item: dict[str, Any]) -> bool:
    return item.get("type") == "dialogue" and isinstance(item.get("message_id"), str)


@dataclass(slots=True)
class LookupProgress:
    """What the look-ups found so far: kept by the caller, so a reveal whose look-ups run
    out of time still annotates with the names found and counts the calls made (R6)."""

    reactors: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    lookups: int = 0


async def fetch_reactors(
    items: list[dict[str, Any]],
    channel: ReactorSource,
    budget: LookupBudget,
    recent: int,
    progress: LookupProgress | None = None,
) -> tuple[dict[tuple[str, str], list[str]], int]:
    """Reactor names per (message id, emoji) for the recent dialogue that carries reactions."""
    found = progress if progress is not None else LookupProgress()
    reactors = found.reactors
    lookups = found.lookups
    dialogue = [item for item in items if _is_dialogue(item)][-recent:]
    for item in dialogue:
        per_message = 0
        for reaction in item.get("reactions") or []:
            if lookups >= budget.per_turn:
                return reactors, lookups
            if per_message >= budget.per_message:
                break
            emoji = reaction.get("emoji") if isinstance(reaction, dict) else None
            if not isinstance(emoji, str):
                continue
            lookups += 1
            found.lookups = lookups
            per_message += 1
            try:
                names = await channel.fetch_reactors(item["message_id"], emoji,
                                                     budget.per_reaction)
            except Exception as exc:  # a failed look-up degrades to counts only
                log.warning("reactor look-up failed for a message: %s", type(exc).__name__)
                continue
            reactors[(item["message_id"], emoji)] = [str(n) for n in names][: budget.per_reaction]
    return reactors, lookups


def annotate(
    items: list[dict[str, Any]],
    reactors: dict[tuple[str, str], list[str]],
    recent: int,
) -> list[dict[str, Any]]:
    """Copies of `items` whose recent dialogue carries a `metadata` block and an annotated
    text line; older items, non-dialogue items and the bot's own messages (role
    `assistant`: the model must not learn to write headers) are returned unchanged."""
    recent_positions = [i for i, item in enumerate(items) if _is_dialogue(item)][-recent:]
    own = {items[i]["message_id"] for i in recent_positions if _is_own(items[i])}
    dialogue_positions = [i for i in recent_positions if not _is_own(items[i])]
    refs = {items[i]["message_id"]: f"ref_{n}" for n, i in enumerate(dialogue_positions, 1)}
    out = list(items)
    for position in dialogue_positions:
        item = dict(items[position])
        message_id = item["message_id"]
        author = one_line(str(item.get("author", "unknown")))
        meta: dict[str, Any] = {
            "ref": refs[message_id],
            "message_id": message_id,
            "author": author,
            "author_id": one_line(str(item.get("author_id", ""))),
            "sent_at": one_line(str(item.get("sent_at", ""))),
        }
        reply_to = item.get("reply_to")
        if isinstance(reply_to, str):
            meta["reply_to"] = "you" if reply_to in own else refs.get(reply_to, one_line(reply_to))
        reactions_meta = []
        for reaction in item.get("reactions") or []:
            if not isinstance(reaction, dict) or not isinstance(reaction.get("emoji"), str):
                continue
            emoji = reaction["emoji"]
            entry: dict[str, Any] = {"emoji": one_line(emoji), "count": reaction.get("count", 0)}
            names = reactors.get((message_id, emoji))
            if names is not None:
                entry["users"] = [one_line(n) for n in names]
            reactions_meta.append(entry)
        if reactions_meta:
            meta["reactions"] = reactions_meta
        item["metadata"] = meta
        item["content"] = neutralize(str(item.get("content", "")))
        item["annotated_text"] = render_line(meta, item["content"])
        out[position] = item
    return out


def _is_own(item: dict[str, Any]) -> bool:
    return item.get("role") in ("assistant", "model")


def render_line(meta: dict[str, Any], content: str) -> str:
    """One dialogue message as the model reads it after the reveal: a header line whose
    user-controlled fields are quoted strings, then the content quoted line by line, so
    nothing a user writes can look like a header or a directive."""
    header = (f"{meta['ref']} | {quoted_name(meta['author'])} ({meta['author_id']}) "
              f"at {meta['sent_at']}")
    if "reply_to" in meta:
        header += f" replying to {meta['reply_to']}"
    reactions = meta.get("reactions") or []
    if reactions:
        shown = []
        for reaction in reactions:
            users = reaction.get("users")
            who = f" by {', '.join(quoted_name(user) for user in users)}" if users else ""
            shown.append(f"{reaction['emoji']}x{reaction['count']}{who}")
        header += " | reactions: " + "; ".join(shown)
    # the names and the text, each neutralized, must not make a look-alike together either
    return neutralize(f"{header}\n{quoted_lines(content)}")


def tail_directive(text: str) -> dict[str, Any]:
    """The engine's own directive item, in the system role, where no chat user writes (A4):
    a user's look-alike of it is only ever user text."""
    return {"role": "system", "type": "directive", "parts": [{"type": "text", "text": text}]}
