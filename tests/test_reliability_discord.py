"""The Discord layer under faults and load: the bot (`turn_engine.bot.TurnBot`) with real discord.py
against the Discord REST emulator on loopback, the real engine and the engine's scripted
provider, in virtual time. Faults are Discord's own answers: 429 storms (per route and
global), 5xx on sends, failing deletes, a failing typing endpoint; the load cell runs many
channels at once with queued turns, random /kill and follow-ups, stalls that fire the
timers and an abandoned lock for the stale sweeper, with two /kill cells beside it.

The cells found three defects in `discord_io/` and `turn_engine/`, fixed there, each with its
regression cell here: a request cancelled while discord.py sleeps off a global 429 wedged
the client for good (`discord_io/rate_limits.py`); the idle flush livelocked on a deadline
off the clock's grid (`DiscordChannel._idle_flush`); /kill during the bot's history read
was not honoured until the read returned (`TurnBot._read_history`). Three engine defects
they found (B16 and B19 in RELIABILITY.md: unsent text glued to a fallback's answer and a
send landing within the settle wait missing from the continuation; a finished reply timed
out while Discord rate-limited its flush) are fixed; their cells here keep them fixed.

After every cell the harness checks what a user and an operator would: each turn ended in
exactly one terminal state; the delivered text is what Discord really received (the
`DiscordChannel`'s record against the emulator's messages); no lock held, no queue left,
every typing indicator stopped and no typing post outside a running turn; no task left but
the bot's sweeper and the emulator's own (and none at all once both are closed).

Users' messages and /kill are handed to discord.py's own parser (`client._connection.parse_*`)
instead of going through the emulated gateway, on purpose: the cells place faults and kills
at exact instants of virtual time and note the bot's state at the instant of each /kill, and
a websocket hop would put socket waits between that instant and the handling. The gateway
path, the bot started with `client.start()`, is covered end to end by test_bot.py,
test_discord_gateway*.py, test_discord_kill.py and the operator, vision, lock-parity and
telemetry tests.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import discord
import pytest

from discord_io.channel_queue import QUEUE_FULL_TEXT, STOPPING_TEXT, ChannelQueue, Submission
from discord_io.delivery import DeliveryError, DiscordChannel
from discord_io.testing import DiscordEmulator, Fault, RecordedRequest, emulated_discord
from discord_io.typing_indicator import TypingIndicator
from fsm.engine.config import TurnConfig
from fsm.engine.generation import Attempt, GenerationResult, run_generation_turn
from fsm.engine.locks import ChannelLock, ChannelLockRegistry
from fsm.engine.provider import AbortSignal, PassRequest, ProviderEvent
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import ScriptedProvider
from turn_engine import bot as bot_module
from turn_engine.bot import TurnBot

from reliability_support import EPS, NIGHTLY, TERMINAL_NAMES, check_walk

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

SEND = "POST /channels/{channel_id}/messages"
TYPING = "POST /channels/{channel_id}/typing"
DELETE = "DELETE /channels/{channel_id}/messages/{message_id}"
CALLBACK = "POST /interactions/{interaction_id}/{token}/callback"
HISTORY = "GET /channels/{channel_id}/messages"
REFUSALS = frozenset({QUEUE_FULL_TEXT, STOPPING_TEXT})

Passes = list[list[dict[str, Any]]]


def paragraphs(tag: str, count: int, words: int = 150) -> list[str]:
    """`count` paragraphs of about `words` * 5 characters, each ending in a blank line."""
    return [f"{tag} paragraph {i}: " + "word " * words + "\n\n" for i in range(count)]


def streamed(
    pieces: list[str], start: float = 1.0, gap: float = 1.0, end: str | None = "completed"
) -> list[dict[str, Any]]:
    """One pass streaming `pieces` a `gap` apart, then `end` (None: stall)."""
    steps: list[dict[str, Any]] = [
        {"at": start + i * gap, "text": piece} for i, piece in enumerate(pieces)
    ]
    last = start + len(pieces) * gap
    if end is None:
        steps.append({"at": last, "stall": True})
    else:
        steps.append({"at": last, "end": end})
    return steps


# -------------------------------------------------------------------------------- harness


class RoutedProvider:
    """The engine's scripted provider, one script per trigger message: concurrent turns in
    many channels each play exactly the passes the test wrote for their message."""

    name = "routed-scripted"

    def __init__(self) -> None:
        self.scripts: dict[str, ScriptedProvider] = {}
        self.calls: list[str] = []

    def add(self, message_id: int, passes: Passes) -> None:
        self.scripts[str(message_id)] = ScriptedProvider(parse_scenario({"passes": passes}).passes)

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        key = request.reply_to_message_id
        assert key is not None, "a queued turn replies to its trigger (S2)"
        self.calls.append(key)
        return self.scripts[key].stream(request, abort)


@dataclass
class TurnRecord:
    """One message the bot answered: its channel, typing indicator, engine turns, result."""

    message_id: int
    channel_id: int
    channel: DiscordChannel
    typing: TypingIndicator
    started_at: float
    turns: list[Turn] = field(default_factory=list)
    result: GenerationResult | None = None
    closed_at: float | None = None


@dataclass
class Submitted:
    """A message handed to the channel queue, and the engine turn running in that channel
    at that instant (what a follow-up from the same user may interrupt, S17)."""

    at: float
    channel_id: int
    message_id: int
    author_id: int
    submission: Submission
    running: Turn | None = None
    running_state: str = ""
    running_elapsed: float = 0.0
    running_author: int = 0
    interrupts_before: int = 0


@dataclass
class KillRecord:
    """A /kill and what the channel held at that instant."""

    at: float
    channel_id: int
    interaction_id: str
    lock_held: bool
    active: TurnRecord | None
    turn: Turn | None
    turn_state: str
    turn_elapsed: float
    pending: tuple[int, ...]


@dataclass
class Harness:
    emu: DiscordEmulator
    client: discord.Client
    bot: TurnBot
    provider: RoutedProvider
    loop: asyncio.AbstractEventLoop
    records: list[TurnRecord] = field(default_factory=list)
    submissions: list[Submitted] = field(default_factory=list)
    kills: list[KillRecord] = field(default_factory=list)
    channels: list[int] = field(default_factory=list)
    posted: int = 0

    def now(self) -> float:
        return self.loop.time()

    def new_channel(self) -> int:
        channel_id = self.emu.add_text_channel(f"load-{len(self.channels)}")
        self.channels.append(channel_id)
        return channel_id

    def post(
        self,
        passes: Passes,
        *,
        channel: int | None = None,
        author: int | None = None,
        text: str = "hello",
    ) -> int:
        """A user mentions the bot; the gateway hands it to the bot (a task of its own)."""
        channel_id = channel if channel is not None else self.emu.channel_id
        payload = self.emu.add_message(
            channel_id,
            author or self.emu.alice_id,
            f"<@{self.emu.bot_id}> {text}",
            mentions=[self.emu.bot_id],
        )
        message_id = int(payload["id"])
        self.provider.add(message_id, passes)
        self.posted += 1
        self.client._connection.parse_message_create(payload)  # type: ignore[arg-type]
        return message_id

    def kill(self, channel_id: int) -> None:
        """/kill typed in `channel_id` by a member who may stop any reply there (Manage
        Messages, O4), noting what was running at that instant."""
        payload = self.emu.slash_command_payload("kill", channel_id=channel_id,
                                                 permissions=MANAGE_MESSAGES)
        active = next(
            (
                r
                for r in reversed(self.records)
                if r.channel_id == channel_id and r.closed_at is None
            ),
            None,
        )
        turn = active.turns[-1] if active is not None and active.turns else None
        self.kills.append(
            KillRecord(
                at=self.now(),
                channel_id=channel_id,
                interaction_id=payload["id"],
                lock_held=str(channel_id) in self.bot.locks,
                active=active,
                turn=turn,
                turn_state=turn.state if turn is not None else "",
                turn_elapsed=turn.elapsed if turn is not None else 0.0,
                pending=tuple(m.id for m in self.bot.queue.pending(str(channel_id))),
            )
        )
        self.client._connection.parse_interaction_create(payload)  # type: ignore[arg-type]

    def kill_answer(self, kill: KillRecord) -> str:
        [answer] = [
            r
            for r in self.emu.requests_to(CALLBACK)
            if r.params["interaction_id"] == kill.interaction_id
        ]
        content = answer.json["data"]["content"]
        assert isinstance(content, str)
        return content

    def in_channel(self, channel_id: int | None = None) -> list[TurnRecord]:
        wanted = channel_id if channel_id is not None else self.emu.channel_id
        return [r for r in self.records if r.channel_id == wanted]

    def sends(self, channel_id: int | None = None) -> list[RecordedRequest]:
        wanted = str(channel_id if channel_id is not None else self.emu.channel_id)
        return [r for r in self.emu.requests_to(SEND) if r.params["channel_id"] == wanted]

    async def idle(self) -> None:
        """Until every posted message reached the queue and no channel has a running or
        queued turn."""
        async with asyncio.timeout(1.0):  # the gateway hands a message over at once
            while len(self.submissions) < self.posted:
                await asyncio.sleep(0.001)
        channels = {str(c) for c in (*self.channels, self.emu.channel_id)}
        while any(self.bot.queue.busy(c) for c in channels):
            for c in channels:
                await self.bot.queue.join(c)


MANAGE_MESSAGES = 1 << 13
"""Discord's permission bit for members who may stop anyone's reply."""


@contextmanager
def real_time_limit(seconds: float) -> Iterator[None]:
    """A hang detector in real time: a livelock stops the virtual clock, so no asyncio
    timeout would ever fire. It fires only when the loop's clock has not moved for `seconds`
    of real time — a slow machine makes a cell take longer, never trips it."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    fired = threading.Event()
    done = threading.Event()

    def watch() -> None:
        last, still_since = loop.time(), time.monotonic()
        while not done.wait(0.5):
            now = loop.time()
            if now != last:
                last, still_since = now, time.monotonic()
            elif time.monotonic() - still_since >= seconds:
                fired.set()
                loop.call_soon_threadsafe(task.cancel)
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    except asyncio.CancelledError:
        if not fired.is_set():
            raise
        task.uncancel()
        raise AssertionError(
            f"livelock: virtual time stopped for {seconds} s of real time"
        ) from None
    finally:
        done.set()
        watcher.join()


