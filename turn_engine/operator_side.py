"""What the bot does for the operator around each turn: the model and persona chosen for the
channel or its server, the tools of the moment, the history reset, the usage record and the
daily quota (docs/spec.md M).

`TurnBot` asks `prepare` before a turn and `record` after it; the slash commands
(`operator_commands.py`) change the choices. Everything that a reload may change (the
models, personas, prompt, who may manage, prices and quota) is replaced whole by
`reconfigure`, so a turn always sees one consistent set.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fsm import Attempt, GenerationResult, ToolRegistry

from .operator_settings import ManageSettings, ScopeKind, UsageSettings
from .persona import render
from .persona_library import NamedPersona
from .settings_store import Choice, ChoiceKey, SettingsStore, StoreError, UsageRow, utc_day
from .tool_catalog import ToolCatalog
from .usage import quota_notice, tokens_by_model

log = logging.getLogger(__name__)

DEFAULT = "default"

Clock = Callable[[], datetime.datetime]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class OperatorConfig:
    """The part of the operator's side a reload replaces."""

    models: Mapping[str, Sequence[Attempt]]
    """Name -> the attempts it means (the chosen model first, then the fallbacks);
    `default` is the configured provider and fallbacks."""
    personas: Mapping[str, NamedPersona] = field(default_factory=dict)
    default_prompt: Callable[[], str] = lambda: ""
    manage: ManageSettings = field(default_factory=ManageSettings)
    usage: UsageSettings = field(default_factory=UsageSettings)


@dataclass(frozen=True)
class TurnSetup:
    """What one turn runs with."""

    attempts: list[Attempt]
    system_prompt: str
    tools: ToolRegistry
    model: str
    persona: str
    display_name: str | None


@dataclass(frozen=True)
class Effective:
    """The choice in force in a channel, and where it comes from."""

    model: str
    model_from: str
    persona: str
    persona_from: str


class OperatorSide:
    def __init__(self, config: OperatorConfig, store: SettingsStore, catalog: ToolCatalog,
                 *, clock: Clock = _now) -> None:
        self.config = config
        self.store = store
        self.catalog = catalog
        self._clock = clock
        self._resets: dict[str, int] = {}
        self._noticed: set[tuple[str, str]] = set()
        self._warned_choices: set[tuple[str, str]] = set()

    def reconfigure(self, config: OperatorConfig) -> None:
        self.config = config

    async def start(self) -> None:
        """The store is opened before the bot connects (`open_store`); the MCP servers start
        here, with the bot."""
        await self.catalog.start()

    async def aclose(self) -> None:
        await self.catalog.aclose()
        await self.store.aclose()

    # ---- choices

    async def effective(self, guild_id: str | None, channel_id: str) -> Effective:
        """The model and persona in force: the channel's choice, else its server's, else the
        configured default. A stored choice naming something no longer configured is kept in
        the store (it applies again if it comes back) and the default is used."""
        chosen: dict[tuple[ScopeKind, ChoiceKey], str] = {
            (c.scope, c.key): c.value for c in await self.store.choices_for(guild_id, channel_id)}
        found: dict[ChoiceKey, tuple[str, str]] = {}
        lookups: tuple[tuple[ChoiceKey, Mapping[str, object]], ...] = (
            ("model", self.config.models), ("persona", self.config.personas))
        for key, known in lookups:
            found[key] = (DEFAULT, "default")
            scopes: tuple[tuple[ScopeKind, str], ...] = (("guild", "this server"),
                                                         ("channel", "this channel"))
            for scope, where in scopes:
                value = chosen.get((scope, key))
                if value is None:
                    continue
                if value in known:
                    found[key] = (value, where)
                elif (key, value) not in self._warned_choices:
                    self._warned_choices.add((key, value))
                    log.warning("%s %r chosen in %s is no longer configured; using the default",
                                key, value, where)
        return Effective(found["model"][0], found["model"][1], found["persona"][0],
                         found["persona"][1])

    async def choose(self, choice: Choice) -> None:
        """Store a choice (`DEFAULT` clears it). Raises `StoreError` when it was not saved."""
        if choice.value == DEFAULT:
            await self.store.clear_choice(choice.scope, choice.scope_id, choice.key)
        else:
            await self.store.set_choice(choice)

    # ---- one turn

    async def prepare(self, guild_id: str | None, channel_id: str,
                      bot_name: str) -> TurnSetup:
        config = self.config
        try:
            here = await self.effective(guild_id, channel_id)
            marker = await self.store.reset_marker(channel_id)
        except StoreError as exc:
            log.warning("settings store unreadable (%s); this reply uses the defaults", exc)
            here, marker = Effective(DEFAULT, "default", DEFAULT, "default"), None
        if marker is not None:
            self._resets[channel_id] = marker
        persona = config.personas.get(here.persona)
        template = persona.system_prompt if persona is not None else config.default_prompt()
        name = (persona.display_name if persona is not None else None) or bot_name
        prompt = render(template, self._clock().astimezone()).replace("{name}", name)
        return TurnSetup(attempts=list(config.models[here.model]), system_prompt=prompt,
                         tools=self.catalog.registry(), model=here.model, persona=here.persona,
                         display_name=persona.display_name if persona is not None else None)

    def forgotten(self, channel_id: str, message_id: int) -> bool:
        """A message from before the channel's last /reset: the model no longer sees it."""
        marker = self._resets.get(channel_id)
        return marker is not None and message_id < marker

    async def reset(self, channel_id: str, before_id: int) -> None:
        await self.store.set_reset_marker(channel_id, before_id)
        self._resets[channel_id] = max(before_id, self._resets.get(channel_id, 0))

    # ---- usage and quota

    async def over_quota(self, user_id: str) -> str | None:
        """The notice for a user over today's quota, the first time today; "" after that
        (answer nothing); None when they may go on."""
        limit = self.config.usage.daily_user_tokens
        if limit is None:
            return None
        day = utc_day(self._clock())
        try:
            spent = await self.store.user_tokens(day, user_id)
        except StoreError as exc:
            log.warning("quota not checked (%s)", exc)
            return None
        if spent < limit:
            return None
        if (day, user_id) in self._noticed:
            return ""
        self._noticed = {seen for seen in self._noticed if seen[0] == day}
        self._noticed.add((day, user_id))
        return quota_notice(limit)

    async def record(self, result: GenerationResult, *, user_id: str, channel_id: str,
                     guild_id: str | None) -> None:
        """Add a reply's reported tokens to today's counters (a failure is logged: usage is
        worth less than the reply that was given)."""
        if not self.config.usage.enabled:
            return
        day = utc_day(self._clock())
        for model, tokens in tokens_by_model(result).items():
            try:
                await self.store.add_usage(UsageRow(day, user_id, channel_id, guild_id, model,
                                                    tokens.input, tokens.output))
            except StoreError as exc:
                log.warning("usage of a reply in %s not recorded: %s", channel_id, exc)
                return

    def may_manage(self, user_id: int, role_ids: Sequence[int], *, in_guild: bool,
                   manage_guild: bool) -> bool:
        """Who may change settings and see usage: Manage Server, the configured roles and
        users; in a DM only the configured users."""
        manage = self.config.manage
        if user_id in manage.users:
            return True
        if not in_guild:
            return False
        return manage_guild or any(role in manage.roles for role in role_ids)
