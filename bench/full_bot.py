"""Item 7: the whole bot, measured. The real bot process (`full_bot_process`: the production
`serve()` with `build_client()`, pinned to one core) runs against the emulated Discord —
REST with Discord's per-channel send buckets (5 per 5 s), and the gateway with two shards —
and a paced loopback model (`paced_provider`), both in this driver process on another core.
N channels each get one mention at once and stream a long reply; every tenth channel gets
`/kill` (an INTERACTION_CREATE) a second after its first message. At every N the raw loop
(`raw_loop_process`: plain discord.py + aiohttp, written for the benchmark) streams the same
replies into the same channels in the same run, as the floor a user would write by hand.

Per N it reports: mention to first message sent (p50/p99), how late each send that waited
out an exhausted bucket came after the bucket reopened (p99: the lag behind the rate-limit
floor), `/kill` to the turn ending Stopped in the bot process (p99, one monotonic clock),
the bot's CPU per turn and share of its core, its memory per active channel (peak RSS over
the RSS after READY), and whether every reply arrived whole. Optionally the largest N again
under cProfile: where the bot's time goes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from discord_io.testing.emulator import SEND_MESSAGE, DiscordEmulator, RecordedRequest

from .common import ROOT, Section, percentile, run_async
from .paced_provider import PacedProvider

TYPING = "POST /channels/{channel_id}/typing"
HISTORY = "GET /channels/{channel_id}/messages"
SIZES = (10, 100, 300, 1000)
QUICK_SIZES = (5, 20)
GOAL_CHANNELS = 1000
GOAL_LAG_P99_MS = 50.0
GOAL_KILL_P99_MS = 5.0
PARAGRAPH_CHARS = 900
PARAGRAPHS = 14  # about 7 messages of up to 2,000 characters: past the 5-per-5-s bucket
CHUNK_CHARS = 300
CHUNK_INTERVAL_S = 0.05
KILL_EVERY = 10
KILL_AFTER_FIRST_SEND_S = 1.0
READY_TIMEOUT_S = 120.0
QUIET_S = 20.0
RUN_TIMEOUT_S = 300.0
INCOMPLETE_SHOWN = 5
LOG_TAIL_CHARS = 4000


def reply_text() -> str:
    words = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit",
             "sed", "do"]
    paragraphs = []
    for p in range(PARAGRAPHS):
        body = " ".join(words[(p + i) % len(words)] for i in range(PARAGRAPH_CHARS // 6))
        paragraphs.append(f"{p} {body}"[:PARAGRAPH_CHARS])
    return "\n\n".join(paragraphs)


def _visible(text: str) -> int:
    """Characters other than whitespace (the splitter trims whitespace at its cuts)."""
    return len("".join(text.split()))


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _proc_waiting_s(pid: int) -> float:
    """How long the process's main thread (the bot's event loop) has been runnable but
    waiting for a CPU (`/proc/PID/schedstat`): the share of latency other processes cause."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _proc_rss(pid: int) -> int:
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _cores() -> tuple[int | None, int | None]:
    """(the bot's core, the driver's core): two different ones when there are two."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None, None
    return cores[0], cores[1]


@dataclass
class Run:
    """What one N measured (seconds unless named otherwise)."""

    channels: int
    first_send: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    kill_to_stopped: list[float] = field(default_factory=list)
    kill_to_answer: list[float] = field(default_factory=list)
    kill_at: dict[int, float] = field(default_factory=dict)
    bot_cpu_s: float = 0.0
    bot_waiting_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)
    active_s: float = 0.0
    driver_cpu_s: float = 0.0
    rss_ready: int = 0
    rss_peak: int = 0
    complete: int = 0
    expected_complete: int = 0
    stopped: int = 0
    sends: int = 0
    rate_limited: int = 0
    provider_requests: int = 0
    profile: dict[str, Any] | None = None
    per_reply: dict[str, float] = field(default_factory=dict)
    """REST requests per whole reply (sends, typing posts, history reads, all), over the
    channels that were not killed."""
    refused: dict[str, int] = field(default_factory=dict)
    """Every 429 the emulator answered, by scope (`global`, `user`: a route's bucket,
    `shared`)."""
    errors: int = 0
    """Tracebacks the bot process printed."""
    replies_per_s: float = 0.0
    """Whole replies over the time from the first mention to the last reply's last send."""
    incomplete: dict[str, list[tuple[float, str, int]]] = field(default_factory=dict)
    """For the first few replies that did not arrive whole (killed channels aside): each
    request of their channel (seconds after its mention, route, status), so that a run that
    misses replies shows where each stopped."""
    log_tail: str = ""
    """The bot process's last log lines (warnings and errors) when a reply was missing."""

    def summary(self) -> dict[str, Any]:
        n = self.channels
        return {
            "channels": n,
            "first_send_p50_ms": 1000 * percentile(self.first_send, 50),
            "first_send_p99_ms": 1000 * percentile(self.first_send, 99),
            "lag_p99_ms": 1000 * percentile(self.lags, 99),
            "lag_samples": len(self.lags),
            "kill_p99_ms": 1000 * percentile(self.kill_to_stopped, 99),
            "kill_answer_p99_ms": 1000 * percentile(self.kill_to_answer, 99),
            "kills": len(self.kill_to_stopped),
            "cpu_ms_per_turn": 1000 * self.bot_cpu_s / n,
            "bot_core_pct": 100 * self.bot_cpu_s / self.active_s if self.active_s else 0.0,
            "bot_waiting_pct": (100 * self.bot_waiting_s / self.active_s if self.active_s
                                else 0.0),
            "load_before": self.load[0], "load_after": self.load[1],
            "driver_core_pct": 100 * self.driver_cpu_s / self.active_s if self.active_s else 0.0,
            "kib_per_channel": (self.rss_peak - self.rss_ready) / 1024 / n,
            "complete": self.complete, "expected_complete": self.expected_complete,
            "stopped": self.stopped, "sends": self.sends, "rate_limited": self.rate_limited,
            "active_s": self.active_s, "per_reply": self.per_reply,
            "replies_per_s": self.replies_per_s, "errors": self.errors,
            "refused": self.refused,
            "incomplete": self.incomplete, "log_tail": self.log_tail,
        }