@asynccontextmanager
async def bot_harness(
    monkeypatch: pytest.MonkeyPatch, config: TurnConfig | None = None, attempts: int = 1
) -> AsyncIterator[Harness]:
    """The bot on the emulator, recording every answered message's `DiscordChannel`,
    typing indicator, engine turns and result, every submission and every /kill."""
    async with emulated_discord() as (emu, client):
        provider = RoutedProvider()
        labels = ["primary", *(f"fallback-{i}" for i in range(1, attempts))]
        bot = TurnBot(client, [Attempt(provider, label) for label in labels], config=config)
        h = Harness(emu, client, bot, provider, asyncio.get_running_loop())
        by_channel: dict[int, TurnRecord] = {}

        class RecordingChannel(DiscordChannel):
            def __init__(self, client: discord.Client, channel_id: int, **kwargs: Any) -> None:
                super().__init__(client, channel_id, **kwargs)
                assert self.typing is not None and self.reply_to is not None
                record = TurnRecord(self.reply_to, channel_id, self, self.typing, h.now())
                h.records.append(record)
                by_channel[id(self)] = record

            async def aclose(self) -> None:
                await super().aclose()
                by_channel[id(self)].closed_at = h.now()

        async def recording_run(attempts: Any, **kwargs: Any) -> GenerationResult:
            record = by_channel[id(kwargs["channel"])]
            inner: Callable[[Turn], None] | None = kwargs.get("on_attempt")

            def on_attempt(turn: Turn) -> None:
                record.turns.append(turn)
                if inner is not None:
                    inner(turn)

            kwargs["on_attempt"] = on_attempt
            record.result = await run_generation_turn(attempts, **kwargs)
            return record.result

        original_submit = bot.queue.submit

        def recording_submit(channel_id: str, message: discord.Message) -> Submission:
            submission = original_submit(channel_id, message)
            record = Submitted(h.now(), int(channel_id), message.id, message.author.id, submission)
            if (running := bot.current.get(channel_id)) is not None:
                turn, record.running_author = running
                record.running, record.running_state = turn, turn.state
                record.running_elapsed = turn.elapsed
                record.interrupts_before = turn.lock.follow_up_interrupts
            h.submissions.append(record)
            return submission

        monkeypatch.setattr(bot_module, "DiscordChannel", RecordingChannel)
        monkeypatch.setattr(bot_module, "run_generation_turn", recording_run)
        monkeypatch.setattr(bot.queue, "submit", recording_submit)
        bot.attach()
        await bot.start()
        try:
            with real_time_limit(30.0):
                yield h
        finally:
            await bot.aclose()
    await no_task_left()


async def no_task_left() -> None:
    """Once the bot, the client and the emulator are closed, no task is left; a request the
    emulator was told never to answer is the emulator's own and is cancelled here."""
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current]
    if left:
        await asyncio.wait(left, timeout=10)
    server = [t for t in left if not t.done() and _emulator_task(t)]
    for task in server:
        task.cancel()
    if server:
        await asyncio.wait(server)
    assert all(t.done() for t in left), [t.get_name() for t in left if not t.done()]


