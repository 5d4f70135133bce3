"""Service nodes (each process's machine and data dir, by its heartbeats) and the named leases they take."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import Any

from sqlalchemy import case, delete, func, or_, select, update

from taskgate.application.nodes.ports import Lease, NodeRecord
from taskgate.domain.entities import AgentStatus
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.repository_base import TERMINAL, SqlRepository


class SqlAlchemyNodeRepository(SqlRepository):
    async def beat(self, node: NodeRecord) -> None:
        values = {f.name: getattr(node, f.name) for f in fields(NodeRecord)}
        values["down_at"] = None  # a node that beats is not down, whatever a survivor found meanwhile
        # one statement, INSERT … ON CONFLICT DO UPDATE: two processes of one node id (the same machine and data
        # dir, e.g. `serve` and a CLI that launches agents) beating at once leave one row, the later beat
        stmt = sql.dialect_insert(self._dialect)(t.nodes).values(values)
        changed = {k: v for k, v in values.items() if k != "id"}
        await self._conn.execute(stmt.on_conflict_do_update(index_elements=[t.nodes.c.id], set_=changed))

    async def get(self, node_id: str) -> NodeRecord | None:
        rows = await self._all(select(t.nodes).where(t.nodes.c.id == node_id))
        return _node(rows[0]) if rows else None

    async def list(self) -> list[NodeRecord]:
        return [_node(r) for r in await self._all(select(t.nodes).order_by(t.nodes.c.id))]

    async def live_agents(self) -> dict[str | None, int]:
        c = t.agents.c
        live = (AgentStatus.QUEUED.value, AgentStatus.RUNNING.value)
        stmt = select(c.node_id, func.count()).where(c.status.in_(live)).group_by(c.node_id)
        return {row[0]: row[1] for row in (await self._conn.execute(stmt)).all()}

    async def live_sessions(self) -> dict[str | None, int]:
        c = t.sessions.c
        stmt = select(c.node_id, func.count()).where(c.state.not_in(TERMINAL)).group_by(c.node_id)
        return {row[0]: row[1] for row in (await self._conn.execute(stmt)).all()}

    async def mark_down(self, node_id: str, beat_before: datetime, at: datetime) -> bool:
        c = t.nodes.c
        # the compare-and-swap: of several survivors finding the same lapse, one updates the row, the rest 0 rows
        stmt = (
            update(t.nodes).where(c.id == node_id, c.down_at.is_(None), c.heartbeat_at < beat_before).values(down_at=at)
        )
        return (await self._conn.execute(stmt)).rowcount == 1


def _node(row: Any) -> NodeRecord:
    return NodeRecord(**{f.name: row[f.name] for f in fields(NodeRecord)})


class SqlAlchemyLeaseRepository(SqlRepository):
    async def acquire(self, name: str, holder: str, node_id: str, now: datetime, until: datetime) -> Lease:
        c = t.leases.c
        stmt = sql.dialect_insert(self._dialect)(t.leases).values(
            name=name, holder=holder, node_id=node_id, acquired_at=now, expires_at=until
        )
        # One statement decides: the row is created, or updated only when it is the holder's own (a renewal) or
        # has expired. PostgreSQL locks the conflicting row and re-checks the WHERE against its latest committed
        # version, SQLite runs write transactions one at a time: two nodes never both take it.
        taken = stmt.on_conflict_do_update(
            index_elements=[c.name],
            set_={
                "holder": stmt.excluded.holder,
                "node_id": stmt.excluded.node_id,
                "acquired_at": case((c.holder == stmt.excluded.holder, c.acquired_at), else_=stmt.excluded.acquired_at),
                "expires_at": stmt.excluded.expires_at,
            },
            where=or_(c.holder == stmt.excluded.holder, c.expires_at < now),
        )
        await self._conn.execute(taken)
        row = (await self._all(select(t.leases).where(c.name == name)))[0]
        return Lease(row["name"], row["holder"], row["node_id"], row["acquired_at"], row["expires_at"])

    async def release(self, name: str, holder: str) -> None:
        c = t.leases.c
        await self._conn.execute(delete(t.leases).where(c.name == name, c.holder == holder))
