"""Status write-backs to an external tracker (Beads), as a durable outbox: the rows and their retry rule.

A transition that changes the status of a task from an external tracker writes a `pending` row in its own
commit, so the write is owed even if the process dies right after. A worker then runs the tracker's command
outside any transaction. Its lifecycle:

    pending ──(tracker call succeeded)──────────────────────────────▶ done
       │  └─(failed: attempts < MAX_ATTEMPTS, retried after backoff)─▶ pending
       ├──(failed MAX_ATTEMPTS times)────────────────────────────────▶ failed ──(operator: retry)──▶ pending
       ├──(a newer row for the same task)────────────────────────────▶ superseded
       └──(operator: dismiss)────────────────────────────────────────▶ dismissed  ◀──(dismiss)── failed

Only the newest owed row of a task is ever written: the tracker should end with the task's latest status,
and writing an older one after it would be wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

PENDING = "pending"
DONE = "done"
FAILED = "failed"
DISMISSED = "dismissed"
SUPERSEDED = "superseded"
OPEN_STATES = frozenset({PENDING, FAILED})  # owed and not yet written: what the operator must see
STATES = (PENDING, DONE, FAILED, DISMISSED, SUPERSEDED)

MAX_ATTEMPTS = 6
FIRST_DELAY_S = 10
MAX_DELAY_S = 3600


@dataclass(frozen=True, slots=True)
class Writeback:
    """One status write owed to (or once owed to) the tracker a task came from."""

    id: int
    project_id: int
    task_id: str
    session_id: str | None
    tracker: str
    status: str  # the taskgate task status to write (the tracker's word comes from its status map)
    reason: str
    state: str
    attempts: int
    next_attempt_at: datetime | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    resolved_by: str | None = None

    def describe(self) -> str:
        """One line for an operator: which task, what status, where it stands and bd's own words."""
        error = f": {self.last_error}" if self.last_error else ""
        tried = f"after {self.attempts} attempt(s)"
        return f"write-back #{self.id} of {self.task_id} → {self.status} {self.state} {tried}{error}"


def retry_delay(attempts: int) -> timedelta:
    """How long to wait after the `attempts`-th failed attempt: 10 s, 20 s, 40 s, … capped at an hour."""
    return timedelta(seconds=min(FIRST_DELAY_S * 2 ** max(attempts - 1, 0), MAX_DELAY_S))


def gives_up(attempts: int) -> bool:
    """Whether a row that failed `attempts` times is failed for good (until an operator retries it)."""
    return attempts >= MAX_ATTEMPTS
