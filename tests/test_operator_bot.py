"""The operator's controls on the running bot, started as production starts it (the sharded
client through the emulated gateway; messages, /kill, new roles and channels arrive as gateway
dispatches), the real engine, a scripted model, virtual time. Access lists (users, roles,
channels, DMs), who may /kill, the history the model sees (D4: never the messages queued
behind it; SPEC issue 15 item 7), graceful shutdown with turns running (S7, D3)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from gateway_support import SEND, Harness, bot_on_gateway

from discord_io.admission import AccessPolicy
from discord_io.history import HistoryPolicy
from discord_io.kill_command import install_kill_command

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

MANAGE_MESSAGES = 1 << 13


def _answers(*texts: str, stall: bool = False) -> list[list[dict[str, Any]]]:
    passes: list[list[dict[str, Any]]] = []
    for text in texts:
        end: dict[str, Any] = {"at": 3, "stall": True} if stall else {"at": 2, "end": "completed"}
        passes.append([{"at": 1, "text": text}, end])
    return passes


def _replies(h: Harness) -> list[str]:
    """What the bot posted in any channel, in order."""
    return [r.json["content"] for r in h.emu.requests_to(SEND, status=200)
            if isinstance(r.json, dict) and r.json.get("content")]


# ---- access lists -------------------------------------------------------------------------


async def test_blocked_users_and_roles_get_no_reply_and_allowed_ones_do() -> None:
    # covers O4: allow and deny lists of users and roles (deny wins)
    async with bot_on_gateway(_answers("hi member", "hi friend"), None) as h:
        member_role = await h.add_role("member")
        muted_role = await h.add_role("muted")
        bob, carol, dave = h.bob, h.user("carol"), h.user("dave")
        h.emu.member_roles[bob].append(member_role)
        h.emu.member_roles[carol].extend([member_role, muted_role])
        h.bot.policy = type(h.bot.policy)(access=AccessPolicy.of(
            allowed_roles=[member_role], blocked_roles=[muted_role], allowed_users=[dave]))
        await h.say("bob asks", author=bob)
        await h.idle()
        await h.say("carol asks", author=carol)  # has the allowed role and the blocked one
        await h.say("alice asks")  # neither listed nor holding the role
        await h.say("dave asks", author=dave)  # allowed by id
        await h.idle()
        assert h.provider.calls == 2
        assert _replies(h) == ["hi member", "hi friend"]


async def test_channel_lists_and_dms_off() -> None:
    # covers O4: allowed channels, blocked channels, DMs on or off
    async with bot_on_gateway(_answers("in general"), None) as h:
        other = await h.add_text_channel("random")
        dm = h.dm()
        h.bot.policy = type(h.bot.policy)(access=AccessPolicy.of(
            allowed_channels=[h.emu.channel_id], allow_dms=False))
        await h.say("here?", channel=other)
        await h.say("in a DM", channel=dm, mention=False)
        await h.say("and here?")
        await h.idle()
        assert h.provider.calls == 1 and _replies(h) == ["in general"]
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
    async with bot_on_gateway(stalled, None) as h:
        helper_role = await h.add_role("helpers")
        bob, mod, helper = h.bob, h.user("mod"), h.user("helper")
        h.emu.member_roles[helper].append(helper_role)
        h.bot.kill_permission = type(h.bot.kill_permission)(h.bot._requester,
                                                            roles={helper_role})
        h.bot.tree.remove_command("kill")
        install_kill_command(h.bot.tree, h.bot.locks, h.bot.queue, h.bot.kill_permission)
        await h.bot.tree.sync()
        channel = str(h.emu.channel_id)

        await h.say("story")
        await asyncio.sleep(2)
        refused = await h.kill_answer(user=bob)
        assert "Only the person" in refused and h.bot.queue.busy(channel)
        assert (await h.kill_answer(user=h.emu.alice_id)).startswith("Stopping")  # requester
        await h.idle()

        for killer, permissions in ((mod, MANAGE_MESSAGES), (helper, 0)):
            await h.say("another story")
            await asyncio.sleep(2)
            answer = await h.kill_answer(user=killer, permissions=permissions)
            assert answer.startswith("Stopping")
            await h.idle()
        assert [r.status for r in h.bot.results] == ["stopped_by_user"] * 3
        assert h.provider.calls == 3


async def test_a_dm_is_answered_and_kill_there_stops_its_reply() -> None:
    # covers D3 with O4 (DMs on by default): a DM reaches the bot without a mention, and /kill
    # in the DM (an interaction with a user, no guild) stops the reply
    async with bot_on_gateway(_answers("Once upon a time.\n\n", stall=True), None) as h:
        dm = h.dm()
        await h.say("tell me a story", channel=dm, mention=False)
        await h.queued(dm)
        await h.emu.wait_for(lambda r: r.route == SEND and r.params["channel_id"] == str(dm))
        assert (await h.kill_answer(dm)) == "Stopping the reply in this channel."
        shard_zero = h.emu.gateway.live_session(0)  # DMs' events go to shard 0
        assert shard_zero is not None
        [kill] = [e for _, name, e in shard_zero.events if name == "INTERACTION_CREATE"]
        assert "guild_id" not in kill and kill["user"]["id"] == str(h.emu.alice_id)
        assert kill["authorizing_integration_owners"] == {"0": "0"}  # the bot's DM
        await h.idle(dm)
        assert [r.status for r in h.bot.results] == ["stopped_by_user"]
        assert h.sent(dm) == ["Once upon a time."]


# ---- the history the model sees -----------------------------------------------------------


async def test_a_queued_turn_never_sees_the_messages_waiting_behind_it() -> None:
    # covers D4 (issue 15 item 7): turn 1 answers message 1 only; turn 2 sees turn 1's answer
    # and message 2, never message 3 still waiting
    passes = [[{"at": 1, "text": "answer one"}, {"at": 20, "end": "completed"}],
              [{"at": 1, "text": "answer two"}, {"at": 2, "end": "completed"}],
              [{"at": 1, "text": "answer three"}, {"at": 2, "end": "completed"}]]
    async with bot_on_gateway(passes, None) as h:
        h.bot.history = HistoryPolicy(max_messages=20)
        one = await h.say("question one")
        await asyncio.sleep(0.1)
        # The history read of turn 1 is in flight or done; messages 2 and 3 queue behind it.
        bob, carol = h.bob, h.user("carol")
        two = await h.say("question two", author=bob)
        three = await h.say("question three", author=carol)
        chatter = await h.say("unrelated chatter", author=bob, mention=False)
        await h.queued(h.emu.channel_id, count=3)
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
    async with bot_on_gateway(_answers("ok"), None) as h:
        h.bot.history = HistoryPolicy(max_messages=50, max_chars=300, max_message_chars=4000)
        old = [await h.say("x" * 100 + f" old {n}", mention=False) for n in range(5)]
        trigger = await h.say("y" * 250)
        await h.queued(h.emu.channel_id)
        await h.idle()
        seen = h.context_ids(0)
        assert seen[-1] == trigger["id"]
        assert old[0]["id"] not in seen and len(seen) <= 2
        total = sum(len(i.get("content", "")) for i in h.provider.requests[0].context_items)
        assert total <= 300 + 50  # the answered message is kept whatever it costs


async def test_reply_chain_mode_sees_only_the_chain() -> None:
    # covers O5: llmcord's reply chains
    async with bot_on_gateway(_answers("chain answer"), None) as h:
        h.bot.history = HistoryPolicy(mode="reply_chain", max_messages=10)
        root = await h.say("root question", mention=False)
        await h.say("noise in between", mention=False)
        middle = h.emu.add_message(h.emu.channel_id, h.emu.bot_id, "bot said this",
                                   reply_to=int(root["id"]))
        trigger = await h.say("and then?", reply_to=int(middle["id"]))
        await h.queued(h.emu.channel_id)
        await h.idle()
        items = [i for i in h.provider.requests[0].context_items if i.get("type") == "dialogue"]
        assert [i["message_id"] for i in items] == [root["id"], middle["id"], trigger["id"]]
        assert [i["role"] for i in items] == ["user", "assistant", "user"]


# ---- graceful shutdown --------------------------------------------------------------------


async def test_shutdown_stops_running_turns_keeping_their_text_and_journals(
        tmp_path: Path) -> None:
    # covers S7 and D3 at shutdown (O8): stop admitting, kill politely, flush
    stalled: list[list[dict[str, Any]]] = [
        [{"at": 1, "text": "Delivered before the stop.\n\n"}, {"at": 2, "text": "more"},
         {"at": 3, "stall": True}] for _ in range(3)]
    async with bot_on_gateway(stalled, tmp_path) as h:
        other = await h.add_text_channel("random")
        await h.say("story one")
        await h.say("story two", channel=other)
        await h.say("queued behind one", author=h.user("bob"))
        await h.queued(h.emu.channel_id, count=2)
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
        contents = _replies(h)
        assert contents.count("Delivered before the stop.") == 2
