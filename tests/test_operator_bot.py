"""The operator's controls on the running bot: real discord.py against the Discord emulator,
the real engine, a scripted model, virtual time. Access lists (users, roles, channels, DMs),
who may /kill, the history the model sees (D4: never the messages queued behind it; SPEC
issue 15 item 7), graceful shutdown with turns running (S7, D3)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import discord
import pytest

from discord_io.admission import AccessPolicy
from discord_io.history import HistoryPolicy
from discord_io.kill_command import install_kill_command
from discord_io.testing import DiscordEmulator, emulated_discord
from fsm.engine.generation import Attempt
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import ScriptedProvider
from turn_engine.bot import TurnBot

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

SEND = "POST /channels/{channel_id}/messages"
CALLBACK = "POST /interactions/{interaction_id}/{token}/callback"
MANAGE_MESSAGES = 1 << 13


@dataclass
class Harness:
    emu: DiscordEmulator
    client: discord.Client
    bot: TurnBot
    provider: ScriptedProvider

    async def say(self, text: str, *, author: int | None = None, channel: int | None = None,
                  mention: bool = True, reply_to: int | None = None,
                  attachments: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
        """A user posts; the gateway delivers it with the author's member object."""
        author = author if author is not None else self.emu.alice_id
        channel = channel if channel is not None else self.emu.channel_id
        content = f"<@{self.emu.bot_id}> {text}" if mention else text
        payload = self.emu.add_message(channel, author, content,
                                       mentions=[self.emu.bot_id] if mention else [],
                                       reply_to=reply_to, attachments=attachments)
        event = dict(payload)
        if "guild_id" in payload:
            event["member"] = self.emu.member_payload(author)
        self.client._connection.parse_message_create(event)  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        return payload

    def user(self, name: str) -> int:
        return int(self.emu.add_user(name)["id"])

    def sent(self) -> list[str]:
        return [r.json["content"] for r in self.emu.requests_to(SEND, status=200)
                if isinstance(r.json, dict) and r.json.get("content")]

    async def kill(self, user_id: int, *, permissions: int = 0) -> str:
        before = len(self.emu.requests_to(CALLBACK))
        self.client._connection.parse_interaction_create(  # type: ignore[arg-type]
            self.emu.slash_command_payload("kill", user_id=user_id, permissions=permissions))
        answers = await self.emu.wait_for(lambda r: r.route == CALLBACK, count=before + 1)
        return str(answers[-1].json["data"]["content"])

    async def idle(self, channel: int | None = None) -> None:
        await self.bot.queue.join(str(channel if channel is not None else self.emu.channel_id))

    def context_ids(self, request_index: int) -> list[str]:
        return [item["message_id"] for item in self.provider.requests[request_index].context_items
                if item.get("type") == "dialogue"]


def _answers(*texts: str, stall: bool = False) -> list[list[dict[str, Any]]]:
    passes: list[list[dict[str, Any]]] = []
    for text in texts:
        end: dict[str, Any] = {"at": 3, "stall": True} if stall else {"at": 2, "end": "completed"}
        passes.append([{"at": 1, "text": text}, end])
    return passes


@asynccontextmanager
async def harness(passes: list[list[dict[str, Any]]], tmp_path: Path | None = None,
                  **options: Any) -> AsyncIterator[Harness]:
    async with emulated_discord() as (emu, client):
        client._connection._add_guild_from_data(emu.guild_payload())  # type: ignore[arg-type]
        provider = ScriptedProvider(parse_scenario({"passes": passes}).passes)
        bot = TurnBot(client, [Attempt(provider, "scripted")], journal_dir=tmp_path, **options)
        bot.attach()
        await bot.start()
        try:
            yield Harness(emu, client, bot, provider)
        finally:
            await bot.aclose()


# ---- access lists -------------------------------------------------------------------------


