"""Issue 12's lock findings: a /kill in a turn's tail must not leave a follow-up-interrupt
count for the next, unrelated turn (S17), and the stale-lock sweeper must not kill a slow
but healthy metadata reveal (R6 look-ups run under the watchdog like tools, S6). The bot is
started as production starts it (the sharded client through the emulated gateway, mentions as
MESSAGE_CREATE dispatches); virtual time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from gateway_support import bot_on_gateway

from discord_io.delivery import DiscordChannel
from discord_io.stale_sweeper import StaleLockSweeper
from fsm.engine.config import TurnConfig
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.stash import ContextStash
from fsm.engine.turn import Turn
from fsm.scenarios.format import HistoryMessage, parse_scenario
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider, ScriptedTools, history_items

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

MANAGE_MESSAGES = 1 << 13  # the requester's own right to /kill ends with the reply's text


async def test_a_kill_drops_the_count_carried_to_the_next_turn() -> None:
    # covers S17 (per-lock cap across queued turns, nothing inherited after /kill), D3
    locks = ChannelLockRegistry(max_follow_up_interrupts=1)
    first = locks.try_acquire("c", "a")
    assert first is not None
    first.follow_up_interrupts = 1
    locks.carry_follow_up_interrupts(first, queued_next=True)
    locks.release(first)
    queued = locks.try_acquire("c", "b")
    assert queued is not None and queued.follow_up_interrupts == 1  # the busy chain's cap
    locks.carry_follow_up_interrupts(queued, queued_next=True)
    assert locks.request_stop("c")  # /kill in the turn's tail, after the count was carried
    locks.release(queued)
    unrelated = locks.try_acquire("c", "c")
    assert unrelated is not None and unrelated.follow_up_interrupts == 0
    unrelated.follow_up_interrupts = 1
    locks.carry_follow_up_interrupts(unrelated, queued_next=False)  # the channel goes idle
    locks.release(unrelated)
    fresh = locks.try_acquire("c", "d")
    assert fresh is not None and fresh.follow_up_interrupts == 0


async def test_a_kill_in_a_turns_tail_leaves_no_interrupt_count_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # covers S17, D3: the second turn ends with a message queued behind it (its count is
    # carried); /kill arrives in its tail and clears the queue. The next, unrelated turn may
    # still be interrupted by a follow-up — before, it inherited the spent cap
    long_pass = [{"at": 1, "text": "thinking"}, {"at": 50, "end": "completed"}]
    short = [{"at": 1, "text": "ok"}, {"at": 2, "end": "completed"}]
    async with bot_on_gateway([long_pass, long_pass, long_pass, short], tmp_path,
                              config=TurnConfig(max_follow_up_interrupts=1)) as h:
        bot = h.bot
        channel_id = str(h.emu.channel_id)
        closing = DiscordChannel.aclose
        kills: list[str] = []

        async def kill_in_the_tail(self: DiscordChannel) -> None:
            if len(bot.results) == 2 and not kills:  # a moderator's /kill, via the gateway
                kills.append(await h.kill_answer(user=h.bob, permissions=MANAGE_MESSAGES))
            await closing(self)

        monkeypatch.setattr(DiscordChannel, "aclose", kill_in_the_tail)
        await h.mention("first")
        await asyncio.sleep(3)
        await h.mention("second")  # interrupts the first turn: the cap is spent
        await asyncio.sleep(3)
        await h.mention("third")  # queued behind the second turn
        await bot.queue.join(channel_id)
        assert kills == ["Stopping the reply in this channel. Dropped 1 queued message."]
        assert [r.status for r in bot.results] == ["follow_up_interrupt", "completed"]
        await h.mention("a new question")
        await asyncio.sleep(3)
        await h.mention("and a follow-up")
        await bot.queue.join(channel_id)
        assert [r.status for r in bot.results][2:] == ["follow_up_interrupt", "completed"]


async def test_the_requester_may_still_kill_in_their_turns_tail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # covers S16, D3, A7: while the reply's last send has its grace and the journal is
    # written, the turn still holds the channel, and the person who asked may still /kill
    # it without a moderator's rights; bob's question behind it is not theirs, and stays
    long_pass = [{"at": 1, "text": "thinking"}, {"at": 5, "end": "completed"}]
    async with bot_on_gateway([long_pass, long_pass], tmp_path) as h:
        closing = DiscordChannel.aclose
        kills: list[str] = []

        async def kill_in_the_tail(self: DiscordChannel) -> None:
            if not kills:  # alice asked: her own /kill, no permissions
                kills.append(await h.kill_answer())
            await closing(self)

        monkeypatch.setattr(DiscordChannel, "aclose", kill_in_the_tail)
        await h.mention("first")
        await h.mention("second", author=h.bob)
        await h.bot.queue.join(str(h.emu.channel_id))
        assert kills == ["Stopping the reply in this channel."]
        assert len(h.bot.results) == 2  # bob's question was answered after it


class _SlowReactors(InMemoryChannel):
    """Each reactor look-up takes 100 s of loop time: slow, but every one answers."""

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        await asyncio.sleep(100)
        return await super().fetch_reactors(message_id, emoji, limit)


async def test_the_sweeper_spares_a_slow_but_healthy_metadata_reveal() -> None:
    # covers R6, S6: 250 s of look-ups (inside the 300 s tool budget) outlast the 180 s stale
    # age; under the watchdog the lock is not released and the reveal completes
    scenario = parse_scenario({
        "passes": [[{"at": 1, "tool_call": {"name": "reveal_message_metadata"}}],
                   [{"at": 1, "text": "Bo and Cy reacted."}, {"at": 2, "end": "completed"}]],
        "tools": {"reveal_message_metadata": {"guard": "message_metadata", "outcomes": [
            {"success": True, "data": {"type": "context_restart_message_metadata"}}]}},
    })
    history = [HistoryMessage(id=f"m{n}", author="ana", content="hi",
                              reactions=[{"emoji": "👍", "users": ["bo", "cy"]}])
               for n in range(3)]
    locks = ChannelLockRegistry(stale_age_s=180)
    lock = locks.try_acquire("c", "reveal")
    assert lock is not None
    stash = ContextStash()
    tools = ScriptedTools(scenario.tools, stash, {})
    channel = _SlowReactors(history)
    turn = Turn(provider=ScriptedProvider(scenario.passes), channel=channel, locks=locks,
                lock=lock, request=TurnRequest(context_items=history_items(history)),
                tools=tools.registry, stash=stash, config=TurnConfig())
    async with StaleLockSweeper(locks, interval_s=30) as sweeper:
        result = await turn.run()
    assert result.status == "completed" and result.reactor_lookups == 3
    assert sweeper.released == 0 and not lock.released
    assert channel.reactor_lookups == 3


async def test_a_turn_released_as_stale_says_so() -> None:
    # covers S6, D4: a stale release stops the turn, and its result does not pass for a
    # user's /kill
    scenario = parse_scenario({"passes": [[{"at": 1, "text": "hm"}, {"at": 2, "stall": True}]]})
    locks = ChannelLockRegistry(stale_age_s=180)
    lock = locks.try_acquire("c", "hung")
    assert lock is not None
    turn = Turn(provider=ScriptedProvider(scenario.passes), channel=InMemoryChannel(),
                locks=locks, lock=lock, config=TurnConfig())
    running = asyncio.ensure_future(turn.run())
    await asyncio.sleep(5)
    assert lock.turn_kill is not None
    lock.turn_kill("stale_lock")
    result = await running
    assert result.status == "stopped_by_user"
    assert result.error == "the channel lock was released as stale"


class _CountingTurn(Turn):
    """Counts how often the lock's kill slots reach the turn."""

    stops = 0

    def request_stop(self, reason: str = "kill") -> None:
        self.stops += 1
        super().request_stop(reason)


@pytest.mark.parametrize("at", [0.5, 1.5, 3.0])
async def test_one_kill_calls_request_stop_once(at: float) -> None:
    # covers S7, S16: during a pass the lock holds the pass's kill handle and the turn's;
    # one /kill runs the turn's stop once (it ran twice: the two slots held one bound method
    # each and `is not` never matched them), whether in the first-token wait, mid-stream
    # or in a tool
    scenario = parse_scenario({
        "passes": [[{"at": 1, "text": "hm"}, {"at": 2, "tool_call": {"name": "t"}}]],
        "tools": {"t": [{"after": 5, "success": True, "data": {}}]}})
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "o")
    assert lock is not None
    stash = ContextStash()
    tools = ScriptedTools(scenario.tools, stash, {})
    turn = _CountingTurn(provider=ScriptedProvider(scenario.passes), channel=InMemoryChannel(),
                         locks=locks, lock=lock, tools=tools.registry, stash=stash)
    running = asyncio.ensure_future(turn.run())
    await asyncio.sleep(at)
    assert locks.request_stop("c")
    result = await running
    assert result.status == "stopped_by_user" and turn.stops == 1
