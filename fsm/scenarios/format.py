"""Scenario and journal files (docs/scenarios.md): the script of everything outside the
engine for one turn, and a recorded turn's journal.

Loading validates the whole file and names the first problem (file and field) in one line;
unknown fields are ignored so a scenario written for a later version still runs. Reading
refuses what no recorder writes (integers of absurd length, non-finite numbers) with one line
instead of a traceback further on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..engine.config import TurnConfig
from ..engine.flags import EnrichmentKind
from ..engine.stash import item_size
from ..engine.tools import LoopPolicy
from ..journal.reading import ScenarioError, read_json


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, allow_inf_nan=False)


class ToolCallSpec(_Loose):
    name: str | None = None
    args: Any = Field(default_factory=dict)
    truncated: bool = False
    id: str | None = None


STEP_KINDS = ("text", "keepalive", "reasoning", "usage", "finish", "tool_call", "tool_calls",
              "end", "error", "raise", "stall")

ErrorKind = Literal["provider_stream_error", "stall_timeout", "blocked", "http"]


class ErrorSpec(_Loose):
    """A provider error result as the adapter reported it (what the engine and the result
    see: kind, message, type, HTTP status, whether it may be retried)."""

    message: str = ""
    kind: ErrorKind = "provider_stream_error"
    type: str | None = None
    status: int | None = None
    retryable: bool = False
    retry_after_s: float | None = None


class UsageSpec(_Loose):
    """Token counts as the provider reported them."""

    input_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int | None = Field(default=None, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)
    thoughts_tokens: int | None = Field(default=None, ge=0)


class Step(_Loose):
    """One provider step; exactly one kind key per step."""

    at: float = Field(ge=0)
    text: str | None = None
    keepalive: bool = False
    count: int = Field(default=1, ge=1)
    """On a keep-alive step: how many keep-alives arrived in a row (a run is one step)."""
    until: float | None = Field(default=None, ge=0)
    """On a keep-alive run: when the last of them arrived."""
    reasoning: str | None = None
    usage: UsageSpec | None = None
    finish: str | None = None
    tool_call: ToolCallSpec | None = None
    tool_calls: list[ToolCallSpec] | None = None
    end: Literal["completed", "empty"] | None = None
    error: str | ErrorSpec | None = None
    raise_: str | None = Field(default=None, alias="raise")
    error_type: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
    """On a `raise` step: the class name of the exception the provider raised."""
    stall: bool = False
    settles_after: float = Field(default=0.0, ge=0)
    lands: str | None = None
    flush_s: float = Field(default=0.0, ge=0)
    """On the step that ends a pass: how long the channel then took to send what the pass
    had handed it (a live Discord channel waiting out rate limits)."""

    @property
    def error_spec(self) -> ErrorSpec:
        """The `error` step's error; a bare message is a stream error of a scripted type."""
        if isinstance(self.error, ErrorSpec):
            return self.error
        return ErrorSpec(message=self.error or "", type="scripted_error")

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
    error_type: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
    """On a `raise` outcome: the class name of the exception the tool raised."""
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
    """A tool with a declaration: the enrichment flag that guards it (R8) and/or its loop
    policy (T9)."""

    guard: EnrichmentKind | None = None
    loop: LoopPolicy = "next_pass"
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
    before_start: bool = False
    """On a kill: it was asked for on the channel before the turn began (a /kill while the
    bot read the history), so the turn meets it in Preparing."""

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
    batch: str | None = None


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


class LookupSpec(_Loose):
    """One reactor look-up of a metadata reveal as the live channel answered it (R6), in call
    order: after `after` seconds the `users`, or an exception of class `error_type`; `hang`
    when it had not answered by the turn's end (the reveal's budget or a kill cut it off)."""

    message_id: str
    emoji: str
    after: float = Field(default=0.0, ge=0)
    users: list[str] = Field(default_factory=list)
    error_type: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
    hang: bool = False


class ChannelSpec(_Loose):
    """What a live channel reported about itself: `delivered_text` is its own account of
    what reached the users by the turn's end (a Discord channel that dropped unsent text at
    a kill), recorded only when it differs from the text the passes handed it; `lookups`,
    how it answered the reactor look-ups, with their timing."""

    delivered_text: str | None = None
    lookups: list[LookupSpec] = Field(default_factory=list)
    """The reactor look-ups the live channel answered, recorded when a reveal made any."""


class Scenario(_Loose):
    name: str = "scenario"
    channel: ChannelSpec = Field(default_factory=ChannelSpec)
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


def load_scenario(path: Path) -> Scenario:
    return parse_scenario(read_json(path), str(path))


def split_journal(data: Any, source: str) -> tuple[Scenario, list[dict[str, Any]], dict[str, Any]]:
    """A recorded journal's scenario, transitions and result.

    Accepts the JSON document `write_journal` produces, or JSON Lines with a
    `{"scenario": …}` line, the transition lines and the `{"result": …}` line."""
    if isinstance(data, list):
        scenario_data: Any = None
        lines: list[dict[str, Any]] = []
        result: Any = None
        for line in data:
            if not isinstance(line, dict):
                raise ScenarioError(f"{source}: every journal line must be a JSON object")
            if "scenario" in line:
                scenario_data = line["scenario"]
            elif "result" in line:
                result = line["result"]
            else:
                lines.append(line)
        if scenario_data is None:
            raise ScenarioError(f"{source}: the journal carries no scenario line")
        if not isinstance(scenario_data, dict):
            raise ScenarioError(f"{source}: scenario: not an object")
        data = {**scenario_data, "journal": lines, "result": result}
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a journal is a JSON object")
    transitions = data.get("journal")
    result = data.get("result")
    if not isinstance(transitions, list):
        raise ScenarioError(f"{source}: journal: missing or not a list of transitions")
    for index, line in enumerate(transitions):
        if not isinstance(line, dict):
            raise ScenarioError(f"{source}: journal[{index}]: a transition is a JSON object")
    if not isinstance(result, dict):
        raise ScenarioError(f"{source}: result: missing or not an object")
    scenario = parse_scenario({k: v for k, v in data.items() if k not in ("journal", "result")},
                              source)
    return scenario, transitions, result
