"""Bot processes sharing channels through a real redis-server (SPEC D3, D4, S7, S17): each
worker is the real `TurnBot` in a process of its own (tests/redis_worker.py) against the
Discord emulator this test runs. Real processes, so real time: every wait is on a condition
(an event a worker reports, a request the emulator sees) with a bound, never a sleep."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from discord_io.redis_backend.queue import UNAVAILABLE_TEXT
from discord_io.testing import DiscordEmulator, emulated_discord
from discord_io.testing.redis_server import RedisServer, running_redis

pytestmark = pytest.mark.asyncio


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A fresh redis-server per test, in its own directory (a unix socket path stays short)."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "redis_worker.py"
SEND = "POST /channels/{channel_id}/messages"
CALLBACK = "POST /interactions/{interaction_id}/{token}/callback"
TTL_S = 2.0
RENEW_S = 0.5
WAIT_S = 30.0


def answer(worker: str, n: int, end_at: float = 0.4) -> list[dict[str, Any]]:
    """A scripted pass whose text names the worker and the pass."""
    return [{"at": 0.05, "text": f"{worker} answer {n}"}, {"at": end_at, "end": "completed"}]


def stalled(worker: str) -> list[dict[str, Any]]:
    return [{"at": 0.05, "text": f"{worker} starts"}, {"at": 0.1, "stall": True}]


@dataclass
class BotProcess:
    name: str
    process: asyncio.subprocess.Process
    journals: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    reader: asyncio.Task[None] | None = None

    def origins(self) -> list[dict[str, Any]]:
        """The `origin` of every journal this worker wrote, in message order."""
        documents = [json.loads(path.read_text()) for path in self.journals.glob("*.json")]
        return sorted((d["origin"] for d in documents), key=lambda o: int(o["message_id"]))

    async def read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            event = json.loads(line)
            async with self.changed:
                self.events.append(event)
                self.changed.notify_all()

    async def send(self, op: str, payload: dict[str, Any] | None = None) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps({"op": op, "payload": payload}) + "\n").encode())
        await self.process.stdin.drain()

    async def wait(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first event matching `predicate`, once it is reported."""
        def found() -> list[dict[str, Any]]:
            return [e for e in self.events if predicate(e)]

        async with asyncio.timeout(WAIT_S), self.changed:
            await self.changed.wait_for(lambda: bool(found()))
        return found()[0]

    async def turn(self, kind: str, message: dict[str, Any]) -> dict[str, Any]:
        return await self.wait(lambda e: e["event"] == kind and e.get("message") == message["id"])

    def turns(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.process.pid, sig)


@dataclass
class Cluster:
    emu: DiscordEmulator
    redis: RedisServer
    workers: dict[str, BotProcess]

    def mention(self, text: str, *, channel: int | None = None,
                author: int | None = None) -> dict[str, Any]:
        return self.emu.add_message(channel or self.emu.channel_id, author or self.emu.alice_id,
                                    f"<@{self.emu.bot_id}> {text}", mentions=[self.emu.bot_id])

    async def deliver(self, worker: str, payload: dict[str, Any]) -> None:
        """Hand `payload` to `worker` as its gateway would; returns once it was submitted,
        so the order of deliveries is the order the queue sees."""
        bot = self.workers[worker]
        await bot.send("message", payload)
        await bot.wait(lambda e: e["event"] == "submitted" and e["message"] == payload["id"])

    def answers(self) -> list[dict[str, Any]]:
        return [r.json for r in self.emu.requests_to(SEND, status=200) if isinstance(r.json, dict)]

    async def finished(self, message: dict[str, Any]) -> dict[str, Any]:
        """The end of `message`'s turn, in whichever worker ran it."""
        waits = [asyncio.create_task(bot.turn("end", message)) for bot in self.workers.values()]
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return done.pop().result()

    async def answered(self, count: int) -> list[dict[str, Any]]:
        await self.emu.wait_for(lambda r: r.route == SEND, count=count, timeout=WAIT_S)
        return self.answers()


async def _spawn(name: str, emu: DiscordEmulator, redis: RedisServer,
                 passes: list[list[dict[str, Any]]], journals: Path) -> BotProcess:
    config = {"emulator": emu.base_url, "token": emu.token, "redis": redis.url,
              "worker": name, "passes": passes, "ttl_s": TTL_S, "renew_every_s": RENEW_S,
              "journals": str(journals)}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), json.dumps(config), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, cwd=ROOT, env=env)
    bot = BotProcess(name, process, journals)
    bot.reader = asyncio.create_task(bot.read())
    await bot.wait(lambda e: e["event"] == "ready")
    return bot


