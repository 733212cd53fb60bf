"""Figures, timing, memory and process helpers shared by every benchmark."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


@dataclass(slots=True)
class Figure:
    """One measured number. `met` is None for figures that have no goal (context)."""

    name: str
    value: float
    unit: str
    goal: str | None = None
    met: bool | None = None
    note: str = ""
    spread: tuple[float, float] | None = None
    """Lowest and highest sample of a judged figure (`Section.judged`)."""
    samples: int = 0
    flag: str = ""
    """Why a goal figure has no verdict (impossible, unresolved: `bench.verdict`)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class Section:
    """The figures of one benchmark, plus details (profiles, tables, raw samples)."""

    key: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, value: float, unit: str, goal: str | None = None,
            met: bool | None = None, note: str = "") -> Figure:
        fig = Figure(name, float(value), unit, goal, met, note)
        self.figures.append(fig)
        return fig

    def judged(self, name: str, samples: Sequence[float], unit: str, *, goal: str,
               at_most: float | None = None, at_least: float | None = None,
               floor: float | None = None, note: str = "") -> Figure:
        """A goal figure from its samples (one per repeat): their median, their spread, and
        the verdict `bench.verdict.judge` gives — never "met" for an impossible value."""
        from .verdict import judge

        verdict = judge(samples, at_most=at_most, at_least=at_least, floor=floor)
        fig = Figure(name, verdict.value, unit, goal, verdict.met, note,
                     (verdict.low, verdict.high), verdict.samples, verdict.flag)
        self.figures.append(fig)
        return fig

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title,
                "figures": [f.as_dict() for f in self.figures], "details": self.details}


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), nearest-rank on the sorted values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def new_loop() -> asyncio.AbstractEventLoop:
    """A plain asyncio loop on the real monotonic clock (never looptime here)."""
    return asyncio.new_event_loop()


def run_async(factory: Callable[[], Awaitable[T]]) -> T:
    """Run one coroutine on a fresh real-clock loop and close it cleanly."""
    loop = new_loop()
    try:
        return loop.run_until_complete(factory())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


class Clock:
    """Wall and CPU time of a block: `with Clock() as c: ...; c.wall, c.cpu`."""

    wall = 0.0
    cpu = 0.0

    def __enter__(self) -> Clock:
        gc.collect()
        self._w = time.perf_counter()
        self._c = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._w
        self.cpu = time.process_time() - self._c


class GcTimer:
    """Time spent in the cyclic garbage collector while installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.collections = [0, 0, 0]
        self._start = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = int(line.split()[1]) / 1024 / 1024
                break
    except OSError:
        pass
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "memory_gib": round(mem_gib, 1),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in (
            "transitions", "aiohttp", "pydantic", "pydantic-ai-slim", "langgraph",
            "langgraph-prebuilt", "langchain-core", "pyinstrument")},
    }


def run_isolated(module: str, func: str, kwargs: dict[str, Any], timeout: float = 600.0
                 ) -> dict[str, Any]:
    """Run `bench.<module>.<func>(**kwargs)` in a fresh interpreter and return its JSON.

    Memory figures (RSS growth) are only meaningful in a process that has not already
    grown and freed memory, so they are measured in a child of their own.
    """
    cmd = [sys.executable, "-m", "bench._isolated", module, func, json.dumps(kwargs)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"isolated {module}.{func} failed ({proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"isolated {module}.{func} printed no result:\n{proc.stdout[-2000:]}")
    result = json.loads(lines[-1])
    assert isinstance(result, dict)
    return result


def fmt(value: float, unit: str) -> str:
    """A figure as people read it."""
    if math.isnan(value):
        return "n/a"
    if unit in ("×", "x"):
        return f"{value:.2f}×"
    if unit == "%":
        return f"{value:.1f} %"
    if abs(value) >= 1000:
        return f"{value:,.0f} {unit}"
    if abs(value) >= 100:
        return f"{value:.0f} {unit}"
    if abs(value) >= 10:
        return f"{value:.1f} {unit}"
    return f"{value:.2f} {unit}"


def module_at_commit(commit: str, path: str, name: str, package: str | None = None) -> Any:
    """The module at `path` as it was at `commit` (for before/after benchmarks in one run),
    or None without git history. `package` lets its relative imports resolve."""
    import importlib.util
    import subprocess
    import sys

    try:
        source = subprocess.run(
            ["git", "show", f"{commit}:{path}"], cwd=ROOT,
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    if package is not None:
        module.__package__ = package
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{path}@{commit}", "exec"), module.__dict__)
    return module
