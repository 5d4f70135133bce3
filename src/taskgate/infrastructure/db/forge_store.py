"""The forge loop's rows: each session's pull request, and the webhook deliveries (0020, docs/forge.md)."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update

from taskgate.application.forge.ports import PullRequestRecord
from taskgate.infrastructure.db import read_statements as reads
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.repository_base import TERMINAL, SqlRepository
from taskgate.infrastructure.db.row_maps import pull_request_of

_COLUMNS = tuple(f.name for f in fields(PullRequestRecord))


class SqlAlchemyPullRequestRepository(SqlRepository):
    async def get(self, session_id: str) -> PullRequestRecord | None:
        row = await self._one(reads.PULL_REQUEST_OF_SESSION, {"session_id": session_id})
        return _record(row) if row else None

    async def save(self, record: PullRequestRecord) -> None:
        values = {name: getattr(record, name) for name in _COLUMNS}
        stmt = sql.dialect_insert(self._dialect)(t.pull_requests).values(values)
        changed = {k: v for k, v in values.items() if k != "session_id"}
        await self._conn.execute(
            stmt.on_conflict_do_update(index_elements=[t.pull_requests.c.session_id], set_=changed)
        )

    async def following(self) -> list[PullRequestRecord]:
        p, s = t.pull_requests.c, t.sessions.c
        stmt = (
            select(t.pull_requests)
            .join(t.sessions, s.id == p.session_id)
            .where(s.state.not_in(TERMINAL))
            .order_by(p.session_id)
        )
        return [_record(row) for row in await self._all(stmt)]

    async def store_observation(
        self, session_id: str, pushed_at: datetime | None, observation: dict[str, Any], status: str, at: datetime
    ) -> bool:
        p = t.pull_requests.c
        # the compare-and-swap: a publish since the look began changed `pushed_at` (even one that found its commit
        # pushed already, e.g. reopening a closed pull request), and the look no longer applies
        same_push = p.pushed_at.is_(None) if pushed_at is None else p.pushed_at == pushed_at
        stmt = (
            update(t.pull_requests)
            .where(p.session_id == session_id, same_push)
            .values(observation=observation, status=status, observed_at=at, error=None, updated_at=at)
        )
        return (await self._conn.execute(stmt)).rowcount == 1

    async def unpoke(self, session_id: str) -> None:
        p = t.pull_requests.c
        await self._conn.execute(update(t.pull_requests).where(p.session_id == session_id).values(poke=False))

    async def note(self, session_id: str, note: str, at: datetime) -> None:
        p = t.pull_requests.c
        await self._conn.execute(
            update(t.pull_requests).where(p.session_id == session_id).values(note=note, updated_at=at)
        )

    async def poke(self, branch: str | None, number: int | None) -> int:
        p = t.pull_requests.c
        # the branch when the delivery names one (numbers repeat across repositories), else the number
        if branch:
            wanted = p.branch == branch
        elif number is not None:
            wanted = p.number == number
        else:
            return 0
        return (await self._conn.execute(update(t.pull_requests).where(wanted).values(poke=True))).rowcount

    async def record_delivery(self, delivery: str, event: str, outcome: str, at: datetime) -> bool:
        # the primary key refuses a delivery id seen before: a replay, whichever node received the first one
        stmt = sql.dialect_insert(self._dialect)(t.forge_deliveries).values(
            id=delivery, event=event, outcome=outcome, received_at=at
        )
        return (await self._conn.execute(stmt.on_conflict_do_nothing(index_elements=["id"]))).rowcount == 1

    async def delivery_counts(self) -> dict[str, int]:
        d = t.forge_deliveries.c
        rows = (await self._conn.execute(select(d.outcome, func.count()).group_by(d.outcome))).all()
        return {row[0]: row[1] for row in rows}


_record = pull_request_of  # rows in, records out: shared with the engine-free read path (row_maps.py)