@asynccontextmanager
async def cluster(redis: RedisServer, passes: dict[str, list[list[dict[str, Any]]]]
                  ) -> AsyncIterator[Cluster]:
    async with emulated_discord() as (emu, _client):
        workers: dict[str, BotProcess] = {}
        try:
            for name, script in passes.items():
                journals = Path(tempfile.mkdtemp(prefix=f"journals-{name}-",
                                                 dir=redis.directory))
                workers[name] = await _spawn(name, emu, redis, script, journals)
            yield Cluster(emu, redis, workers)
        finally:
            for bot in workers.values():
                if bot.process.returncode is None:
                    bot.signal(signal.SIGCONT)
                    await bot.send("quit")
            for bot in workers.values():
                try:
                    await asyncio.wait_for(bot.process.wait(), WAIT_S)
                except TimeoutError:
                    bot.process.kill()
                    await bot.process.wait()
                if bot.reader is not None:
                    await asyncio.wait({bot.reader})
                print(bot.name, *bot.events, sep="\n  ")  # shown when the test fails


def _replied_to(message: dict[str, Any]) -> str | None:
    reference = message.get("message_reference")
    return str(reference["message_id"]) if reference else None


async def test_two_processes_share_channels_one_turn_per_channel(
        redis_server: RedisServer) -> None:
    # covers D4 across processes: whichever process a message reaches, each channel runs one
    # turn at a time, in arrival order, and every message is answered once
    passes = {"A": [answer("A", n) for n in range(4)], "B": [answer("B", n) for n in range(4)]}
    async with cluster(redis_server, passes) as c:
        second = c.emu.add_text_channel("second")
        plan = [("A", None), ("B", None), ("B", second), ("A", second), ("A", None),
                ("B", second)]
        sent = []
        for n, (worker, channel) in enumerate(plan):
            user = int(c.emu.add_user(f"user{n}")["id"])  # no follow-up interrupts (S17)
            payload = c.mention(f"question {n}", channel=channel, author=user)
            sent.append(payload)
            await c.deliver(worker, payload)
        answers = await c.answered(len(plan))
        assert sorted(_replied_to(m) or "" for m in answers) == sorted(p["id"] for p in sent)
        for payload in sent:
            await c.finished(payload)
        ends = [e for bot in c.workers.values() for e in bot.turns("end")]
        assert {e["status"] for e in ends} == {"completed"}
        starts = {e["message"]: e for bot in c.workers.values() for e in bot.turns("start")}
        finished = {e["message"]: e for e in ends}
        for channel in {p["channel_id"] for p in sent}:
            ids = [p["id"] for p in sent if p["channel_id"] == channel]
            spans = [(starts[i]["at"], finished[i]["at"]) for i in ids]
            assert spans == sorted(spans), "a channel's turns ran out of arrival order"
            assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))


async def test_kill_sent_to_the_other_process_stops_the_turn(redis_server: RedisServer) -> None:
    # covers D3, S7: the interaction reaches B, the turn runs in A
    async with cluster(redis_server, {"A": [stalled("A")], "B": []}) as c:
        trigger = c.mention("go on forever")
        await c.deliver("A", trigger)
        await c.workers["A"].turn("start", trigger)
        await c.workers["B"].send("interaction", c.emu.slash_command_payload("kill"))
        end = await c.workers["A"].turn("end", trigger)
        assert end["status"] == "stopped_by_user"
        [callback] = await c.emu.wait_for(lambda r: r.route == CALLBACK, timeout=WAIT_S)
        assert callback.json["data"]["content"] == "Stopping the reply in this channel."


async def test_follow_up_across_processes_interrupts_the_stream(
        redis_server: RedisServer) -> None:
    # covers S17 across processes: the same user's next message reaches B while A streams
    long_stream = [{"at": 0.05 * (i + 1), "text": "A " + "word " * 100} for i in range(200)]
    passes = {"A": [[*long_stream, {"at": 30, "end": "completed"}], answer("A", 2)], "B": []}
    async with cluster(redis_server, passes) as c:
        first, second = c.mention("tell me a story"), c.mention("actually, a short one")
        await c.deliver("A", first)
        await c.emu.wait_for(lambda r: r.route == SEND, timeout=WAIT_S)  # A is streaming
        await c.deliver("B", second)
        end = await c.workers["A"].turn("end", first)
        assert end["status"] == "follow_up_interrupt"
        after = await c.workers["A"].turn("end", second)
        assert after["status"] == "completed"
        assert c.workers["B"].turns("start") == []


