"""A real redis-server for the Redis backend's tests and benchmarks: started on a private
unix socket in a directory of the caller's, stopped (or restarted) on request, never a fake."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

READY_LINE = b"ready to accept connections"
START_TIMEOUT_S = 20.0


@dataclass
class RedisServer:
    """One redis-server process on a unix socket under `directory`."""

    directory: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    log: list[bytes] = field(default_factory=list)
    _reader: threading.Thread | None = field(default=None, repr=False)

    @property
    def socket_path(self) -> Path:
        return self.directory / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self) -> None:
        """Start the server and return once it accepts connections (its own log says so)."""
        assert self.process is None, "already running"
        self.process = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", str(self.socket_path),
             "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
             "--dir", str(self.directory), "--maxmemory-policy", "noeviction",
             "--loglevel", "notice"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.starts += 1
        assert self.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        buffered = b""
        while READY_LINE not in buffered.lower():
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.process.stdout], [], [], max(left, 0))
            if not ready:
                self.stop()
                raise RuntimeError("redis-server did not become ready")
            chunk = os.read(self.process.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"redis-server exited: {buffered.decode(errors='replace')}")
            buffered += chunk
        self.log.append(buffered)
        # Keep reading its log: a full pipe would stall the server on its next log line.
        self._reader = threading.Thread(target=self._drain, args=(self.process.stdout,),
                                        daemon=True)
        self._reader.start()

    def _drain(self, stream: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := os.read(stream.fileno(), 4096):
                self.log.append(chunk)

    def stop(self) -> None:
        """Stop the server (its data is gone: no persistence) and wait for it to exit."""
        process, self.process = self.process, None
        if process is None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if self._reader is not None:
            self._reader.join(timeout=START_TIMEOUT_S)  # the pipe is at its end: it exited
            self._reader = None
        if process.stdout is not None:
            process.stdout.close()


@contextmanager
def running_redis(directory: Path) -> Iterator[RedisServer]:
    """A started server under `directory`, stopped on exit."""
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed: run scripts/setup.sh")
    server = RedisServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()
