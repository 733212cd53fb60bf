"""Turn journals: a turn's inputs (in scenario form) plus every transition and the result.

A live turn records every input the engine's decisions depend on, as the engine's clock saw
it arrive — chunks, keep-alives, reasoning, usage, the provider's finish word, errors with
their kind and type, exceptions with their class name, flush times, tool outcomes, kills and
follow-ups — so any production turn replays exactly offline (`python -m fsm replay`,
docs/scenarios.md), and can be compared and drawn on the state diagram.

Size is bounded whatever the provider sends: a run of keep-alives is one step with its count
and span, bulky binary media is recorded by size and digest only. Serializing and writing a
journal happen in a worker thread (`save_journal`), never on the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

from ..engine.config import TurnConfig
from ..engine.pass_run import PassRun, TextSink
from ..engine.prefill import TurnRequest
from ..engine.stash import ContextStash
from ..engine.tools import Tool, ToolRegistry
from .document import journal_document
from .encoding import orjson_bytes

__all__ = ["JournalRecorder", "RecordingStash", "journal_document", "jsonable",
           "save_journal", "serialize_journal", "write_journal"]


def jsonable(value: Any) -> Any:
    """A JSON-safe copy: bytes become a digest record, a non-finite float `None` (JSON has
    no NaN; the readers refuse one), unknown objects their repr."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if len(raw) <= 64:
            return {"$bytes": base64.b64encode(raw).decode()}
        return {"$bytes_sha256": hashlib.sha256(raw).hexdigest(), "length": len(raw)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _r(t: float) -> float:
    """Seconds on the journal's microsecond grid."""
    return round(t, 6)


class RecordingStash(ContextStash):
    """A stash that remembers what tools put in it during a live turn, so the journal can
    reproduce the items under stable names instead of unrepeatable random keys."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.names: dict[str, str] = {}
        self.items: dict[str, dict[str, Any]] = {}
        self._clock_origin: float | None = None

    def start(self, origin: float) -> None:
        self._clock_origin = origin

    def put(self, item: Any) -> str:
        key = super().put(item)
        name = f"item{len(self.names) + 1}"
        self.names[key] = name
        record = jsonable(item) if isinstance(item, dict) else {"value": jsonable(item)}
        if self._clock_origin is not None:
            record["stash_at"] = _r(self._clock() - self._clock_origin)
        self.items[name] = record
        return key

    def refs(self, value: Any) -> Any:
        """`value` with every stash key replaced by its `$stash:NAME` reference."""
        if isinstance(value, str) and value in self.names:
            return f"$stash:{self.names[value]}"
        if isinstance(value, dict):
            return {k: self.refs(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.refs(v) for v in value]
        return value


Step = dict[str, Any] | tuple[float, str]
"""A recorded step: a dict in scenario form, or a content chunk as `(at, text)` — the hot
path appends a tuple and the dict is built once, when the journal is written."""


class JournalRecorder:
    """Records a live turn's inputs in scenario form (the engine's `InputRecorder`)."""

    def __init__(self, name: str, config: TurnConfig, tools: ToolRegistry,
                 stash: ContextStash | None = None,
                 history: list[dict[str, Any]] | None = None,
                 request: TurnRequest | None = None) -> None:
        self.name = name
        self.request = request
        self.config = config
        self.tools = tools
        self.stash = stash
        self.history = history or []
        self.tool_outcomes: dict[str, list[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.lookups: list[dict[str, Any]] = []
        self._stashed: dict[str, str] = {}
        """Keys of a shared stash that tools of this turn returned, by stable name."""
        self._stashed_items: dict[str, dict[str, Any]] = {}
        self._origin: float | None = None
        self._passes: list[list[Step]] = []
        self._landed: dict[int, str] = {}

    @property
    def passes(self) -> list[list[dict[str, Any]]]:
        """The recorded passes in scenario form."""
        return [[_as_dict(step) for step in steps] for steps in self._passes]

    def _steps(self, pass_no: int) -> list[Step]:
        while len(self._passes) < pass_no:
            self._passes.append([])
        return self._passes[pass_no - 1]

    def on_pass_start(self, pass_no: int) -> TextSink:
        if self._origin is None and _in_loop():
            self._origin = asyncio.get_running_loop().time()
        return self._steps(pass_no).append

    def on_landed(self, pass_no: int, text: str) -> None:
        """Text that arrived after the pass was aborted: it goes to the stall step."""
        self._landed[pass_no] = self._landed.get(pass_no, "") + text

    def on_keepalive(self, pass_no: int, at: float) -> None:
        """A keep-alive; a run of them in a row stays one step (count and span), so a
        provider that sends nothing else cannot grow the journal (RELIABILITY.md)."""
        steps = self._steps(pass_no)
        last = steps[-1] if steps else None
        if isinstance(last, dict) and last.get("keepalive"):
            last["count"] = last.get("count", 1) + 1
            last["until"] = _r(at)
            return
        steps.append({"at": _r(at), "keepalive": True})

    def on_step(self, pass_no: int, at: float, step: dict[str, Any]) -> None:
        """A stream event the result keeps: `reasoning`, `usage` or the provider's `finish`
        word. Consecutive reasoning chunks are joined into one step."""
        steps = self._steps(pass_no)
        last = steps[-1] if steps else None
        if "reasoning" in step and isinstance(last, dict) and "reasoning" in last:
            last["reasoning"] += step["reasoning"]
            return
        steps.append({"at": _r(at), **jsonable(step)})

    def on_end(self, pass_no: int, at: float, outcome: str, run: PassRun,
               flush_s: float = 0.0) -> None:
        """The stream ended at `at`; the channel then took `flush_s` to send the pass."""
        step: dict[str, Any] = {"at": _r(at)}
        if outcome == "tool_call":
            calls = [{"name": c.name, "args": jsonable(c.arguments), "truncated": c.truncated,
                      **({"id": c.id} if c.id else {})} for c in run.tool_calls]
            if len(calls) == 1:
                step["tool_call"] = calls[0]
            else:
                step["tool_calls"] = calls
        elif outcome == "provider_error" and run.error is not None:
            step["error"] = jsonable(run.error.as_dict())
        else:
            step["end"] = "completed" if outcome == "completed" else "empty"
        if _r(flush_s) > 0:
            step["flush_s"] = _r(flush_s)
        self._steps(pass_no).append(step)

    def on_raise(self, pass_no: int, at: float, error: BaseException) -> None:
        self._steps(pass_no).append({"at": _r(at), "raise": str(error),
                                     "error_type": type(error).__name__})

    def on_stall(self, pass_no: int, settles_after: float) -> None:
        """The pass went silent after its last step and was aborted; it settled
        `settles_after` seconds after the abort."""
        steps = self._steps(pass_no)
        last_step = _as_dict(steps[-1]) if steps else None
        if last_step is not None and last_step.get("stall"):
            return
        last = last_step["at"] if last_step is not None else 0.0
        if last_step is not None and last_step.get("until") is not None:
            last = last_step["until"]
        stall: dict[str, Any] = {"at": last, "stall": True, "settles_after": _r(settles_after)}
        landed = self._landed.pop(pass_no, "")
        if landed:
            stall["lands"] = landed
        steps.append(stall)

    def on_tool(self, name: str, after: float, outcome: dict[str, Any]) -> None:
        record = {"after": _r(after), **outcome}
        if "data" in record:
            record["data"] = jsonable(self._stash_refs(record["data"], after))
        if record.get("hang"):
            record = {"hang": True}
        self.tool_outcomes.setdefault(name, []).append(record)

    def _stash_refs(self, data: Any, after: float) -> Any:
        """`data` with every key of an item a tool stashed as `$stash:NAME`: a recording
        stash knows its items; a shared one (the bot's) is asked, and the item recorded as
        stashed when the tool began (it was put while the tool ran, `after` seconds)."""
        stash = self.stash
        if isinstance(stash, RecordingStash):
            return stash.refs(data)
        if stash is None:
            return data
        if isinstance(data, str):
            name = self._stashed.get(data)
            if name is None:
                item = stash.peek(data)
                if item is None:
                    return data
                name = self._stashed[data] = f"item{len(self._stashed) + 1}"
                record = jsonable(item) if isinstance(item, dict) else {"value": jsonable(item)}
                if self._origin is not None and _in_loop():
                    began = asyncio.get_running_loop().time() - self._origin - after
                    record["stash_at"] = max(0.0, _r(began))
                self._stashed_items[name] = record
            return f"$stash:{name}"
        if isinstance(data, dict):
            return {k: self._stash_refs(v, after) for k, v in data.items()}
        if isinstance(data, list):
            return [self._stash_refs(v, after) for v in data]
        return data

    def on_event(self, at: float, event: dict[str, Any]) -> None:
        self.events.append({"at": _r(at), **event})

    def on_lookup(self, lookup: dict[str, Any]) -> None:
        recorded = jsonable(lookup)
        if "after" in recorded:
            recorded["after"] = _r(recorded["after"])
        self.lookups.append(recorded)

    def scenario(self) -> dict[str, Any]:
        tools: dict[str, Any] = {}
        for name in self.tools.names():
            tool = self.tools.get(name)
            declared = _declaration(tool)
            if declared and name not in self.tool_outcomes:
                tools[name] = {**declared, "outcomes": []}
        for name, outcomes in self.tool_outcomes.items():
            declared = _declaration(self.tools.get(name))
            tools[name] = {**declared, "outcomes": outcomes} if declared else outcomes
        request: dict[str, Any] = {}
        if self.request is not None:
            request = jsonable({
                "owner": self.request.owner, "system_prompt": self.request.system_prompt,
                "prefill": self.request.prefill,
                "request_notices": list(self.request.request_notices),
                "function_history": [dataclasses.asdict(entry)
                                     for entry in self.request.function_history],
                "trigger_message_id": self.request.trigger_message_id,
                "queued": self.request.queued, "scene_turn": self.request.scene_turn,
            })
        return {
            "name": self.name,
            "config": self.config.model_dump(),
            "request": request,
            "passes": self.passes,
            "tools": tools,
            "stash": (self.stash.items if isinstance(self.stash, RecordingStash)
                      else dict(self._stashed_items)),
            "history": self.history,
            "events": self.events,
            **({"channel": {"lookups": self.lookups}} if self.lookups else {}),
        }


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _as_dict(step: Step) -> dict[str, Any]:
    if isinstance(step, tuple):
        at, text = step
        return {"at": _r(at), "text": text}
    return step


def serialize_journal(document: dict[str, Any]) -> bytes:
    """The journal as indented UTF-8 JSON, by orjson where it can (`encoding`). A lone
    surrogate (half an emoji cut by a provider) is written as its JSON escape, so the file
    stays valid UTF-8 and reads back unchanged."""
    fast = orjson_bytes(document, jsonable, indent=True)
    if fast is not None:
        return fast
    safe = jsonable(document)
    text = json.dumps(safe, ensure_ascii=False, indent=1) + "\n"
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(safe, ensure_ascii=True, indent=1) + "\n").encode("ascii")


def write_journal(path: Path, document: dict[str, Any]) -> None:
    """Write `document` to `path` (blocking; on the event loop use `save_journal`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = serialize_journal(document)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    partial.replace(path)


async def save_journal(path: Path, document: dict[str, Any]) -> None:
    """`write_journal` in a worker thread: a long turn's journal is megabytes of JSON, and
    building it must not stall every other channel's timers. The document must not change
    while it is written (a finished turn's record does not)."""
    await asyncio.to_thread(write_journal, path, document)


def _declaration(tool: Tool | None) -> dict[str, Any]:
    """What a tool declares that replay needs: its guard (R8) and its loop policy (T9)."""
    if tool is None:
        return {}
    declared: dict[str, Any] = {}
    if tool.guard:
        declared["guard"] = tool.guard
    if tool.loop != "next_pass":
        declared["loop"] = tool.loop
    return declared
