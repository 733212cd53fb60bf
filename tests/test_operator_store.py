"""The settings store (docs/spec.md M7): SQLite by default — a file under the data directory,
created and migrated at start, WAL mode, every call off the event loop — and Redis with
TURN_REDIS_URL (a real redis-server), both keeping one contract. A corrupt, locked or
read-only file stops the real bot process with one line before it connects; a write that
fails at run time is said to the user, and nothing pretends to be saved."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from operator_support import MANAGE_GUILD, answers, operator_bot, operator_discord

from discord_io.testing.redis_server import RedisServer, running_redis
from turn_engine.redis_store import RedisStore
from turn_engine.settings import AppSettings
from turn_engine.settings_store import Choice, SettingsStore, UsageRow
from turn_engine.sqlite_store import MIGRATIONS, SqliteStore
from turn_engine.stores import build_store

from engine_support import ROOT

BOUND_S = 60.0


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest_asyncio.fixture(params=["sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SettingsStore]:
    if request.param == "sqlite":
        made: SettingsStore = SqliteStore(tmp_path / "data" / "settings.sqlite3")
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        redis_store = RedisStore(server.url)
        await redis_store.open()
        await redis_store._redis.flushdb()
        made = redis_store
    await made.open()
    yield made
    await made.aclose()


@pytest.mark.asyncio
async def test_both_stores_keep_the_same_contract(store: SettingsStore) -> None:
    # covers M7: choices per server and channel, reset markers that never move back, usage
    # counters added up per day, the quota's per-user total
    await store.set_choice(Choice("guild", "g1", "model", "smart", "g1"))
    await store.set_choice(Choice("channel", "c1", "persona", "pirate", "g1"))
    await store.set_choice(Choice("channel", "c1", "model", "fast", "g1"))
    await store.set_choice(Choice("channel", "c9", "model", "other", "g9"))
    found = sorted(await store.choices_for("g1", "c1"), key=lambda c: (c.scope, c.key))
    assert [(c.scope, c.key, c.value) for c in found] == [
        ("channel", "model", "fast"), ("channel", "persona", "pirate"), ("guild", "model", "smart")]
    assert {(c.scope_id, c.key) for c in await store.choices_in("g1")} == {
        ("g1", "model"), ("c1", "persona"), ("c1", "model")}
    assert await store.clear_choice("channel", "c1", "model") is True
    assert await store.clear_choice("channel", "c1", "model") is False
    assert await store.reset_marker("c1") is None
    await store.set_reset_marker("c1", 500)
    await store.set_reset_marker("c1", 300)
    assert await store.reset_marker("c1") == 500
    for _ in range(2):
        await store.add_usage(UsageRow("2026-01-02", "u1", "c1", "g1", "openai:m", 100, 10))
    await store.add_usage(UsageRow("2026-01-02", "u1", "dm", None, "openai:m", 5, 5))
    [row] = await store.usage("2026-01-02", "g1")
    assert (row.input_tokens, row.output_tokens, row.replies) == (200, 20, 2)
    assert [r.channel_id for r in await store.usage("2026-01-02", None)] == ["dm"]
    assert await store.user_tokens("2026-01-02", "u1") == 230
    assert await store.user_tokens("2026-01-03", "u1") == 0


@pytest.mark.asyncio
async def test_sqlite_is_created_under_the_data_directory_migrated_and_in_wal_mode(
    tmp_path: Path,
) -> None:
    # covers M7: the default file, its schema version, WAL; reopened, nothing is lost
    settings = AppSettings.model_validate({"data_dir": str(tmp_path / "data")})
    made = build_store(settings)
    assert isinstance(made, SqliteStore)
    assert made.path == tmp_path / "data" / "settings.sqlite3"
    await made.open()
    await made.set_choice(Choice("channel", "c1", "model", "smart", None))
    await made.aclose()
    with sqlite3.connect(made.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    again = SqliteStore(made.path)
    await again.open()
    assert [c.value for c in await again.choices_for(None, "c1")] == ["smart"]
    await again.aclose()


def _bot_process(tmp_path: Path, store: Path, *, drop_root: bool = False,
                 **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m turn_engine` as the bot (a token and a provider), with the store at
    `store`; it must stop before it ever contacts Discord (the address is unroutable)."""
    environment = {k: v for k, v in os.environ.items() if not k.upper().startswith("TURN_")}
    environment.update(
        PYTHONPATH=str(ROOT), TURN_DISCORD_TOKEN="not-a-real-token",
        TURN_PROVIDER='{"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}',
        TURN_STORE__PATH=str(store), TURN_JOURNALS__ENABLED="false", **env)
    command = [sys.executable, "-m", "turn_engine"]
    if drop_root and os.geteuid() == 0:
        # root writes any file; without these capabilities the file's modes bind it too
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: a read-only file cannot bind root")
        command = [setpriv, "--bounding-set", "-dac_override,-dac_read_search", *command]
    return subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True,
                          text=True, timeout=BOUND_S, check=False)


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1, done.stderr
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    return errors[0]