class Monitor:
    """Follows the emulator's requests as they arrive (incrementally: the request list gets
    long) and dispatches each kill a second after its channel's first message."""

    def __init__(self, emu: DiscordEmulator, channels: list[int], text: str,
                 mention_at: dict[int, float], kill: set[int]) -> None:
        self.emu = emu
        self.expected = _visible(text)
        self.mention_at = mention_at
        self.kill = kill
        self.first_send: dict[int, float] = {}
        self.delivered = dict.fromkeys(channels, 0)
        self.kill_at: dict[int, float] = {}
        self.answered_at: dict[int, float] = {}
        self._interactions: dict[str, int] = {}
        self.last_send = time.monotonic()
        self.last_send_of: dict[int, float] = {}
        self._seen = 0
        self._kills: list[asyncio.Task[None]] = []

    def complete(self) -> int:
        return sum(1 for c, n in self.delivered.items() if n >= self.expected
                   and c not in self.kill)

    async def follow(self, until_complete: int, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._scan()
            done = (self.complete() >= until_complete
                    and len(self.answered_at) == len(self.kill))
            if done or (self.first_send and time.monotonic() - self.last_send > QUIET_S):
                break
            await asyncio.sleep(0.02)
        for task in self._kills:
            task.cancel()

    def _scan(self) -> None:
        requests = self.emu.requests
        while self._seen < len(requests):
            r = requests[self._seen]
            if not r.status:
                break  # not answered yet: look again later
            self._seen += 1
            if r.route == SEND_MESSAGE and r.status == 200 and isinstance(r.json, dict):
                channel = int(r.params["channel_id"])
                self.last_send = self.last_send_of[channel] = r.at
                self.delivered[channel] += _visible(str(r.json.get("content", "")))
                if channel not in self.first_send:
                    self.first_send[channel] = r.at
                    if channel in self.kill:
                        self._kills.append(asyncio.create_task(self._kill_later(channel)))
            elif r.route.endswith("/callback"):
                killed = self._interactions.get(r.params["interaction_id"])
                if killed is not None:
                    self.answered_at[killed] = r.at

    async def _kill_later(self, channel: int) -> None:
        await asyncio.sleep(KILL_AFTER_FIRST_SEND_S)
        self.kill_at[channel] = time.monotonic()
        payload = await self.emu.gateway.interaction("kill", channel_id=channel)
        self._interactions[payload["id"]] = channel


async def _one_run(channels: int, *, profile: bool = False, sweep: str = "amortized",
                   requests: str = "now", raw: bool = False,
                   speedups: tuple[str, ...] | None = None, global_limit: bool = True,
                   kills: bool | None = None) -> Run:
    """`requests="before"`: the bot as it was before D50–D52 (a typing post right after
    every message, every history read over REST), side by side with the bot as it is.
    `raw`: the hand-written discord.py + aiohttp bot instead (`raw_loop_process`; it has no
    /kill, so no channel is killed). `global_limit=False` lifts Discord's 50 requests a
    second, so that the raw loop, which does not pace itself, delivers every reply too;
    `kills=False` kills no channel (both default to the run as 7 describes it)."""
    text = reply_text()
    emu = DiscordEmulator(validate=False)
    if not global_limit:
        emu.limits.global_limit = None
    emu.gateway.shards = 2
    second = emu.add_guild("second guild")
    emu.add_member(second, emu.alice_id)
    ids = [emu.add_text_channel(f"c{i}", guild_id=emu.guild_id if i % 2 else second)
           for i in range(channels)]
    emu.enable_buckets(5, 5.0)
    provider = PacedProvider(text, CHUNK_CHARS, CHUNK_INTERVAL_S)
    await emu.start()
    provider_url = await provider.start()
    bot_core, driver_core = _cores()
    if driver_core is not None:
        os.sched_setaffinity(0, {driver_core})
    run = Run(channels)
    with tempfile.TemporaryDirectory(prefix="full-bot-") as tmp:
        out = Path(tmp) / "bot.json"
        config = {"rest_base": emu.base_url, "cdn_base": emu.cdn_base,
                  "gateway_url": emu.gateway.url, "provider_url": provider_url,
                  "token": emu.token, "journal_dir": str(Path(tmp) / "journals"),
                  "out": str(out), "core": bot_core, "profile": profile, "turns": channels,
                  "sweep": sweep, "requests": requests,
                  "speedups": list(speedups) if speedups is not None else None}
        config_path = Path(tmp) / "config.json"
        config_path.write_text(json.dumps(config))
        module = "bench.raw_loop_process" if raw else "bench.full_bot_process"
        log_path = Path(tmp) / "stderr.log"  # a file: a chatty bot must not block on a pipe
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", module, str(config_path), cwd=ROOT,
                stdout=subprocess.DEVNULL, stderr=log_file)
        try:
            await _measure(emu, proc, ids, text, run,
                           kills=not raw if kills is None else kills and not raw)
        finally:
            if proc.returncode is None:
                proc.terminate()
            await proc.wait()
            stderr = log_path.read_bytes()
            run.errors = stderr.count(b"Traceback")
            if run.incomplete:
                run.log_tail = stderr.decode(errors="replace")[-LOG_TAIL_CHARS:]
            await emu.stop(check=False)
            await provider.stop()
            if driver_core is not None:
                os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        if not out.exists():
            raise RuntimeError(f"the bot process wrote no result:\n{stderr.decode()[-3000:]}")
        result = json.loads(out.read_text())
    run.provider_requests = len(provider.arrivals)
    _finish(run, result, emu)
    return run


