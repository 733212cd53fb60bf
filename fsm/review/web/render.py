"""Graphviz's `dot` as the review page runs it: a process of its own, a few at a time, killed
when it runs past its time or writes more than its size budget, and every failure one line
(V3). The SVG it writes is then sanitised (`svg.sanitize_svg`) before the page gets it."""

from __future__ import annotations

import asyncio
import contextlib

from .budget import Budgets, OverBudget

STDERR_KEPT = 4096
READ_SIZE = 65536


class DrawingFailed(Exception):
    """`dot` is missing or failed; the message is one line, `status` the HTTP answer."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


async def _kept(stream: asyncio.StreamReader) -> bytes:
    """Everything `dot` writes to stderr is read (so it never blocks on a full pipe); the
    first `STDERR_KEPT` bytes are kept."""
    kept = bytearray()
    while chunk := await stream.read(READ_SIZE):
        kept += chunk[:max(0, STDERR_KEPT - len(kept))]
    return bytes(kept)


def _first_line(stderr: bytes) -> str:
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[0][:200] if lines else "no message"


class Drawer:
    """Runs `dot -Tsvg` within the budgets; `command` is the program (`dot` on the PATH)."""

    def __init__(self, budgets: Budgets, command: str = "dot") -> None:
        self.budgets = budgets
        self.command = command
        self._slots = asyncio.Semaphore(budgets.drawings)

    async def svg(self, dot: str) -> bytes:
        """The SVG of `dot`; OverBudget or DrawingFailed otherwise."""
        source = dot.encode("utf-8")
        if len(source) > self.budgets.dot_bytes:
            raise OverBudget(f"drawing: the diagram is {len(source)} bytes of DOT, more than "
                             f"the {self.budgets.dot_bytes} the page draws", status=413)
        try:
            async with asyncio.timeout(self.budgets.dot_s):
                async with self._slots:
                    return await self._run(source)
        except TimeoutError:
            raise OverBudget(f"drawing: graphviz's `dot` took longer than "
                             f"{self.budgets.dot_s:g} s; stopped it") from None

    async def _run(self, source: bytes) -> bytes:
        try:
            proc = await asyncio.create_subprocess_exec(
                self.command, "-Tsvg", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except FileNotFoundError:
            raise DrawingFailed("graphviz's `dot` is not installed (Debian package graphviz)",
                                503) from None
        except OSError as exc:
            raise DrawingFailed(f"graphviz's `dot` could not start: {exc.strerror or exc}",
                                503) from None
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        stderr = asyncio.create_task(_kept(proc.stderr))
        try:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(source)
                await proc.stdin.drain()
                proc.stdin.close()
            out = bytearray()
            while chunk := await proc.stdout.read(READ_SIZE):
                out += chunk
                if len(out) > self.budgets.svg_bytes:
                    raise OverBudget(f"drawing: graphviz's `dot` wrote more than "
                                     f"{self.budgets.svg_bytes} bytes; stopped it", status=413)
            code = await proc.wait()
            if code != 0:
                raise DrawingFailed(f"graphviz's `dot` failed (exit {code}): "
                                    f"{_first_line(await stderr)}", 502)
            return bytes(out)
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
            stderr.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stderr
