"""The outbox: every write of taskgate appends an event; `WebhookDispatcher` delivers them to webhook subscribers.

How a delivery goes (see docs/events.md):

1. `enqueue_new` (one write unit of work): for each subscriber, read the events after its cursor, up to the
   *committed* high-water mark, and add a `pending` row for every event its filter matches. The cursor is
   derived, not stored: the newest event id among the subscriber's rows. When a scan ends on events the filter
   skips, a `skipped` marker row (one per subscriber) moves the cursor past them, so they are not scanned again.
   A subscriber with no row at all is new: with `backfill="none"` (the default) a `start` marker row at the
   committed high-water mark makes it begin with the events appended after that (see `_start`); with
   `backfill="all"` it begins at event 1. A subscriber that has rows is never moved, whatever its backfill says.
2. `deliver_due`: per subscriber, strictly in event order, only the *head* (its oldest pending row) may be sent,
   and only once its `next_attempt_at` has come. The head is claimed in a write unit of work (attempts+1,
   `next_attempt_at` pushed to now + timeout + lease margin, a compare-and-set on `attempts`); then it is sent
   with no transaction open; then the outcome is recorded: `delivered`, a retry at
   now + min(base·2^(attempts-1), max), or `failed` once `max_attempts` sends have failed. A failing head holds
   back the subscriber's later events until it is delivered or given up; other subscribers are not held back.

Guarantee: at least once, in event order per subscriber. A `delivered` row is never sent again (restarts
included): the row is committed as delivered before anything else happens to it. A `pending` row is never lost:
enqueueing and claiming are committed in the database, so a new dispatcher on the same database picks up where
the old one stopped. The one duplicate window: a process that dies (or loses its database) after the receiver
answered 2xx and before `delivered` was committed leaves a claimed row, sent again once the claim's lease runs
out. Every request carries the event id in `X-Taskgate-Delivery`, stable across retries, so receivers dedupe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from typing import Literal

from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.application.webhooks.ports import Delivery, SendResult, WebhookSender
from taskgate.domain.errors import InvalidInput

log = logging.getLogger("taskgate.webhooks")

LEASE_MARGIN_S = 30.0  # a claim outlives the send's timeout by this much before another dispatcher may retry

Backfill = Literal["none", "all"]
BACKFILLS: tuple[Backfill, ...] = ("none", "all")


@dataclass(frozen=True, slots=True)
class Subscriber:
    """A webhook endpoint and which events it wants (`events`: glob patterns such as `session.*`). `backfill`:
    where it starts when it is new: "none" (the events after the moment it is first seen) or "all" (the whole
    events log)."""

    name: str
    url: str
    secret: str
    events: tuple[str, ...] = ("*",)
    timeout_s: float = 5.0
    max_attempts: int = 8
    backoff_base_s: float = 1.0
    backoff_max_s: float = 300.0
    backfill: Backfill = "none"

    def __post_init__(self) -> None:
        if not self.name or not self.url or not self.secret:
            raise InvalidInput("a webhook subscriber needs a name, a url and a secret")
        if self.backfill not in BACKFILLS:
            raise InvalidInput(f"webhook {self.name}: backfill must be 'none' or 'all', not {self.backfill!r}")
        if self.max_attempts < 1 or self.timeout_s <= 0 or self.backoff_base_s < 0 or self.backoff_max_s < 0:
            raise InvalidInput(f"webhook {self.name}: max_attempts >= 1, timeout_s > 0 and backoffs >= 0 please")

    def wants(self, kind: str) -> bool:
        return any(fnmatchcase(kind, pattern) for pattern in self.events)

    def backoff(self, attempts: int) -> timedelta:
        """How long to wait after the `attempts`-th failed attempt: base·2^(attempts-1), at most backoff_max_s."""
        exponent = min(max(attempts - 1, 0), 62)  # 2**62 s is past any cap; keeps the float finite
        return timedelta(seconds=min(self.backoff_base_s * 2**exponent, self.backoff_max_s))

    def schedule(self) -> list[float]:
        """The waits (seconds) between the attempts of an event that always fails."""
        return [self.backoff(n).total_seconds() for n in range(1, self.max_attempts)]


@dataclass
class DeliveryReport:
    """What one round did: events enqueued, and the outcome of each send."""

    enqueued: int = 0
    delivered: int = 0
    retried: int = 0  # failed attempts that will be retried
    failed: int = 0  # gave up after max_attempts
    lines: list[str] = field(default_factory=list)  # one per send, for progress output

    @property
    def sent(self) -> int:
        return self.delivered + self.retried + self.failed

    def merge(self, other: DeliveryReport) -> DeliveryReport:
        self.enqueued += other.enqueued
        self.delivered += other.delivered
        self.retried += other.retried
        self.failed += other.failed
        self.lines.extend(other.lines)
        return self


@dataclass(frozen=True, slots=True)
class SubscriberStatus:
    """One subscriber's deliveries by status, and its oldest pending delivery (what holds its queue up)."""

    name: str
    url: str
    events: list[str]
    pending: int
    delivered: int
    failed: int
    oldest_pending_event_id: int | None = None
    oldest_pending_at: datetime | None = None  # when that event happened
    next_attempt_at: datetime | None = None
    attempts: int = 0
    last_error: str | None = None
    backfill: str = "none"
    started: bool = False  # it has rows: its start is fixed
    started_after_event_id: int | None = None  # its `start` marker: it gets the events after this one