async def _measure(emu: DiscordEmulator, proc: asyncio.subprocess.Process, ids: list[int],
                   text: str, run: Run, *, kills: bool = True) -> None:
    gateway = emu.gateway

    def ready() -> bool:
        sessions = [s for s in gateway.sessions.values() if s.connection is not None]
        return len(sessions) == 2 and (not kills or any(
            c.get("name") == "kill" for c in emu.commands.get(None, [])))

    await gateway.wait_for(ready, timeout=READY_TIMEOUT_S)
    await asyncio.sleep(3.0)  # discord.py waits out guild_ready_timeout before it is ready
    assert proc.pid is not None
    run.rss_ready = _proc_rss(proc.pid)
    cpu0, driver0, t0 = _proc_cpu_s(proc.pid), time.process_time(), time.monotonic()
    waiting0, load0 = _proc_waiting_s(proc.pid), _load()
    kill = set(ids[::KILL_EVERY]) if kills else set()
    mention_at: dict[int, float] = {}
    monitor = Monitor(emu, ids, text, mention_at, kill)
    peak = [run.rss_ready]

    async def sample_rss() -> None:
        while True:
            peak[0] = max(peak[0], _proc_rss(proc.pid))
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample_rss())
    since = len(emu.requests)
    for channel in ids:
        mention_at[channel] = time.monotonic()
        await gateway.message_create(channel, emu.alice_id, f"<@{emu.bot_id}> tell me a story",
                                     mentions=[emu.bot_id])
    await monitor.follow(len(ids) - len(kill), time.monotonic() + RUN_TIMEOUT_S)
    sampler.cancel()
    run.active_s = time.monotonic() - t0
    run.bot_cpu_s = _proc_cpu_s(proc.pid) - cpu0
    run.bot_waiting_s = _proc_waiting_s(proc.pid) - waiting0
    run.load = (load0, _load())
    run.driver_cpu_s = time.process_time() - driver0
    run.rss_peak = peak[0]
    run.first_send = [monitor.first_send[c] - mention_at[c] for c in monitor.first_send]
    run.complete = monitor.complete()
    run.expected_complete = len(ids) - len(kill)
    run.kill_to_answer = [monitor.answered_at[c] - monitor.kill_at[c]
                          for c in monitor.answered_at if c in monitor.kill_at]
    run.kill_at = monitor.kill_at
    whole = [c for c in ids if c not in kill and monitor.delivered[c] >= monitor.expected]
    answered = set(whole)
    missing = [c for c in ids if c not in kill and c not in answered][:INCOMPLETE_SHOWN]
    run.incomplete = _requests_of(emu.requests[since:], missing, mention_at)
    run.per_reply = requests_per_reply(emu.requests[since:], whole)
    if whole:
        run.replies_per_s = len(whole) / (max(monitor.last_send_of[c] for c in whole)
                                          - min(mention_at.values()))
    proc.terminate()
    await proc.wait()


