"""Links in model text, as Discord would render them, made to show where they lead.

A masked link, `[discord.com/settings](https://evil.example)`, shows its label and hides its
target: a model that repeats a user's bait (or is steered into writing one) would post a
phishing link that looks like something else. Every masked link outside code becomes its
label followed by its real target, `discord.com/settings (https://evil.example)`. The
grammar is simple-markdown's link rule (the parser Discord's markdown grew from: a label of
text and balanced `[…]`, a target of text and balanced `(…)`, optionally in `<…>` and with
a quoted title); a code span or block counts only once it is closed, as Discord shows an
unclosed backtick as it is. A `](` left over that the rule did not match loses its parenthesis to a
full-width one, so no other spelling of the syntax can still mask a target. Code spans and
code blocks are left as they are: Discord shows them literally. Nothing here makes the text
longer, so a message cut to Discord's limit stays within it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_LABEL = r"(?:\[[^\]]*\]|[^\[\]]|\](?=[^\[]*\]))*"
_TARGET = r"\s*<?((?:\([^)]*\)|[^\s\\()]|\\.)*?)>?(?:\s+['\"]([^'\"]*)['\"])?\s*"
MASKED_LINK = re.compile(rf"\[({_LABEL})\]\({_TARGET}\)")
CODE = re.compile(r"```[\s\S]+?```|``[\s\S]+?``|`[^`]+`")
LEFTOVER = "]("
NEUTRAL = "]\uff08"
"""A `](` the link rule did not take: the parenthesis becomes FULLWIDTH LEFT PARENTHESIS."""


def _shown(match: re.Match[str]) -> str:
    label, target = match.group(1).strip(), match.group(2)
    if not target or label == target:
        return target or label
    return f"{label} ({target})" if label else target


def _unmask(text: str) -> str:
    return MASKED_LINK.sub(_shown, text).replace(LEFTOVER, NEUTRAL)


def _outside_code(text: str, change: Callable[[str], str]) -> str:
    out: list[str] = []
    position = 0
    for code in CODE.finditer(text):
        out.append(change(text[position:code.start()]))
        out.append(code.group(0))
        position = code.end()
    out.append(change(text[position:]))
    return "".join(out)


def unmask_links(text: str) -> str:
    """`text` with every masked link outside code showing its target."""
    if LEFTOVER not in text:
        return text
    shown = _outside_code(text, _unmask)
    # Dropping a link's title may re-pair the backticks around it; should that bring a
    # `](` out of code, none is left anywhere.
    if _outside_code(shown, lambda part: part.replace(LEFTOVER, "")) != shown:
        shown = shown.replace(LEFTOVER, NEUTRAL)
    return shown