def _emulator_task(task: asyncio.Task[Any]) -> bool:
    return getattr(task.get_coro(), "__qualname__", "").startswith("RequestHandler.")


def _foreign(task: asyncio.Task[Any]) -> bool:
    """The emulator's server tasks (one per keep-alive connection) and the bot's sweeper."""
    return task.get_name() == "stale-lock-sweeper" or _emulator_task(task)


# -------------------------------------------------------------------------------- oracle


def bot_text_messages(emu: DiscordEmulator, channel_id: int) -> list[tuple[int, str]]:
    """The bot's text messages in the channel as Discord holds them (refusals aside)."""
    return [
        (int(m["id"]), m["content"])
        for m in emu.channel_messages(channel_id)
        if int(m["author"]["id"]) == emu.bot_id and m["content"] and m["content"] not in REFUSALS
    ]


async def check_settled(h: Harness, quiet_s: float = 30.0, stale: set[int] | None = None) -> None:
    """Everything a user and an operator can check once the bot has nothing to do.
    `stale`: messages whose turn the channel queue cancelled after the sweeper released
    its lock before the engine turn began (no result, by design)."""
    await h.idle()
    await asyncio.sleep(quiet_s)  # a refresher or a pump left running would show now
    bot = h.bot
    channels = {r.channel_id for r in h.records} | set(h.channels) | {h.emu.channel_id}
    for record in h.records:
        if stale and record.message_id in stale:
            assert record.result is None and record.turns == [] and record.closed_at
            assert not record.typing.running and record.channel.delivered == []
            continue
        # exactly one terminal state per engine turn, its journal a walk over declared edges
        assert record.result is not None, f"message {record.message_id} has no result"
        assert record.turns and record.closed_at is not None
        for turn in record.turns:
            check_walk(turn)
            assert turn.lock.released
        assert record.result.status == record.turns[-1].status
        # the turn's own record of what it delivered is what reached Discord (D2, G1)
        if record.turns[-1].state == "Done" and record.result.status != "follow_up_interrupt":
            assert record.result.delivered_text == record.channel.delivered_text
        else:  # a send on the wire when the turn stopped may still land (S10, S16)
            assert record.channel.delivered_text.startswith(record.result.delivered_text)
        assert not record.typing.running
    for channel_id in channels:
        # every message that reached Discord is recorded by the turn that sent it (D2)
        recorded = [
            (m.message_id, m.content) for r in h.in_channel(channel_id) for m in r.channel.delivered
        ]
        assert bot_text_messages(h.emu, channel_id) == recorded
        # the typing indicator is only ever posted while a turn of that channel runs
        spans = [(r.started_at, r.closed_at) for r in h.in_channel(channel_id)]
        for post in h.emu.requests_to(TYPING):
            if post.params["channel_id"] == str(channel_id):
                assert any(a - EPS <= post.at <= (b or a) + EPS for a, b in spans), post.at
        assert not bot.queue.busy(str(channel_id)) and not bot.queue.pending(str(channel_id))
    assert len(bot.locks) == 0 and bot.current == {}
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current and not t.done() and not _foreign(t)]
    assert left == [], [t.get_name() for t in left]


def statuses(h: Harness, channel_id: int | None = None) -> list[str]:
    return [r.result.status if r.result else "none" for r in h.in_channel(channel_id)]


def full_text(record: TurnRecord) -> str:
    return "".join(m.source for m in record.channel.delivered)


# ------------------------------------------------------------------------- 1. 429 storms


def retry_gaps(requests: list[RecordedRequest]) -> list[tuple[int, float]]:
    """(status, seconds until the next request) for each answered request but the last."""
    return [(a.status, round(b.at - a.at, 6)) for a, b in itertools.pairwise(requests)]


@pytest.mark.parametrize("scope", ["route", "global"])
async def test_429_storm_on_sends_is_honoured_and_the_reply_completes(
    monkeypatch: pytest.MonkeyPatch, scope: str
) -> None:
    # covers D2 (429 retry_after honoured, every message recorded), D1, D4, S14: four 429s
    # in a row on the first message (discord.py's limit is five tries), per route or global,
    # then Discord's own bucket (one send per 3 s) on the rest. The reply completes in order,
    # one terminal state, nothing lost, nothing left.
    pieces = paragraphs("storm", 6)
    waits = [7.5, 12.25, 20.0, 30.5]
    async with bot_harness(monkeypatch) as h:
        h.emu.inject(SEND, *[Fault.rate_limited(w, is_global=scope == "global") for w in waits])
        h.emu.enable_buckets(limit=1, window_s=3.0)
        h.post([streamed(pieces)])
        await check_settled(h)
        [record] = h.records
        assert record.result is not None
        assert statuses(h) == ["completed"] and record.result.notices == []
        assert record.result.delivered_text == "".join(pieces) == full_text(record)
        sends = h.sends()
        assert retry_gaps(sends)[:4] == [(429, w) for w in waits]
        assert [r.status for r in sends[4:]].count(200) == len(record.channel.delivered) >= 3
        for answer, retry in itertools.pairwise(sends):  # every 429 is waited out
            if answer.status == 429:
                assert retry.at - answer.at >= 1.0 - EPS
        assert [t["to"] for t in record.turns[0].transitions][-1] == "Done"


@pytest.mark.parametrize("scope", ["route", "global"])
async def test_429_storm_past_the_retries_ends_done_error_with_what_discord_received(
    monkeypatch: pytest.MonkeyPatch, scope: str
) -> None:
    # covers D2 (a failed send is reported, not lost), S15, D4, G1, G2: the first message
    # goes out, the second meets five 429s (discord.py gives up after five tries); the turn
    # ends Done/error naming the 429, no text is sent after the hole — only the one notice
    # saying the reply failed — and its delivered text (what a fallback would continue from)
    # is exactly the first message
    pieces = paragraphs("hole", 6)
    async with bot_harness(monkeypatch) as h:
        h.emu.inject(
            SEND, Fault.delay(0.0), *[Fault.rate_limited(2.0, is_global=scope == "global")] * 5
        )
        h.post([streamed(pieces)])
        await check_settled(h)
        [record] = h.records
        assert record.result is not None
        assert statuses(h) == ["error"] and [t["to"] for t in record.turns[0].transitions] == [
            "AwaitingFirstToken",
            "Streaming",
            "Done",
        ]
        assert "HTTP 429" in (record.result.attempts[0].error or "")
        [first] = record.channel.delivered
        assert record.result.delivered_text == first.source == record.channel.delivered_text
        assert first.source.startswith("hole paragraph 0") and len(first.source) > 1000
        assert [r.status for r in h.sends()] == [200, 429, 429, 429, 429, 429, 200]
        assert record.result.notices == ["failed_other"] and "embeds" in h.sends()[-1].json
        assert isinstance(record.channel.failure, DeliveryError)
        assert record.channel.failure.status == 429


