"""The webhooks' ports: the events outbox and its deliveries, and the sender that posts them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """One row of the events log as webhook subscribers receive it."""

    id: int
    kind: str
    session_id: str | None
    at: datetime
    payload: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        """The JSON body of a webhook POST: `{"id", "kind", "session_id", "at", "payload"}`."""
        return {
            "id": self.id,
            "kind": self.kind,
            "session_id": self.session_id,
            "at": self.at.isoformat(),
            "payload": self.payload,
        }


@dataclass(frozen=True, slots=True)
class Delivery:
    """The delivery state of one event to one subscriber. `status`: pending | delivered | failed (gave up).
    `attempts` counts the sends started (a claim increments it), so it doubles as the row's version."""

    id: int
    event_id: int
    subscriber: str
    status: str
    attempts: int
    next_attempt_at: datetime | None
    last_error: str | None
    delivered_at: datetime | None
    event: OutboxEvent | None = None


class DeliveryRepository(Protocol):
    """Webhook delivery state (the outbox's second half); see application/webhooks/outbox.py for the protocol."""

    async def committed_high_water(self) -> int:
        """The newest event id such that no event with a smaller id can still be committed later. PostgreSQL
        allocates ids before commit, so this waits for every transaction that is inserting events (a short
        SHARE lock on `events`, bounded by a lock timeout). Raises: ConcurrentModification on that timeout."""

    async def cursor(self, subscriber: str) -> int:
        """The newest event id already enqueued (or skipped) for the subscriber; 0 when none."""

    async def events_after(self, after_id: int, upto_id: int, limit: int) -> list[OutboxEvent]:
        """Events with after_id < id <= upto_id, by id, at most `limit`."""

    async def enqueue(self, subscriber: str, event_ids: list[int], at: datetime) -> int:
        """Pending rows due at `at`; rows that exist already are left alone. Returns how many were added."""

    async def move_cursor(self, subscriber: str, event_id: int) -> None:
        """Record that the subscriber's filter skipped the events up to `event_id` (one marker row with status
        `skipped` per subscriber, so the next scan starts after it)."""

    async def mark_start(self, subscriber: str, event_id: int) -> None:
        """Record where a new subscriber starts: a marker row with status `start` at `event_id` (it receives the
        events after it). A marker row that exists already is left alone (INSERT … ON CONFLICT DO NOTHING on
        the unique (event_id, subscriber)); `move_cursor` never removes it."""

    async def start(self, subscriber: str) -> int | None:
        """The event id of the subscriber's `start` marker; None when it has none (it started at the beginning
        of the log, or has not started)."""

    async def head(self, subscriber: str) -> Delivery | None:
        """The subscriber's oldest pending delivery (by event id), with its event."""

    async def claim(self, delivery_id: int, attempts: int, now: datetime, lease_until: datetime) -> bool:
        """Start an attempt: attempts+1 and next_attempt_at=lease_until, only if the row is still pending with
        `attempts` attempts and due at `now`. False when another dispatcher got there first."""

    async def mark_delivered(self, delivery_id: int, at: datetime) -> bool:
        """pending → delivered. False when the row was not pending."""

    async def mark_retry(self, delivery_id: int, attempts: int, error: str, next_attempt_at: datetime) -> bool:
        """Record a failed attempt and when to try again, if the row still has `attempts` attempts."""

    async def mark_failed(self, delivery_id: int, attempts: int, error: str) -> bool:
        """pending → failed (gave up), if the row still has `attempts` attempts."""

    async def counts(self) -> dict[tuple[str, str], int]:
        """Rows by (subscriber, status), without the markers (`skipped`, `start`)."""

    async def list(self, subscriber: str | None = None, status: str | None = None, limit: int = 100) -> list[Delivery]:
        """Deliveries by event id (oldest first, at most `limit`), without their events or the markers."""


@dataclass(frozen=True, slots=True)
class SendResult:
    """What one webhook POST came to: `error` is None on a 2xx answer."""

    status: int | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class WebhookSender(Protocol):
    async def send(self, url: str, secret: str, event: OutboxEvent, *, timeout_s: float, attempt: int) -> SendResult:
        """POST the event, signed with `secret`. Never raises for a failed delivery: non-2xx answers, timeouts
        and connection errors come back as a `SendResult` with the reason."""
