"""Runs a module's selected tests against each of its mutants, one forked child per mutant:
the parent imports pytest and the third-party libraries once, each child forgets the project's
modules, imports them again with the one mutated module in place of the file (which is never
written), runs the tests with `-x` and exits with pytest's code. A child that outlives its
budget is killed and its mutant counted as killed (a hang is a failure)."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import resource
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, ModuleType

import pytest
from mutants import mutated_tree

ROOT = Path(__file__).resolve().parents[2]
CHILD_MEMORY_BYTES = 4 * 1024**3
KILL_AFTER_S = 10.0
"""How long past its per-test timeout (pytest-timeout, with a traceback) a child may take
before it is killed: a hang that even the timeout cannot interrupt."""


@dataclass(frozen=True)
class Outcome:
    """What the tests made of one mutant: `killed`, `timeout` (killed by the budget),
    `survived`, or `error` (the tests could not run: pytest's usage or collection codes)."""

    status: str
    seconds: float


class _MutantFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the mutated module in place of its file, under the file's name (tracebacks and
    `__file__` are the real ones)."""

    def __init__(self, name: str, path: Path, code: CodeType) -> None:
        self.name, self.path, self.code = name, path, code

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path, loader=self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(self.code, module.__dict__)


def module_name(path: Path) -> str:
    parts = list(path.resolve().relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _project_modules() -> list[str]:
    """Modules loaded from the checkout (the product, tests, conftest), not from the venv."""
    venv = str(ROOT / ".venv")
    names = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if file.startswith(str(ROOT)) and not file.startswith(venv):
            names.append(name)
    return names


def _pytest_args(tests: Sequence[str], budget_s: float) -> list[str]:
    return [*tests, "-x", "-q", "-n", "0", "-p", "no:cacheprovider", "-p", "no:randomly",
            "--no-header", "-o", "addopts=", f"--timeout={budget_s:.0f}"]


def warm(tests: Sequence[str]) -> None:
    """Imports everything the tests import, once, in the parent (children inherit it)."""
    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        pytest.main([*_pytest_args(tests, 600.0), "--collect-only"])
    finally:
        sys.stdout.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)


def _in_child(prepare: Callable[[], None], tests: Sequence[str], budget_s: float, *,
              log: str) -> int:
    pid = os.fork()
    if pid == 0:
        os.setsid()
        # A mutant that grows a buffer without end fails on memory, not the machine
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        code = 3
        os.environ["RELIABILITY_PROFILE"] = "mutation"  # no shrinking (tests/conftest.py)
        try:
            for name in _project_modules():
                del sys.modules[name]
            prepare()
            code = int(pytest.main(_pytest_args(tests, budget_s)))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + budget_s + KILL_AFTER_S  # pytest-timeout fails it first
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
    except BaseException:  # Ctrl-C or SIGTERM on the run: the child goes too
        _kill(pid)
        raise
    _kill(pid)
    return -signal.SIGKILL


def _kill(pid: int) -> None:
    """The child and whatever it started (it leads its own process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def run_tests(path: Path, number: int | None, tests: Sequence[str], budget_s: float,
              log: str) -> Outcome:
    """The tests against mutant `number` of `path` (None: against the module as it is)."""
    def prepare() -> None:
        if number is not None:
            source = path.read_text(encoding="utf-8")
            code = compile(mutated_tree(source, number), str(path), "exec")
            sys.meta_path.insert(0, _MutantFinder(module_name(path), path, code))

    started = time.monotonic()
    code = _in_child(prepare, tests, budget_s, log=log)
    seconds = time.monotonic() - started
    if code == -signal.SIGKILL:
        return Outcome("timeout", seconds)
    if code == 0:
        return Outcome("survived", seconds)
    if code == 1:
        return Outcome("killed", seconds)
    if code == 2 and _timed_out(log):
        return Outcome("timeout", seconds)
    return Outcome("error" if code in (3, 4, 5) else "killed", seconds)


def _timed_out(log: str) -> bool:
    try:
        return "Timeout" in Path(log).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
