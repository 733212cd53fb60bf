"""The bot's settings that apply from the next reply: built from `AppSettings` at start-up
(`build_bot`) and again on each reload (`reload.py`), then put on the bot in one step.

Everything is computed before anything is assigned, so a reload that fails half-way (a
persona file that has gone, a model that does not validate) changes nothing. What cannot
change while the bot runs is listed in `RESTART_ONLY`, each with the reason, which the docs
repeat (docs/discord.md, "Live reload").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from discord_io.admission import AccessPolicy, AdmissionPolicy
from discord_io.attachments import AttachmentPolicy, AttachmentReader
from discord_io.history import HistoryPolicy
from discord_io.media_fetch import MediaFetcher
from fsm import Attempt, Tool, TurnConfig

from .journals import JournalStore
from .operator_build import model_attempts, operator_config
from .operator_side import DEFAULT, OperatorConfig, OperatorSide
from .persona import Persona
from .settings import AppSettings, ConfigurationError, ToolSettings


class RunningBot(Protocol):
    """What `LiveSettings.apply` sets on the bot (`TurnBot` has all of it)."""

    config: TurnConfig
    attempts: list[Attempt]
    system_prompt: Any
    policy: AdmissionPolicy
    history: HistoryPolicy
    attachments: AttachmentReader | None
    kill_roles: set[int]
    queue: Any
    link_previews: bool
    journals: JournalStore | None
    operator: OperatorSide | None


RESTART_ONLY: dict[str, str] = {
    "discord_token": "the bot logs in to Discord with it once",
    "redis_url": "the shared queues, locks and settings store connect once, at start",
    "store": "the settings database is opened once, at start",
    "data_dir": "the settings database and the MCP logs are opened there at start",
    "tool_hooks": "Python modules are imported once",
    "telemetry": "the exporters and the metrics server start once",
    "log": "logging is set up once, at start",
    "gc": "the garbage collector is tuned once, at start",
    "shutdown_grace_s": "read when the bot starts waiting for signals",
    "event_loop": "the process's event loop is made once, at start",
}
"""Top-level settings a reload cannot apply, and why."""
ENGINE_RESTART_ONLY: dict[str, str] = {
    "stale_lock_age_s": "the channel locks are made once",
    "max_follow_up_interrupts": "the channel locks are made once",
    "stash_ttl_s": "the context stash is made once",
    "stash_max_items": "the context stash is made once",
    "stash_max_bytes": "the context stash is made once",
}


def access_policy(settings: AppSettings) -> AdmissionPolicy:
    access = settings.access
    return AdmissionPolicy(trigger_words=tuple(settings.trigger_words), access=AccessPolicy.of(
        allow_dms=access.allow_dms, allowed_users=access.allowed_users,
        blocked_users=access.blocked_users, allowed_roles=access.allowed_roles,
        blocked_roles=access.blocked_roles, allowed_channels=access.allowed_channels,
        blocked_channels=access.blocked_channels))


def history_policy(settings: AppSettings) -> HistoryPolicy:
    h = settings.history
    return HistoryPolicy(mode=h.mode, max_messages=h.max_messages, max_chars=h.max_chars,
                         max_message_chars=h.max_message_chars)


def attachment_reader(settings: AppSettings, fetcher: MediaFetcher) -> AttachmentReader:
    a = settings.attachments
    return AttachmentReader(fetcher, AttachmentPolicy(
        vision=a.vision, max_images=a.max_images, max_image_bytes=a.max_image_bytes,
        inline_text=a.inline_text, max_text_chars=a.max_text_chars))


def select_tools(all_tools: Sequence[Tool], tools: ToolSettings) -> list[Tool]:
    """The enrichment tools the operator left on; an unknown name in `allowed` is refused."""
    if not tools.enabled:
        return []
    if tools.allowed is None:
        return list(all_tools)
    names = {tool.name for tool in all_tools}
    unknown = sorted(set(tools.allowed) - names)
    if unknown:
        raise ConfigurationError([
            f"tools.allowed (TURN_TOOLS__ALLOWED): no tool named {', '.join(unknown)} "
            f"(the tools are {', '.join(sorted(names))})"])
    return [tool for tool in all_tools if tool.name in tools.allowed]


@dataclass(frozen=True)
class LiveSettings:
    """What the next reply runs with, all of it computed up front."""

    attempts: list[Attempt]
    config: TurnConfig
    persona: Persona
    policy: AdmissionPolicy
    history: HistoryPolicy
    attachments: AttachmentReader
    builtins: list[Tool]
    kill_roles: frozenset[int]
    queue_limit: int
    link_previews: bool
    journals: JournalStore
    operator: OperatorConfig | None

    @classmethod
    def build(cls, settings: AppSettings, session: aiohttp.ClientSession,
              fetcher: MediaFetcher, all_builtins: Sequence[Tool], *,
              with_operator: bool) -> LiveSettings:
        """Raises `ConfigurationError` (one line per problem) and builds nothing then."""
        persona = Persona(settings.system_prompt, settings.system_prompt_file)
        operator = operator_config(settings, session, persona) if with_operator else None
        attempts = (list(operator.models[DEFAULT]) if operator is not None
                    else model_attempts(settings, session).get(DEFAULT, []))
        return cls(attempts=attempts, config=settings.engine, persona=persona,
                   policy=access_policy(settings), history=history_policy(settings),
                   attachments=attachment_reader(settings, fetcher),
                   builtins=select_tools(all_builtins, settings.tools),
                   kill_roles=frozenset(settings.access.kill_roles),
                   queue_limit=settings.queue_limit, link_previews=settings.link_previews,
                   journals=JournalStore(settings.journals), operator=operator)

    def apply(self, bot: RunningBot) -> None:
        """Put it on the running bot: every reply that starts from now on uses it."""
        running = bot.config
        bot.config = self.config.model_copy(
            update={name: getattr(running, name) for name in ENGINE_RESTART_ONLY})
        bot.attempts = list(self.attempts)
        bot.system_prompt = self.persona.system_prompt
        bot.policy = self.policy
        bot.history = self.history
        bot.attachments = self.attachments
        bot.kill_roles.clear()
        bot.kill_roles.update(self.kill_roles)
        bot.queue.max_queued = self.queue_limit
        bot.link_previews = self.link_previews
        bot.journals = self.journals
        if bot.operator is not None and self.operator is not None:
            bot.operator.catalog.set_builtins(self.builtins)
            bot.operator.reconfigure(self.operator)
