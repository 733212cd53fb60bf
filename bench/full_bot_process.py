"""The bot process of the full-bot benchmark: `turn_engine.bot.serve` — the production
wiring (`build_client()`, an AutoShardedClient; the OpenAI adapter over aiohttp; journals on
disk) — pointed at the emulated Discord and the paced model of the driver, pinned to one
core, until SIGTERM. It records when each turn ended and how (`run_generation_turn` wrapped)
and when it asked discord.py for each message send, and writes that, with its CPU time and
optionally a CPU-time cProfile, as JSON. `"sweep": "discord.py"` in the config runs it with
discord.py's own bucket sweep (the side-by-side variant of BENCHMARKS.md 7c); `"speedups"`
names the ones of uvloop and orjson it runs with (7f; by default both, as the bot runs).

`python -m bench.full_bot_process CONFIG_JSON` (written by `bench.full_bot`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import discord
import yarl
from pydantic import SecretStr

from discord_io import rate_limits
from discord_io.history import recent_messages
from discord_io.history_cache import GatewayHistory
from discord_io.typing_indicator import TypingIndicator
from providers import ProviderConfig
from turn_engine import bot as bot_module
from turn_engine.event_loop import EventLoopChoice, run_on_event_loop
from turn_engine.settings import AppSettings, JournalSettings

from .profiling import profile_async


def _point_discord_py(config: dict[str, Any]) -> None:
    discord.http.Route.BASE = config["rest_base"]
    discord.Asset.BASE = config["cdn_base"]
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(config["gateway_url"])


def _record_turn_ends(ends: list[dict[str, Any]]) -> None:
    """Note each generation turn's end (monotonic clock, shared with the driver)."""
    original = getattr(bot_module, "run_generation_turn")  # noqa: B009 (patched below)

    async def recording(*args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        ends.append({"at": time.monotonic(), "status": result.status,
                     "channel": str(kwargs["channel"].channel_id)})
        return result

    setattr(bot_module, "run_generation_turn", recording)  # noqa: B010


def _record_send_calls(calls: list[tuple[str, float]]) -> None:
    """Note when the bot asks discord.py to send a message (before its rate limiter): with
    the emulator's admission of that send, the lag behind the rate-limit floor."""
    original = discord.http.HTTPClient.request

    async def recording(self: discord.http.HTTPClient, route: discord.http.Route,
                        **kwargs: Any) -> Any:
        if route.method == "POST" and route.path == "/channels/{channel_id}/messages":
            calls.append((str(route.channel_id), time.monotonic()))
        return await original(self, route, **kwargs)

    discord.http.HTTPClient.request = recording  # type: ignore[method-assign]


def _restore_discord_py_sweep(client: discord.Client) -> None:
    """The side-by-side variant: discord.py's own walk of every bucket on each new one
    (marked as amortized so that the delivery layer leaves it in place)."""
    http = client.http
    http._try_clear_expired_ratelimits = types.MethodType(  # type: ignore[method-assign]
        discord.http.HTTPClient._try_clear_expired_ratelimits, http)
    setattr(http, rate_limits._AMORTIZED, True)


def _requests_as_before() -> None:
    """The side-by-side variant of the requests per reply: the bot as it was before
    D50–D52, a typing post right after every message and every history read over REST."""
    original_init = TypingIndicator.__init__

    def typing_init(self: TypingIndicator, trigger: Any, *, interval_s: float = 8.0,
                    retype_after_s: float = 0.0) -> None:
        original_init(self, trigger, interval_s=interval_s, retype_after_s=0.0)

    async def read(self: GatewayHistory, channel: Any, *, limit: int,
                   before: Any = None) -> list[discord.Message]:
        return await recent_messages(channel, limit=limit, before=before)

    TypingIndicator.__init__ = typing_init  # type: ignore[method-assign]
    GatewayHistory.read = read  # type: ignore[method-assign]


def _stdlib_json() -> None:
    """The side-by-side variants without orjson (BENCHMARKS.md 7f): the standard library's
    JSON for discord.py (which takes orjson whenever it can import it), the SSE decoder and
    the journals, as the bot was before it adopted orjson."""
    import providers.json_text
    from turn_engine import journals

    discord.utils._from_json = json.loads
    discord.utils._to_json = lambda obj: json.dumps(obj, separators=(",", ":"),
                                                    ensure_ascii=True)
    providers.json_text.loads = json.loads  # type: ignore[assignment]
    journals.orjson_bytes = lambda *args, **kwargs: None  # type: ignore[assignment]


def prepared() -> tuple[dict[str, Any], list[tuple[str, float]]]:
    """A bot process of the benchmark set up from its config (argv[1]): pinned to its core,
    discord.py pointed at the emulator, its sends' calls recorded; the config and calls."""
    config = json.loads(Path(sys.argv[1]).read_text())
    if config.get("core") is not None:
        os.sched_setaffinity(0, {int(config["core"])})
    logging.basicConfig(level=logging.ERROR)
    for project in ("turn_engine", "discord_io", "fsm", "providers"):  # its own warnings too
        logging.getLogger(project).setLevel(logging.WARNING)
    _point_discord_py(config)
    calls: list[tuple[str, float]] = []
    _record_send_calls(calls)
    return config, calls


def main() -> int:
    config, calls = prepared()
    ends: list[dict[str, Any]] = []
    _record_turn_ends(ends)
    if config.get("requests") == "before":
        _requests_as_before()
    speedups = config.get("speedups")
    """None: as the bot runs (uvloop and orjson); otherwise the variant's speed-ups only."""
    if speedups is not None and "orjson" not in speedups:
        _stdlib_json()
    loop: EventLoopChoice = ("uvloop" if speedups is None or "uvloop" in speedups
                             else "asyncio")
    settings = AppSettings(
        discord_token=SecretStr(config["token"]),
        provider=ProviderConfig(kind="openai", model="bench", base_url=config["provider_url"]),
        journals=JournalSettings(dir=config["journal_dir"], max_files=None),
        data_dir=Path(config["journal_dir"]).parent / "data",  # its settings database
    )

    async def serve() -> int:
        client = bot_module.build_client()
        if config.get("sweep") == "discord.py":
            _restore_discord_py_sweep(client)
        return await bot_module.serve(settings, client=client)

    profile: dict[str, Any] | None = None
    if config.get("profile"):
        profile = profile_async(serve, per=max(1, int(config["turns"])), top=20,
                                timer=time.process_time)
    else:
        run_on_event_loop(serve(), loop)
    write_result(config, ends, calls, profile)
    return 0


def write_result(config: dict[str, Any], ends: list[dict[str, Any]],
                 calls: list[tuple[str, float]], profile: dict[str, Any] | None) -> None:
    """What the driver reads back: the turns' ends, the sends' calls, the process's CPU."""
    usage = os.times()
    Path(config["out"]).write_text(json.dumps({
        "ends": ends, "send_calls": calls, "cpu_s": usage.user + usage.system,
        "profile": profile}))


if __name__ == "__main__":
    raise SystemExit(main())