async def test_429_storm_longer_than_the_idle_budget_after_the_model_finished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # covers S5, S15, D2: only the engine's own inactivity timeout is a timeout; a model that
    # finished its answer is not inactive while Discord makes the bot wait (4 x 30 s here,
    # each honoured, the idle budget 120 s)
    async with bot_harness(monkeypatch) as h:
        h.emu.inject(SEND, *[Fault.rate_limited(30.0)] * 4)
        h.post([[{"at": 1, "text": "A short answer."}, {"at": 2, "end": "completed"}]])
        await check_settled(h)
        [record] = h.records
        assert record.result is not None
        assert [r.status for r in h.sends()][:5] == [429, 429, 429, 429, 200]
        assert record.channel.delivered_text == "A short answer."
        assert statuses(h) == ["completed"] and record.result.notices == []


async def test_send_held_by_a_429_at_the_timeout_is_in_the_fallbacks_prefill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # covers S10, S13, G1, D2: "a Discord send already on the wire lands in the delivered
    # text that a fallback continues from". The paragraph streamed at 1 s is sent by the idle
    # flush at 6 s and meets a 429 (8 s); the idle timer fires at 11 s; it lands at 14 s
    first = paragraphs("late", 1)[0]
    config = TurnConfig(idle_timeout_s=10, settle_timeout_s=5)
    async with bot_harness(monkeypatch, config, attempts=2) as h:
        h.emu.inject(SEND, Fault.rate_limited(8.0))
        message = h.post(
            [
                streamed([first], end=None),
                [{"at": 1, "text": "The rest."}, {"at": 2, "end": "completed"}],
            ]
        )
        await h.idle()
        [record] = h.records
        assert record.result is not None
        assert [a.status for a in record.result.attempts] == ["timeout", "completed"]
        assert [round(r.at - record.started_at, 3) for r in h.sends()][:2] == [6.0, 14.0]
        assert record.channel.delivered_text == first + "The rest."  # what Discord shows
        assert h.provider.scripts[str(message)].requests[1].prefill == first
        await check_settled(h)


async def test_text_a_timed_out_attempt_still_buffered_is_sent_before_the_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # covers G1, S10, S13, D1: a fallback continues from the text already delivered. The
    # primary's half sentence, still buffered at the timeout, is sent while the stream
    # settles, in its own message, so it is in the fallback's prefill — never glued to the
    # fallback's answer (B16)
    first = paragraphs("whole", 1)[0]
    config = TurnConfig(idle_timeout_s=10, settle_timeout_s=5)
    async with bot_harness(monkeypatch, config, attempts=2) as h:
        message = h.post(
            [
                streamed([first, "Half a sent"], end=None),
                [{"at": 1, "text": "The rest."}, {"at": 2, "end": "completed"}],
            ]
        )
        await h.idle()
        [record] = h.records
        assert record.result is not None
        assert [a.status for a in record.result.attempts] == ["timeout", "completed"]
        assert h.provider.scripts[str(message)].requests[1].prefill == first + "Half a sent"
        assert [m.content for m in record.channel.delivered] == [
            first.strip(), "Half a sent", "The rest."]
        await check_settled(h)


# ------------------------------------------------------- 2. 5xx on sends, failing deletes


@pytest.mark.parametrize(
    ("status", "faults", "gaps"),
    [
        (500, 5, [1.0, 3.0, 5.0, 7.0]),  # discord.py retries 500/502/504/524: 1+3+5+7+9 s
        (503, 1, []),  # any other 5xx is raised at once
    ],
)
async def test_persistent_5xx_on_a_send_ends_done_error_with_what_discord_received(
    monkeypatch: pytest.MonkeyPatch, status: int, faults: int, gaps: list[float]
) -> None:
    # covers D2 (reported, not lost; no text sent after the hole, only the failure notice),
    # S15, D4, G1, G2
    pieces = paragraphs("five", 6)
    async with bot_harness(monkeypatch) as h:
        h.emu.inject(SEND, Fault.delay(0.0), *[Fault.server_error(status)] * faults)
        h.post([streamed(pieces)])
        await check_settled(h)
        [record] = h.records
        assert record.result is not None and statuses(h) == ["error"]
        assert f"HTTP {status}" in (record.result.attempts[0].error or "")
        assert [r.status for r in h.sends()] == [200] + [status] * faults + [200]
        assert [gap for _, gap in retry_gaps(h.sends()[1:-1])] == gaps
        [first] = record.channel.delivered
        assert record.result.delivered_text == first.source == record.channel.delivered_text
        assert record.result.notices == ["failed_other"] and "embeds" in h.sends()[-1].json


async def test_transient_5xx_on_sends_are_retried_and_the_reply_completes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # covers D2, D1: a 500 then a 502 on the first message, a 504 on a later one; discord.py
    # retries after 1 s and 3 s, the reply completes in order and nothing is sent twice
    pieces = paragraphs("flaky", 6)
    async with bot_harness(monkeypatch) as h:
        h.emu.inject(
            SEND,
            Fault.server_error(500),
            Fault.server_error(502),
            Fault.delay(0.0),
            Fault.server_error(504),
        )
        h.post([streamed(pieces)])
        await check_settled(h)
        [record] = h.records
        assert record.result is not None and statuses(h) == ["completed"]
        assert [r.status for r in h.sends()][:5] == [500, 502, 200, 504, 200]
        assert [gap for _, gap in retry_gaps(h.sends()[:3])] == [1.0, 3.0]
        assert record.result.delivered_text == "".join(pieces) == full_text(record)
        contents = [content for _, content in bot_text_messages(h.emu, h.emu.channel_id)]
        assert len(contents) == len(set(contents)) == len(record.channel.delivered)


async def test_timeout_notice_failing_with_5xx_leaves_the_turn_timed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # covers S11, S12, D2, D4: the model never answers; the first-token timer fires at 30 s
    # exactly, the notice's send fails five times (discord.py gives up at 55 s); the turn is
    # TimedOut without the notice in its result, the lock released at once after
    config = TurnConfig(first_token_timeout_s=30, idle_timeout_s=10, settle_timeout_s=2)
    async with bot_harness(monkeypatch, config) as h:
        h.emu.inject(SEND, *[Fault.server_error()] * 5)
        h.post([[{"at": 0, "stall": True}]])
        await check_settled(h)
        [record] = h.records
        assert record.result is not None and statuses(h) == ["timeout"]
        [turn] = record.turns
        assert [(t["event"], t["t"]) for t in turn.transitions] == [
            ("begin", 0.0),
            ("first_token_timeout", 30.0),
            ("settled", 30.0),
        ]
        assert record.result.notices == [] and turn.metrics[0]["phase"] == "first_token"
        assert [r.status for r in h.sends()] == [500] * 5
        assert record.closed_at is not None
        assert record.closed_at - record.started_at == pytest.approx(55.0, abs=EPS)
        assert bot_text_messages(h.emu, h.emu.channel_id) == []


