"""/model, /persona and /settings through the emulated gateway, with a real SQLite store:
autocomplete of the configured names, who may choose, a choice per channel or per server
that applies from the next reply and survives a restart of the bot, a persona's name and
avatar on the server, and the one clear line for a name that is not configured
(docs/spec.md M3, M4, M6). Scripted models, virtual time."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
from operator_support import (
    DEFAULT_PROMPT,
    MANAGE_GUILD,
    answers,
    operator_bot,
    operator_discord,
)
from PIL import Image

from discord_io.testing.permissions import CHANGE_NICKNAME, DEFAULT_EVERYONE
from turn_engine.operator_settings import ManageSettings
from turn_engine.persona_library import NamedPersona

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]



def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(out, format="PNG")
    return out.getvalue()


PIRATE = NamedPersona("pirate", "You are a pirate called {name}. Today is {date}.",
                      display_name="Captain", avatar=_png())
MODELS = {"default": answers("from default", "default again", "default third"),
          "smart": answers("from smart", "smart again", "smart third")}


async def test_model_autocomplete_offers_the_configured_models(tmp_path: Path) -> None:
    # covers M3: autocomplete lists the configured models, filtered by what was typed
    async with operator_discord() as emu, operator_bot(
            emu, tmp_path / "s.sqlite3", {**MODELS, "small-local": answers()}) as o:
        assert await o.autocomplete("model", "name", "") == ["default", "smart", "small-local"]
        assert await o.autocomplete("model", "name", "sm") == ["smart", "small-local"]
        assert await o.autocomplete("model", "name", "LOC") == ["small-local"]
        assert await o.autocomplete("persona", "name", "") == ["default"]


async def test_a_channel_choice_applies_to_the_next_reply_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    # covers M3, M6: /model in one channel; the other keeps the default; a new bot process
    # on the same store file answers that channel with the chosen model
    store = tmp_path / "s.sqlite3"
    async with operator_discord() as emu:
        other = emu.add_text_channel("random")
        async with operator_bot(emu, store, MODELS) as o:
            answer = await o.command("model", {"name": "smart"}, permissions=MANAGE_GUILD)
            assert answer == "This channel uses the model smart from the next reply."
            await o.h.say("hello")
            await o.h.idle()
            await o.h.say("and here?", channel=other)
            await o.h.idle(other)
            assert o.bot_replies() == ["from smart", "from default"]
        async with operator_bot(emu, store, MODELS) as again:
            await again.h.say("still smart?")
            await again.h.idle()
            assert again.providers["smart"].calls == 1
            assert again.providers["default"].calls == 0
            settings = await again.command("settings")
            assert "**Here**: model smart (this channel), persona default (default)." in settings


async def test_a_server_choice_applies_everywhere_and_a_channel_choice_wins(
    tmp_path: Path,
) -> None:
    # covers M3: server scope, channel scope over it, 'default' clears a choice
    async with operator_discord() as emu:
        other = emu.add_text_channel("random")
        async with operator_bot(emu, tmp_path / "s.sqlite3", MODELS) as o:
            await o.command("model", {"name": "smart", "where": "server"},
                            permissions=MANAGE_GUILD)
            await o.command("model", {"name": "default"}, permissions=MANAGE_GUILD,
                            channel=other)
            await o.h.say("server choice")
            await o.h.idle()
            assert o.providers["smart"].calls == 1
            # 'default' on a channel without a channel choice clears nothing: the server's holds
            await o.h.say("other channel", channel=other)
            await o.h.idle(other)
            assert o.providers["smart"].calls == 2
            text = await o.command("settings")
            assert "**This server**: model smart." in text
            await o.command("model", {"name": "default", "where": "server"},
                            permissions=MANAGE_GUILD)
            await o.h.say("back to default")
            await o.h.idle()
            assert o.providers["default"].calls == 1


async def test_only_managers_may_choose(tmp_path: Path) -> None:
    # covers M3: Manage Server or a configured role; anyone else is refused, nothing changes
    async with operator_discord() as emu, operator_bot(
            emu, tmp_path / "s.sqlite3", MODELS) as o:
        role = await o.h.add_role("bot-admins")
        o.side.config = dataclasses.replace(o.side.config, manage=ManageSettings(roles=[role]))
        refused = await o.command("model", {"name": "smart"}, user=o.h.bob)
        assert refused.startswith("Only members with Manage Server")
        await o.h.say("unchanged", author=o.h.bob)
        await o.h.idle()
        assert o.bot_replies() == ["from default"]
        emu.member_roles[o.h.bob].append(role)
        allowed = await o.command("model", {"name": "smart"}, user=o.h.bob)
        assert allowed == "This channel uses the model smart from the next reply."


async def test_an_unconfigured_model_is_one_clear_line_and_nothing_changes(
    tmp_path: Path,
) -> None:
    # covers M3: /model naming a model the operator did not configure
    async with operator_discord() as emu, operator_bot(
            emu, tmp_path / "s.sqlite3", MODELS) as o:
        answer = await o.command("model", {"name": "gpt-9"}, permissions=MANAGE_GUILD)
        assert answer == ("No model named 'gpt-9' is configured; the models are: default, "
                          "smart.")
        assert await o.side.store.choices_in(str(emu.guild_id)) == []
        await o.h.say("hi")
        await o.h.idle()
        assert o.bot_replies() == ["from default"]


async def test_a_persona_for_the_server_sets_the_prompt_name_and_avatar(tmp_path: Path) -> None:
    # covers M4: the persona's prompt (with {name}) from the next reply; its name and avatar
    # become the bot's nickname and server avatar (Modify Current Member)
    async with operator_discord() as emu, operator_bot(
            emu, tmp_path / "s.sqlite3", MODELS, personas={"pirate": PIRATE}) as o:
        assert await o.autocomplete("persona", "name", "p") == ["pirate"]
        await o.h.say("before")
        await o.h.idle()
        answer = await o.command("persona", {"name": "pirate", "where": "server"},
                                 permissions=MANAGE_GUILD)
        assert answer == "This server uses the persona pirate from the next reply."
        own = emu.user_routes.own_member
        await o.h.until(lambda: own.get(emu.guild_id, {}).get("nick") == "Captain")
        assert own[emu.guild_id]["avatar_data"].startswith("data:image/png;base64,")
        await o.h.say("after")
        await o.h.idle()
        first, second = o.providers["default"].requests
        assert first.system_prompt.startswith(DEFAULT_PROMPT + "\n")  # then the framing (A)
        assert second.system_prompt.startswith("You are a pirate called Captain. Today is ")
        await o.command("persona", {"name": "default", "where": "server"},
                        permissions=MANAGE_GUILD)
        await o.h.until(lambda: own[emu.guild_id]["nick"] is None)
        assert own[emu.guild_id]["avatar"] is None


async def test_a_nickname_discord_refuses_is_said_and_the_persona_still_applies(
    tmp_path: Path,
) -> None:
    # covers M4: without Change Nickname (Modify Current Member answers 403 50013) the
    # chooser is told in a private follow-up; the persona's prompt applies all the same
    async with operator_discord() as emu, operator_bot(
            emu, tmp_path / "s.sqlite3", MODELS, personas={"pirate": PIRATE}) as o:
        emu.set_role_permissions(emu.guild_id, DEFAULT_EVERYONE & ~CHANGE_NICKNAME)
        answer = await o.command("persona", {"name": "pirate", "where": "server"},
                                 permissions=MANAGE_GUILD)
        assert answer == "This server uses the persona pirate from the next reply."
        [follow_up] = await emu.wait_for(
            lambda r: r.route == "POST /webhooks/{application_id}/{token}", timeout=30)
        assert follow_up.json["content"] == (
            "The persona applies, but Discord refused to change my name or avatar in this "
            "server (HTTP 403; my role needs Change Nickname).")
        assert follow_up.json["flags"] & 64
        assert emu.user_routes.own_member.get(emu.guild_id, {}).get("nick") is None
        await o.h.say("after")
        await o.h.idle()
        assert o.providers["default"].requests[0].system_prompt.startswith(
            "You are a pirate called Captain.")