def _finish(run: Run, result: dict[str, Any], emu: DiscordEmulator) -> None:
    kill_at = run.kill_at
    stopped = {int(e["channel"]): e["at"] for e in result["ends"]
               if e["status"] == "stopped_by_user"}
    run.stopped = len(stopped)
    run.kill_to_stopped = [stopped[c] - kill_at[c] for c in stopped if c in kill_at]
    run.lags = send_lags(result["send_calls"], emu)
    run.sends = len(emu.requests_to(SEND_MESSAGE, status=200))
    run.rate_limited = len(emu.requests_to(SEND_MESSAGE, status=429))
    run.refused = dict(emu.limits.refused)
    run.profile = result.get("profile")


def _requests_of(requests: list[RecordedRequest], channels: list[int],
                 mention_at: dict[int, float]) -> dict[str, list[tuple[float, str, int]]]:
    """Each request of `channels`: seconds after the channel's mention, route, status."""
    wanted = {str(c): mention_at[c] for c in channels}
    shown: dict[str, list[tuple[float, str, int]]] = {c: [] for c in wanted}
    for r in requests:
        channel = r.params.get("channel_id")
        if channel in wanted:
            shown[channel].append((round(r.at - wanted[channel], 3), r.route, r.status))
    return shown


def requests_per_reply(requests: list[RecordedRequest], channels: list[int]
                       ) -> dict[str, float]:
    """The REST requests of `channels` (each answered with one whole reply), per reply:
    every request the emulator recorded with the channel in its route."""
    wanted = {str(c) for c in channels}
    counts = {"sends": 0, "typing": 0, "history": 0, "all": 0, "refused": 0}
    for r in requests:
        if r.params.get("channel_id") not in wanted:
            continue
        counts["all"] += 1
        counts["refused"] += r.status == 429
        if r.route == SEND_MESSAGE:
            counts["sends"] += 1
        elif r.route == TYPING:
            counts["typing"] += 1
        elif r.route == HISTORY:
            counts["history"] += 1
    return {k: v / len(channels) for k, v in counts.items()} if channels else counts


