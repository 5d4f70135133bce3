"""The base of the repositories over SQLAlchemy Core, and the helpers they share.

Repositories map rows in, domain dataclasses out, no ORM identity map or lazy loads; they are split by concept:
work_store.py (projects, plans, tasks), session_store.py (sessions and their logs, decisions and snapshots),
access_store.py (operators, tokens), agent_store.py (agents, test and step runs), node_store.py (nodes, leases),
outbox_store.py (webhook deliveries, tracker writebacks) and audit_store.py (the audit chains).

Each repository works on the connection of its unit of work. `lock=True` adds `FOR UPDATE` on PostgreSQL;
on SQLite the unit of work already holds the database write lock (`BEGIN IMMEDIATE`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Select

from taskgate.domain.states import TERMINAL_STATES
from taskgate.infrastructure.db.connections import AnyConnection

TERMINAL = [s.value for s in TERMINAL_STATES]
_INTEGER_IDS = range(-(2**31), 2**31)  # INTEGER id columns: 32-bit on PostgreSQL, 64-bit on SQLite


def storable(ident: int) -> bool:
    """Whether an INTEGER id column could hold `ident`. One it cannot names nothing, and must not reach the
    driver: sqlite3 raises OverflowError past 64 bits, asyncpg a DataError past 32."""
    return ident in _INTEGER_IDS


class SqlRepository:
    """The base of every repository on SQLAlchemy here (audit_store.py's too): the unit of work's connection and
    dialect, and the few helpers every repository uses to run its statements."""

    def __init__(self, conn: AnyConnection, dialect: str) -> None:
        self._conn, self._dialect = conn, dialect

    def _pick(self, plain: Select[Any], for_update: Select[Any], lock: bool) -> Select[Any]:
        return for_update if lock and self._dialect == "postgresql" else plain

    async def _one(self, stmt: Any, params: dict[str, Any] | None = None) -> Any:
        return (await self._conn.execute(stmt, params)).mappings().first()

    async def _all(self, stmt: Any, params: dict[str, Any] | None = None) -> list[Any]:
        return list((await self._conn.execute(stmt, params)).mappings().all())

    async def _write(
        self,
        stmt: Any,
        params: dict[str, Any],
        *,
        expect: int | None = None,
        error: Callable[[], Exception] | None = None,
    ) -> None:
        """A write whose result the caller does not need now. PostgreSQL's write unit holds it and sends it with the
        next write (pg_writes.py: one statement for the transition's writes); elsewhere it runs now. `expect`: the row
        count it must have, else `error()` is raised (now, or when it is sent, before COMMIT either way)."""
        defer = getattr(self._conn, "defer", None)
        if defer is not None and await defer(stmt, params, expect, error):
            return
        result = await self._conn.execute(stmt, params)
        if expect is not None and result.rowcount != expect:
            assert error is not None
            raise error()