async def test_worker_killed_mid_turn_is_taken_over_in_queue_order(
        redis_server: RedisServer) -> None:
    # covers D4 (crash): the lease lapses, another worker takes the channel over without a
    # new message and runs its queue in order; the turn in flight is lost, not retried.
    # (How soon after the lapse is the upkeep's schedule, `_run_upkeep`; these are real
    # processes on a possibly busy machine, so no wall-clock bound is asserted here.)
    passes = {"A": [stalled("A")], "B": [answer("B", 1), answer("B", 2)]}
    async with cluster(redis_server, passes) as c:
        m1, m2, m3 = (c.mention(f"message {n}") for n in (1, 2, 3))
        await c.deliver("A", m1)
        await c.workers["A"].turn("start", m1)
        await c.deliver("B", m2)
        await c.deliver("B", m3)
        c.workers["A"].signal(signal.SIGKILL)
        await c.workers["A"].process.wait()
        await c.workers["B"].turn("start", m2)
        await c.workers["B"].turn("end", m3)
        assert [e["message"] for e in c.workers["B"].turns("start")] == [m2["id"], m3["id"]]
        # each turn's owner (and journal name) carries its worker and fencing token
        fence_a = int(c.workers["A"].turns("start")[0]["owner"].rsplit(".f", 1)[1])
        owners = [e["owner"] for e in c.workers["B"].turns("start")]
        assert [o.split("@")[1].split(".f")[0] for o in owners] == ["B", "B"]
        assert [int(o.rsplit(".f", 1)[1]) for o in owners] == [fence_a + 1, fence_a + 2]
        # and their journals say so in fields of their own; A's lost turn wrote none
        assert c.workers["B"].origins() == [
            {"channel_id": str(c.emu.channel_id), "message_id": m["id"], "worker": "B",
             "fence": fence_a + n} for n, m in ((1, m2), (2, m3))]
        assert c.workers["A"].origins() == []
        replies = [_replied_to(m) for m in c.answers() if m["content"].startswith("B")]
        assert replies == [m2["id"], m3["id"]]
        assert not [m for m in c.answers() if _replied_to(m) == m1["id"]]
        takeover = [e for e in c.workers["B"].events if e["event"] == "log"
                    and "taken over" in e["message"]]
        assert takeover


async def test_frozen_worker_stops_itself_on_resume_and_sends_nothing_more(
        redis_server: RedisServer) -> None:
    # covers S7 (partition): A is frozen with SIGSTOP past its lease; B takes the channel
    # over; when A resumes, its turn stops before its next send (its pass ended meanwhile)
    passes = {"A": [answer("A", 1, end_at=1.5)], "B": [answer("B", 2)]}
    async with cluster(redis_server, passes) as c:
        m1, m2 = c.mention("first"), c.mention("second")
        await c.deliver("A", m1)
        await c.workers["A"].turn("start", m1)
        await c.deliver("B", m2)
        c.workers["A"].signal(signal.SIGSTOP)
        assert not [m for m in c.answers() if m["content"].startswith("A")], \
            "A sent before it was frozen: the machine is too slow for this test's script"
        await c.workers["B"].turn("end", m2)
        resumed_at = c.emu._now()
        c.workers["A"].signal(signal.SIGCONT)
        end = await c.workers["A"].turn("end", m1)
        assert end["status"] == "stopped_by_user"
        late = [r for r in c.emu.requests if r.at >= resumed_at and r.method != "GET"
                and isinstance(r.json, dict) and str(r.json.get("content", "")).startswith("A")]
        assert late == []
        assert not [m for m in c.answers() if m["content"].startswith("A")]
        assert [_replied_to(m) for m in c.answers()] == [m2["id"]]
        await c.workers["A"].wait(lambda e: e["event"] == "log" and "lease lost" in e["message"])


async def test_redis_restart_stops_running_turns_and_new_ones_get_a_notice(
        redis_server: RedisServer) -> None:
    # covers S7, D4: with Redis gone the running turn stops cleanly within its lease, a new
    # message gets a clear notice, and once Redis is back messages are answered again
    passes = {"A": [stalled("A")], "B": [answer("B", 1)]}
    async with cluster(redis_server, passes) as c:
        m1 = c.mention("long one")
        await c.deliver("A", m1)
        await c.workers["A"].turn("start", m1)
        redis_server.stop()
        end = await c.workers["A"].turn("end", m1)
        assert end["status"] == "stopped_by_user"
        m2 = c.mention("while it is down")
        await c.deliver("B", m2)
        [notice] = await c.emu.wait_for(
            lambda r: r.route == SEND and isinstance(r.json, dict)
            and r.json.get("content") == UNAVAILABLE_TEXT, timeout=WAIT_S)
        assert _replied_to(notice.json) == m2["id"]
        redis_server.start()
        m3 = c.mention("after it is back")
        await c.deliver("B", m3)
        assert (await c.workers["B"].turn("end", m3))["status"] == "completed"


async def test_duplicate_delivery_of_one_message_is_answered_once(
        redis_server: RedisServer) -> None:
    # covers D4: two gateway sessions of one shard (a deploy) both deliver the message
    passes = {"A": [answer("A", 1)], "B": [answer("B", 1)]}
    async with cluster(redis_server, passes) as c:
        m1 = c.mention("hello")
        await c.deliver("A", m1)
        await c.deliver("B", m1)  # returns once B's submit has answered (a duplicate)
        end = await c.finished(m1)
        assert end["status"] == "completed"
        starts = [e["message"] for bot in c.workers.values() for e in bot.turns("start")]
        assert starts == [m1["id"]]
        assert [_replied_to(m) for m in c.answers()] == [m1["id"]]
