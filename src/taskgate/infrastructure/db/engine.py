"""The database handle: engines, connections with the right transaction start, and the writer lock.

SQLite runs **inline**: a synchronous SQLAlchemy connection (the stdlib `sqlite3` driver) called on the event
loop thread, wrapped in `InlineConnection`, which has the `AsyncConnection` methods the repositories use.
Why not aiosqlite: every statement through SQLAlchemy's aiosqlite adapter makes 3–4 hops to the driver's
thread, and on this project's machines a hop costs 100–450 µs, while the statement itself costs 10–60 µs
(measured: one primary-key SELECT 1,784 µs via aiosqlite, 186 µs inline; docs/decisions.md). SQLite calls
are in-process and short; the only long waits are for another process's write lock, and those are taken
without blocking the loop (below). PostgreSQL runs on asyncpg through SQLAlchemy's async engine.

How writes are serialised (DESIGN §3):
- SQLite allows one writer. A write unit of work first takes its process's writer turn (coroutines queue
  in FIFO order; concurrent writers share one COMMIT, see commit_group.py), then a connection, then
  `BEGIN IMMEDIATE`, which takes the database's write lock at once:
  a DEFERRED transaction that upgrades from read to write can fail with SQLITE_BUSY mid-way; IMMEDIATE
  cannot. Connections run with `busy_timeout=0`, so a lock held by another OS process makes BEGIN fail at
  once; it is retried with `asyncio.sleep` backoff until `sqlite.busy_timeout_ms`, so the loop never blocks.
  pysqlite's own transaction handling is off (`isolation_level = None`); a `begin` listener emits BEGIN
  (or the BEGIN IMMEDIATE a write unit asked for), so `engine.begin()` is a real transaction too.
- PostgreSQL uses READ COMMITTED and row locks (`SELECT … FOR UPDATE`), taken by the repositories when a use
  case asks for `lock=True`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import OperationalError

from taskgate.domain.errors import ConcurrentModification, InvalidInput
from taskgate.infrastructure.db.commit_group import MAX_MEMBERS, CommitGroups
from taskgate.infrastructure.db.driver_statements import DriverStatements, run_bare

if TYPE_CHECKING:  # the asyncio extension (and the ORM it pulls in) loads only for PostgreSQL: ~70 ms of start-up
    from sqlalchemy.ext.asyncio import AsyncEngine

    from taskgate.infrastructure.db.pg_writes import PgWriteConnection
from taskgate.infrastructure.db.connections import AnyConnection, InlineConnection

SUPPORTED = {
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite",
    "sqlite+aiosqlite": "sqlite",  # accepted for compatibility; runs inline like plain sqlite (see above)
    "postgresql+asyncpg": "postgresql",
}
_BEGIN_KEY = "taskgate_begin"


def redact(url: str) -> str:
    """The URL with its password hidden, for messages and `taskgate info`."""
    return make_url(url).render_as_string(hide_password=True)


class Database:
    """The engine for one database URL, plus what it takes to run correct transactions on it.

    Nothing connects until used. Raises: InvalidInput for an unsupported URL.
    """

    def __init__(
        self,
        url: str,
        *,
        busy_timeout_ms: int = 30_000,
        synchronous: str = "FULL",
        pool_size: int = 10,
        max_overflow: int = 20,
        group_commit_max: int = MAX_MEMBERS,
    ) -> None:
        parsed = make_url(url)
        self.dialect = SUPPORTED.get(parsed.drivername)
        if self.dialect is None:
            raise InvalidInput(
                f"unsupported database URL driver '{parsed.drivername}'; use sqlite:///PATH "
                "or postgresql+asyncpg://USER@HOST/DB"
            )
        self.url = url
        self.lock_timeout = busy_timeout_ms / 1000
        # SQLite's writers of this process queue for one turn and share COMMITs (commit_group.py)
        self.groups: CommitGroups | None = None
        self._writer: InlineConnection | None = None  # the commit groups' connection, kept open (_begin_group)
        self._driver: DriverStatements | None = None  # SQLite's hot statements, run on the driver
        if self.is_sqlite:
            self.engine: Engine | AsyncEngine = _sqlite_engine(parsed.set(drivername="sqlite+pysqlite"), synchronous)
            self.groups = CommitGroups(self._begin_group, max_members=group_commit_max)
            from taskgate.infrastructure.db.statements import (
                hot_statements,  # the tables' module: only for SQLite handles
            )

            self._driver = DriverStatements(self.engine.dialect, hot_statements())
        else:
            from sqlalchemy.ext.asyncio import create_async_engine

            from taskgate.infrastructure.db.pg_kept import KEEP, KeptWriterConnections
            from taskgate.infrastructure.db.pg_writes import PgStatements
            from taskgate.infrastructure.db.statements import pg_hot_statements

            self.engine = create_async_engine(url, pool_size=pool_size, max_overflow=max_overflow)
            # Write units run their transaction on asyncpg (pg_writes.py): SQLAlchemy's adapter must not begin one of
            # its own on the connection, so their connections are checked out in AUTOCOMMIT (same pool; SQLAlchemy
            # resets the level when the connection goes back).
            self._pg_writers = KeptWriterConnections(
                self.engine.execution_options(isolation_level="AUTOCOMMIT"), min(KEEP, pool_size)
            )
            self._pg_statements = PgStatements(self.engine.dialect, pg_hot_statements())

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[AnyConnection]:
        """A pooled connection (no transaction yet), closed on exit."""
        conn = await self._checkout()
        try:
            yield conn
        finally:
            await conn.close()

    async def open(self, *, write: bool) -> AnyConnection:
        """A connection inside a new transaction; a write transaction on SQLite holds the write lock.

        The caller must `close()` it. Raises: ConcurrentModification when another process holds SQLite's
        write lock for longer than the busy timeout.
        """
        if not (self.is_sqlite and write):
            conn = await self._checkout()
            await conn.begin()
            return conn
        return await self._open_sqlite_writer()

    async def open_pg_writer(self) -> PgWriteConnection:
        """PostgreSQL: a connection in a new transaction run on asyncpg, for a write unit of work (pg_writes.py).

        The caller must `close()` it (which rolls back a transaction left open)."""
        from taskgate.infrastructure.db.pg_writes import PgWriteConnection

        conn, raw = await self._pg_writers.take()  # a kept one, or one from the pool (pg_kept.py)
        writer = PgWriteConnection(conn, raw, self._pg_statements, self._pg_writers)
        try:
            await writer.begin()
        except BaseException:
            await self._pg_writers.give_back(conn, raw, reusable=False)
            raise
        return writer

    async def _open_sqlite_writer(self) -> InlineConnection:
        """A pooled connection of its own in `BEGIN IMMEDIATE` (a migration's). Raises: as `open`."""
        return await self._begin_immediate(None)

    async def _begin_group(self) -> InlineConnection:
        """The process's SQLite writer connection in `BEGIN IMMEDIATE`, for a commit group.

        The connection stays open for the life of the handle: a pool checkout and return (with its reset
        ROLLBACK) per write transaction cost more than a transition's statements. Only the writer turn's holder
        uses it (commit_group.py). Raises: ConcurrentModification as `open`.
        """
        if self._writer is None:
            self._writer = await self._checkout()
        return await self._begin_immediate(self._writer)

    async def _begin_immediate(self, kept: InlineConnection | None) -> InlineConnection:
        """`BEGIN IMMEDIATE` on `kept`, or on a fresh pooled connection (closed again if BEGIN fails), retried
        with backoff while another process holds the lock, up to the busy timeout."""
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + self.lock_timeout, 0.001
        while True:
            conn = kept or await self._checkout()
            conn.sync_connection.info[_BEGIN_KEY] = "BEGIN IMMEDIATE"
            try:
                await conn.begin()
                return conn
            except OperationalError as exc:
                if kept is None:
                    await conn.close()
                if "locked" not in str(exc) or loop.time() + delay > deadline:
                    raise ConcurrentModification(
                        f"the SQLite database stayed locked by another process for {self.lock_timeout:g} s; retry"
                    ) from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def _checkout(self) -> Any:
        if not self.is_sqlite:
            return await self.engine.connect()
        return InlineConnection(self.engine.connect(), self._driver)

    async def acquire_writer(self) -> None:
        """Queue behind other writers of this process and have a transaction of one's own (SQLite only:
        the open commit group is committed first; PostgreSQL locks rows instead). For migrations."""
        if self.groups is not None:
            await self.groups.exclusive()

    def release_writer(self) -> None:
        """Give back the turn `acquire_writer` took."""
        if self.groups is not None:
            self.groups.release_exclusive()

    async def dispose(self) -> None:
        """Close every connection (the writer's too); the handle reconnects if used again."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.sync_connection.close()
        if not self.is_sqlite:
            await self._pg_writers.close()
            await self.engine.dispose()
        else:
            self.engine.dispose()


def _sqlite_engine(url: Any, synchronous: str) -> Engine:
    engine = create_engine(url, connect_args={"check_same_thread": False}, pool_size=5, max_overflow=10)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # BEGIN comes from `_on_begin`, not from pysqlite
        cursor = dbapi_connection.cursor()
        # WAL needs a moment of exclusive access the first time: wait for it here, then never again. A page cache of
        # 16 MiB (SQLite's default is 2): with a history of 1,000,000 audit links the linker's b-tree descents
        # missed the default cache and cost it a third more CPU (benchmarks/audit_cost.py --history; docs/decisions.md).
        for pragma in (
            "busy_timeout=5000",
            "journal_mode=WAL",
            "foreign_keys=ON",
            "cache_size=-16384",
            f"synchronous={synchronous}",
            "busy_timeout=0",
        ):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # On the driver; its errors are wrapped as SQLAlchemy wraps them, so callers catch the same OperationalError
        run_bare(conn.connection.dbapi_connection, conn.info.pop(_BEGIN_KEY, "BEGIN"))  # type: ignore[arg-type]

    return engine