async def test_failed_deletes_keep_the_record_and_never_hold_the_lock() -> None:
    # covers D2 ("every delivered message is recorded so a superseded attempt's partial
    # output can be cleaned up"), D4: nothing in the bot calls `DiscordChannel.cleanup` yet,
    # so this drives it as a superseded attempt would, under the channel queue's lock. Of
    # five messages the first is deleted, the second is refused (403), the third meets five
    # 500s, the fourth a 429 then succeeds, the fifth is already gone (404 counts as deleted).
    # The cleanup raises `DeliveryError`, keeps exactly the two undeleted messages on record,
    # the lock is released and the next queued cleanup deletes them.
    with real_time_limit(30.0):
        async with emulated_discord() as (emu, client):
            registry = ChannelLockRegistry()
            channel = DiscordChannel(
                client, emu.channel_id, flush_paragraphs=True, idle_flush_s=None
            )
            outcomes: list[int | DeliveryError] = []
            held: list[bool] = []

            async def run_turn(job: str, lock: ChannelLock) -> None:
                held.append(registry.get(lock.channel_id) is lock)
                if job == "reply":
                    for piece in paragraphs("gone", 5, words=60):
                        await channel.deliver(piece)
                    await channel.finish_pass()
                    return
                try:
                    outcomes.append(await channel.cleanup())
                except DeliveryError as exc:
                    outcomes.append(exc)
                    raise

            queue: ChannelQueue[str] = ChannelQueue(registry, run_turn)
            key = str(emu.channel_id)
            assert queue.submit(key, "reply").status == "started"
            await queue.join(key)
            ids = [m.message_id for m in channel.delivered]
            assert len(ids) == 5
            emu.messages[emu.channel_id].pop(ids[4])  # someone deleted it by hand
            emu.inject(
                DELETE,
                Fault.delay(0.0),
                Fault.forbidden(),
                *[Fault.server_error()] * 5,
                Fault.rate_limited(1.5),
            )
            assert queue.submit(key, "cleanup").status == "started"
            assert queue.submit(key, "cleanup again").status == "queued"
            await queue.join(key)
            first, second = outcomes
            assert isinstance(first, DeliveryError) and "2 delivered message(s)" in str(first)
            assert second == 2 and channel.delivered == [] and held == [True, True, True]
            assert len(registry) == 0 and not queue.busy(key)
            deleted = [
                int(r.params["message_id"])
                for r in emu.requests_to(DELETE)
                if r.status in (204, 404)
            ]
            assert deleted == [ids[0], ids[3], ids[4], ids[1], ids[2]]
            assert [r.status for r in emu.requests_to(DELETE)][:9] == [
                204,
                403,
                500,
                500,
                500,
                500,
                500,
                429,
                204,
            ]
            assert bot_text_messages(emu, emu.channel_id) == []
            await channel.aclose()
    await no_task_left()


async def test_failed_delete_record_is_exact_at_the_failure() -> None:
    # covers D2: right after a cleanup that failed, the record lists exactly the messages
    # still in the channel, and its delivered text is theirs (no message lost, none stale)
    with real_time_limit(30.0):
        async with emulated_discord() as (emu, client):
            channel = DiscordChannel(
                client, emu.channel_id, flush_paragraphs=True, idle_flush_s=None
            )
            for piece in paragraphs("kept", 3, words=60):
                await channel.deliver(piece)
            await channel.finish_pass()
            sent = [m.content for m in channel.delivered]
            emu.inject(DELETE, Fault.delay(0.0), Fault.forbidden())
            with pytest.raises(DeliveryError):
                await channel.cleanup()
            assert [(m.message_id, m.content) for m in channel.delivered] == bot_text_messages(
                emu, emu.channel_id
            )
            assert [m.content for m in channel.delivered] == [sent[1]]
            assert channel.delivered_text == "".join(m.source for m in channel.delivered)
            await channel.aclose()
    await no_task_left()


async def test_delete_cancelled_during_a_global_429_does_not_wedge_the_client() -> None:
    # covers D2, D4: a cleanup's delete sleeps off a global 429 (60 s) when the channel queue
    # shuts down and cancels its turn; the lock is released, and the same Discord client
    # still sends at once afterwards (discord.py would wait forever for the global limit,
    # see discord_io/rate_limits.py)
    with real_time_limit(30.0):
        async with emulated_discord() as (emu, client):
            registry = ChannelLockRegistry()
            channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None)
            await channel.deliver("To be withdrawn.")
            await channel.finish_pass()

            async def run_turn(_job: str, _lock: ChannelLock) -> None:
                await channel.cleanup()

            queue: ChannelQueue[str] = ChannelQueue(registry, run_turn)
            emu.inject(DELETE, Fault.rate_limited(60.0, is_global=True))
            queue.submit(str(emu.channel_id), "cleanup")
            await emu.wait_for(lambda r: r.route == DELETE)
            await asyncio.sleep(1.0)
            await queue.aclose()
            assert len(registry) == 0 and [m.content for m in channel.delivered] == [
                "To be withdrawn."
            ]
            loop = asyncio.get_running_loop()
            before = loop.time()
            await asyncio.wait_for(
                client.get_partial_messageable(emu.channel_id).send("still here"), timeout=5.0
            )
            assert loop.time() == before
            await channel.aclose()
    await no_task_left()


# ------------------------------------------------------------ the idle flush off the grid


@pytest.mark.parametrize("at", [5.660298, 0.333333, 12.345678])
async def test_idle_flush_of_text_sent_off_the_clock_grid_fires(at: float) -> None:
    # covers D1, D2, S14: the idle flush sends the finished paragraph 5 s after the text
    # stopped, also when that instant is not on the loop clock's grid (5.660298 + 5 s is
    # 10.660298000000001): `DiscordChannel._idle_flush` compared the clock with the deadline
    # and re-slept for it forever on a virtual clock (as B1 did in the engine), so the
    # message was never sent, the reply stalled and the turn hung
    async with emulated_discord() as (emu, client):
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=5.0)
        try:
            with real_time_limit(5.0):
                await asyncio.sleep(at)
                loop = asyncio.get_running_loop()
                sent_at = loop.time()
                await channel.deliver("The first thought.\n\nThe second is still co")
                [send] = await emu.wait_for(lambda r: r.route == SEND)
                assert send.json["content"] == "The first thought."
                assert send.at - sent_at == pytest.approx(5.0, abs=EPS)
                assert channel.pending_text == "The second is still co"
        finally:
            await channel.aclose()
    await no_task_left()


