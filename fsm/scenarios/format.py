"""Scenario files (SCENARIOS.md): the script of everything outside the engine for one turn.

Loading validates the whole file and names the first problem (file and field) in one line;
unknown fields are ignored so a scenario written for a later version still runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..engine.config import TurnConfig
from ..engine.flags import EnrichmentKind
from ..engine.stash import item_size


class ScenarioError(ValueError):
    """A malformed scenario or journal; the message is one line naming file and field."""


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, allow_inf_nan=False)


class ToolCallSpec(_Loose):
    name: str | None = None
    args: Any = Field(default_factory=dict)
    truncated: bool = False
    id: str | None = None


STEP_KINDS = ("text", "keepalive", "tool_call", "tool_calls", "end", "error", "raise", "stall")


class Step(_Loose):
    """One provider step; exactly one kind key per step."""

    at: float = Field(ge=0)
    text: str | None = None
    keepalive: bool = False
    tool_call: ToolCallSpec | None = None
    tool_calls: list[ToolCallSpec] | None = None
    end: Literal["completed", "empty"] | None = None
    error: str | None = None
    raise_: str | None = Field(default=None, alias="raise")
    stall: bool = False
    settles_after: float = Field(default=0.0, ge=0)
    lands: str | None = None
    flush_s: float = Field(default=0.0, ge=0)
    """On the step that ends a pass: how long the channel then took to send what the pass
    had handed it (a live Discord channel waiting out rate limits)."""

    @model_validator(mode="after")
    def _one_kind(self) -> Step:
        kinds = [k for k in STEP_KINDS if self._has(k)]
        if len(kinds) != 1:
            found = ", ".join(kinds) if kinds else "none"
            raise ValueError(f"a step needs exactly one of {', '.join(STEP_KINDS)} "
                             f"(found: {found})")
        return self

    def _has(self, kind: str) -> bool:
        value = getattr(self, "raise_" if kind == "raise" else kind)
        return value is not None and value is not False

    @property
    def kind(self) -> str:
        return next(k for k in STEP_KINDS if self._has(k))


class ToolOutcome(_Loose):
    after: float = Field(default=0.0, ge=0)
    success: bool | None = None
    data: Any = None
    error: str | None = None
    hang: bool = False
    raise_: str | None = Field(default=None, alias="raise")
    refused: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ToolOutcome:
        kinds = [name for name, present in (
            ("success", self.success is not None), ("hang", self.hang),
            ("raise", self.raise_ is not None), ("refused", self.refused is not None),
        ) if present]
        if len(kinds) != 1:
            raise ValueError("a tool outcome needs exactly one of success, hang, raise, refused")
        return self


class GuardedTool(_Loose):
    guard: EnrichmentKind
    outcomes: list[ToolOutcome]


class Reaction(_Loose):
    emoji: str
    users: list[str] = Field(default_factory=list)
    count: int | None = None


class HistoryMessage(_Loose):
    id: str
    author: str
    content: str = ""
    at: str = ""
    author_id: str | None = None
    reply_to: str | None = None
    reactions: list[Reaction] = Field(default_factory=list)


class ScheduledEvent(_Loose):
    at: float = Field(ge=0)
    kill: bool = False
    follow_up: bool = False

    @model_validator(mode="after")
    def _one_kind(self) -> ScheduledEvent:
        if self.kill == self.follow_up:
            raise ValueError("an event needs exactly one of kill, follow_up")
        return self


class HistoryEntrySpec(_Loose):
    tool_name: str
    arguments: Any = Field(default_factory=dict)
    result: Any = Field(default_factory=dict)
    call_id: str | None = None
    pre_tool_text: str = ""
    success: bool = True


class RequestSpec(_Loose):
    """How the turn was asked to reply (a project extension of the format): recorded for
    live turns so a fallback attempt's prefill and replayed calls replay too."""

    owner: str = "assistant"
    system_prompt: str = ""
    prefill: str = ""
    request_notices: list[str] = Field(default_factory=list)
    function_history: list[HistoryEntrySpec] = Field(default_factory=list)
    trigger_message_id: str | None = None
    queued: bool = False
    scene_turn: bool = False


class Scenario(_Loose):
    name: str = "scenario"
    config: dict[str, Any] = Field(default_factory=dict)
    passes: list[list[Step]] = Field(default_factory=list)
    tools: dict[str, list[ToolOutcome] | GuardedTool] = Field(default_factory=dict)
    stash: dict[str, dict[str, Any]] = Field(default_factory=dict)
    history: list[HistoryMessage] = Field(default_factory=list)
    events: list[ScheduledEvent] = Field(default_factory=list)
    request: RequestSpec = Field(default_factory=RequestSpec)
    expect: Any = None

    def flush_delays(self) -> list[float]:
        """Per pass, the channel's `flush_s` after the stream ended (0 when not given)."""
        return [max((step.flush_s for step in steps), default=0.0) for steps in self.passes]

    def turn_config(self) -> TurnConfig:
        known = {k: v for k, v in self.config.items() if k in TurnConfig.model_fields}
        return TurnConfig.model_validate(known)


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("list[ToolOutcome]", "GuardedTool") or "[" in str(part):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _first_problem(exc: ValidationError) -> str:
    err = exc.errors()[0]
    message = err["msg"].removeprefix("Value error, ")
    return f"{_where(tuple(err['loc']))}: {message}"


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate `data` as a scenario, config included; raise ScenarioError naming the field."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario is a JSON object, not {type(data).__name__}")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"{source}: {_first_problem(exc)}") from None
    try:
        config = scenario.turn_config()
    except ValidationError as exc:
        raise ScenarioError(f"{source}: config.{_first_problem(exc)}") from None
    for name, item in scenario.stash.items():
        if item_size({k: v for k, v in item.items() if k != "stash_at"}) > config.stash_max_bytes:
            raise ScenarioError(f"{source}: stash.{name}: larger than config.stash_max_bytes "
                                f"({config.stash_max_bytes})")
    return scenario


def read_text(path: Path) -> str:
    """The file's text, or a ScenarioError naming the file."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not UTF-8 text") from None


def decode_json(text: str, where: str) -> Any:
    """Parse JSON text; any failure, absurd nesting and huge numbers included, is one
    ScenarioError naming `where`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: "
                            f"{exc.msg}") from None
    except RecursionError:
        raise ScenarioError(f"{where}: JSON nested too deeply to read") from None
    except ValueError as exc:
        raise ScenarioError(f"{where}: unreadable JSON ({exc})") from None


def read_json(path: Path) -> Any:
    return decode_json(read_text(path), str(path))


def load_scenario(path: Path) -> Scenario:
    return parse_scenario(read_json(path), str(path))
