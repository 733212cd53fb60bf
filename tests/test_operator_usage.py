"""Usage, quotas, /help and /reset through the emulated gateway with a real SQLite store
(docs/spec.md M5, M8, M9): tokens per user, channel and server per day from the providers'
reported usage, /usage with cost for managers only, one polite notice a day past the quota,
/reset forgetting the channel's history before it (nothing deleted from Discord), /help
saying what the bot does here. Scripted models, virtual time."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from operator_support import MANAGE_GUILD, MANAGE_MESSAGES, answers, operator_bot, operator_discord

from turn_engine.operator_settings import ModelPrice, UsageSettings
from turn_engine.settings_store import utc_day

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


async def test_every_reply_is_counted_and_usage_shows_it_with_cost(tmp_path: Path) -> None:
    # covers M5: per user, channel, server and model per day; cost where priced
    usage = UsageSettings(prices={"scripted:default": ModelPrice(input=1.0, output=2.0)})
    async with operator_discord() as emu:
        other = emu.add_text_channel("random")
        async with operator_bot(emu, tmp_path / "s.sqlite3",
                                {"default": answers("a", "b", "c", usage=(1000, 200))},
                                usage=usage) as o:
            await o.h.say("one")
            await o.h.idle()
            await o.h.say("two", author=o.h.bob)
            await o.h.idle()
            await o.h.say("three", channel=other)
            await o.h.idle(other)
            rows = await o.side.store.usage(utc_day(), str(emu.guild_id))
            by_user = {(r.user_id, r.channel_id): (r.input_tokens, r.output_tokens, r.replies)
                       for r in rows}
            alice, channel = str(emu.alice_id), str(emu.channel_id)
            assert by_user == {(alice, channel): (1000, 200, 1),
                               (str(o.h.bob), channel): (1000, 200, 1),
                               (alice, str(other)): (1000, 200, 1)}
            refused = await o.command("usage", user=o.h.bob)
            assert refused.startswith("Only members with Manage Server")
            report = await o.command("usage", permissions=MANAGE_GUILD)
            lines = report.splitlines()
            assert lines[0] == (f"**Usage in this server on {utc_day()} (UTC)**: 3 replies, "
                                "3,000 tokens in, 600 out, 0.0042 USD.")
            assert lines[1] == f"Users: <@{alice}> 2,400, <@{o.h.bob}> 1,200"
            assert lines[3] == "Models: scripted:default 3,000/600 (0.0042 USD)"
            yesterday = utc_day(datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1))
            assert await o.command("usage", {"days_ago": 1}, permissions=MANAGE_GUILD) == (
                f"No usage recorded in this server on {yesterday} (UTC).")


async def test_a_user_past_the_daily_quota_gets_one_polite_notice(tmp_path: Path) -> None:
    # covers M5: the quota counts the user's reported tokens today; one notice, then silence
    usage = UsageSettings(daily_user_tokens=100)
    async with operator_discord() as emu, operator_bot(
            emu, tmp_path / "s.sqlite3", {"default": answers("a", "b", usage=(60, 50))},
            usage=usage) as o:
        await o.h.say("first")
        await o.h.idle()
        await o.h.say("second")
        await o.h.say("third")
        await o.h.say("bob is fine", author=o.h.bob)
        await o.h.idle()
        replies = o.bot_replies()
        assert replies[0] == "a"
        assert replies[1].startswith("You have used today's 100 tokens with me")
        assert replies[2:] == ["b"]
        assert o.providers["default"].calls == 2


async def test_reset_forgets_the_history_before_it_and_deletes_nothing(tmp_path: Path) -> None:
    # covers M8: the model no longer sees the channel's messages from before /reset
    async with operator_discord() as emu, operator_bot(
            emu, tmp_path / "s.sqlite3", {"default": answers("first", "second")}) as o:
        old = await o.h.say("remember the password is swordfish", mention=False)
        await o.h.say("what did I say?")
        await o.h.idle()
        assert old["id"] in o.h.context_ids(0)
        refused = await o.command("reset", user=o.h.bob)
        assert refused.startswith("Only members who can manage messages here")
        answer = await o.command("reset", permissions=MANAGE_MESSAGES)
        assert answer == ("From now on I do not see this channel's messages from before this "
                          "moment. Nothing was deleted from Discord.")
        new = await o.h.say("new topic")
        await o.h.idle()
        assert o.h.context_ids(1) == [new["id"]]
        assert not emu.requests_to("DELETE /channels/{channel_id}/messages/{message_id}")
        assert await o.side.store.reset_marker(str(emu.channel_id)) is not None


async def test_help_says_what_the_bot_does_here_and_who_may_do_what(tmp_path: Path) -> None:
    # covers M9: everyone may ask; the model and persona in force, the commands and rights
    async with operator_discord() as emu, operator_bot(
            emu, tmp_path / "s.sqlite3", {"default": answers()},
            usage=UsageSettings(daily_user_tokens=5000), trigger_words=["hey bot"]) as o:
        text = await o.command("help", user=o.h.bob)
        assert text.startswith("Mention me or reply to one of my messages, or write 'hey bot' "
                               "and I answer here")
        assert "I answer with the model **default** as the persona **default**." in text
        assert "Each person may use 5,000 tokens a day." in text
        for command in ("/kill", "/reset", "/model, /persona", "/settings", "/usage", "/help"):
            assert f"\n{command}:" in text
        assert len(text) <= 2000