def send_lags(calls: list[tuple[str, float]], emu: DiscordEmulator) -> list[float]:
    """Each send's lag behind its floor: the later of when the bot asked for it and when the
    emulator's bucket allowed it (the channel's sends go out one at a time, in order, so the
    k-th call is the k-th admission)."""
    reopened = {(w.bucket.rsplit(":", 1)[1], w.admitted_at): w.floor
                for w in emu.rate_limit_waits}
    asked: dict[str, list[float]] = {}
    for channel, at in calls:
        asked.setdefault(channel, []).append(at)
    lags = []
    for channel, times in asked.items():
        admitted = [r.at for r in emu.requests_to(SEND_MESSAGE, status=200)
                    if r.params["channel_id"] == channel]
        for call_at, admitted_at in zip(times, admitted, strict=False):
            floor = max(call_at, reopened.get((channel, admitted_at), call_at))
            lags.append(admitted_at - floor)
    return lags


def measure(sizes: tuple[int, ...] = SIZES, profile_largest: bool = True,
            compare_sweep: bool = False, compare_requests: bool = False,
            raw_loop: bool = True, compare_speedups: bool = False,
            compare_floor: bool = False) -> Section:
    """`compare_sweep` runs the largest N a second time, in the same run, with discord.py's
    own rate-limit bucket sweep instead of the amortized one (`discord_io.rate_limits`);
    `compare_requests` runs every N again with the requests per reply of before D50–D52
    (typing after every message, history over REST): the replies per second the global limit
    allows."""
    section = Section("full_bot", "7. The whole bot through the gateway (N channels "
                                  "streaming at once)")
    runs = [run_async(partial(_one_run, n)) for n in sizes]
    section.details["runs"] = [r.summary() for r in runs]
    if raw_loop:  # the floor: what a user would write by hand, at every N of the same run
        raws = [run_async(partial(_one_run, n, raw=True)).summary() for n in sizes]
        section.details["raw_loop"] = raws
        for ours, raw in zip(section.details["runs"], raws, strict=True):
            section.add(f"CPU per turn, the raw loop ÷ the bot (N={ours['channels']})",
                        raw["cpu_ms_per_turn"] / ours["cpu_ms_per_turn"], "×",
                        note=f"raw loop {raw['cpu_ms_per_turn']:.1f} ms, the bot "
                             f"{ours['cpu_ms_per_turn']:.1f} ms; raw replies whole "
                             f"{raw['complete']}/{raw['expected_complete']}")
    largest = runs[-1].summary()
    n = largest["channels"]
    if compare_sweep:
        before = run_async(partial(_one_run, n, sweep="discord.py")).summary()
        section.details["discord_py_sweep"] = before
        section.add(f"CPU per turn, discord.py's sweep ÷ amortized (N={n})",
                    before["cpu_ms_per_turn"] / largest["cpu_ms_per_turn"], "×")
    section.add(f"REST requests per whole reply (N={n})", largest["per_reply"].get("all", 0.0),
                "requests", goal="≤ 8 for a 7-message reply",
                met=largest["per_reply"].get("all", 99.0) <= 8.0,
                note=_per_reply_note(largest["per_reply"]))
    if compare_requests:
        _compare_requests(section, runs)
    if compare_speedups:
        _speedups(section, n)
    if compare_floor:
        _floor(section, n)
    section.add(f"mention → first message p50 (N={n})", largest["first_send_p50_ms"], "ms",
                note=_floor_note())
    section.add(f"mention → first message p99 (N={n})", largest["first_send_p99_ms"], "ms")
    section.add(f"send lag behind the rate-limit floor p99 (N={n})", largest["lag_p99_ms"],
                "ms", goal=f"≤ {GOAL_LAG_P99_MS:.0f} ms at N={GOAL_CHANNELS}",
                met=n >= GOAL_CHANNELS and largest["lag_p99_ms"] <= GOAL_LAG_P99_MS)
    section.add(f"/kill → turn Stopped p99 (N={n})", largest["kill_p99_ms"], "ms",
                goal=f"≤ {GOAL_KILL_P99_MS:.0f} ms at N={GOAL_CHANNELS}",
                met=n >= GOAL_CHANNELS and largest["kill_p99_ms"] <= GOAL_KILL_P99_MS)
    section.add(f"bot CPU per turn (N={n})", largest["cpu_ms_per_turn"], "ms")
    section.add(f"bot memory per active channel (N={n})", largest["kib_per_channel"], "KiB")
    section.add(f"replies complete (N={n})", largest["complete"], "turns",
                goal=f"all {largest['expected_complete']}",
                met=largest["complete"] == largest["expected_complete"])
    missed = not all(f.met for f in section.figures if f.met is not None)
    if profile_largest and missed:
        profiled = run_async(partial(_one_run, n, profile=True))
        section.details["profile"] = profiled.profile
        section.details["profiled_run"] = profiled.summary()
    return section


