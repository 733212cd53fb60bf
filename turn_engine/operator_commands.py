"""The operator's slash commands: /model, /persona, /settings, /usage, /help, /reset.

Every answer is ephemeral (only the person who asked sees it) and goes out at once, inside
Discord's 3 s window: a store read or write is a local file or Redis round trip. Choosing a
model or persona, /usage and (with Manage Messages) /reset are for whoever may manage the bot
(`OperatorSide.may_manage`); /help and /settings are for everyone. A name that is not
configured, a choice the store could not save, a command where it cannot apply: each is one
clear line, and nothing changes (docs/spec.md M3-M6).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal

import discord
from discord import app_commands

from .operator_side import DEFAULT, OperatorSide
from .settings_store import Choice, ChoiceKey, StoreError, utc_day
from .usage import usage_report

log = logging.getLogger(__name__)

AUTOCOMPLETE_LIMIT = 25
"""Discord shows at most 25 choices."""
NOT_MANAGER = ("Only members with Manage Server (or the roles the bot's operator named) can "
               "do that.")
NOT_MANAGER_DM = "In direct messages only the bot's operators can do that."
Where = Literal["channel", "server"]


def _role_ids(user: discord.abc.User) -> list[int]:
    return [role.id for role in getattr(user, "roles", ())]


def may_manage(side: OperatorSide, interaction: discord.Interaction) -> bool:
    return side.may_manage(interaction.user.id, _role_ids(interaction.user),
                           in_guild=interaction.guild_id is not None,
                           manage_guild=interaction.permissions.manage_guild)


async def _say(interaction: discord.Interaction, text: str) -> None:
    await interaction.response.send_message(
        text[:2000], ephemeral=True, allowed_mentions=discord.AllowedMentions.none())


def _names(known: Sequence[str], current: str) -> list[app_commands.Choice[str]]:
    typed = current.lower()
    ranked = [n for n in known if n.lower().startswith(typed)]
    ranked += [n for n in known if typed in n.lower() and n not in ranked]
    return [app_commands.Choice(name=n, value=n) for n in ranked[:AUTOCOMPLETE_LIMIT]]


def install_operator_commands(tree: app_commands.CommandTree[Any], side: OperatorSide, *,
                              trigger_words: Callable[[], Sequence[str]] = tuple) -> None:
    """Add the commands to `tree` (sync the tree afterwards to register them)."""

    async def choose(interaction: discord.Interaction, key: ChoiceKey, name: str,
                     where: Where, known: Sequence[str]) -> None:
        if interaction.channel_id is None:
            await _say(interaction, "There is no channel to choose for.")
            return
        if not may_manage(side, interaction):
            await _say(interaction, NOT_MANAGER if interaction.guild_id else NOT_MANAGER_DM)
            return
        if name not in known:
            await _say(interaction, f"No {key} named {name[:64]!r} is configured; the "
                                    f"{key}s are: {', '.join(known)}.")
            return
        guild = str(interaction.guild_id) if interaction.guild_id is not None else None
        if where == "server" and guild is None:
            await _say(interaction, "A direct message has no server; choose for the channel.")
            return
        scope_id = guild if where == "server" and guild else str(interaction.channel_id)
        try:
            await side.choose(Choice("guild" if where == "server" else "channel", scope_id,
                                     key, name, guild))
        except StoreError as exc:
            log.warning("/%s %s in %s not saved: %s", key, name, scope_id, exc)
            await _say(interaction, f"That could not be saved ({exc}); nothing changed.")
            return
        log.info("/%s %s for %s %s by %s", key, name, where, scope_id, interaction.user.id)
        target = "this server" if where == "server" else "this channel"
        if name == DEFAULT:
            await _say(interaction, f"{target.capitalize()} uses the default {key} again "
                                    "from the next reply.")
        else:
            await _say(interaction, f"{target.capitalize()} uses the {key} {name} from the "
                                    "next reply.")
        if key == "persona" and where == "server":
            await _apply_identity(interaction, side, name)

    def choice_command(key: ChoiceKey, description: str,
                       known: Callable[[], list[str]]) -> app_commands.Command[Any, ..., None]:
        """/model or /persona: a name (autocompleted from `known`) and where it applies."""

        @app_commands.command(name=key, description=description)
        @app_commands.describe(name=f"a configured {key}, or 'default'",
                               where="this channel (the default) or the whole server")
        async def command(interaction: discord.Interaction, name: str,
                          where: Where = "channel") -> None:
            await choose(interaction, key, name, where, known())

        @command.autocomplete("name")
        async def names(interaction: discord.Interaction,
                        current: str) -> list[app_commands.Choice[str]]:
            return _names(known(), current)

        return command

    model = choice_command("model", "Choose the model the bot answers with in this channel "
                                    "or server.", lambda: list(side.config.models))
    persona = choice_command("persona", "Choose the bot's persona in this channel or server.",
                             lambda: [DEFAULT, *side.config.personas])

    @app_commands.command(name="settings", description="What model and persona apply here, "
                                                       "and where they were chosen.")
    async def settings(interaction: discord.Interaction) -> None:
        if interaction.channel_id is None:
            await _say(interaction, "There is no channel here.")
            return
        await _say(interaction, await settings_text(side, interaction))

    @app_commands.command(name="usage", description="Tokens (and cost) the bot used in this "
                                                    "server on a day.")
    @app_commands.describe(days_ago="0 for today (UTC), 1 for yesterday, ...")
    async def usage(interaction: discord.Interaction,
                    days_ago: app_commands.Range[int, 0, 400] = 0) -> None:
        if not may_manage(side, interaction):
            await _say(interaction, NOT_MANAGER if interaction.guild_id else NOT_MANAGER_DM)
            return
        day = utc_day(datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=days_ago))
        guild = str(interaction.guild_id) if interaction.guild_id is not None else None
        try:
            rows = await side.store.usage(day, guild)
        except StoreError as exc:
            await _say(interaction, f"Usage cannot be read now ({exc}).")
            return
        if guild is None:  # a DM: the operator's own conversation only
            rows = [r for r in rows if r.channel_id == str(interaction.channel_id)]
        prices = side.config.usage
        await _say(interaction, usage_report(rows, prices.prices, prices.currency, day=day,
                                             where="in this server" if guild else "here"))

    @app_commands.command(name="reset", description="Make the bot forget this channel's "
                                                    "history before now (nothing is deleted).")
    async def reset(interaction: discord.Interaction) -> None:
        if interaction.channel_id is None:
            await _say(interaction, "There is no channel here.")
            return
        allowed = (interaction.guild_id is None or interaction.permissions.manage_messages
                   or may_manage(side, interaction))
        if not allowed:
            await _say(interaction, "Only members who can manage messages here (or the bot's "
                                    "managers) can reset its memory of this channel.")
            return
        try:
            await side.reset(str(interaction.channel_id), interaction.id)
        except StoreError as exc:
            await _say(interaction, f"That could not be saved ({exc}); nothing changed.")
            return
        log.info("/reset in %s by %s", interaction.channel_id, interaction.user.id)
        await _say(interaction, "From now on I do not see this channel's messages from before "
                                "this moment. Nothing was deleted from Discord.")

    @app_commands.command(name="help", description="What the bot does here and who may do what.")
    async def help_(interaction: discord.Interaction) -> None:
        await _say(interaction, await help_text(side, interaction, trigger_words()))

    commands: list[app_commands.Command[Any, ..., None]] = [model, persona, settings, usage,
                                                            reset, help_]
    for command in commands:
        tree.add_command(command)


async def _apply_identity(interaction: discord.Interaction, side: OperatorSide,
                          name: str) -> None:
    """A persona chosen for a whole server also gives the bot its name and avatar there
    (a server nickname and server avatar; Discord has no per-channel identity)."""
    guild = interaction.guild
    if guild is None:
        return
    persona = side.config.personas.get(name)
    nick = persona.display_name if persona is not None else None
    avatar = persona.avatar if persona is not None else None
    try:
        await guild.me.edit(nick=nick, avatar=avatar)
    except ValueError:
        log.warning("persona %s: its avatar is not an image Discord takes", name)
    except discord.HTTPException as exc:
        log.warning("persona %s: the bot's name or avatar in %s not changed (HTTP %s)",
                    name, guild.id, exc.status)
        await interaction.followup.send(
            "The persona applies, but Discord refused to change my name or avatar in this "
            f"server (HTTP {exc.status}; my role needs Change Nickname).", ephemeral=True)


async def settings_text(side: OperatorSide, interaction: discord.Interaction) -> str:
    guild = str(interaction.guild_id) if interaction.guild_id is not None else None
    channel = str(interaction.channel_id)
    try:
        here = await side.effective(guild, channel)
        everywhere = await side.store.choices_in(guild) if guild is not None else []
    except StoreError as exc:
        return f"The settings cannot be read now ({exc})."
    lines = [f"**Here**: model {here.model} ({here.model_from}), persona {here.persona} "
             f"({here.persona_from})."]
    if guild is not None:
        server = [c for c in everywhere if c.scope == "guild"]
        channels = [c for c in everywhere if c.scope == "channel"]
        lines.append("**This server**: " + (", ".join(f"{c.key} {c.value}" for c in server)
                                            or "the defaults") + ".")
        if channels:
            lines.append("**Channels**: " + "; ".join(
                f"<#{c.scope_id}> {c.key} {c.value}" for c in channels) + ".")
    lines.append(f"Models: {', '.join(side.config.models)}. Personas: "
                 f"{', '.join([DEFAULT, *side.config.personas])}.")
    return "\n".join(lines)


async def help_text(side: OperatorSide, interaction: discord.Interaction,
                    trigger_words: Sequence[str]) -> str:
    guild = str(interaction.guild_id) if interaction.guild_id is not None else None
    try:
        here = await side.effective(guild, str(interaction.channel_id))
        in_force = f"I answer with the model **{here.model}** as the persona **{here.persona}**."
    except StoreError:
        in_force = ""
    words = f", or write {', '.join(repr(w) for w in trigger_words)}" if trigger_words else ""
    tools = side.catalog.registry().names()
    tool_line = f"Tools I may use: {', '.join(tools)}." if tools else "I use no tools here."
    if len(tool_line) > 400:
        tool_line = tool_line[:397] + "..."
    quota = side.config.usage.daily_user_tokens
    lines = [
        f"Mention me or reply to one of my messages{words} and I answer here; one reply at a "
        "time per channel, later messages wait their turn.",
        in_force, tool_line,
        f"Each person may use {quota:,} tokens a day." if quota else "",
        "**Commands**",
        "/kill: stop my reply here (the person it answers, members with Manage Messages, the "
        "operator's roles)",
        "/reset: forget this channel's history before now; nothing is deleted (members with "
        "Manage Messages, managers)",
        "/model, /persona: choose for this channel or server (members with Manage Server, "
        "the operator's roles)",
        "/settings: what applies where (everyone)",
        "/usage: tokens and cost per day (managers)",
        "/help: this (everyone)",
    ]
    return "\n".join(line for line in lines if line)
