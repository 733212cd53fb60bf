"""The settings store in a SQLite file (the default): WAL mode, migrated on open, every call
on one worker thread so the event loop never waits on the disk.

One connection, one thread: SQLite serialises writers anyway, and a single thread keeps the
connection's state (its transaction, its pragmas) in one place. The schema's version is
SQLite's own `user_version`; each migration is a script run once, in a transaction. A file
that is not a database, one made by a newer version, one another process holds locked, or
one that cannot be written is refused at open with one line naming the file and the fix.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from .operator_settings import ScopeKind
from .settings_store import Choice, ChoiceKey, StoreError, UsageRow

T = TypeVar("T")

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE choices (
        scope TEXT NOT NULL, scope_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
        guild_id TEXT NOT NULL DEFAULT '', PRIMARY KEY (scope, scope_id, key));
    CREATE INDEX choices_by_guild ON choices (guild_id);
    CREATE TABLE resets (channel_id TEXT PRIMARY KEY, before_id INTEGER NOT NULL);
    CREATE TABLE usage (
        day TEXT NOT NULL, user_id TEXT NOT NULL, channel_id TEXT NOT NULL,
        guild_id TEXT NOT NULL, model TEXT NOT NULL,
        input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, replies INTEGER NOT NULL,
        PRIMARY KEY (day, user_id, channel_id, guild_id, model));
    CREATE INDEX usage_by_guild ON usage (day, guild_id);
    """,
)
"""Schema version N+1 is MIGRATIONS[N]; never edit one that has shipped, add the next."""


class SqliteStore:
    """`SettingsStore` over a SQLite file."""

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0) -> None:
        self.path = path
        self.description = f"SQLite file {path}"
        self._busy_timeout_s = busy_timeout_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="settings-db")
        self._db: sqlite3.Connection | None = None

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._db is None:
            raise StoreError(f"{self.path}: the settings database is closed")

        def call() -> T:
            if self._db is None:
                raise StoreError(f"{self.path}: the settings database is closed")
            try:
                return work(self._db)
            except sqlite3.Error as exc:
                raise StoreError(_explain(self.path, exc)) from None

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def open(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._open)

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.path.parent}: cannot create the data directory "
                             f"({type(exc).__name__}); set TURN_DATA_DIR or TURN_STORE__PATH"
                             ) from None
        try:
            db = sqlite3.connect(self.path, timeout=self._busy_timeout_s,
                                 isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(_explain(self.path, exc)) from None
        try:
            db.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: SQLite would not use WAL mode here ({mode}); "
                                 "put the file on a local disk")
            db.execute("PRAGMA synchronous = NORMAL")
            _migrate(db, self.path)
            # Prove the file can be written now, not when a user's choice would be lost.
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")
        except sqlite3.Error as exc:
            db.close()
            raise StoreError(_explain(self.path, exc)) from None
        except StoreError:
            db.close()
            raise
        self._db = db

    async def aclose(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            await asyncio.get_running_loop().run_in_executor(self._executor, db.close)
        self._executor.shutdown(wait=False)

    async def choices_for(self, guild_id: str | None, channel_id: str) -> list[Choice]:
        def read(db: sqlite3.Connection) -> list[Choice]:
            rows = db.execute(
                "SELECT scope, scope_id, key, value, guild_id FROM choices "
                "WHERE (scope = 'channel' AND scope_id = ?) OR (scope = 'guild' AND scope_id = ?)",
                (channel_id, guild_id or "")).fetchall()
            return [_choice(row) for row in rows]

        return await self._run(read)

    async def choices_in(self, guild_id: str) -> list[Choice]:
        def read(db: sqlite3.Connection) -> list[Choice]:
            rows = db.execute(
                "SELECT scope, scope_id, key, value, guild_id FROM choices WHERE guild_id = ? "
                "ORDER BY scope DESC, scope_id, key", (guild_id,)).fetchall()
            return [_choice(row) for row in rows]

        return await self._run(read)

    async def set_choice(self, choice: Choice) -> None:
        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO choices (scope, scope_id, key, value, guild_id) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (scope, scope_id, key) "
                "DO UPDATE SET value = excluded.value, guild_id = excluded.guild_id",
                (choice.scope, choice.scope_id, choice.key, choice.value,
                 choice.guild_id or ""))

        await self._run(write)

    async def clear_choice(self, scope: ScopeKind, scope_id: str, key: ChoiceKey) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "DELETE FROM choices WHERE scope = ? AND scope_id = ? AND key = ?",
                (scope, scope_id, key))
            return cursor.rowcount > 0

        return await self._run(write)

    async def reset_marker(self, channel_id: str) -> int | None:
        def read(db: sqlite3.Connection) -> int | None:
            row = db.execute("SELECT before_id FROM resets WHERE channel_id = ?",
                             (channel_id,)).fetchone()
            return int(row[0]) if row is not None else None

        return await self._run(read)

    async def set_reset_marker(self, channel_id: str, before_id: int) -> None:
        def write(db: sqlite3.Connection) -> None:
            db.execute("INSERT INTO resets (channel_id, before_id) VALUES (?, ?) "
                       "ON CONFLICT (channel_id) DO UPDATE SET before_id = "
                       "max(before_id, excluded.before_id)", (channel_id, before_id))

        await self._run(write)

    async def add_usage(self, row: UsageRow) -> None:
        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (day, user_id, channel_id, guild_id, model) DO UPDATE SET "
                "input_tokens = input_tokens + excluded.input_tokens, "
                "output_tokens = output_tokens + excluded.output_tokens, "
                "replies = replies + excluded.replies",
                (row.day, row.user_id, row.channel_id, row.guild_id or "", row.model,
                 row.input_tokens, row.output_tokens, row.replies))

        await self._run(write)

    async def usage(self, day: str, guild_id: str | None) -> list[UsageRow]:
        def read(db: sqlite3.Connection) -> list[UsageRow]:
            rows = db.execute(
                "SELECT day, user_id, channel_id, guild_id, model, input_tokens, output_tokens, "
                "replies FROM usage WHERE day = ? AND guild_id = ?",
                (day, guild_id or "")).fetchall()
            return [UsageRow(r[0], r[1], r[2], r[3] or None, r[4], r[5], r[6], r[7])
                    for r in rows]

        return await self._run(read)

    async def user_tokens(self, day: str, user_id: str) -> int:
        def read(db: sqlite3.Connection) -> int:
            row = db.execute(
                "SELECT coalesce(sum(input_tokens + output_tokens), 0) FROM usage "
                "WHERE day = ? AND user_id = ?", (day, user_id)).fetchone()
            return int(row[0])

        return await self._run(read)