def _compare_requests(section: Section, runs: list[Run]) -> None:
    """Every N again, in the same run, with the requests per reply of before D50–D52: the
    replies per second the global limit allows, now ÷ before."""
    befores = []
    for run in runs:
        now = run.summary()
        n = now["channels"]
        before = run_async(partial(_one_run, n, requests="before")).summary()
        befores.append(before)
        section.add(f"REST requests per whole reply, before D50–D52 (N={n})",
                    before["per_reply"].get("all", 0.0), "requests",
                    note=_per_reply_note(before["per_reply"]))
        if before["replies_per_s"]:
            section.add(f"replies per second under the global limit, now ÷ before (N={n})",
                        now["replies_per_s"] / before["replies_per_s"], "×",
                        note=f"{now['replies_per_s']:.2f}/s against "
                             f"{before['replies_per_s']:.2f}/s; requests per reply "
                             f"{before['per_reply'].get('all', 0.0):.2f} → "
                             f"{now['per_reply'].get('all', 0.0):.2f}; 429s now "
                             f"{now['refused'] or 'none'}, before {before['refused'] or 'none'}")
    section.details["requests_before"] = befores


SPEEDUPS: dict[str, tuple[str, ...]] = {
    "asyncio, stdlib json": (), "uvloop": ("uvloop",), "orjson": ("orjson",),
    "uvloop + orjson": ("uvloop", "orjson")}
"""The event loop and JSON variants of 7f (`full_bot_process._stdlib_json`): the bot runs with
both; each variant keeps only its own."""


def _speedups(section: Section, n: int) -> None:
    """The largest N once per variant, interleaved in two rounds (the variants meet the same
    load), CPU per turn of each against the baseline's of the same round."""
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in SPEEDUPS}
    for order in (list(SPEEDUPS), list(reversed(SPEEDUPS))):
        for name in order:
            rounds[name].append(run_async(partial(_one_run, n, speedups=SPEEDUPS[name]))
                                .summary())
    section.details["speedups"] = rounds
    base = rounds["asyncio, stdlib json"]
    for name, runs in rounds.items():
        ratios = [r["cpu_ms_per_turn"] / b["cpu_ms_per_turn"] for r, b in zip(runs, base,
                                                                               strict=True)]
        per_turn = ", ".join(f"{r['cpu_ms_per_turn']:.2f}" for r in runs)
        section.add(f"CPU per turn, {name} ÷ asyncio with stdlib json (N={n})",
                    max(ratios), "×",
                    note=f"{', '.join(f'{r:.2f}' for r in ratios)} in the two rounds (the "
                         f"higher shown); {per_turn} ms a turn")


FLOOR: dict[str, dict[str, Any]] = {
    "the bot": {}, "the bot on asyncio, stdlib json": {"speedups": ()},
    "the raw loop": {"raw": True}}
"""The floor comparison of 7g: the same replies, each delivered whole, by the bot as it runs,
by the bot without uvloop and orjson (the raw loop has neither), and by the raw loop."""


