"""Ports: what the application needs from the outside world, as Protocols.

Adapters live in `taskgate.infrastructure`; in-memory twins live in `tests/fakes.py`, and
`tests/contract` runs one suite against both so the fakes stay honest.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from taskgate.domain.entities import (
    ApiToken,
    Operator,
    Plan,
    PlanStatus,
    Project,
    Session,
    Task,
    TaskStatus,
    TransitionRecord,
)
from taskgate.domain.policies import BlockerFact
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


class ProjectRepository(Protocol):
    async def add(self, name: str, key: str, root_path: str, created_at: datetime) -> Project: ...
    async def get(self, project_id: int) -> Project:
        """Raises: ProjectNotFound."""

    async def find(
        self, *, name: str | None = None, root_path: str | None = None, key: str | None = None
    ) -> Project | None: ...
    async def list(self) -> list[Project]: ...
    async def archive(self, project_id: int, at: datetime) -> None: ...
    async def allocate_task_number(self, project_id: int) -> int:
        """The next task number of the project; call inside a write unit of work."""


class PlanRepository(Protocol):
    async def add(self, project_id: int, name: str, created_at: datetime) -> Plan: ...
    async def get(self, plan_id: int, *, lock: bool = False) -> Plan:
        """Raises: PlanNotFound. `lock` takes a row lock until the unit of work ends."""

    async def list(self, project_id: int) -> list[Plan]: ...
    async def set_status(self, plan_id: int, status: PlanStatus) -> None: ...


class TaskRepository(Protocol):
    async def add(self, task: Task) -> None: ...
    async def get(self, task_id: str, *, lock: bool = False, with_blockers: bool = True) -> Task:
        """Raises: TaskNotFound. `with_blockers=False` skips loading the blocker ids (one query less)."""

    async def list(
        self, project_id: int, *, plan_id: int | None = None, status: TaskStatus | None = None
    ) -> list[Task]: ...
    async def ready(self, project_id: int) -> list[Task]:
        """Open tasks with no active session whose blockers are all completed, by priority then id."""

    async def blockers_of(self, task_id: str) -> list[BlockerFact]: ...
    async def set_status(self, task_id: str, status: TaskStatus) -> None: ...
    async def count_unfinished(self, plan_id: int) -> int: ...


class OperatorRepository(Protocol):
    async def add(self, operator: Operator) -> None: ...
    async def get(self, operator_id: str) -> Operator:
        """Raises: OperatorNotFound."""

    async def find(self, operator_id: str) -> Operator | None: ...
    async def list(self) -> list[Operator]: ...


class SessionRepository(Protocol):
    async def add(self, session: Session) -> None:
        """Raises: SessionAlreadyActive when the task already has a non-terminal session."""

    async def get(self, session_id: str, *, lock: bool = False) -> Session:
        """Raises: SessionNotFound. `lock` holds the row until the unit of work ends."""

    async def update(self, session: Session, expected_version: int) -> None:
        """Write `session` if the stored version is still `expected_version`. Raises: ConcurrentModification."""

    async def list(
        self, *, project_id: int | None = None, plan_id: int | None = None, states: set[SessionState] | None = None
    ) -> list[Session]: ...
    async def active_for_task(self, task_id: str) -> list[str]: ...
    async def ids_with_prefix(self, prefix: str, limit: int) -> list[str]: ...
    async def count_in_states(self, plan_id: int, states: frozenset[SessionState]) -> int: ...


class TransitionLog(Protocol):
    async def append(self, record: TransitionRecord) -> int:
        """Append one row; returns its sequence number (the log is never updated or deleted)."""

    async def history(self, session_id: str, *, limit: int) -> list[TransitionRecord]:
        """The newest `limit` rows of the session, oldest first."""

    async def applied_until(self, session_id: str, at: datetime) -> list[TransitionRecord]:
        """Applied rows of the session at or before `at`, in log order (for replay)."""

    async def query(self, query: TransitionQuery) -> list[TransitionRecord]:
        """Rows matching the filters, oldest first, at most `query.limit`."""


class EventLog(Protocol):
    async def append(self, kind: str, at: datetime, payload: dict[str, Any], session_id: str | None = None) -> None: ...
    async def list(self, session_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]: ...


class TokenRepository(Protocol):
    async def add(self, token: ApiToken) -> None: ...
    async def find_by_hash(self, token_hash: str) -> ApiToken | None: ...
    async def list(self) -> list[ApiToken]: ...
    async def revoke(self, token_id: str, at: datetime) -> bool:
        """Mark revoked; False when no such token exists."""


class UnitOfWork(Protocol):
    """One database transaction. Write units serialise against each other (see the adapter for how)."""

    projects: ProjectRepository
    plans: PlanRepository
    tasks: TaskRepository
    operators: OperatorRepository
    sessions: SessionRepository
    transitions: TransitionLog
    events: EventLog
    tokens: TokenRepository

    async def __aenter__(self) -> UnitOfWork: ...
    async def __aexit__(self, *exc_info: object) -> None:
        """Rolls back whatever was not committed."""

    async def commit(self) -> None: ...


class UnitOfWorkFactory(Protocol):
    def __call__(self, *, write: bool) -> UnitOfWork: ...


@dataclass(frozen=True, slots=True)
class RepositoryInfo:
    root: str
    head_branch: str | None


class VcsProvider(Protocol):
    async def inspect_repository(self, path: str) -> RepositoryInfo:
        """Raises: InvalidInput when `path` is not inside a git repository."""


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""


class IdGenerator(Protocol):
    def new_session_id(self) -> str: ...
