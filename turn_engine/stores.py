"""Which settings store the bot uses: Redis when `TURN_REDIS_URL` is set (every process sees
the same choices), otherwise the SQLite file under the data directory."""

from __future__ import annotations

from .settings import AppSettings
from .settings_store import SettingsStore, StoreError
from .sqlite_store import SqliteStore

DEFAULT_FILE = "settings.sqlite3"


def build_store(settings: AppSettings) -> SettingsStore:
    if settings.redis_url is not None:
        try:
            from .redis_store import RedisStore
        except ImportError as exc:
            raise StoreError("TURN_REDIS_URL is set but redis-py is missing: "
                             "pip install 'turn-engine[redis]'") from exc
        return RedisStore(settings.redis_url.get_secret_value())
    path = settings.store.path or settings.data_dir / DEFAULT_FILE
    return SqliteStore(path, busy_timeout_s=settings.store.busy_timeout_s)
