"""What is owed to the outside: webhook deliveries of events, and status writebacks to external trackers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, String, Text, func, insert, literal, or_, select, update

from taskgate.application.webhooks.ports import Delivery, OutboxEvent
from taskgate.domain import writebacks as wb
from taskgate.domain.errors import WritebackNotFound
from taskgate.domain.writebacks import Writeback
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.repository_base import SqlRepository, storable

_DELIVERY_MARKERS = ("skipped", "start")


class SqlAlchemyDeliveryRepository(SqlRepository):
    """Webhook delivery rows. `skipped` and `start` rows are cursor markers (see application/webhooks/outbox.py), never
    deliveries."""

    _LOCK_TIMEOUT = "5s"  # how long the enqueuer waits for PostgreSQL's event writers to finish

    async def committed_high_water(self) -> int:
        if self._dialect == "postgresql":
            # Ids come from a sequence before commit: a SHARE lock waits for every transaction inserting events,
            # so no smaller id can commit after this read. SQLite has one writer and needs nothing.
            await self._conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{self._LOCK_TIMEOUT}'")
            await self._conn.exec_driver_sql("LOCK TABLE events IN SHARE MODE")
        row = await self._one(select(func.max(t.events.c.id).label("top")))
        return int(row["top"] or 0) if row else 0

    async def cursor(self, subscriber: str) -> int:
        c = t.webhook_deliveries.c
        stmt = select(c.event_id).where(c.subscriber == subscriber).order_by(c.event_id.desc()).limit(1)
        row = await self._one(stmt)
        return int(row["event_id"]) if row else 0

    async def events_after(self, after_id: int, upto_id: int, limit: int) -> list[OutboxEvent]:
        c = t.events.c
        stmt = select(t.events).where(c.id > after_id, c.id <= upto_id).order_by(c.id).limit(limit)
        return [OutboxEvent(r["id"], r["kind"], r["session_id"], r["at"], r["payload"]) for r in await self._all(stmt)]

    async def enqueue(self, subscriber: str, event_ids: list[int], at: datetime) -> int:
        if not event_ids:
            return 0
        row = {"subscriber": subscriber, "status": "pending", "next_attempt_at": at}
        rows = [{"event_id": event_id, **row} for event_id in event_ids]
        inserted = await self._conn.execute(self._insert_new(rows).returning(t.webhook_deliveries.c.id))
        return len(inserted.all())

    async def move_cursor(self, subscriber: str, event_id: int) -> None:
        c = t.webhook_deliveries.c
        await self._conn.execute(t.webhook_deliveries.delete().where(c.subscriber == subscriber, c.status == "skipped"))
        marker = {"event_id": event_id, "subscriber": subscriber, "status": "skipped"}
        await self._conn.execute(self._insert_new([marker]))

    async def mark_start(self, subscriber: str, event_id: int) -> None:
        marker = {"event_id": event_id, "subscriber": subscriber, "status": "start"}
        await self._conn.execute(self._insert_new([marker]))

    async def start(self, subscriber: str) -> int | None:
        c = t.webhook_deliveries.c
        row = await self._one(select(c.event_id).where(c.subscriber == subscriber, c.status == "start").limit(1))
        return int(row["event_id"]) if row else None

    def _insert_new(self, rows: list[dict[str, Any]]) -> Any:
        """INSERT … ON CONFLICT DO NOTHING: a concurrent enqueuer may have added the same rows."""
        dialect_insert = sql.dialect_insert(self._dialect)
        return dialect_insert(t.webhook_deliveries).values(rows).on_conflict_do_nothing()

    async def head(self, subscriber: str) -> Delivery | None:
        d, e = t.webhook_deliveries.c, t.events.c
        stmt = (
            select(t.webhook_deliveries, e.kind, e.session_id, e.at, e.payload)
            .join(t.events, e.id == d.event_id)
            .where(d.subscriber == subscriber, d.status == "pending")
            .order_by(d.event_id)
            .limit(1)
        )
        row = await self._one(stmt)
        if row is None:
            return None
        event = OutboxEvent(row["event_id"], row["kind"], row["session_id"], row["at"], row["payload"])
        return _delivery(row, event)

    async def claim(self, delivery_id: int, attempts: int, now: datetime, lease_until: datetime) -> bool:
        c = t.webhook_deliveries.c
        due = (c.next_attempt_at.is_(None)) | (c.next_attempt_at <= now)
        stmt = (
            update(t.webhook_deliveries)
            .where(c.id == delivery_id, c.status == "pending", c.attempts == attempts, due)
            .values(attempts=attempts + 1, next_attempt_at=lease_until)
        )
        return (await self._conn.execute(stmt)).rowcount == 1

    async def mark_delivered(self, delivery_id: int, at: datetime) -> bool:
        c = t.webhook_deliveries.c
        stmt = (
            update(t.webhook_deliveries)
            .where(c.id == delivery_id, c.status == "pending")
            .values(status="delivered", delivered_at=at, next_attempt_at=None, last_error=None)
        )
        return (await self._conn.execute(stmt)).rowcount == 1

    async def mark_retry(self, delivery_id: int, attempts: int, error: str, next_attempt_at: datetime) -> bool:
        return await self._finish_attempt(delivery_id, attempts, last_error=error, next_attempt_at=next_attempt_at)

    async def mark_failed(self, delivery_id: int, attempts: int, error: str) -> bool:
        failed = {"status": "failed", "last_error": error, "next_attempt_at": None}
        return await self._finish_attempt(delivery_id, attempts, **failed)

    async def _finish_attempt(self, delivery_id: int, attempts: int, **values: Any) -> bool:
        c = t.webhook_deliveries.c
        stmt = (
            update(t.webhook_deliveries)
            .where(c.id == delivery_id, c.status == "pending", c.attempts == attempts)
            .values(**values)
        )
        return (await self._conn.execute(stmt)).rowcount == 1

    async def counts(self) -> dict[tuple[str, str], int]:
        c = t.webhook_deliveries.c
        stmt = (
            select(c.subscriber, c.status, func.count().label("n"))
            .where(c.status.not_in(_DELIVERY_MARKERS))
            .group_by(c.subscriber, c.status)
        )
        return {(r["subscriber"], r["status"]): int(r["n"]) for r in await self._all(stmt)}

    async def list(self, subscriber: str | None = None, status: str | None = None, limit: int = 100) -> list[Delivery]:
        c = t.webhook_deliveries.c
        stmt = select(t.webhook_deliveries).where(c.status.not_in(_DELIVERY_MARKERS))
        if subscriber is not None:
            stmt = stmt.where(c.subscriber == subscriber)
        if status is not None:
            stmt = stmt.where(c.status == status)
        return [_delivery(r, None) for r in await self._all(stmt.order_by(c.event_id, c.subscriber).limit(limit))]


def _delivery(row: Any, event: OutboxEvent | None) -> Delivery:
    names = ("id", "event_id", "subscriber", "status", "attempts", "next_attempt_at", "last_error", "delivered_at")
    return Delivery(**{name: row[name] for name in names}, event=event)


class SqlAlchemyWritebackRepository(SqlRepository):
    """Status writes owed to external trackers (`tracker_writebacks`); see domain/writebacks.py."""

    async def enqueue_for_task(
        self, task_id: str, sources: Sequence[str], status: str, session_id: str | None, reason: str, now: datetime
    ) -> None:
        # INSERT … SELECT: one statement, and nothing at all for a built-in task (no read first on the hot path).
        tk = t.tasks.c
        source = select(
            tk.project_id, tk.id, literal(session_id, String), tk.source, literal(status, String),
            literal(reason, Text), literal(wb.PENDING, String), literal(0, Integer), literal(now, t.UtcDateTime),
            literal(now, t.UtcDateTime), literal(now, t.UtcDateTime),
        ).where(tk.id == task_id, tk.source.in_(list(sources)))  # fmt: skip
        columns = ["project_id", "task_id", "session_id", "tracker", "status", "reason", "state", "attempts",
                   "next_attempt_at", "created_at", "updated_at"]  # fmt: skip
        await self._conn.execute(insert(t.tracker_writebacks).from_select(columns, source))

    async def get(self, writeback_id: int) -> Writeback:
        if not storable(writeback_id):
            raise WritebackNotFound(writeback_id)
        row = await self._one(select(t.tracker_writebacks).where(t.tracker_writebacks.c.id == writeback_id))
        if row is None:
            raise WritebackNotFound(writeback_id)
        return Writeback(**row)

    async def due(self, now: datetime, limit: int = 100) -> list[Writeback]:
        c = t.tracker_writebacks.c
        stmt = (
            select(t.tracker_writebacks)
            .where(c.state == wb.PENDING, or_(c.next_attempt_at.is_(None), c.next_attempt_at <= now))
            .order_by(c.id)
            .limit(limit)
        )
        return [Writeback(**r) for r in await self._all(stmt)]

    async def list(self, *, states=None, task_ids=None, limit: int = 100) -> list[Writeback]:
        c = t.tracker_writebacks.c
        stmt = select(t.tracker_writebacks)
        if states is not None:
            stmt = stmt.where(c.state.in_(list(states)))
        if task_ids is not None:
            stmt = stmt.where(c.task_id.in_(list(task_ids)))
        return [Writeback(**r) for r in await self._all(stmt.order_by(c.id.desc()).limit(limit))]

    async def claim(self, writeback_id: int, attempts: int, lease_until: datetime, now: datetime) -> bool:
        c = t.tracker_writebacks.c
        stmt = (
            update(t.tracker_writebacks)
            .where(c.id == writeback_id, c.state == wb.PENDING, c.attempts == attempts)
            .values(attempts=attempts + 1, next_attempt_at=lease_until, updated_at=now)
        )
        return (await self._conn.execute(stmt)).rowcount == 1

    async def finish(self, writeback_id, attempts, state, error, next_attempt_at, now) -> bool:
        c = t.tracker_writebacks.c
        stmt = (
            update(t.tracker_writebacks)
            .where(c.id == writeback_id, c.state == wb.PENDING, c.attempts == attempts)
            .values(state=state, last_error=error, next_attempt_at=next_attempt_at, updated_at=now)
        )
        return (await self._conn.execute(stmt)).rowcount == 1

    async def set_state(self, writeback_id, from_states, state, now, *, actor=None) -> bool:
        c = t.tracker_writebacks.c
        values: dict[str, Any] = {"state": state, "updated_at": now, "resolved_by": actor}
        if state == wb.PENDING:
            values["next_attempt_at"] = now
            values["attempts"] = 0  # an operator's retry gets the full series of attempts again
        stmt = update(t.tracker_writebacks).where(c.id == writeback_id, c.state.in_(list(from_states))).values(**values)
        return (await self._conn.execute(stmt)).rowcount == 1

    async def supersede_older(self, task_id: str, newest_id: int, now: datetime) -> int:
        c = t.tracker_writebacks.c
        stmt = (
            update(t.tracker_writebacks)
            .where(c.task_id == task_id, c.id < newest_id, c.state.in_(list(wb.OPEN_STATES)))
            .values(state=wb.SUPERSEDED, updated_at=now, next_attempt_at=None)
        )
        return (await self._conn.execute(stmt)).rowcount