# ------------------------------------------------------------------------ 4. typing faults


TYPING_FAULTS: dict[str, list[Fault]] = {
    "500": [Fault.server_error()] * 40,  # each post retried for 25 s, then given up
    "403": [Fault.forbidden()] * 40,
    "429": [Fault.rate_limited(3.0)] * 40,
    "429 global": [Fault.rate_limited(3.0, is_global=True)] * 40,
    "no answer": [Fault.delay(1000.0)] * 4,  # a post that never returns while the turn runs
}


@pytest.mark.parametrize("fault", list(TYPING_FAULTS))
async def test_typing_endpoint_failing_never_breaks_a_turn(
    monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    # covers D1, D2, D4, S14: the typing indicator is cosmetic; whatever its endpoint answers,
    # the reply is sent at the same instants as without the fault (a global 429 holds every
    # route, so only there may sends wait), the indicator stops with the turn and no post
    # outlives it
    pieces = paragraphs("typed", 4)
    async with bot_harness(monkeypatch) as h:
        h.emu.inject(TYPING, *TYPING_FAULTS[fault])
        h.post([streamed(pieces, gap=6.0)])  # a 25 s reply: the indicator is refreshed
        await check_settled(h)
        [record] = h.records
        assert record.result is not None and statuses(h) == ["completed"]
        assert record.result.delivered_text == "".join(pieces) == full_text(record)
        assert all(r.status == 200 for r in h.sends())
        typing_posts = h.emu.requests_to(TYPING)
        assert typing_posts and all(r.status != 204 for r in typing_posts[:2])
        if fault != "no answer":  # the refresher goes on after a failed post
            assert len(typing_posts) >= 2
        assert record.typing.posts == len([r for r in typing_posts if r.status == 204])
        if fault == "403":  # a refused post changes nothing: posted at the start and 2 s
            # after every message but the last (the next is seconds away: D50), as with a
            # healthy endpoint
            assert [round(r.at - record.started_at, 6) for r in typing_posts] == [
                0.0,
                8.0,
                14.0,
                20.0,
            ]
        if fault != "429 global":
            # the idle flush sends each paragraph 5 s after it arrived (1, 7, 13, 19 s)
            assert [round(r.at - record.started_at, 6) for r in h.sends()] == [
                6.0,
                12.0,
                18.0,
                24.0,
            ]


@pytest.mark.parametrize("retry_after", [5.0, 60.0])
async def test_typing_cancelled_in_a_global_429_does_not_mute_the_bot(
    monkeypatch: pytest.MonkeyPatch, retry_after: float
) -> None:
    # covers D2, D4, D1: the typing post at the turn's start meets a global 429; the reply is
    # done at 2 s and stopping the indicator cancels the post in its global sleep. discord.py
    # then never lifts its global wait, and every later request of the client (this reply,
    # the next turns, notices, /kill answers) hangs forever; the fix in
    # discord_io/rate_limits.py lifts it. The reply goes out at once, the next turn at 12 s.
    async with bot_harness(monkeypatch) as h:
        h.emu.inject(TYPING, Fault.rate_limited(retry_after, is_global=True))
        start = h.now()
        h.post([[{"at": 1, "text": "First answer."}, {"at": 2, "end": "completed"}]])
        await asyncio.sleep(10)
        h.post([[{"at": 1, "text": "Second answer."}, {"at": 2, "end": "completed"}]])
        async with asyncio.timeout(600):  # fail, never hang, if the client is wedged
            await check_settled(h)
        assert statuses(h) == ["completed", "completed"]
        assert [(round(r.at - start, 6), r.json["content"]) for r in h.sends()] == [
            (2.0, "First answer."),
            (12.0, "Second answer."),
        ]
        assert [r.status for r in h.emu.requests_to(TYPING)] == [429, 204]


# ------------------------------------------------ 3. load: queue, /kill, stale sweeper


LOAD_CONFIG = TurnConfig(
    first_token_timeout_s=20, idle_timeout_s=10, settle_timeout_s=2, stale_lock_age_s=60
)
LOAD_CHANNELS = 200 if NIGHTLY else 96
LOAD_SEEDS = [random.randrange(10**6) for _ in range(5)] if NIGHTLY else [20261130]
EXPECTED_STATUS = {
    "reply": "completed",
    "slow": "completed",
    "long": "completed",
    "stall_first": "timeout",
    "stall_idle": "timeout",
    "error": "error",
    "empty": "empty_response",
}
KINDS = ["reply"] * 4 + ["slow"] * 2 + ["long", "stall_first", "stall_idle", "error", "empty"]
INTERRUPTIBLE = ("AwaitingFirstToken", "Streaming")


@dataclass
class Planned:
    """One message of the load: what its model will do and the text it streams."""

    kind: str
    passes: Passes
    text: str = ""
    last_text_at: float = 0.0


def plan_message(rng: random.Random, tag: str, kind: str) -> Planned:
    pieces = [
        f"{tag} piece {i}: "
        + "word " * rng.randint(5, 300)
        + ("\n\n" if rng.random() < 0.6 else "")
        for i in range(rng.randint(1, 4))
    ]
    start, gap = rng.choice([0.25, 1.0, 2.5]), rng.choice([0.5, 1.0, 3.0])
    if kind in ("slow", "long"):  # long: 80 s, longer than the stale age (S6)
        pieces = [f"{tag} {kind} {i}. " for i in range(8 if kind == "slow" else 20)]
        gap = 4.0
    last = start + (len(pieces) - 1) * gap
    if kind in ("reply", "slow", "long"):
        return Planned(kind, [streamed(pieces, start, gap)], "".join(pieces))
    if kind == "stall_first":
        return Planned(kind, [[{"at": 0, "stall": True}]])
    if kind == "stall_idle":
        return Planned(kind, [streamed(pieces, start, gap, end=None)], "".join(pieces), last)
    if kind == "error":
        steps = streamed(pieces, start, gap, end=None)
        steps[-1] = {"at": last + gap, "error": "upstream overloaded"}
        return Planned(kind, [steps], "".join(pieces))
    return Planned(kind, [[{"at": start, "end": "empty"}]])


def dropped_by(answer: str) -> int:
    """The count in /kill's answer ("Dropped 3 queued messages.")."""
    words = answer.split()
    return int(words[words.index("Dropped") + 1]) if "Dropped" in words else 0


def off_grid(rng: random.Random, at: float) -> float:
    """`at` pushed by a random fraction of a second (1 µs resolution), so no user action falls
    on the instant of another or of a scripted step or timer: every outcome is predictable."""
    return at + rng.randrange(1, 200_000) / 1_000_000


@pytest.mark.parametrize("seed", LOAD_SEEDS)
async def test_many_channels_with_queues_kills_follow_ups_stalls_and_a_stale_lock(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    # covers D3, D4, S4, S5, S6, S7, S11, S16, S17, D1, D2: many channels at once, a few
    # queued messages each at random times (a burst of 14 in some: the queue holds 10, the
    # rest are refused), random /kill and follow-ups from the same user, replies that
    # complete (some for longer than the stale age), stall (first-token and idle timers
    # fire), fail or come back empty, transient 429s and 5xx on sends and typing, and one
    # history read that never answers, so its lock goes stale and the sweeper releases it.
    # Afterwards: every turn ended in one terminal state with the status its model implies
    # unless a kill ended it (Stopped at the kill's instant) or a follow-up from the same user
    # did (Done/follow_up_interrupt at its instant, exactly when it arrived during the first
    # token wait or the stream, within the cap); each timer fired exactly at its budget;
    # every accepted message was answered in FIFO order or dropped by /kill (its answer counts
    # them), every refusal posted; plus the harness's checks (delivered text, locks, queues,
    # typing, tasks)
    rng = random.Random(seed)
    async with bot_harness(monkeypatch, LOAD_CONFIG) as h:
        sweeper_start = h.now()
        users = [int(h.emu.add_user(f"user{i}")["id"]) for i in range(6)]
        plans: dict[int, Planned] = {}
        bursts: list[int] = []
        events: list[tuple[float, int, Callable[[], None]]] = []

        def post(channel: int, author: int, kind: str) -> None:
            planned = plan_message(rng, f"c{channel % 1000}", kind)
            plans[h.post(planned.passes, channel=channel, author=author)] = planned

        def at(when: float, act: Callable[[], None]) -> None:
            events.append((when, len(events), act))

        for index in range(LOAD_CHANNELS):
            channel = h.new_channel()
            if index % 12 == 5:  # a burst past the queue bound behind a stalled turn
                bursts.append(channel)
                at(0.5, partial(post, channel, users[0], "stall_first"))
                for i in range(14):
                    author, kind = rng.choice(users[1:]), rng.choice(KINDS)
                    at(1.0 + 0.5 * i, partial(post, channel, author, kind))
                continue
            for _ in range(rng.randint(2, 5)):
                author, kind = rng.choice(users[:3]), rng.choice(KINDS)
                at(off_grid(rng, rng.randrange(0, 120) * 0.5), partial(post, channel, author, kind))
            for _ in range(rng.choices([0, 1, 2], weights=[6, 3, 1])[0]):
                at(off_grid(rng, rng.randrange(1, 140) * 0.5), partial(h.kill, channel))
        stale = h.new_channel()  # its first history read never answers
        at(0.125, partial(h.emu.inject, HISTORY, Fault.delay(10_000.0)))
        at(0.125, partial(post, stale, users[4], "reply"))
        for when in (10.0, 20.5, 31.0):
            at(when, partial(post, stale, users[5], "reply"))
        at(5.25, partial(h.emu.inject, SEND, Fault.rate_limited(1.5)))
        at(12.25, partial(h.emu.inject, SEND, Fault.server_error()))
        at(20.75, partial(h.emu.inject, TYPING, Fault.rate_limited(2.0, is_global=True)))
        at(30.75, partial(h.emu.inject, SEND, Fault.rate_limited(1.0, is_global=True)))

        start = h.now()
        for when, _, act in sorted(events, key=lambda e: (e[0], e[1])):
            await asyncio.sleep(start + when - h.now())
            act()
        async with asyncio.timeout(3600):
            await check_settled(h, stale={h.in_channel(stale)[0].message_id})

        # the stale lock: released by the sweeper's first pass after the stale age (60 s
        # after it was taken at 0.125 s: at 90 s), its history read cancelled, the queue goes on
        assert h.bot.sweeper.released == 1  # and no healthy turn's lock (S6)
        [swept, *after] = h.in_channel(stale)
        assert swept.closed_at == pytest.approx(sweeper_start + 90.0, abs=EPS)
        assert after and after[0].started_at == pytest.approx(swept.closed_at, abs=EPS)
        for channel in bursts:  # one running, ten queued (the bound), four refused (D4)
            assert [s.submission.status for s in h.submissions if s.channel_id == channel] == [
                "started",
                *["queued"] * 10,
                *["full"] * 4,
            ]
        check_load(h, plans)


def check_load(h: Harness, plans: dict[int, Planned]) -> None:
    """The load cell's oracle over the queue, /kill, follow-ups, statuses and timers."""
    max_queued = h.bot.queue.max_queued
    by_message = {r.message_id: r for r in h.records}
    for channel_id in h.channels:
        subs = [s for s in h.submissions if s.channel_id == channel_id]
        accepted = [s.message_id for s in subs if s.submission.accepted]
        ran = [r.message_id for r in h.in_channel(channel_id)]
        # FIFO (D4): the answered messages are the accepted ones, in order, less the dropped
        assert ran == [m for m in accepted if m in set(ran)]
        kills = [k for k in h.kills if k.channel_id == channel_id]
        answers = [h.kill_answer(k) for k in kills]
        assert len(accepted) - len(ran) == sum(dropped_by(a) for a in answers)  # D3
        assert not {str(m) for m in set(accepted) - set(ran)} & set(h.provider.calls)
        replies = {
            (m["message_reference"]["message_id"], m["content"])
            for m in h.emu.channel_messages(channel_id)
            if "message_reference" in m and m["content"] in REFUSALS
        }
        last_refused: dict[int, float] = {}  # the sender's last refusal with text
        for sub in subs:
            if sub.submission.status == "full":  # the queue bound (10) was reached
                assert sub.submission.position == max_queued
                # one refusal per sender per window, so spam cannot spend the send budget
                last = last_refused.get(sub.author_id)
                due = last is None or sub.at - last >= h.bot.queue.refusal_window_s - EPS
                assert (sub.submission.refusal is not None) == due
                assert ((str(sub.message_id), QUEUE_FULL_TEXT) in replies) == due
                if due:
                    last_refused[sub.author_id] = sub.at
            elif sub.submission.status == "stopping":  # refused while a /kill unwinds the turn
                assert (str(sub.message_id), STOPPING_TEXT) in replies
                assert any(
                    k.at <= sub.at
                    and k.active is not None
                    and k.active.closed_at is not None
                    and k.active.closed_at >= sub.at
                    for k in kills
                )
        for kill, answer in zip(kills, answers, strict=True):
            assert answer.startswith(
                "Stopping the reply" if kill.lock_held else "Nothing is running here."
            )
            # D3: the queue at that instant is emptied, counted in the answer, never answered
            assert dropped_by(answer) == len(kill.pending) and not set(kill.pending) & set(ran)
            active = kill.active
            if active is None or active.result is None:
                continue
            if kill.turn is None:  # before the engine turn began: it stops in Preparing
                assert [(t["event"], t["from"]) for t in active.turns[0].transitions] == [
                    ("kill", "Preparing")
                ]
            elif kill.turn_state not in TERMINAL_NAMES:  # honoured at once (S7, S16)
                assert kill.turn.state == "Stopped" and active.result.status == "stopped_by_user"
                assert kill.turn.transitions[-1]["t"] == pytest.approx(kill.turn_elapsed, abs=EPS)
        for sub in subs:  # S17: a follow-up from the same user while the model is answering
            turn = sub.running
            if (
                turn is not None
                and sub.submission.status == "queued"
                and sub.running_author == sub.author_id
                and sub.running_state in INTERRUPTIBLE
                and sub.interrupts_before < h.bot.locks.max_follow_up_interrupts
                and not turn.stop_requested
            ):
                assert turn.status == "follow_up_interrupt", sub
                assert turn.transitions[-1]["t"] == pytest.approx(sub.running_elapsed, abs=EPS)
    for message, planned in plans.items():
        record = by_message.get(message)
        if record is None or record.result is None:
            continue
        [turn] = record.turns
        status = record.result.status
        if status == "stopped_by_user":
            assert any(k.active is record for k in h.kills)
            continue
        if status == "follow_up_interrupt":  # only when one came (S17)
            assert any(s.running is turn and s.running_author == s.author_id for s in h.submissions)
            continue
        assert status == EXPECTED_STATUS[planned.kind], (planned.kind, record.result.as_dict())
        if planned.kind in ("reply", "slow", "long", "error"):
            assert record.result.delivered_text == planned.text  # all of it, in order (D1)
        events = [(t["event"], t["t"]) for t in turn.transitions]
        if planned.kind == "stall_first":  # S4, S11: the first-token budget, exactly
            assert events == [("begin", 0.0), ("first_token_timeout", 20.0), ("settled", 20.0)]
            assert [m["phase"] for m in turn.metrics] == ["first_token"]
        if planned.kind == "stall_idle":  # S5, S11: the idle budget after the last chunk
            assert events[2] == ("idle_timeout", pytest.approx(planned.last_text_at + 10, abs=EPS))
            assert [m["phase"] for m in turn.metrics] == ["idle"]


async def test_kill_while_a_send_waits_out_a_429_refuses_then_takes_new_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # covers D3, S16, D4, D2: /kill at 3.5 s stops the turn at once while its first message
    # (cut at 2 s, when the buffer passed 2,000 characters) waits out a 429 until 6 s and the
    # second (cut at 3 s) waits behind it; the channel unwinds (the send in flight gets its
    # grace, the one not yet started is dropped), so a message at 4 s is refused with the
    # "stopping" text, the queued one was dropped, and a message at 10 s is answered. The
    # message that landed after the kill is on record (what Discord shows).
    first, second, third = paragraphs("killed", 3, words=300)
    async with bot_harness(monkeypatch) as h:
        start = h.now()
        h.emu.inject(SEND, Fault.rate_limited(4.0))
        killed = h.post([streamed([first, second, third], gap=1.0, end=None)])
        await asyncio.sleep(1.5)
        dropped = h.post([streamed(["never"])], author=int(h.emu.add_user("bob")["id"]))
        await asyncio.sleep(2.0)
        h.kill(h.emu.channel_id)
        await asyncio.sleep(0.5)
        refused = h.post([streamed(["too early"])])
        await asyncio.sleep(6.0)
        answered = h.post([streamed(["Back again."])])
        await check_settled(h)
        assert [r.message_id for r in h.records] == [killed, answered]
        assert statuses(h) == ["stopped_by_user", "completed"]
        [kill] = h.kills
        assert (
            h.kill_answer(kill) == "Stopping the reply in this channel. Dropped 1 queued message."
        )
        [turn] = h.records[0].turns
        assert turn.transitions[-1]["to"] == "Stopped"
        assert turn.transitions[-1]["t"] == pytest.approx(3.5, abs=EPS)
        subs = {s.message_id: s.submission.status for s in h.submissions}
        assert subs == {
            killed: "started",
            dropped: "queued",
            refused: "stopping",
            answered: "started",
        }
        assert str(dropped) not in h.provider.calls and str(refused) not in h.provider.calls
        refusal = [m for m in h.emu.channel_messages() if m["content"] == STOPPING_TEXT]
        assert [m["message_reference"]["message_id"] for m in refusal] == [str(refused)]
        assert [(round(r.at - start, 6), r.status, r.json["content"]) for r in h.sends()] == [
            (2.0, 429, first.strip()),
            (6.0, 200, first.strip()),  # the second paragraph was never sent
            (6.0, 200, STOPPING_TEXT),  # behind the same route's rate limit
            (12.0, 200, "Back again."),  # posted at 10 s, finished at 12 s
        ]
        killed_record = h.records[0]
        assert killed_record.result is not None and killed_record.result.delivered_text == ""
        assert killed_record.channel.delivered_text == first  # visible, not in the result


async def test_kill_while_the_history_read_hangs_stops_the_turn_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # covers D3, S16, D4: the bot reads the channel's history before the engine turn starts;
    # Discord never answers that read. /kill at 1 s stops the turn at once (it ends Stopped
    # from Preparing, one terminal state), and a message at 2 s is answered at once, not
    # refused as "stopping" until the stale sweeper frees the channel minutes later
    async with bot_harness(monkeypatch) as h:
        start = h.now()
        h.emu.inject(HISTORY, Fault.delay(10_000.0))
        killed = h.post([streamed(["never"])])
        await asyncio.sleep(1.0)
        h.kill(h.emu.channel_id)
        await asyncio.sleep(1.0)
        answered = h.post([[{"at": 1, "text": "Here."}, {"at": 2, "end": "completed"}]])
        async with asyncio.timeout(3600):
            await check_settled(h)
        assert h.kill_answer(h.kills[0]) == "Stopping the reply in this channel."
        subs = {s.message_id: s.submission.status for s in h.submissions}
        assert subs == {killed: "started", answered: "started"}
        assert statuses(h) == ["stopped_by_user", "completed"]
        [stopped] = h.records[0].turns
        assert [(t["event"], t["from"], t["to"]) for t in stopped.transitions] == [
            ("kill", "Preparing", "Stopped")
        ]
        assert h.records[0].closed_at == pytest.approx(start + 1.0, abs=EPS)
        assert [round(r.at - start, 6) for r in h.sends()] == [4.0]
        assert str(killed) not in h.provider.calls
