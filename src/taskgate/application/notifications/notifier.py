"""The notifier: tells the operator, through each configured channel, what waits for them (docs/notifications.md).

A round, under the `notify` lease (one node of a cluster sends; without nodes, this process):

1. `collect` (one write unit of work): read the events past the notifier's cursor, up to the *committed*
   high-water mark; turn each one worth it into a notice (domain/notifications.py); queue it for every channel
   that wants its kind and its session's project; move the cursor past the events read. The queue and the cursor
   commit together, so a restart neither loses an event nor reads one twice. A notifier new to a database starts
   at the high-water mark: it does not tell the operator about history.
2. `flush`: per channel, once its oldest pending notice has waited `batch_s` (and no retry wait holds the channel),
   every pending notice goes out as one message. Sent: the rows are marked sent. Failed: each row's attempts+1 and
   the channel waits base·2^(attempts-1) seconds (at most `backoff_max_s`) before trying again; after
   `max_attempts` the rows are marked failed (`taskgate notify status` shows them and the last error).

Guarantee: at least once. A process that dies after the channel took a message and before `sent` was committed
sends that batch again after its restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from taskgate.application.nodes.ports import Lease
from taskgate.application.notifications.ports import NotificationSender, QueuedNotice
from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.application.webhooks.ports import OutboxEvent
from taskgate.domain.errors import InvalidInput
from taskgate.domain.notifications import EVENT_KINDS, KINDS, Notice, due, is_ci_failure, notice_for, render

log = logging.getLogger("taskgate.notify")

NOTIFY_LEASE = "notify"


class Leases(Protocol):
    """The node service's leases (application/nodes): who holds a named lease across the cluster."""

    holder: str
    lease_s: float

    async def hold(self, name: str, ttl_s: float) -> Lease: ...
    async def release(self, name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Channel:
    """An Apprise URL and what it is told: `kinds`, for `project` only (None: every project but `opted_out`)."""

    url: str
    shown: str  # the URL with its secrets masked, for status lines and logs
    kinds: frozenset[str] = frozenset(KINDS)
    project: str | None = None
    opted_out: frozenset[str] = frozenset()  # projects that replace the top-level channels with their own

    @property
    def key(self) -> str:
        """Stable across restarts (rows are queued under it) and free of the URL's secrets."""
        scope = f"{self.project or '*'}\n{self.url}"
        return hashlib.sha256(scope.encode()).hexdigest()[:16]

    def wants(self, kind: str, project: str | None) -> bool:
        if kind not in self.kinds:
            return False
        if self.project is not None:
            return project == self.project
        return project not in self.opted_out


@dataclass(frozen=True, slots=True)
class NotifyOptions:
    console_url: str = "http://127.0.0.1:8765"
    batch_s: float = 10.0
    interval_s: float = 2.0
    ci_failures: int = 2
    include_details: bool = False
    max_attempts: int = 10
    backoff_base_s: float = 5.0
    backoff_max_s: float = 600.0
    read_batch: int = 500

    def backoff(self, attempts: int) -> timedelta:
        exponent = min(max(attempts - 1, 0), 62)
        return timedelta(seconds=min(self.backoff_base_s * 2**exponent, self.backoff_max_s))


@dataclass
class NotifyReport:
    queued: int = 0
    sent: int = 0  # messages
    retried: int = 0
    failed: int = 0
    turn: str = "held"
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ChannelStatus:
    channel: str  # masked
    scope: str
    kinds: list[str]
    pending: int
    sent: int
    failed: int
    next_attempt_at: datetime | None
    last_error: str | None


class Notifier:
    """Collects notices from the events log and sends them, batched, to the channels; see the module docstring."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        clock: Clock,
        sender: NotificationSender,
        channels: Sequence[Channel],
        options: NotifyOptions | None = None,
        leases: Leases | None = None,
    ) -> None:
        if not channels:
            raise InvalidInput("the notifier needs at least one channel ([notify] channels)")
        self._uow, self._clock, self._sender, self._leases = uow, clock, sender, leases
        self.channels = list({c.key: c for c in channels}.values())
        self.options = options or NotifyOptions()

    async def run(self, stop: asyncio.Event) -> None:
        """`run_once` every `interval_s` until `stop` is set; a failed round is logged and tried again."""
        try:
            while not stop.is_set():
                try:
                    report = await self.run_once()
                    for line in report.lines:
                        log.warning("notify: %s", line)
                except Exception:
                    log.warning("notify round failed; trying again in %ss", self.options.interval_s, exc_info=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.options.interval_s)
        finally:
            if self._leases is not None:
                with contextlib.suppress(Exception):
                    await self._leases.release(NOTIFY_LEASE)

    async def run_once(self) -> NotifyReport:
        """Collect, then send what is due, if this process holds the `notify` lease."""
        report = NotifyReport()
        if self._leases is not None:
            lease = await self._leases.hold(NOTIFY_LEASE, self._leases.lease_s + self.options.interval_s)
            if lease.holder != self._leases.holder:
                report.turn = f"held by {lease.holder}"
                return report
        report.queued = await self.collect()
        await self.flush(report)
        return report

    async def collect(self) -> int:
        """Queue the notices of the events past the cursor. Returns how many rows were queued."""
        async with self._uow(write=False) as uow:
            cursor, newest = await uow.notifications.cursor(), await uow.events.high_water()
        if cursor is not None and cursor >= newest:
            return 0
        total = 0
        while True:
            queued, more = await self._collect_batch()
            total += queued
            if not more:
                return total

    async def _collect_batch(self) -> tuple[int, bool]:
        async with self._uow(write=True) as uow:
            horizon = await uow.deliveries.committed_high_water()
            cursor = await uow.notifications.cursor()
            if cursor is None:  # first sight of this database: start now, not with its history
                await uow.notifications.move_cursor(horizon)
                await uow.commit()
                return 0, False
            events = await uow.deliveries.events_after(cursor, horizon, self.options.read_batch)
            if not events:
                return 0, False
            wanted = [e for e in events if e.kind in EVENT_KINDS]
            sessions = sorted({sid for e in wanted if (sid := _session_of(e))})
            projects = await uow.notifications.session_projects(sessions) if sessions else {}
            by_channel: dict[str, list[Notice]] = defaultdict(list)
            for event in wanted:
                notice = await self._notice(uow, event.id, event.kind, _session_of(event), event.payload)
                project = projects.get(_session_of(event) or "")
                for channel in self.channels:
                    if notice is not None and channel.wants(notice.kind, project):
                        by_channel[channel.key].append(notice)
            now = self._clock.now()
            queued = sum([await uow.notifications.queue(key, found, now) for key, found in by_channel.items()])
            await uow.notifications.move_cursor(events[-1].id)
            await uow.commit()
        return queued, len(events) == self.options.read_batch

    async def _notice(
        self, uow: UnitOfWork, event_id: int, kind: str, session_id: str | None, payload: dict
    ) -> Notice | None:
        failures = 0
        if session_id is not None and is_ci_failure(kind, payload):
            failures = await uow.notifications.ci_failures(session_id, event_id)
        return notice_for(event_id, kind, session_id, payload, ci_failures=failures,
                          ci_threshold=self.options.ci_failures)  # fmt: skip

    async def flush(self, report: NotifyReport | None = None, *, force: bool = False) -> NotifyReport:
        """Send each channel's due batch (`force`: whatever is pending, batch window or not, retry wait or not)."""
        report = report or NotifyReport()
        await asyncio.gather(*(self._flush_channel(c, report, force) for c in self.channels))
        return report

    async def _flush_channel(self, channel: Channel, report: NotifyReport, force: bool) -> None:
        async with self._uow(write=False) as uow:
            rows = await uow.notifications.pending(channel.key, limit=200)
        now = self._clock.now()
        if not rows or (not force and not self._due(rows, now)):
            return
        message = render([r.notice for r in rows], self.options.console_url,
                         include_details=self.options.include_details)  # fmt: skip
        error = await self._send(channel.url, message.title, message.body)
        async with self._uow(write=True) as uow:
            if error is None:
                await uow.notifications.mark_sent([r.id for r in rows], self._clock.now())
                report.sent += 1
            else:
                line = await self._record_failure(uow, rows, error, report)
                report.lines.append(f"{channel.shown}: {line}")
            await uow.commit()

    async def _record_failure(
        self, uow: UnitOfWork, rows: Sequence[QueuedNotice], error: str, report: NotifyReport
    ) -> str:
        """Each notice's attempt counted: the ones at `max_attempts` are given up, the others (a notice that joined
        the batch late has had fewer tries) wait for the channel's next try, set by its most tried notice."""
        spent = [r.id for r in rows if r.attempts + 1 >= self.options.max_attempts]
        left = [r.id for r in rows if r.attempts + 1 < self.options.max_attempts]
        said = []
        if spent:
            await uow.notifications.mark_failed(spent, error)
            report.failed += 1
            said.append(f"{len(spent)} notice(s) given up after {self.options.max_attempts} attempts")
        if left:
            attempts = max(r.attempts for r in rows if r.id in left) + 1
            retry_at = self._clock.now() + self.options.backoff(attempts)
            await uow.notifications.mark_retry(left, error, retry_at)
            report.retried += 1
            said.append(f"{len(left)} notice(s) retried at {retry_at.isoformat(timespec='seconds')}")
        return f"{'; '.join(said)}: {error}"

    def _due(self, rows: Sequence[QueuedNotice], now: datetime) -> bool:
        if any(r.next_attempt_at is not None and r.next_attempt_at > now for r in rows):
            return False  # backing off
        if any(r.attempts for r in rows):
            return True  # a retry whose wait is over
        return due(min(r.queued_at for r in rows), now, self.options.batch_s)

    async def _send(self, url: str, title: str, body: str) -> str | None:
        try:
            return await self._sender.send(url, title, body)
        except Exception as exc:  # a sender must not raise; if one does, it is a failed attempt all the same
            return f"{type(exc).__name__}"

    async def test(self) -> list[tuple[str, str | None]]:
        """Send a test message to every channel now (nothing queued): each channel's masked URL and its error."""
        body = f"taskgate can reach you here. The console: {self.options.console_url.rstrip('/')}/"
        errors = await asyncio.gather(*(self._send(c.url, "taskgate: test notification", body) for c in self.channels))
        return [(c.shown, e) for c, e in zip(self.channels, errors, strict=True)]

    async def status(self) -> list[ChannelStatus]:
        """Per channel: notices pending, sent and given up, and the last error with the next try."""
        async with self._uow(write=False) as uow:
            counts = await uow.notifications.counts()
            errors = {c.key: await uow.notifications.last_error(c.key) for c in self.channels}
        return [
            ChannelStatus(
                channel=c.shown,
                scope=f"project {c.project}" if c.project else "every project",
                kinds=sorted(c.kinds),
                pending=counts.get((c.key, "pending"), 0),
                sent=counts.get((c.key, "sent"), 0),
                failed=counts.get((c.key, "failed"), 0),
                next_attempt_at=errors[c.key][0],
                last_error=errors[c.key][1],
            )
            for c in self.channels
        ]


def _session_of(event: OutboxEvent) -> str | None:
    """The event's session: its column, else its payload's `session_id` (a `question.asked` names it there too)."""
    named = event.payload.get("session_id") if isinstance(event.payload, dict) else None
    return event.session_id or (str(named) if named else None)