def test_a_corrupt_database_file_is_one_line_at_start(tmp_path: Path) -> None:
    # covers M7: not a database; the file is left as it was for the operator to look at
    store = tmp_path / "settings.sqlite3"
    store.write_bytes(b"this is no sqlite file, it is a shopping list\n" * 200)
    line = _one_error_line(_bot_process(tmp_path, store))
    assert line == (f"error: {store}: not a usable SQLite database (file is not a database); "
                    "move it away to start afresh, or restore a backup")
    assert store.read_bytes().startswith(b"this is no sqlite file")


def test_a_database_locked_by_another_process_is_one_line_at_start(tmp_path: Path) -> None:
    # covers M7: another process holds the write lock for longer than the busy timeout
    store = tmp_path / "settings.sqlite3"
    holder = sqlite3.connect(store, isolation_level=None)
    holder.execute("PRAGMA journal_mode = WAL")
    holder.execute("CREATE TABLE mine (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        line = _one_error_line(_bot_process(tmp_path, store, TURN_STORE__BUSY_TIMEOUT_S="0.2"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert line == (f"error: {store}: the settings database is locked by another process; "
                    "stop it, or give this bot its own TURN_STORE__PATH (many processes share "
                    "settings through TURN_REDIS_URL)")


def test_a_read_only_database_file_is_one_line_at_start(tmp_path: Path) -> None:
    # covers M7: the file and its directory cannot be written by the bot
    folder = tmp_path / "ro"
    folder.mkdir()
    store = folder / "settings.sqlite3"
    with sqlite3.connect(store) as db:
        db.execute("CREATE TABLE kept (x)")
    store.chmod(0o444)
    folder.chmod(0o555)
    try:
        line = _one_error_line(_bot_process(tmp_path, store, drop_root=True))
    finally:
        folder.chmod(0o755)
        store.chmod(0o644)
    assert line == (f"error: {store}: the settings database is read-only; make the file and "
                    "its directory writable by the bot, or set TURN_STORE__PATH")


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_write_that_fails_at_run_time_is_said_and_nothing_pretends(
    tmp_path: Path,
) -> None:
    # covers M7, M3: the store cannot take the choice; the user is told, the reply unchanged
    async with operator_discord() as emu, operator_bot(
            emu, tmp_path / "s.sqlite3", {"default": answers("default"), "smart": answers()}) as o:
        assert isinstance(o.side.store, SqliteStore)
        await o.side.store.aclose()  # the database goes away under the running bot
        answer = await o.command("model", {"name": "smart"}, permissions=MANAGE_GUILD)
        assert answer == (f"That could not be saved ({tmp_path / 's.sqlite3'}: the settings "
                          "database is closed); nothing changed.")
        await o.h.say("hello")
        await o.h.idle()
        assert o.bot_replies() == ["default"]


@pytest.mark.asyncio
async def test_with_redis_two_bots_see_one_choice(redis_server: RedisServer,
                                                  tmp_path: Path) -> None:
    # covers M7: a choice made through one process applies in another (shared Redis)
    first, second = RedisStore(redis_server.url), RedisStore(redis_server.url)
    await first.open()
    await first._redis.flushdb()
    await second.open()
    models = {"default": answers("default"), "smart": answers("smart")}
    async with operator_discord() as emu:
        async with operator_bot(emu, tmp_path / "unused", models, store=first) as o:
            await o.command("model", {"name": "smart"}, permissions=MANAGE_GUILD)
        async with operator_bot(emu, tmp_path / "unused", models, store=second) as other:
            await other.h.say("which model?")
            await other.h.idle()
            assert other.bot_replies()[-1] == "smart"