def _floor(section: Section, n: int) -> None:
    """The largest N once per variant of `FLOOR`, interleaved in two rounds, with Discord's
    global limit lifted and no channel killed, so that every variant delivers every reply
    and CPU per turn is per the same work; then each under cProfile, for where it goes."""
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in FLOOR}
    for order in (list(FLOOR), list(reversed(FLOOR))):
        for name in order:
            rounds[name].append(run_async(partial(
                _one_run, n, global_limit=False, kills=False, **FLOOR[name])).summary())
    section.details["floor"] = rounds
    for name in ("the bot", "the bot on asyncio, stdlib json"):
        ratios = [raw["cpu_ms_per_turn"] / ours["cpu_ms_per_turn"]
                  for raw, ours in zip(rounds["the raw loop"], rounds[name], strict=True)]
        whole = ", ".join(f"{r['complete']}/{r['expected_complete']}"
                          for r in rounds["the raw loop"])
        section.add(f"CPU per turn, the raw loop ÷ {name}, every reply whole (N={n})",
                    max(ratios), "×",
                    note=f"{_listed(ratios)} in the two rounds (the higher shown); {name} "
                         f"{_listed(r['cpu_ms_per_turn'] for r in rounds[name])} ms, the raw "
                         f"loop {_listed(r['cpu_ms_per_turn'] for r in rounds['the raw loop'])}"
                         f" ms; raw replies whole {whole}")
    profiles = {}
    for name in ("the bot on asyncio, stdlib json", "the raw loop"):
        profiles[name] = run_async(partial(_one_run, n, global_limit=False, kills=False,
                                           profile=True, **FLOOR[name])).profile
    section.details["floor_profiles"] = profiles


def _listed(values: Iterable[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def floor_areas(section: Section) -> list[str]:
    """The floor comparison's profiles side by side: µs of self time per turn by area."""
    profiles = section.details.get("floor_profiles") or {}
    if not profiles:
        return []
    names = list(profiles)
    per_area: dict[str, dict[str, float]] = {}
    for name, profile in profiles.items():
        for area in profile["areas"]:
            per_area.setdefault(area["area"], {})[name] = area["us_per"]
    lines = ["| area (cProfile, CPU time, µs per turn) | " + " | ".join(names) + " |",
             "| --- |" + " ---: |" * len(names)]
    for area, row in sorted(per_area.items(), key=lambda kv: -max(kv[1].values())):
        lines.append(f"| {area} | " + " | ".join(f"{row.get(name, 0.0):,.0f}" for name in names)
                     + " |")
    return lines


def _per_reply_note(per_reply: dict[str, float]) -> str:
    return (f"{per_reply.get('sends', 0.0):.2f} sends, {per_reply.get('typing', 0.0):.2f} "
            f"typing, {per_reply.get('history', 0.0):.2f} history reads; "
            f"{per_reply.get('refused', 0.0):.2f} of all refused with a 429 (and sent again)")


def _floor_note() -> str:
    chunks_per_message = 2000 // CHUNK_CHARS
    floor_ms = 1000 * CHUNK_INTERVAL_S * chunks_per_message
    return (f"the model needs ≈{floor_ms:.0f} ms to stream a message's worth "
            f"({CHUNK_CHARS} chars every {1000 * CHUNK_INTERVAL_S:.0f} ms)")


def table(section: Section) -> list[str]:
    lines = ["| N | first msg p50 | p99 | lag p99 (samples) | /kill→Stopped p99 | "
             "/kill→answer p99 | CPU/turn | bot running | bot waiting for a CPU | driver "
             "core | KiB/channel | complete | sends | 429s | run | load avg |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
             "---: | ---: | ---: | ---: | ---: |"]
    variant = section.details.get("discord_py_sweep")
    rows = [("", r) for r in section.details.get("runs", [])]
    rows += [(" (discord.py's sweep)", variant)] if variant else []
    rows += [(" (requests before D50–D52)", before)
             for before in section.details.get("requests_before", [])]
    rows += [(" (raw loop)", raw) for raw in section.details.get("raw_loop", [])]
    for label, r in rows:
        lines.append(
            f"| {r['channels']:,}{label} | {r['first_send_p50_ms']:.0f} ms | "
            f"{r['first_send_p99_ms']:.0f} ms | {r['lag_p99_ms']:.1f} ms ({r['lag_samples']}) "
            f"| {r['kill_p99_ms']:.1f} ms | {r['kill_answer_p99_ms']:.1f} ms | "
            f"{r['cpu_ms_per_turn']:.1f} ms | {r['bot_core_pct']:.0f} % | "
            f"{r['bot_waiting_pct']:.0f} % | "
            f"{r['driver_core_pct']:.0f} % | {r['kib_per_channel']:.0f} | "
            f"{r['complete']}/{r['expected_complete']} | {r['sends']:,} | {r['rate_limited']} "
            f"| {r['active_s']:.0f} s | {r['load_before']:.1f}–{r['load_after']:.1f} |")
    return lines
