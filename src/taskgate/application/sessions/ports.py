"""The session engine's ports: sessions, their transition log, the decisions and snapshots recorded with them, and the
test runs `require_tests` reads and makes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from taskgate.domain.entities import (
    Decision,
    Plan,
    Session,
    SessionSnapshot,
    TransitionRecord,
)
from taskgate.domain.policies.facts import TestRun
from taskgate.domain.states import SessionState


@dataclass(frozen=True, slots=True)
class TransitionQuery:
    """Filters of an audit query; every field is optional and they combine with AND."""

    session_id: str | None = None
    actor: str | None = None
    state: str | None = None
    outcome: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = 1000


@dataclass(frozen=True, slots=True)
class TransitionLocks:
    """What `SessionRepository.lock_for_transition` locked: the session, whether the operator's row asked for was
    there (True when none was asked for), and the session's plan (None when not asked for, or the session has none)."""

    session: Session
    operator_found: bool
    plan: Plan | None


class SessionRepository(Protocol):
    async def add(self, session: Session) -> None:
        """Raises: SessionAlreadyActive when the task already has a non-terminal session."""

    async def get(self, session_id: str, *, lock: bool = False) -> Session:
        """Raises: SessionNotFound. `lock` holds the row until the unit of work ends."""

    async def lock_for_transition(
        self, session_id: str, operator_id: str | None, *, session_operator: bool, plan: bool
    ) -> TransitionLocks:
        """Lock, in the one lock order, the session's row, then the operator's (`operator_id`, else the session's own
        operator when `session_operator`), then the session's plan's (when `plan`), each until the unit of work ends.
        Raises: SessionNotFound."""

    async def update(self, session: Session, expected_version: int) -> None:
        """Write `session` if the stored version is still `expected_version`. Raises: ConcurrentModification."""

    async def list(
        self, *, project_id: int | None = None, plan_id: int | None = None, states: set[SessionState] | None = None
    ) -> list[Session]: ...
    async def active_for_task(self, task_id: str) -> list[str]: ...
    async def active_of_node(self, node_id: str) -> list[str]:
        """Ids of the node's sessions that are not in a terminal state."""

    async def ids_with_prefix(self, prefix: str, limit: int) -> list[str]: ...
    async def count_in_states(self, plan_id: int, states: frozenset[SessionState]) -> int: ...
    async def count_of_operator(self, operator_id: str, states: frozenset[SessionState]) -> int:
        """Sessions of the operator (any project) in `states` (operator_capacity)."""

    async def count_by_state(
        self, project_id: int, *, plan_id: int | None = None, operator_id: str | None = None
    ) -> dict[SessionState, int]:
        """The project's sessions per state (states with none are left out), narrowed to a plan and an operator
        when given."""

    async def page_in_states(
        self,
        project_id: int,
        states: frozenset[SessionState],
        *,
        offset: int,
        limit: int,
        plan_id: int | None = None,
        operator_id: str | None = None,
    ) -> list[Session]:
        """`limit` of the project's sessions in `states` from `offset`, the most recently moved first (updated_at,
        then id, descending), narrowed to a plan and an operator when given."""

    async def count_by_plan(self, project_id: int, states: frozenset[SessionState]) -> dict[int, int]:
        """The project's sessions in `states` per plan id (plans with none, and sessions of no plan, left out)."""

    async def operators_of_project(self, project_id: int) -> list[str]:
        """The operators holding at least one of the project's sessions, sorted."""


class TransitionLog(Protocol):
    async def append(self, record: TransitionRecord) -> int:
        """Append one row; returns its sequence number (the log is never updated or deleted)."""

    async def history(self, session_id: str, *, limit: int) -> list[TransitionRecord]:
        """The newest `limit` rows of the session, oldest first."""

    async def applied_until(self, session_id: str, at: datetime) -> list[TransitionRecord]:
        """Applied rows of the session at or before `at`, in log order (for replay)."""

    async def query(self, query: TransitionQuery) -> list[TransitionRecord]:
        """Rows matching the filters, oldest first, at most `query.limit`."""


class DecisionRepository(Protocol):
    async def add(self, decision: Decision) -> int:
        """Raises: AlreadyExists when the operator already decided this verification (session, version)."""

    async def for_verification(self, session_id: str, session_version: int) -> list[Decision]:
        """Every operator's decision on the session at that version, oldest first."""

    async def of_session(self, session_id: str, limit: int = 100) -> list[Decision]:
        """The session's decisions, oldest first (the newest `limit`)."""

    async def approvals(self, session_id: str, session_version: int) -> list[str]:
        """Operator ids that approved the session at that version (for review_approval), sorted."""


class SnapshotRepository(Protocol):
    async def add(self, snapshot: SessionSnapshot) -> int: ...
    async def list(self, session_id: str, *, kind: str | None = None, limit: int = 50) -> list[SessionSnapshot]:
        """The newest `limit` snapshots of the session, newest first."""


class TestRunRepository(Protocol):
    """Runs of `require_tests` (one row per run of the test command in a session worktree)."""

    __test__ = False  # not a pytest class

    async def add(self, run: TestRun) -> int: ...
    async def latest(self, session_id: str, head_commit: str, command: tuple[str, ...]) -> TestRun | None:
        """The newest run of `command` in the session on `head_commit`, or None."""

    async def of_session(self, session_id: str, limit: int = 20) -> list[TestRun]:
        """The session's newest runs, newest first."""


@dataclass(frozen=True, slots=True)
class TestOutcome:
    """How one run of a test command ended. `exit_code` is None when it timed out or could not start;
    `output_tail` is the end of its combined stdout and stderr (bounded)."""

    __test__ = False  # not a pytest class

    exit_code: int | None
    timed_out: bool
    duration_ms: int
    output_tail: str


class TestRunner(Protocol):
    """Runs a project's test command in a worktree (require_tests)."""

    __test__ = False  # not a pytest class

    async def run(self, command: tuple[str, ...], cwd: str, *, timeout_s: float) -> TestOutcome:
        """Run `command` (an argv list, no shell) in `cwd`; past `timeout_s` the whole process group is killed.

        Never raises for a failing, hanging or missing command: the outcome says what happened.
        """
