"""The notifier's cursor and queue (0024, docs/notifications.md)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import case, func, select, update

from taskgate.application.notifications.ports import QueuedNotice
from taskgate.domain.notifications import TRANSITION_EVENT, Notice, is_ci_failure
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.repository_base import SqlRepository

_CURSOR = "events"
_N = t.notifications


class SqlAlchemyNotificationRepository(SqlRepository):
    async def cursor(self) -> int | None:
        c = t.notification_cursor.c
        row = await self._one(select(c.event_id).where(c.name == _CURSOR))
        return None if row is None else int(row["event_id"])

    async def move_cursor(self, event_id: int) -> None:
        stmt = sql.dialect_insert(self._dialect)(t.notification_cursor).values(name=_CURSOR, event_id=event_id)
        await self._conn.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={"event_id": event_id}))

    async def queue(self, channel: str, notices: Sequence[Notice], at: datetime) -> int:
        if not notices:
            return 0
        rows = [
            {
                "channel": channel,
                "event_id": n.event_id,
                "kind": n.kind,
                "notice": n.as_json(),
                "queued_at": at,
                "status": "pending",
                "attempts": 0,
            }
            for n in notices
        ]
        stmt = sql.dialect_insert(self._dialect)(_N).values(rows).on_conflict_do_nothing()
        return int((await self._conn.execute(stmt)).rowcount or 0)

    async def pending(self, channel: str, limit: int = 100) -> list[QueuedNotice]:
        stmt = select(_N).where(_N.c.channel == channel, _N.c.status == "pending").order_by(_N.c.event_id).limit(limit)
        return [_queued(row) for row in await self._all(stmt)]

    async def mark_sent(self, ids: Sequence[int], at: datetime) -> None:
        await self._conn.execute(update(_N).where(_N.c.id.in_(ids)).values(status="sent", sent_at=at))

    async def mark_retry(self, ids: Sequence[int], error: str, next_attempt_at: datetime) -> None:
        values = {"attempts": _N.c.attempts + 1, "last_error": error, "next_attempt_at": next_attempt_at}
        await self._conn.execute(update(_N).where(_N.c.id.in_(ids)).values(values))

    async def mark_failed(self, ids: Sequence[int], error: str) -> None:
        values = {"attempts": _N.c.attempts + 1, "last_error": error, "status": "failed", "next_attempt_at": None}
        await self._conn.execute(update(_N).where(_N.c.id.in_(ids)).values(values))

    async def counts(self) -> dict[tuple[str, str], int]:
        stmt = select(_N.c.channel, _N.c.status, func.count()).group_by(_N.c.channel, _N.c.status)
        return {(row[0], row[1]): int(row[2]) for row in (await self._conn.execute(stmt)).all()}

    async def last_error(self, channel: str) -> tuple[datetime | None, str | None]:
        stmt = (
            select(_N.c.next_attempt_at, _N.c.last_error)
            .where(_N.c.channel == channel, _N.c.status.in_(("pending", "failed")), _N.c.last_error.is_not(None))
            .order_by(case((_N.c.status == "pending", 0), else_=1), _N.c.id.desc())
            .limit(1)
        )
        row = await self._one(stmt)
        return (None, None) if row is None else (row["next_attempt_at"], row["last_error"])

    async def session_projects(self, session_ids: Sequence[str]) -> dict[str, str]:
        stmt = (
            select(t.sessions.c.id, t.projects.c.name)
            .join(t.projects, t.projects.c.id == t.sessions.c.project_id)
            .where(t.sessions.c.id.in_(list(session_ids)))
        )
        return {row[0]: row[1] for row in (await self._conn.execute(stmt)).all()}

    async def ci_failures(self, session_id: str, up_to_event_id: int) -> int:
        e = t.events.c
        stmt = select(e.kind, e.payload).where(
            e.session_id == session_id, e.kind == TRANSITION_EVENT, e.id <= up_to_event_id
        )
        return sum(1 for row in (await self._conn.execute(stmt)).all() if is_ci_failure(row[0], row[1] or {}))


def _queued(row: dict) -> QueuedNotice:
    return QueuedNotice(
        id=int(row["id"]),
        channel=row["channel"],
        notice=Notice.from_json(row["notice"]),
        queued_at=row["queued_at"],
        status=row["status"],
        attempts=int(row["attempts"]),
        next_attempt_at=row["next_attempt_at"],
        last_error=row["last_error"],
        sent_at=row["sent_at"],
    )
