"""The base of the repositories over SQLAlchemy Core, and the helpers they share.

Repositories map rows in, domain dataclasses out, no ORM identity map or lazy loads; they are split by concept:
work_store.py (projects, plans, tasks), session_store.py (sessions and their logs, decisions and snapshots),
access_store.py (operators, tokens), agent_store.py (agents, test and step runs), node_store.py (nodes, leases),
outbox_store.py (webhook deliveries, tracker writebacks) and audit_store.py (the audit chains).

Each repository works on the connection of its unit of work. `lock=True` adds `FOR UPDATE` on PostgreSQL;
on SQLite the unit of work already holds the database write lock (`BEGIN IMMEDIATE`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Select

from taskgate.domain.errors import StorageError
from taskgate.domain.states import TERMINAL_STATES
from taskgate.infrastructure.db.engine import AnyConnection

if TYPE_CHECKING:
    from taskgate.infrastructure.db.audit_trail import AuditTrail

TERMINAL = [s.value for s in TERMINAL_STATES]
_INTEGER_IDS = range(-(2**31), 2**31)  # INTEGER id columns: 32-bit on PostgreSQL, 64-bit on SQLite


def storable(ident: int) -> bool:
    """Whether an INTEGER id column could hold `ident`. One it cannot names nothing, and must not reach the
    driver: sqlite3 raises OverflowError past 64 bits, asyncpg a DataError past 32."""
    return ident in _INTEGER_IDS


class SqlRepository:
    """The base of every repository on SQLAlchemy here (audit_store.py's too): the unit of work's connection and
    dialect, its audit trail, and the few helpers every repository uses to run its statements."""

    def __init__(self, conn: AnyConnection, dialect: str, trail: AuditTrail | None = None) -> None:
        self._conn, self._dialect = conn, dialect
        self._trail = trail  # where an audited record goes to be chained at commit (audit_trail.py)

    def _audited(self, table: str, record_id: int, values: dict[str, Any]) -> None:
        if self._trail is None:
            raise StorageError(f"{type(self).__name__} appends audited records: it needs its unit of work's trail")
        self._trail.add(table, record_id, values)

    def _pick(self, plain: Select[Any], for_update: Select[Any], lock: bool) -> Select[Any]:
        return for_update if lock and self._dialect == "postgresql" else plain

    async def _one(self, stmt: Any, params: dict[str, Any] | None = None) -> Any:
        return (await self._conn.execute(stmt, params)).mappings().first()

    async def _all(self, stmt: Any, params: dict[str, Any] | None = None) -> list[Any]:
        return list((await self._conn.execute(stmt, params)).mappings().all())
