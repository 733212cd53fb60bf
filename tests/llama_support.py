"""The opt-in real-server tier's parts: tiny generated models and a llama.cpp server process.

`TURN_LLAMA_SERVER=/path/to/llama-server` turns the tier on; without it (or without the
`llama` extra, gguf and numpy, which generate the models) every test is skipped with the
reason. Models come from `tests/llama/make_gguf.py` into a temporary directory: a chain
model that writes " The quick brown fox jumps over the lazy dog." then stops (`eos`), loops
(`loop`), emits a `get_weather` tool call (`tool`), or writes a leading think block before
the sentence (`think`) or before the call (`think-tool`). Flags the binary may lack (such
as `--reasoning-format`) are checked against its `--help` (`supports`). Each server runs on a
free loopback port; its log is read line by line by a thread, so a test can wait for what the
server says (ready, a task cancelled) without sleeping.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVER_ENV = "TURN_LLAMA_SERVER"
MAKE_GGUF = Path(__file__).resolve().parent / "llama" / "make_gguf.py"
SENTENCE = " The quick brown fox jumps over the lazy dog."
THOUGHT = " Checking weather first."
"""What the `think` models write between `<think>` and `</think>`."""
START_TIMEOUT_S = 120.0
"""How long a server may take to load a model before the test fails (a bound, not a wait)."""


def server_binary() -> Path:
    """The llama-server binary, or skip with the reason the tier is off."""
    value = os.environ.get(SERVER_ENV)
    if not value:
        pytest.skip(f"real-server tier is opt-in: set {SERVER_ENV}=/path/to/llama-server")
    path = Path(value)
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{SERVER_ENV}={value} is not an executable file")
    for module in ("gguf", "numpy"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the tier generates its models with gguf and numpy: "
                        f"pip install -e '.[llama]' (missing {module})")
    return path


def supports(binary: Path, flag: str) -> bool:
    """Whether this llama-server build documents `flag` in its `--help`."""
    shown = subprocess.run([str(binary), "--help"], capture_output=True, text=True,
                           errors="replace", timeout=60, check=False)
    return flag in shown.stdout + shown.stderr


def make_model(directory: Path, end: str) -> Path:
    """A chain model that ends with `end` (eos, loop, tool, think, think-tool), generated in
    seconds."""
    out = directory / f"chain-{end}.gguf"
    if not out.exists():
        subprocess.run([sys.executable, str(MAKE_GGUF), str(out), "--kind", "chain",
                        "--end", end], check=True, capture_output=True)
    return out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _exit_reason(code: int | None) -> str:
    """How the server process ended, in words: a SIGILL means the binary was built for CPU
    instructions this machine lacks (rebuild it from source, README)."""
    if code is None:
        return "still running, never said it was listening"
    if code < 0:
        name = signal.Signals(-code).name
        hint = ": built for CPU instructions this machine lacks, rebuild it" \
            if name == "SIGILL" else ""
        return f"killed by {name}{hint}"
    return f"exit status {code}"


class LlamaServer:
    """One llama-server process on loopback, with its log kept in memory."""

    def __init__(self, binary: Path, model: Path, *, ctx: int = 2048,
                 extra: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            [str(binary), "-m", str(model), "-a", "chain", "--host", "127.0.0.1",
             "--port", str(self.port), "-c", str(ctx), "-t", "1", "-np", "1", "--jinja",
             "--log-colors", "off", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self.wait_for(r"listening on|server is listening", START_TIMEOUT_S):
            code = self.process.poll()
            self.close()
            raise RuntimeError(f"llama-server did not start ({_exit_reason(code)}):\n"
                               + self.log())

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout_s: float, start: int = 0) -> bool:
        """True once a log line from `start` on matches `pattern` (False if the process
        exits or `timeout_s` passes first)."""
        regex = re.compile(pattern)
        with self._changed:
            return self._changed.wait_for(
                lambda: any(regex.search(line) for line in self.lines[start:])
                or (self.process.poll() is not None and not self._reader.is_alive()),
                timeout_s,
            ) and any(regex.search(line) for line in self.lines[start:])

    def log(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def signal(self, number: int) -> None:
        self.process.send_signal(number)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=30)
        self._reader.join(timeout=30)


def running(binary: Path, model: Path, **options: object) -> Iterator[LlamaServer]:
    """A fixture body: a server for the duration of the fixture."""
    server = LlamaServer(binary, model, **options)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.close()