async def test_blocked_users_and_roles_get_no_reply_and_allowed_ones_do() -> None:
    # covers O4: allow and deny lists of users and roles (deny wins)
    async with harness(_answers("hi member", "hi friend")) as h:
        member_role = h.emu.add_role("member")
        muted_role = h.emu.add_role("muted")
        bob, carol, dave = h.user("bob"), h.user("carol"), h.user("dave")
        h.emu.member_roles[bob].append(member_role)
        h.emu.member_roles[carol].extend([member_role, muted_role])
        h.client._connection._add_guild_from_data(h.emu.guild_payload())  # type: ignore[arg-type]
        h.bot.policy = type(h.bot.policy)(access=AccessPolicy.of(
            allowed_roles=[member_role], blocked_roles=[muted_role], allowed_users=[dave]))
        await h.say("bob asks", author=bob)
        await h.idle()
        await h.say("carol asks", author=carol)  # has the allowed role and the blocked one
        await h.say("alice asks")  # neither listed nor holding the role
        await h.say("dave asks", author=dave)  # allowed by id
        await h.idle()
        assert h.provider.calls == 2
        assert h.sent() == ["hi member", "hi friend"]


async def test_channel_lists_and_dms_off() -> None:
    # covers O4: allowed channels, blocked channels, DMs on or off
    async with harness(_answers("in general")) as h:
        other = h.emu.add_text_channel("random")
        h.client._connection._add_guild_from_data(h.emu.guild_payload())  # type: ignore[arg-type]
        dm = h.emu.add_dm_channel(h.emu.alice_id)
        h.bot.policy = type(h.bot.policy)(access=AccessPolicy.of(
            allowed_channels=[h.emu.channel_id], allow_dms=False))
        await h.say("here?", channel=other)
        await h.say("in a DM", channel=dm, mention=False)
        await h.say("and here?")
        await h.idle()
        assert h.provider.calls == 1 and h.sent() == ["in general"]
        h.bot.policy = type(h.bot.policy)(access=AccessPolicy.of(
            blocked_channels=[h.emu.channel_id]))
        await h.say("blocked now")
        await h.idle()
        assert h.provider.calls == 1


# ---- /kill permissions --------------------------------------------------------------------


async def test_only_the_requester_moderators_and_kill_roles_may_kill() -> None:
    # covers D3 with O4: /kill is not for everyone
    stalled = _answers("Once upon a time.\n\n", "Again.\n\n", "Third.\n\n", "Fourth.\n\n",
                       stall=True)
    async with harness(stalled) as h:
        helper_role = h.emu.add_role("helpers")
        bob, mod, helper = h.user("bob"), h.user("mod"), h.user("helper")
        h.emu.member_roles[helper].append(helper_role)
        h.client._connection._add_guild_from_data(h.emu.guild_payload())  # type: ignore[arg-type]
        h.bot.kill_permission = type(h.bot.kill_permission)(h.bot._requester,
                                                            roles={helper_role})
        h.bot.tree.remove_command("kill")
        install_kill_command(h.bot.tree, h.bot.locks, h.bot.queue, h.bot.kill_permission)
        await h.bot.tree.sync()
        channel = str(h.emu.channel_id)

        await h.say("story")
        await asyncio.sleep(2)
        refused = await h.kill(bob)
        assert "Only the person" in refused and h.bot.queue.busy(channel)
        assert (await h.kill(h.emu.alice_id)).startswith("Stopping")  # the requester
        await h.idle()

        for killer, permissions in ((mod, MANAGE_MESSAGES), (helper, 0)):
            await h.say("another story")
            await asyncio.sleep(2)
            assert (await h.kill(killer, permissions=permissions)).startswith("Stopping")
            await h.idle()
        assert [r.status for r in h.bot.results] == ["stopped_by_user"] * 3
        assert h.provider.calls == 3


# ---- the history the model sees -----------------------------------------------------------


