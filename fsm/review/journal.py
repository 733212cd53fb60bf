"""Turn journals: a turn's inputs (in scenario form) plus every transition and the result.

A live turn records its inputs as they really arrive, so any production turn can be replayed
offline (`python -m fsm replay`), compared, and drawn on the state diagram. Bulky binary
media is recorded by size and digest only: a journal must stay small and carry no payloads
a user did not see as text.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from ..engine.config import TurnConfig
from ..engine.prefill import TurnRequest
from ..engine.stash import ContextStash
from ..engine.pass_run import PassRun, TextSink
from ..engine.tools import ToolRegistry


def jsonable(value: Any) -> Any:
    """A JSON-safe copy: bytes become a digest record, unknown objects their repr."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if len(raw) <= 64:
            return {"$bytes": base64.b64encode(raw).decode()}
        return {"$bytes_sha256": hashlib.sha256(raw).hexdigest(), "length": len(raw)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _r(t: float) -> float:
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
    """Records a live turn's inputs in scenario form."""

    def __init__(self, name: str, config: TurnConfig, tools: ToolRegistry,
                 stash: RecordingStash | None = None,
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
        return self._steps(pass_no).append

    def on_landed(self, pass_no: int, text: str) -> None:
        """Text that arrived after the pass was aborted: it goes to the stall step."""
        self._landed[pass_no] = self._landed.get(pass_no, "") + text

    def on_keepalive(self, pass_no: int, at: float) -> None:
        self._steps(pass_no).append({"at": _r(at), "keepalive": True})

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
            step["error"] = run.error.message
        else:
            step["end"] = "completed" if outcome == "completed" else "empty"
        if _r(flush_s) > 0:
            step["flush_s"] = _r(flush_s)
        self._steps(pass_no).append(step)

    def on_raise(self, pass_no: int, at: float, error: BaseException) -> None:
        self._steps(pass_no).append({"at": _r(at), "raise": f"{type(error).__name__}: {error}"})

    def on_stall(self, pass_no: int, settles_after: float) -> None:
        """The pass went silent after its last step and was aborted; it settled
        `settles_after` seconds after the abort."""
        steps = self._steps(pass_no)
        last_step = _as_dict(steps[-1]) if steps else None
        if last_step is not None and last_step.get("stall"):
            return
        last = last_step["at"] if last_step is not None else 0.0
        stall: dict[str, Any] = {"at": last, "stall": True, "settles_after": _r(settles_after)}
        landed = self._landed.pop(pass_no, "")
        if landed:
            stall["lands"] = landed
        steps.append(stall)

    def on_tool(self, name: str, after: float, outcome: dict[str, Any]) -> None:
        record = {"after": _r(after), **outcome}
        if "data" in record:
            data = self.stash.refs(record["data"]) if self.stash is not None else record["data"]
            record["data"] = jsonable(data)
        if record.get("hang"):
            record = {"hang": True}
        self.tool_outcomes.setdefault(name, []).append(record)

    def on_event(self, at: float, event: dict[str, Any]) -> None:
        self.events.append({"at": _r(at), **event})

    def scenario(self) -> dict[str, Any]:
        tools: dict[str, Any] = {}
        for name, outcomes in self.tool_outcomes.items():
            tool = self.tools.get(name)
            guard = tool.guard if tool is not None else None
            tools[name] = {"guard": guard, "outcomes": outcomes} if guard else outcomes
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
            "stash": self.stash.items if self.stash is not None else {},
            "history": self.history,
            "events": self.events,
        }


def _as_dict(step: Step) -> dict[str, Any]:
    if isinstance(step, tuple):
        at, text = step
        return {"at": _r(at), "text": text}
    return step


def journal_document(scenario: dict[str, Any], transitions: list[dict[str, Any]],
                     result: dict[str, Any]) -> dict[str, Any]:
    """A recorded journal: the scenario fields that reproduce it, the transitions, the result."""
    doc = {k: v for k, v in scenario.items() if k not in ("journal", "result", "expect")}
    doc["journal"] = [dict(t) for t in transitions]
    doc["result"] = result
    return doc


def write_journal(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(document), ensure_ascii=False, indent=1) + "\n",
                    encoding="utf-8")
