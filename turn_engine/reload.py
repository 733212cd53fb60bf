"""Live reload: SIGHUP (and, with `TURN_RELOAD__WATCH=true`, a change to the files) re-reads
`turn.toml`, `.env` and the persona files; a valid change applies from the next reply, an
invalid one keeps the running settings and logs one line naming the mistake.

The settings are read off the event loop (they are files). A reload that asks for a setting
only a restart can apply (`live_settings.RESTART_ONLY`) applies the rest and says, in one
line per such setting, that it waits for a restart and why. The environment of the process
does not change, so a variable still overrides the file as it did at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import aiohttp

from discord_io.media_fetch import MediaFetcher
from fsm import Tool

from .live_settings import ENGINE_RESTART_ONLY, RESTART_ONLY, LiveSettings, RunningBot
from .setting_names import env_name
from .settings import DEFAULT_CONFIG_FILE, AppSettings, ConfigurationError, load_settings

log = logging.getLogger(__name__)

Loader = Callable[[], AppSettings]


class SettingsReloader:
    """Reloads the bot's settings on request; one reload at a time."""

    def __init__(self, bot: RunningBot, settings: AppSettings, session: aiohttp.ClientSession,
                 fetcher: MediaFetcher, all_builtins: Sequence[Tool], *,
                 load: Loader = load_settings) -> None:
        self.bot = bot
        self.settings = settings
        self._session = session
        self._fetcher = fetcher
        self._all_builtins = list(all_builtins)
        self._load = load
        self._running: asyncio.Task[bool] | None = None
        self._again = False
        self.reloads = 0
        """Reloads applied (a refused one does not count)."""

    def request(self) -> None:
        """Start a reload (a signal handler's job: it returns at once). A request while one
        runs makes it run once more afterwards, so the last edit always counts."""
        if self._running is not None and not self._running.done():
            self._again = True
            return
        self._running = asyncio.get_running_loop().create_task(self._reload_until_settled(),
                                                               name="settings-reload")

    async def _reload_until_settled(self) -> bool:
        applied = await self.reload()
        while self._again:
            self._again = False
            applied = await self.reload()
        return applied

    async def reload(self) -> bool:
        """Read and apply the settings; False (and one log line) when they are refused."""
        try:
            fresh = await asyncio.to_thread(self._load)
            live = LiveSettings.build(fresh, self._session, self._fetcher, self._all_builtins,
                                      with_operator=self.bot.operator is not None)
        except ConfigurationError as exc:
            log.error("reload refused, the running settings stay: %s", "; ".join(exc.problems))
            return False
        waiting = _restart_only_changes(self.settings, fresh)
        for line in waiting:
            log.warning("reload: %s", line)
        live.apply(self.bot)
        if self.bot.operator is not None:
            self.bot.operator.catalog.configure(fresh.mcp_servers)
        self.settings = fresh
        self.reloads += 1
        log.info("settings reloaded: they apply from the next reply%s",
                 f" ({len(waiting)} wait for a restart)" if waiting else "")
        return True

    @contextlib.contextmanager
    def installed(self) -> Iterator[SettingsReloader]:
        """SIGHUP reloads while inside (where the loop supports signals); with
        `reload.watch`, so does a change to the configuration or a persona file."""
        loop = asyncio.get_running_loop()
        hooked = False
        with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
            loop.add_signal_handler(signal.SIGHUP, self.request)
            hooked = True
        watcher = (loop.create_task(self.watch(), name="settings-watch")
                   if self.settings.reload.watch else None)
        try:
            yield self
        finally:
            if hooked:
                loop.remove_signal_handler(signal.SIGHUP)
            if watcher is not None:
                watcher.cancel()

    async def watch(self) -> None:
        """Reload when a watched file's modification time changes (polled: nothing to
        install, and an editor's save-by-rename is seen like any other write)."""
        seen = await asyncio.to_thread(_stamps, self.watched_files())
        while True:
            await asyncio.sleep(self.settings.reload.interval_s)
            now = await asyncio.to_thread(_stamps, self.watched_files())
            if now != seen:
                seen = now
                log.info("a settings file changed: reloading")
                self.request()

    def watched_files(self) -> list[Path]:
        s = self.settings
        named = os.environ.get("TURN_CONFIG_FILE")
        files = [Path(named) if named else Path(DEFAULT_CONFIG_FILE), Path(".env"),
                 *s.personas.values()]
        if s.system_prompt_file is not None:
            files.append(s.system_prompt_file)
        return files


def _stamps(files: Sequence[Path]) -> dict[Path, float | None]:
    stamps: dict[Path, float | None] = {}
    for path in files:
        try:
            stamps[path] = path.stat().st_mtime
        except OSError:
            stamps[path] = None
    return stamps


def _restart_only_changes(running: AppSettings, fresh: AppSettings) -> list[str]:
    lines = []
    for name, why in RESTART_ONLY.items():
        if getattr(running, name) != getattr(fresh, name):
            lines.append(f"{name} ({env_name([name])}) changed; it applies after a restart "
                         f"({why})")
    for name, why in ENGINE_RESTART_ONLY.items():
        if getattr(running.engine, name) != getattr(fresh.engine, name):
            lines.append(f"engine.{name} ({env_name(['engine', name])}) changed; it applies "
                         f"after a restart ({why})")
    return lines
