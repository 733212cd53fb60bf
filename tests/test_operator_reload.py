"""Live reload of a real bot process (tests/operator_reload_process.py) by SIGHUP, and by a
file change with `reload.watch` (docs/spec.md M10): a valid turn.toml or persona file applies
from the next reply without a restart; an invalid one (a bad value, a missing persona file)
keeps the running settings and logs one line naming the mistake; a setting only a restart
can apply says so. Real processes, real time; timeouts only bound a hang."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from engine_support import ROOT

CHILD = ROOT / "tests" / "operator_reload_process.py"
BOUND_S = 60.0


class BotProcess:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.log: queue.Queue[str] = queue.Queue()
        self.lines: list[str] = []
        self.cursor = 0
        assert process.stderr is not None
        threading.Thread(target=self._drain, args=(process.stderr,), daemon=True).start()

    def _drain(self, stream: IO[str]) -> None:
        for line in stream:
            self.log.put(line.rstrip("\n"))

    def expect(self, prefix: str) -> str:
        """The next stdout line, which must start with `prefix`."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline().rstrip("\n")
        assert line.startswith(prefix), (line, self.logged())
        return line[len(prefix):].strip()

    def logged(self) -> list[str]:
        while True:
            try:
                self.lines.append(self.log.get_nowait())
            except queue.Empty:
                return self.lines

    def wait_log(self, needle: str) -> str:
        """The first log line containing `needle` after the one the last wait found."""
        self.logged()
        while True:
            for index in range(self.cursor, len(self.lines)):
                if needle in self.lines[index]:
                    self.cursor = index + 1
                    return self.lines[index]
            try:
                self.lines.append(self.log.get(timeout=BOUND_S))
            except queue.Empty:
                raise AssertionError(f"no log line with {needle!r}: {self.lines}") from None

    def ask(self, text: str = "hello") -> str | None:
        self.send(f"ask {text}")
        return json.loads(self.expect("REPLY "))["system"]  # type: ignore[no-any-return]

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def reload(self) -> None:
        self.process.send_signal(signal.SIGHUP)


@contextmanager
def bot_process(workdir: Path, **env: str) -> Iterator[BotProcess]:
    environment = {k: v for k, v in os.environ.items() if not k.upper().startswith("TURN_")}
    environment.update(PYTHONPATH=str(ROOT), TURN_LOG__LEVEL="INFO", **env)
    process = subprocess.Popen([sys.executable, str(CHILD)], cwd=workdir, env=environment,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    bot = BotProcess(process)
    try:
        bot.expect("READY")
        yield bot
        assert process.stdin is not None
        process.stdin.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(BOUND_S) == 0, bot.logged()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def write(path: Path, text: str) -> None:
    """Replace a file the way editors do (a new file renamed over the old one)."""
    fresh = path.with_suffix(path.suffix + ".new")
    fresh.write_text(text, encoding="utf-8")
    fresh.replace(path)


TOML = '''system_prompt = "{prompt}"
queue_limit = {queue_limit}

[journals]
enabled = false

[personas]
pirate = "pirate.toml"
{extra}'''


def turn_toml(prompt: str, *, queue_limit: int = 10, extra: str = "") -> str:
    return TOML.format(prompt=prompt, queue_limit=queue_limit, extra=extra)


def test_sighup_applies_a_valid_change_and_keeps_the_running_settings_on_a_bad_one(
    tmp_path: Path,
) -> None:
    # covers M10: turn.toml and a persona file re-read on SIGHUP, from the next reply
    write(tmp_path / "turn.toml", turn_toml("You are Alpha."))
    write(tmp_path / "pirate.toml", 'system_prompt = "Arr, version one."\n')
    with bot_process(tmp_path) as bot:
        assert bot.ask() == "You are Alpha."
        assert bot.send("persona pirate") is None and bot.expect("ANSWER ").startswith(
            "This server uses the persona pirate")
        assert bot.ask() == "Arr, version one."

        write(tmp_path / "pirate.toml", 'system_prompt = "Arr, version two."\n')
        write(tmp_path / "turn.toml", turn_toml("You are Beta."))
        bot.reload()
        bot.wait_log("settings reloaded: they apply from the next reply")
        assert bot.ask() == "Arr, version two."
        bot.send("persona default")
        bot.expect("ANSWER ")
        assert bot.ask() == "You are Beta."

        # a value out of range: one line naming it, nothing changes
        write(tmp_path / "turn.toml", turn_toml("You are Gamma.", queue_limit=0))
        bot.reload()
        refused = bot.wait_log("reload refused")
        assert refused.endswith("reload refused, the running settings stay: turn.toml: "
                                "queue_limit: Input should be greater than or equal to 1")
        assert bot.ask() == "You are Beta."

        # a persona file that is missing: one line naming it, nothing changes
        write(tmp_path / "turn.toml", turn_toml("You are Gamma.", extra='ghost = "ghost.toml"\n'))
        bot.reload()
        missing = bot.wait_log("reload refused")
        assert missing.endswith("personas.ghost (TURN_PERSONAS): cannot read the persona file "
                                "ghost.toml (FileNotFoundError)")
        assert bot.ask() == "You are Beta."

        # a setting only a restart applies: said so, the rest applies
        write(tmp_path / "turn.toml", 'data_dir = "elsewhere"\n' + turn_toml("You are Delta."))
        bot.reload()
        waiting = bot.wait_log("reload: data_dir")
        assert waiting.endswith("reload: data_dir (TURN_DATA_DIR) changed; it applies after a "
                                "restart (the settings database and the MCP logs are opened "
                                "there at start)")
        bot.wait_log("settings reloaded")
        assert bot.ask() == "You are Delta."
    assert not [line for line in bot.logged() if "Traceback" in line]


def test_with_watch_a_change_to_the_file_reloads_without_a_signal(tmp_path: Path) -> None:
    # covers M10: reload.watch polls the files and reloads when one changes
    write(tmp_path / "turn.toml", turn_toml("You are Alpha.",
                                            extra="\n[reload]\nwatch = true\ninterval_s = 0.2\n"))
    write(tmp_path / "pirate.toml", 'system_prompt = "Arr."\n')
    with bot_process(tmp_path) as bot:
        assert bot.ask() == "You are Alpha."
        write(tmp_path / "turn.toml", turn_toml(
            "You are Omega.", extra="\n[reload]\nwatch = true\ninterval_s = 0.2\n"))
        bot.wait_log("a settings file changed: reloading")
        bot.wait_log("settings reloaded")
        assert bot.ask() == "You are Omega."
