"""The last poll of each project's external tracker (0021, docs/trackers.md)."""

from __future__ import annotations

from dataclasses import fields

from sqlalchemy import select

from taskgate.application.trackers.ports import TrackerPoll
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.repository_base import SqlRepository

_COLUMNS = tuple(f.name for f in fields(TrackerPoll))


class SqlAlchemyTrackerPollRepository(SqlRepository):
    async def save(self, poll: TrackerPoll) -> None:
        values = {name: getattr(poll, name) for name in _COLUMNS}
        stmt = sql.dialect_insert(self._dialect)(t.tracker_polls).values(values)
        changed = {k: v for k, v in values.items() if k != "project_id"}
        await self._conn.execute(
            stmt.on_conflict_do_update(index_elements=[t.tracker_polls.c.project_id], set_=changed)
        )

    async def list(self) -> list[TrackerPoll]:
        rows = await self._all(select(t.tracker_polls).order_by(t.tracker_polls.c.project_id))
        return [TrackerPoll(**{name: row[name] for name in _COLUMNS}) for row in rows]