class WebhookDispatcher:
    """Delivers the events log to webhook subscribers; see the module docstring for the protocol."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        clock: Clock,
        sender: WebhookSender,
        subscribers: Sequence[Subscriber],
        *,
        batch_size: int = 500,
    ) -> None:
        names = [s.name for s in subscribers]
        if len(set(names)) != len(names):
            raise InvalidInput(f"webhook names must be unique: {', '.join(names)}")
        self._uow, self._clock, self._sender = uow, clock, sender
        self.subscribers = list(subscribers)
        self._batch = batch_size
        self._stop: asyncio.Event | None = None
        # New subscribers this dispatcher saw while the events log was empty: they start at the beginning, but
        # there is no event to put a `start` marker on yet (see `_start`).
        self._seen_on_empty_log: set[str] = set()

    async def run_once(self, limit: int = 100) -> DeliveryReport:
        """Enqueue the new events, then send what is due (at most `limit` sends per subscriber)."""
        enqueued = await self.enqueue_new()
        report = await self.deliver_due(limit)
        report.enqueued += enqueued
        return report

    async def run(self, stop: asyncio.Event, interval_s: float = 1.0) -> None:
        """`run_once` until `stop` is set: at once again after a busy round, else after `interval_s`. A failing
        round (database unreachable, lock timeout) is logged and tried again; it never ends the loop. Once `stop`
        is set, no new send starts; the ones in flight are finished and recorded."""
        self._stop = stop
        while not stop.is_set():
            busy = False
            try:
                busy = (await self.run_once()).sent > 0
            except Exception:
                log.warning("webhook delivery round failed; trying again in %ss", interval_s, exc_info=True)
            if not busy:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval_s)

    async def enqueue_new(self) -> int:
        """Add pending deliveries for the events past each subscriber's cursor. Returns how many were added.

        Raises: ConcurrentModification when PostgreSQL's event writers hold the events table for too long.
        """
        if await self._caught_up():
            return 0
        total = 0
        while True:
            added, more = await self._enqueue_batch()
            total += added
            if not more:
                return total

    async def _caught_up(self) -> bool:
        """No visible event past any subscriber's cursor: the common idle round, answered by a read unit of work
        (no SQLite write lock, no PostgreSQL lock on `events`). An event still in flight is found next round."""
        async with self._uow(write=False) as uow:
            newest = await uow.events.high_water()
            cursors = {sub.name: await uow.deliveries.cursor(sub.name) for sub in self.subscribers}
        if newest == 0:
            self._seen_on_empty_log.update(name for name, cursor in cursors.items() if cursor == 0)
        return all(cursor >= newest for cursor in cursors.values())

    async def _enqueue_batch(self) -> tuple[int, bool]:
        added, more = 0, False
        async with self._uow(write=True) as uow:
            horizon = await uow.deliveries.committed_high_water()
            now = self._clock.now()
            for sub in self.subscribers:
                cursor = await uow.deliveries.cursor(sub.name)
                if cursor == 0:
                    cursor = await self._start(uow, sub, horizon)
                events = await uow.deliveries.events_after(cursor, horizon, self._batch)
                if not events:
                    continue
                wanted = [e.id for e in events if sub.wants(e.kind)]
                if wanted:
                    added += await uow.deliveries.enqueue(sub.name, wanted, now)
                if not wanted or wanted[-1] != events[-1].id:
                    await uow.deliveries.move_cursor(sub.name, events[-1].id)
                more = more or len(events) == self._batch
            await uow.commit()
        return added, more

    async def _start(self, uow: UnitOfWork, sub: Subscriber, horizon: int) -> int:
        """Where a subscriber with no rows starts, inside `_enqueue_batch`'s write unit of work: 0 (the beginning
        of the log) for backfill "all", else after `horizon`, the committed high-water mark, fixed by a `start`
        marker row so that a restart (or another dispatcher) does not move it.

        Two dispatchers (two `taskgate serve` on one PostgreSQL database, `serve` and `webhooks deliver`, or two
        processes on one SQLite file) may see a new subscriber at once; they must not put two markers at two
        places (the later one would drop the events between them) nor lose an event. How that is prevented:
        - SQLite: write units of work are serialised (an in-process lock, then BEGIN IMMEDIATE across processes),
          so the second dispatcher's `cursor` already reads the first one's committed marker and never comes here.
        - PostgreSQL (READ COMMITTED): two dispatchers may both read cursor 0, but then they read the *same*
          horizon: `committed_high_water` holds a SHARE lock on `events` until commit, which no event writer can
          pass, and the second one can only have read cursor 0 while the first one's transaction (and lock) was
          still open, so no event committed between their two reads. Both insert the same (horizon, subscriber)
          row, and the unique constraint `uq_webhook_deliveries_event_subscriber` with ON CONFLICT DO NOTHING
          keeps one: the second insert waits for the first transaction, then does nothing. This is the same
          mechanism that keeps `enqueue` from adding a pending row twice.
        Nothing is lost: no event with an id at or below the horizon can still commit (that is what "committed"
        means here), so every event the subscriber should get is past the marker. The cursor is read again
        after the insert, so a dispatcher whose insert did nothing goes on from the marker that is there.

        An empty log (horizon 0) has no event to put a marker on (the row's event_id is a foreign key): the
        subscriber starts at the beginning, which is the same place, and this dispatcher remembers it until the
        first events come and its rows fix the cursor. A dispatcher that stops before then leaves no trace, so
        the next one starts the subscriber at its own first sight (docs/events.md says so).
        """
        if horizon == 0:
            self._seen_on_empty_log.add(sub.name)
        if sub.backfill == "all" or sub.name in self._seen_on_empty_log:
            return 0
        await uow.deliveries.mark_start(sub.name, horizon)
        return await uow.deliveries.cursor(sub.name)

    async def deliver_due(self, limit: int = 100) -> DeliveryReport:
        """Send each subscriber's due deliveries in event order, at most `limit` per subscriber; subscribers are
        served concurrently. A failed attempt stops that subscriber for this round (its later events wait)."""
        # Every subscriber finishes its round even if another one's fails: no send is cut off half-way.
        reports = await asyncio.gather(*(self._deliver_to(s, limit) for s in self.subscribers), return_exceptions=True)
        total = DeliveryReport()
        for report in reports:
            if isinstance(report, BaseException):
                raise report
            total.merge(report)
        return total

    async def _deliver_to(self, sub: Subscriber, limit: int) -> DeliveryReport:
        report = DeliveryReport()
        for _ in range(limit):
            if self._stop is not None and self._stop.is_set():
                break
            head = await self._claim_head(sub)
            if head is None:
                break
            outcome = await self._send_and_record(sub, head, report)
            if outcome not in ("delivered", "failed"):
                break  # a retry (or a lost claim) holds the subscriber's later events back
        return report

    async def _claim_head(self, sub: Subscriber) -> Delivery | None:
        """The subscriber's head delivery if it is due and this dispatcher claimed it, else None."""
        async with self._uow(write=False) as uow:  # most rounds find nothing due: no write lock for that
            head = await uow.deliveries.head(sub.name)
        now = self._clock.now()
        if head is None or (head.next_attempt_at is not None and head.next_attempt_at > now):
            return None
        lease_until = now + timedelta(seconds=sub.timeout_s + LEASE_MARGIN_S)
        async with self._uow(write=True) as uow:
            if not await uow.deliveries.claim(head.id, head.attempts, now, lease_until):
                return None  # another dispatcher claimed it (or it changed) since we read it
            await uow.commit()
        return head

    async def _send_and_record(self, sub: Subscriber, head: Delivery, report: DeliveryReport) -> str:
        assert head.event is not None
        attempt = head.attempts + 1
        try:
            result = await self._sender.send(sub.url, sub.secret, head.event, timeout_s=sub.timeout_s, attempt=attempt)
        except Exception as exc:  # a sender must not raise; if one does, it is a failed attempt all the same
            result = SendResult(None, f"{type(exc).__name__}: {exc}")
        async with self._uow(write=True) as uow:
            outcome = await self._record(uow, sub, head, attempt, result)
            await uow.commit()
        if outcome != "superseded":
            setattr(report, outcome, getattr(report, outcome) + 1)
        detail = "" if result.ok else f": {result.error}"
        report.lines.append(
            f"{sub.name} event {head.event_id} ({head.event.kind}) attempt {attempt}: {outcome}{detail}"
        )
        return outcome

    async def _record(self, uow: UnitOfWork, sub: Subscriber, head: Delivery, attempt: int, result: SendResult) -> str:
        """delivered | retried | failed, or superseded when our claim ran out and another dispatcher owns the row."""
        now, deliveries, error = self._clock.now(), uow.deliveries, str(result.error)
        if result.ok:
            return "delivered" if await deliveries.mark_delivered(head.id, now) else "superseded"
        if attempt >= sub.max_attempts:
            return "failed" if await deliveries.mark_failed(head.id, attempt, error) else "superseded"
        recorded = await deliveries.mark_retry(head.id, attempt, error, now + sub.backoff(attempt))
        return "retried" if recorded else "superseded"

    async def status(self) -> list[SubscriberStatus]:
        """Per subscriber: deliveries by status, and the oldest pending one (what holds the queue up)."""
        async with self._uow(write=False) as uow:
            counts = await uow.deliveries.counts()
            found = {}
            for sub in self.subscribers:
                d = uow.deliveries
                found[sub.name] = (await d.head(sub.name), await d.cursor(sub.name) > 0, await d.start(sub.name))
        return [self._status_of(sub, counts, *found[sub.name]) for sub in self.subscribers]

    @staticmethod
    def _status_of(
        sub: Subscriber, counts: dict[tuple[str, str], int], head: Delivery | None, started: bool, start: int | None
    ) -> SubscriberStatus:
        base = SubscriberStatus(
            name=sub.name,
            url=sub.url,
            events=list(sub.events),
            pending=counts.get((sub.name, "pending"), 0),
            delivered=counts.get((sub.name, "delivered"), 0),
            failed=counts.get((sub.name, "failed"), 0),
            backfill=sub.backfill,
            started=started,
            started_after_event_id=start,
        )
        if head is None or head.event is None:
            return base
        return replace(
            base,
            oldest_pending_event_id=head.event_id,
            oldest_pending_at=head.event.at,
            next_attempt_at=head.next_attempt_at,
            attempts=head.attempts,
            last_error=head.last_error,
        )
