"""Assembling Vertex's streamed function-call arguments into one call.

With argument streaming on, Vertex sends a call in several parts: the first carries the
`name` (and maybe an `id`), each part carries `partialArgs` — one value at a `jsonPath` such
as `$.location.city` or `$.stops[1]`, a string value continued by the next part while its
`willContinue` is true — and the call itself has `willContinue: true` until a closing part,
an empty `functionCall {}`, ends it. Without this, each part would look like a whole call
with empty arguments. The Gemini Developer API sends calls whole, which is the other path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_PATH_STEP = re.compile(
    r"\.([A-Za-z_][\w-]*)|\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]|\[\"((?:[^\"\\]|\\.)*)\"\]"
)


def is_partial(call: dict[str, Any]) -> bool:
    """A part that belongs to a streamed call (or closes one)."""
    return "partialArgs" in call or call.get("willContinue") is True or not call


def path_steps(path: str) -> list[str | int] | None:
    """`$.a.b[0]` -> ["a", "b", 0]; None for a path this reader does not understand."""
    if not path.startswith("$"):
        return None
    steps: list[str | int] = []
    position = 1
    while position < len(path):
        match = _PATH_STEP.match(path, position)
        if match is None:
            return None
        name, index, single, double = match.groups()
        if index is not None:
            steps.append(int(index))
        else:
            steps.append(name if name is not None else (single if single is not None else double))
        position = match.end()
    return steps


@dataclass(slots=True)
class StreamedCall:
    """One call being assembled; `broken` when a part could not be placed (never runs)."""

    name: str
    call_id: str | None
    args: dict[str, Any] = field(default_factory=dict)
    broken: bool = False
    _open_string: tuple[str | int, ...] | None = None

    def add(self, partial_args: Any) -> None:
        if not isinstance(partial_args, list):
            return
        for item in partial_args:
            if isinstance(item, dict):
                self._add_one(item)

    def _add_one(self, item: dict[str, Any]) -> None:
        steps = path_steps(str(item.get("jsonPath", "")))
        if not steps:
            self.broken = True
            return
        key = tuple(steps)
        if "stringValue" in item:
            text = str(item["stringValue"])
            if self._open_string == key:
                current = self._get(steps)
                text = (current if isinstance(current, str) else "") + text
            value: Any = text
        elif "numberValue" in item:
            value = item["numberValue"]
        elif "boolValue" in item:
            value = bool(item["boolValue"])
        else:
            value = None
        self._open_string = key if item.get("willContinue") is True else None
        if not self._set(steps, value):
            self.broken = True

    def _get(self, steps: list[str | int]) -> Any:
        node: Any = self.args
        for step in steps:
            if isinstance(step, int):
                if not isinstance(node, list) or step >= len(node):
                    return None
                node = node[step]
            else:
                if not isinstance(node, dict):
                    return None
                node = node.get(step)
        return node

    def _set(self, steps: list[str | int], value: Any) -> bool:
        if isinstance(steps[0], int):
            return False  # the arguments are an object, never a list
        node: Any = self.args
        for step, following in zip(steps, [*steps[1:], None], strict=True):
            container: Any = [] if isinstance(following, int) else {}
            if isinstance(step, int):
                if not isinstance(node, list) or step > len(node):
                    return False
                if step == len(node):
                    node.append(value if following is None else container)
                elif following is None:
                    node[step] = value
                node = node[step]
            else:
                if not isinstance(node, dict):
                    return False
                if following is None:
                    node[step] = value
                else:
                    node = node.setdefault(step, container)
        return True