async def test_a_queued_turn_never_sees_the_messages_waiting_behind_it() -> None:
    # covers D4 (issue 15 item 7): turn 1 answers message 1 only; turn 2 sees turn 1's answer
    # and message 2, never message 3 still waiting
    passes = [[{"at": 1, "text": "answer one"}, {"at": 20, "end": "completed"}],
              [{"at": 1, "text": "answer two"}, {"at": 2, "end": "completed"}],
              [{"at": 1, "text": "answer three"}, {"at": 2, "end": "completed"}]]
    async with harness(passes) as h:
        h.bot.history = HistoryPolicy(max_messages=20)
        one = await h.say("question one")
        await asyncio.sleep(0.1)
        # The history read of turn 1 is in flight or done; messages 2 and 3 queue behind it.
        bob, carol = h.user("bob"), h.user("carol")
        two = await h.say("question two", author=bob)
        three = await h.say("question three", author=carol)
        chatter = await h.say("unrelated chatter", author=bob, mention=False)
        await h.idle()
        first, second, third = (h.context_ids(i) for i in range(3))
        assert one["id"] in first and two["id"] not in first and three["id"] not in first
        assert two["id"] in second and three["id"] not in second
        assert chatter["id"] in second  # not addressed to the bot: context, not a turn
        bot_replies = [m["id"] for m in h.emu.channel_messages()
                       if m["author"]["id"] == str(h.emu.bot_id)]
        assert bot_replies[0] in second  # the answer to message 1
        roles = {item["message_id"]: item["role"]
                 for item in h.provider.requests[1].context_items}
        assert roles[bot_replies[0]] == "assistant" and roles[two["id"]] == "user"
        assert three["id"] in third


async def test_history_fits_its_character_budget_keeping_the_answered_message() -> None:
    # covers O5: a size budget, oldest dropped first
    async with harness(_answers("ok")) as h:
        h.bot.history = HistoryPolicy(max_messages=50, max_chars=300, max_message_chars=4000)
        old = [await h.say("x" * 100 + f" old {n}", mention=False) for n in range(5)]
        trigger = await h.say("y" * 250)
        await h.idle()
        seen = h.context_ids(0)
        assert seen[-1] == trigger["id"]
        assert old[0]["id"] not in seen and len(seen) <= 2
        total = sum(len(i.get("content", "")) for i in h.provider.requests[0].context_items)
        assert total <= 300 + 50  # the answered message is kept whatever it costs


async def test_reply_chain_mode_sees_only_the_chain() -> None:
    # covers O5: llmcord's reply chains
    async with harness(_answers("chain answer")) as h:
        h.bot.history = HistoryPolicy(mode="reply_chain", max_messages=10)
        root = await h.say("root question", mention=False)
        await h.say("noise in between", mention=False)
        middle = h.emu.add_message(h.emu.channel_id, h.emu.bot_id, "bot said this",
                                   reply_to=int(root["id"]))
        trigger = await h.say("and then?", reply_to=int(middle["id"]))
        await h.idle()
        items = [i for i in h.provider.requests[0].context_items if i.get("type") == "dialogue"]
        assert [i["message_id"] for i in items] == [root["id"], middle["id"], trigger["id"]]
        assert [i["role"] for i in items] == ["user", "assistant", "user"]


# ---- graceful shutdown --------------------------------------------------------------------


async def test_shutdown_stops_running_turns_keeping_their_text_and_journals(
        tmp_path: Path) -> None:
    # covers S7 and D3 at shutdown (O8): stop admitting, kill politely, flush
    stalled = [[{"at": 1, "text": "Delivered before the stop.\n\n"}, {"at": 2, "text": "more"},
                {"at": 3, "stall": True}] for _ in range(3)]
    async with harness(stalled, tmp_path) as h:
        other = h.emu.add_text_channel("random")
        h.client._connection._add_guild_from_data(h.emu.guild_payload())  # type: ignore[arg-type]
        await h.say("story one")
        await h.say("story two", channel=other)
        await h.say("queued behind one", author=h.user("bob"))
        await asyncio.sleep(9)  # the idle flush has sent the first paragraph of both
        await h.bot.shutdown(grace_s=10)
        await h.say("after the stop")
        assert [r.status for r in h.bot.results] == ["stopped_by_user"] * 2
        assert all("Delivered before the stop." in r.delivered_text for r in h.bot.results)
        assert h.provider.calls == 2 and len(h.bot.locks) == 0
        journals = sorted(tmp_path.glob("*.json"))
        assert len(journals) == 2
        for path in journals:
            assert json.loads(path.read_text())["result"]["status"] == "stopped_by_user"
        contents = h.sent()
        assert contents.count("Delivered before the stop.") == 2
