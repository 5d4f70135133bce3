"""The database handle: engine, per-dialect transaction start, and the writer lock.

How writes are serialised (DESIGN §3):
- SQLite allows one writer. A write unit of work first takes an in-process `asyncio.Lock` (coroutines queue in
  FIFO order instead of busy-polling the file lock), then a connection, then `BEGIN IMMEDIATE`, which takes
  the database's RESERVED lock at once; another OS process waits on `busy_timeout`. A DEFERRED transaction
  that upgrades from read to write could fail with SQLITE_BUSY mid-way; IMMEDIATE cannot.
  pysqlite's own transaction handling is switched off (`isolation_level = None`) so we say when BEGIN happens.
- PostgreSQL uses READ COMMITTED and row locks (`SELECT … FOR UPDATE`), taken by the repositories when a use
  case asks for `lock=True`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from taskgate.domain.errors import InvalidInput

SUPPORTED = {"sqlite+aiosqlite": "sqlite", "postgresql+asyncpg": "postgresql"}


def redact(url: str) -> str:
    """The URL with its password hidden, for messages and `taskgate info`."""
    return make_url(url).render_as_string(hide_password=True)


class Database:
    """An async engine plus what it takes to run correct transactions on it. Nothing connects until used."""

    def __init__(
        self,
        url: str,
        *,
        busy_timeout_ms: int = 30_000,
        synchronous: str = "FULL",
        pool_size: int = 10,
        max_overflow: int = 20,
    ) -> None:
        parsed = make_url(url)
        self.dialect = SUPPORTED.get(parsed.drivername)
        if self.dialect is None:
            raise InvalidInput(
                f"unsupported database URL driver '{parsed.drivername}'; use sqlite+aiosqlite:///PATH "
                "or postgresql+asyncpg://USER@HOST/DB"
            )
        self.url = url
        self.engine: AsyncEngine = create_async_engine(url, **self._engine_options(pool_size, max_overflow))
        self._write_lock = asyncio.Lock() if self.is_sqlite else None
        if self.is_sqlite:
            self._install_sqlite_pragmas(busy_timeout_ms, synchronous)

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    def _engine_options(self, pool_size: int, max_overflow: int) -> dict[str, Any]:
        if self.is_sqlite:
            return {"pool_size": 5, "max_overflow": 10}
        return {"pool_size": pool_size, "max_overflow": max_overflow, "pool_pre_ping": False}

    def _install_sqlite_pragmas(self, busy_timeout_ms: int, synchronous: str) -> None:
        @event.listens_for(self.engine.sync_engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see module docstring)
            cursor = dbapi_connection.cursor()
            for pragma in (
                "journal_mode=WAL",
                "foreign_keys=ON",
                f"busy_timeout={int(busy_timeout_ms)}",
                f"synchronous={synchronous}",
            ):
                cursor.execute(f"PRAGMA {pragma}")
            cursor.close()

    async def acquire_writer(self) -> None:
        """Queue behind other writers of this process (SQLite only; PostgreSQL locks rows instead)."""
        if self._write_lock is not None:
            await self._write_lock.acquire()

    def release_writer(self) -> None:
        if self._write_lock is not None and self._write_lock.locked():
            self._write_lock.release()

    async def begin(self, conn: AsyncConnection, *, write: bool) -> None:
        """Start the transaction the way this dialect needs."""
        if self.is_sqlite:
            await conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
        else:
            await conn.begin()

    async def dispose(self) -> None:
        await self.engine.dispose()