def _choice(row: tuple[str, str, str, str, str]) -> Choice:
    scope, scope_id, key, value, guild_id = row
    return Choice(scope=scope, scope_id=scope_id, key=key, value=value,  # type: ignore[arg-type]
                  guild_id=guild_id or None)


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > len(MIGRATIONS):
        raise StoreError(f"{path}: made by a newer turn-engine (schema {version}, this one "
                         f"knows {len(MIGRATIONS)}); upgrade, or point TURN_STORE__PATH "
                         "elsewhere")
    for number in range(version, len(MIGRATIONS)):
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _statements(MIGRATIONS[number]):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {number + 1}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")


def _statements(script: str) -> list[str]:
    """A migration's statements (no semicolons inside them: they are plain DDL)."""
    return [part.strip() for part in script.split(";") if part.strip()]


def _explain(path: Path, exc: sqlite3.Error) -> str:
    """One line for what went wrong with the file, and what to do about it."""
    text = str(exc)
    lowered = text.lower()
    if "readonly" in lowered or "read-only" in lowered:
        return (f"{path}: the settings database is read-only; make the file and its "
                "directory writable by the bot, or set TURN_STORE__PATH")
    if "locked" in lowered or "busy" in lowered:
        return (f"{path}: the settings database is locked by another process; stop it, or "
                "give this bot its own TURN_STORE__PATH (many processes share settings "
                "through TURN_REDIS_URL)")
    if "not a database" in lowered or "malformed" in lowered or "corrupt" in lowered:
        return (f"{path}: not a usable SQLite database ({text}); move it away to start "
                "afresh, or restore a backup")
    if "unable to open" in lowered:
        return (f"{path}: cannot open the settings database ({text}); check that its "
                "directory exists and is writable")
    return f"{path}: settings database error: {text}"
