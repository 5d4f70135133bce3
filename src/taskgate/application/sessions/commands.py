"""What callers hand the session engine and get back: the commands (create a session, fire a trigger, start a task, page
through sessions), a fire's result, the refusal an effect raises, and the state_data keys an interrupted operation
leaves for `resume`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from taskgate.application.ports import UnitOfWork
from taskgate.domain.bounds import IDS, OFFSETS, PAGE_SIZES, VERSIONS
from taskgate.domain.entities import (
    Decision,
    Session,
    SessionSnapshot,
    TransitionRecord,
)
from taskgate.domain.errors import (
    InvalidInput,
    TaskgateError,
)
from taskgate.domain.policies.violations import Violation
from taskgate.domain.states import SessionState, Trigger

SYSTEM_ACTOR = "system"


START_REQUESTED = "start_requested"  # state_data key: who asked for the start a crash may cut off


MERGE_REQUESTED = "merge_requested"  # state_data key: a merge asked for, recorded before git moves anything


@dataclass(frozen=True, slots=True)
class CreateSession:
    task_id: str
    actor: str
    operator_id: str | None = None
    # The caller goes on to `start` the session (start_task): recorded with the session, so a crash before the
    # start is carried on to it at restart (`resume`), and cleared by the start (applied or refused).
    start_requested: bool = False
    reason: str | None = None  # recorded on the `create` row
    note: Mapping[str, Any] | None = None  # state_data keys the session is born with (dispatch's mark)


@dataclass(frozen=True, slots=True)
class FireTrigger:
    session_id: str
    trigger: str
    actor: str
    reason: str | None = None
    expected_version: int | None = None
    # Set by effects, not by callers: session fields to write with the transition (branch_name,
    # worktree_path, state_data keys to merge) and a snapshot to store in the same transaction.
    changes: Mapping[str, Any] | None = None
    snapshot: SessionSnapshot | None = None
    # Set by the decision use case: the operator's decision, stored in the transition's own transaction
    # (so a decision is recorded if and only if it moved the session).
    decision: Decision | None = None
    # Policies whose violations are recorded but do not block (an authorised operator's override).
    overrides: frozenset[str] = frozenset()
    # Set by an entry point: the caller's authorisation, run first in the fire's first unit of work (the read
    # before outside work, else the transaction), so it costs one statement, not a transaction of its own, and
    # refuses before anything is read, done or written. Raises Forbidden.
    authorize: Callable[[UnitOfWork], Awaitable[Any]] | None = None

    def __post_init__(self) -> None:
        """Raises: InvalidInput for a version out of its range (domain/bounds.py), before any I/O."""
        VERSIONS.check("expected_version", self.expected_version)


class EffectRefused(TaskgateError):
    """An effect's `before` refused the transition; `violations` go into the log as a blocked row."""

    def __init__(
        self, error: TaskgateError, violations: list[Violation], changes: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(str(error))
        self.error, self.violations, self.changes = error, violations, changes


@dataclass(frozen=True, slots=True)
class SessionPage:
    """Which sessions to list (every filter optional) and which page: `limit` from `offset`, newest first."""

    project_id: int | None = None
    plan_id: int | None = None
    states: set[SessionState] | None = None
    operator_id: str | None = None
    limit: int = 100
    offset: int = 0

    def check(self) -> None:
        """Raises: InvalidInput for a limit outside 1..1,000, a negative offset or an id out of range."""
        PAGE_SIZES.check("limit", self.limit)
        OFFSETS.check("offset", self.offset)
        IDS.check("project_id", self.project_id)
        IDS.check("plan_id", self.plan_id)


@dataclass(frozen=True, slots=True)
class StartTask:
    task_id: str
    actor: str
    operator_id: str | None = None
    reason: str | None = None  # recorded on the `create` and `start` rows (dispatch names the trigger)
    note: Mapping[str, Any] | None = None  # state_data keys a new session is born with (see CreateSession)


@dataclass(frozen=True, slots=True)
class FireResult:
    """`record` is the row of the trigger asked for; `session` is the session after it and after every
    automatic follow-up (`follow_ups`, e.g. `cleanup_done` after `merge`). A follow-up that failed leaves the
    session where it was and says why in `warnings`."""

    session: Session
    record: TransitionRecord
    follow_ups: tuple[TransitionRecord, ...] = ()
    warnings: tuple[str, ...] = ()


def parse_trigger(name: str) -> Trigger:
    """The trigger called `name`. Raises: InvalidInput naming the valid triggers."""
    try:
        return Trigger(name)
    except ValueError:
        valid = ", ".join(t.value for t in Trigger if t != Trigger.CREATE)
        raise InvalidInput(f"unknown trigger '{name}'; valid triggers: {valid}") from None
