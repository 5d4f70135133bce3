"""PostgreSQL write units' connections, kept checked out between units (a few, per event loop).

A write unit of work on PostgreSQL runs on a SQLAlchemy `AsyncConnection` in AUTOCOMMIT whose transaction is asyncpg's
(pg_writes.py). Checking such a connection out of SQLAlchemy's pool and back in cost a `start` ~50 µs of CPU in a
tight loop and 150–200 µs measured inside a transition (the pool's checkout and checkin events, the AUTOCOMMIT
characteristic set and reset, the reset on return, a greenlet hop each way): more than any other part of a
transition's own Python. So a unit that ends cleanly leaves its connection here, still in AUTOCOMMIT, and the next
write unit of the same event loop takes it; only `keep` are kept, the rest go back to the pool as before.

What is kept is exactly what the pool would hand out again: a connection with no transaction open (asyncpg's
`is_in_transaction()`, SQLAlchemy's own autobegun marker rolled back: a no-op in AUTOCOMMIT), not closed, not
invalidated. Nothing session-scoped is set by a unit (`SET LOCAL` and `pg_advisory_xact_lock` end with the
transaction), so the pool's reset on return (a ROLLBACK on the adapter, which has no transaction of its own here) had
nothing to undo. A unit whose ROLLBACK failed invalidates its connection (pg_writes.py) and never reaches this list;
one found closed when taken (lost while kept: a server restart) is invalidated, never handed out.

Why a kept connection cannot starve the pool's other users: at most `keep` (2, or the pool's size if smaller) are
held idle, out of `pool_size + max_overflow`; a reader waits for one only when every other connection is in use, as it
would if the writers' units were still open. No race: the list is only touched by plain code between awaits
(a take or a give-back is one `pop`/`append`, on the loop that owns the connections), and connections kept by one
event loop are never handed to another (asyncpg connections belong to the loop that opened them).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

KEEP = 2


class KeptWriterConnections:
    """Write units' connections (AUTOCOMMIT) of one engine: taken from the few kept, else from the pool."""

    def __init__(self, engine: AsyncEngine, keep: int) -> None:
        self._engine, self._keep = engine, keep
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the kept connections belong to
        self._idle: list[tuple[AsyncConnection, Any]] = []

    async def take(self) -> tuple[AsyncConnection, Any]:
        """A connection in AUTOCOMMIT and its asyncpg connection, with no transaction open."""
        loop = asyncio.get_running_loop()
        while self._idle and self._loop is loop:
            conn, raw = self._idle.pop()
            if not raw.is_closed():
                return conn, raw
            # lost while kept (the server restarted, or closed it): invalidated, so the pool does not hand it out
            with contextlib.suppress(Exception):
                await conn.invalidate()
            await conn.close()
        if self._loop is not None and self._loop is not loop and self._loop.is_closed():
            # kept by a loop that has ended (one asyncio.run after another): they cannot be used or closed from here;
            # forgotten, the pool's finalizer reclaims them, and this loop may keep its own
            self._idle, self._loop = [], None
        conn = await self._engine.connect()
        try:
            return conn, (await conn.get_raw_connection()).driver_connection
        except BaseException:
            await conn.close()
            raise

    async def give_back(self, conn: AsyncConnection, raw: Any, *, reusable: bool) -> None:
        """Keep `conn` for the next write unit when it is reusable (see the module docstring), else close it (back to
        the pool)."""
        loop = asyncio.get_running_loop()
        if reusable and not conn.closed and not conn.invalidated and not raw.is_closed():
            try:
                if conn.in_transaction():  # SQLAlchemy's autobegun marker of a statement sent through it: a no-op
                    await conn.rollback()
            except Exception:  # not kept: the close below gives it back to the pool (or raises what is wrong)
                reusable = False
            if reusable and not raw.is_in_transaction() and len(self._idle) < self._keep and self._loop in (None, loop):
                self._loop = loop
                self._idle.append((conn, raw))
                return
        await conn.close()

    def drivers(self) -> list[Any]:
        """The asyncpg connections kept now (for benchmarks/transition_cost.py's statement log)."""
        return [raw for _conn, raw in self._idle]

    async def close(self) -> None:
        """Give every kept connection back to the pool (before the engine is disposed)."""
        idle, self._idle, loop, self._loop = self._idle, [], self._loop, None
        if loop is not asyncio.get_running_loop():
            return  # another loop's connections cannot be closed from this one; the pool's finalizer reclaims them
        for conn, _raw in idle:
            await conn.close()
