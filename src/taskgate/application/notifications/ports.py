"""The notifications' ports: their store (a cursor over the events log and a queue per channel) and the sender."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from taskgate.domain.notifications import Notice


@dataclass(frozen=True, slots=True)
class QueuedNotice:
    """A notice waiting for (or done with) one channel. `status`: pending | sent | failed (gave up)."""

    id: int
    channel: str
    notice: Notice
    queued_at: datetime
    status: str = "pending"
    attempts: int = 0
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    sent_at: datetime | None = None


class NotificationRepository(Protocol):
    async def cursor(self) -> int | None:
        """The id of the last event the notifier has read; None before its first pass."""

    async def move_cursor(self, event_id: int) -> None: ...

    async def queue(self, channel: str, notices: Sequence[Notice], at: datetime) -> int:
        """Pending rows for the channel (a (channel, event) queued already is left alone). Returns how many were new."""

    async def pending(self, channel: str, limit: int = 100) -> list[QueuedNotice]:
        """The channel's pending notices, oldest event first."""

    async def mark_sent(self, ids: Sequence[int], at: datetime) -> None: ...

    async def mark_retry(self, ids: Sequence[int], error: str, next_attempt_at: datetime) -> None:
        """A failed attempt: attempts+1, the error, and when to try again."""

    async def mark_failed(self, ids: Sequence[int], error: str) -> None:
        """Given up: attempts+1, status failed."""

    async def counts(self) -> dict[tuple[str, str], int]:
        """Rows by (channel, status)."""

    async def last_error(self, channel: str) -> tuple[datetime | None, str | None]:
        """The channel's newest error on a pending row (what holds it up), else on a failed one; and its next try."""

    async def session_projects(self, session_ids: Sequence[str]) -> dict[str, str]:
        """Each session's project name (sessions that do not exist are left out)."""

    async def ci_failures(self, session_id: str, up_to_event_id: int) -> int:
        """How many `ci_failed` transitions the session had, by its events up to and including `up_to_event_id`."""


class NotificationSender(Protocol):
    async def send(self, url: str, title: str, body: str) -> str | None:
        """Send one message to the channel `url`. Returns None when it went, else why not (never the URL in full);
        never raises for a failed send."""
