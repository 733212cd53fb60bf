"""Record journals of real turns against a real llama.cpp server, for the replay fixtures.

    .venv/bin/python scripts/record_llama_journals.py --base-url http://127.0.0.1:8082/v1 \
        --case plain --out tests/fixtures/journals/llama_plain_reply.json

Each case is one generation turn through the real engine, the real OpenAI-compatible
adapter over HTTP and the terminal chat's channel (`turn_engine.chat.TerminalChannel`, into
a buffer), recorded by the journal recorder exactly as the bot records one. The cases need
the server to run a model of the matching kind (llama.cpp's `llama-server` with a tiny model
from its `make_gguf.py`, see docs/scenarios.md):

- `plain` — `--kind chain --end eos`: a reply that completes;
- `tool` — `--end tool` with `--jinja`: a real `get_weather` tool call, twice, until the
  iteration cap (`max_iterations` 2);
- `idle` — `--end loop`: the server is stopped (SIGSTOP, `--server-pid`) after a few chunks
  for longer than the idle budget, so the turn times out and settles; it is resumed after;
- `kill` — `--end loop`: a `/kill` after a few chunks.

The suite never runs this: it replays the recorded journals (tests/test_replay_live.py).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fsm.engine.config import TurnConfig  # noqa: E402
from fsm.engine.generation import Attempt, run_generation_turn  # noqa: E402
from fsm.engine.locks import ChannelLockRegistry  # noqa: E402
from fsm.engine.prefill import TurnRequest  # noqa: E402
from fsm.engine.tools import FunctionTool, ToolContext, ToolRegistry, ToolResult  # noqa: E402
from fsm.engine.turn import Turn  # noqa: E402
from fsm.journal import JournalRecorder, journal_document, write_journal  # noqa: E402
from providers import ProviderConfig, build_provider  # noqa: E402
from turn_engine.chat import Screen, TerminalChannel  # noqa: E402

CHANNEL = "terminal"
CASES = ("plain", "tool", "idle", "kill")


class WeatherArgs(BaseModel):
    city: str


async def get_weather(args: WeatherArgs, _ctx: ToolContext) -> ToolResult:
    """A real tool with a real (short) wait, as a network call would have."""
    await asyncio.sleep(0.05)
    return ToolResult.ok({"city": args.city, "temp_c": 18, "sky": "clear"})


class WatchedChannel(TerminalChannel):
    """The terminal chat's channel, calling `after_chunks` once when chunk N is delivered."""

    def __init__(self, chunks: int, after_chunks: Any) -> None:
        super().__init__(Screen(io.StringIO(), io.StringIO()))
        self.left = chunks
        self.after_chunks = after_chunks

    async def deliver(self, text: str) -> None:
        await super().deliver(text)
        self.left -= 1
        if self.left == 0 and self.after_chunks is not None:
            self.after_chunks()


def config_for(case: str) -> TurnConfig:
    if case == "tool":
        return TurnConfig(max_iterations=2)
    if case == "idle":
        return TurnConfig(first_token_timeout_s=30, idle_timeout_s=10, settle_timeout_s=2)
    return TurnConfig(first_token_timeout_s=60, idle_timeout_s=30)


async def record(case: str, base_url: str, server_pid: int | None) -> dict[str, Any]:
    locks = ChannelLockRegistry()
    lock = locks.try_acquire(CHANNEL, owner=f"llama-{case}")
    assert lock is not None
    tools = ToolRegistry([FunctionTool(name="get_weather", description="Current weather",
                                       args_model=WeatherArgs, func=get_weather)]
                         if case == "tool" else [])
    loop = asyncio.get_running_loop()
    resume: list[asyncio.TimerHandle] = []

    def pause_server() -> None:
        assert server_pid is not None, "--server-pid is needed for the idle case"
        os.kill(server_pid, signal.SIGSTOP)
        resume.append(loop.call_later(14.0, os.kill, server_pid, signal.SIGCONT))

    trigger = {"idle": pause_server, "kill": lambda: locks.request_stop(CHANNEL)}.get(case)
    channel = WatchedChannel(chunks=6, after_chunks=trigger)
    history = [{"type": "dialogue", "role": "user", "author": "you", "message_id": "t1",
                "content": "What is the weather in Paris?" if case == "tool" else "hi"}]
    recorded: list[tuple[Turn, JournalRecorder]] = []

    def on_attempt(turn: Turn) -> None:
        recorder = JournalRecorder(turn.turn_id, turn.config, tools, request=turn.request,
                                   history=[{"id": "t1", "author": "you",
                                             "content": history[0]["content"]}])
        turn.recorder = recorder
        recorded.append((turn, recorder))

    async with aiohttp.ClientSession() as session:
        provider = build_provider(ProviderConfig(kind="openai", model="llama", base_url=base_url,
                                                 max_output_tokens=400), session)
        try:
            result = await run_generation_turn(
                [Attempt(provider, "openai:llama")], channel=channel, locks=locks, lock=lock,
                request=TurnRequest(context_items=history,
                                    system_prompt="You are a test model."),
                config=config_for(case), tools=tools, on_attempt=on_attempt)
        finally:
            for handle in resume:
                handle.cancel()
                if server_pid is not None:
                    os.kill(server_pid, signal.SIGCONT)
            locks.release(lock)
    (turn, recorder), = recorded
    print(f"{case}: {result.status}; {len(turn.transitions)} transitions", file=sys.stderr)
    return journal_document(recorder.scenario(), turn.transitions, turn.result().as_dict())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the server's /v1 URL (loopback)")
    parser.add_argument("--case", choices=CASES, required=True)
    parser.add_argument("--out", required=True, help="where the journal goes")
    parser.add_argument("--server-pid", type=int, help="the server's pid (the idle case)")
    args = parser.parse_args(argv)
    document = asyncio.run(record(args.case, args.base_url, args.server_pid))
    write_journal(Path(args.out), document)
    print(json.dumps(document["result"]["status"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
