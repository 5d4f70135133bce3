"""Ports: what the application needs from the outside world, as Protocols.

Adapters live in `taskgate.infrastructure`; in-memory twins live in `tests/fakes.py`, and
`tests/contract` runs one suite against both so the fakes stay honest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from taskgate.domain.entities import (
    ApiToken,
    Decision,
    Operator,
    Plan,
    PlanStatus,
    Project,
    Session,
    SessionSnapshot,
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
    async def get_many(self, task_ids: list[str]) -> list[Task]:
        """The tasks of any project with these ids (with blockers), by id; unknown ids are left out."""

    async def update_details(self, task_id: str, *, title: str, description: str, priority: int) -> None: ...
    async def set_blockers(self, task_id: str, blockers: list[tuple[str, str]]) -> None:
        """Replace the task's dependency rows with these (depends_on_id, type) pairs; all of them block."""

    async def blocker_links(self, task_ids: list[str]) -> dict[str, list[tuple[str, str]]]:
        """The (depends_on_id, type) rows of each task, by depends_on_id; tasks without rows are left out."""


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
    async def high_water(self) -> int:
        """The id of the newest event (0 when there is none): every write of taskgate appends an event, so
        an unchanged high-water mark means nothing was written since (the context cache relies on it)."""


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
    snapshots: SnapshotRepository
    decisions: DecisionRepository

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


@dataclass(frozen=True, slots=True)
class WorktreeCreated:
    """What `create_worktree` made: the folder, its new branch, and the base it started from."""

    path: str
    branch: str
    base_ref: str
    base_commit: str


@dataclass(frozen=True, slots=True)
class CommitInfo:
    sha: str
    subject: str
    author: str
    at: datetime


@dataclass(frozen=True, slots=True)
class FileStat:
    path: str
    added: int  # -1 for binary files
    deleted: int


@dataclass(frozen=True, slots=True)
class WorkspaceContext:
    """What an operator reviews: the branch against its base, and the state of the worktree."""

    branch: str
    base_ref: str
    base_commit: str
    head_commit: str
    ahead: int
    behind: int
    diff_stat: list[FileStat]
    patch: str
    patch_truncated: bool
    commits: list[CommitInfo]
    dirty: list[str]
    untracked: list[str]
    conflicts: list[str]


@dataclass(frozen=True, slots=True)
class MergeOutcome:
    """A merge that happened (`merged`) or was refused with the conflicting files, leaving nothing changed."""

    merged: bool
    base_ref: str
    merged_commit: str | None = None
    rebased: bool = False
    conflicts: list[str] = field(default_factory=list)
    detail: str = ""


@dataclass(frozen=True, slots=True)
class WorktreeEntry:
    """One entry of `git worktree list`; `missing` when its folder is gone."""

    path: str
    branch: str | None
    head: str | None
    missing: bool = False


@dataclass(frozen=True, slots=True)
class RepoContext:
    """The project repository at a glance (the context scout's git half)."""

    branch: str | None
    head: str | None
    clean: bool
    staged: int
    unstaged: int
    untracked: int
    conflicted: int
    state: str  # clean | merging | rebasing | cherry-picking | reverting | bisecting
    recent_commits: list[CommitInfo]
    worktrees: list[WorktreeEntry]


class VcsProvider(Protocol):
    """Git operations on a project repository and its session worktrees. Mutating calls on one repository are
    serialised by the adapter; every name and path argument has been validated (see domain/naming.py)."""

    async def inspect_repository(self, path: str) -> RepositoryInfo:
        """Raises: InvalidInput when `path` is not inside a git repository."""

    async def create_worktree(self, repo_root: str, path: str, branch: str, base: str) -> WorktreeCreated:
        """A new worktree at `path` on a new `branch` from `base` (after a fetch when `origin` exists).

        Raises: VcsError (base missing, branch or path taken); nothing is left behind on failure.
        """

    async def remove_worktree(self, repo_root: str, path: str, branch: str | None) -> None:
        """Remove the worktree (even if dirty or already deleted by hand) and delete its branch. Idempotent."""

    async def delete_branch(self, repo_root: str, branch: str) -> None:
        """Delete a local branch (forced); a missing branch is fine."""

    async def reset_worktree(self, path: str, commit: str) -> None:
        """Discard every change in the worktree: hard reset to `commit` and remove untracked files."""

    async def workspace_context(
        self, repo_root: str, path: str, branch: str, base: str, *, max_patch_bytes: int = 200_000
    ) -> WorkspaceContext:
        """Diff, commits and worktree state of a session branch against `base`. Raises: VcsError."""

    async def merge(
        self, repo_root: str, path: str, branch: str, base: str, *, strategy: str, mode: str
    ) -> MergeOutcome:
        """Bring `base` into the branch if it moved (`strategy` rebase|merge), then merge into `base` (`mode`
        ff-only|no-ff). A conflict aborts and returns the files; nothing is half-applied.

        Raises: VcsError (dirty worktree, base checked out with local changes, ...).
        """

    async def repo_context(self, repo_root: str, *, recent: int = 10) -> RepoContext: ...
    async def worktrees(self, repo_root: str) -> list[WorktreeEntry]: ...
    async def branches(self, repo_root: str, prefix: str) -> list[str]:
        """Local branch names starting with `prefix`."""

    async def prune(self, repo_root: str) -> None:
        """Forget worktrees whose folder is gone (`git worktree prune`)."""

    async def disk_usage(self, path: str) -> int:
        """Bytes used under `path` (0 when it does not exist)."""


@dataclass(frozen=True, slots=True)
class TrackerIssue:
    """An issue as a tracker reports it. `status` is the tracker's own word (Beads: open, in_progress,
    blocked, deferred, closed); `dependencies` are (depends_on_id, type) pairs."""

    id: str
    title: str
    description: str = ""
    status: str = "open"
    priority: int = 2
    issue_type: str = "task"
    labels: tuple[str, ...] = ()
    dependencies: tuple[tuple[str, str], ...] = ()


class TrackerProvider(Protocol):
    """Where a project's tasks come from. Built-in (our tables) or Beads (`bd … --json`)."""

    name: str

    async def ready(self, project: Project) -> list[TrackerIssue]:
        """Open issues with no open blocking dependency, by priority then id."""

    async def show(self, project: Project, issue_id: str) -> TrackerIssue:
        """Raises: TaskNotFound."""

    async def list(self, project: Project) -> list[TrackerIssue]: ...
    async def set_status(self, project: Project, issue_id: str, status: TaskStatus, reason: str = "") -> None:
        """Write a task status back to the tracker (a no-op when write-back is off). Raises: TrackerError."""


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""


class IdGenerator(Protocol):
    def new_session_id(self) -> str: ...
