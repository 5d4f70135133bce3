"""Ports: what the application needs from the outside world, as Protocols.

Adapters live in `taskgate.infrastructure`; in-memory twins live in `tests/fakes.py`, and
`tests/contract` runs one suite against both so the fakes stay honest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from taskgate.domain.entities import (
    Agent,
    AgentStatus,
    ApiToken,
    Decision,
    Operator,
    Plan,
    PlanStatus,
    Project,
    Session,
    SessionSnapshot,
    StepRun,
    StepStatus,
    Task,
    TaskStatus,
    TransitionRecord,
)
from taskgate.domain.outputs import OutputLimits, OutputRecord
from taskgate.domain.policies.facts import BlockerFact, TestRun
from taskgate.domain.states import SessionState
from taskgate.domain.writebacks import Writeback


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


@dataclass(frozen=True, slots=True)
class TaskFacts:
    """A task (its `blockers` list left empty) with what the guards ask about it, read in one query."""

    task: Task
    project: Project
    blockers: tuple[BlockerFact, ...]  # by blocker id
    plan_sessions_in: int  # sessions of the plan asked about in the states asked about (0 without a plan)


class TaskRepository(Protocol):
    async def add(self, task: Task) -> None: ...
    async def facts(self, task_id: str, plan_id: int | None, states: frozenset[SessionState]) -> TaskFacts:
        """The task, its project, its blockers with their status, and the count of `plan_id`'s sessions in
        `states`: the guard facts of a transition, in one round trip. Raises: TaskNotFound."""

    async def get(self, task_id: str, *, lock: bool = False, with_blockers: bool = True) -> Task:
        """Raises: TaskNotFound. `with_blockers=False` skips loading the blocker ids (one query less)."""

    async def list(
        self, project_id: int, *, plan_id: int | None = None, status: TaskStatus | None = None
    ) -> list[Task]: ...
    async def ready(self, project_id: int, limit: int | None = None) -> list[Task]:
        """Open tasks with no active session whose blockers are all completed and whose plan (if any) is not
        closed, by priority then id."""

    async def blockers_of(self, task_id: str) -> list[BlockerFact]: ...
    async def set_status(self, task_id: str, status: TaskStatus) -> None: ...
    async def count_unfinished(self, plan_id: int) -> int: ...
    async def get_many(self, task_ids: list[str]) -> list[Task]:
        """The tasks of any project with these ids (with blockers), by id; unknown ids are left out."""

    async def update_details(
        self, task_id: str, *, title: str, description: str, priority: int, labels: Sequence[str] | None = None
    ) -> None:
        """Set the task's details; its labels too when `labels` is given."""

    async def set_tracker_facts(self, task_id: str, *, tracker_status: str | None, hold: str | None) -> None:
        """What the external tracker says of the task: its status there and why it keeps it out of ready."""

    async def of_source(self, project_id: int, source: str) -> list[Task]:
        """The project's tasks from one tracker (`beads`), without blockers, by id."""

    async def add_many(self, tasks: Sequence[Task]) -> None:
        """Insert tasks in bulk (their `blockers` are not written: see add_links)."""

    async def add_links(self, links: Sequence[tuple[str, str, str]]) -> None:
        """Insert blocker rows (task id, blocker id, type) in bulk; every id must be a task."""

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
    async def update(self, operator: Operator) -> None: ...
    async def lock(self, operator_id: str) -> None:
        """Hold the operator's row until the unit of work ends. Raises: OperatorNotFound."""


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
    async def active_of_node(self, node_id: str) -> list[str]:
        """Ids of the node's sessions that are not in a terminal state."""

    async def ids_with_prefix(self, prefix: str, limit: int) -> list[str]: ...
    async def count_in_states(self, plan_id: int, states: frozenset[SessionState]) -> int: ...
    async def count_of_operator(self, operator_id: str, states: frozenset[SessionState]) -> int:
        """Sessions of the operator (any project) in `states` (operator_capacity)."""


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
    async def list(
        self,
        session_id: str | None = None,
        limit: int = 100,
        *,
        kind: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """The newest `limit` events matching the filters, oldest first. `kind` ending in "." matches a prefix
        (`tracker.`); `since`/`until` are inclusive."""

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
    async def get(self, token_id: str) -> ApiToken | None: ...
    async def list(self) -> list[ApiToken]: ...
    async def revoke(self, token_id: str, at: datetime) -> bool:
        """Mark revoked; False when no such token exists."""

    async def revoke_for_agent(self, agent_id: str, at: datetime) -> int:
        """Revoke the agent's live tokens; how many were live."""

    async def revoke_for_session(self, session_id: str, at: datetime) -> int:
        """Revoke every live token scoped to the session (its agents' and any issued for it); how many."""

    async def revoke_dangling(self, at: datetime) -> list[str]:
        """Revoke live agent tokens whose agent is neither queued, running nor lost (or is gone), or whose
        session ended (completed, cancelled); the ids revoked. Start-up runs it for agents that ended while no
        service watched."""


class StepRunRepository(Protocol):
    """Workflow step runs (attempts), per session in the order they started."""

    async def add(self, run: StepRun) -> int:
        """Store a new run; returns its id."""

    async def update(self, run: StepRun) -> None:
        """Overwrite the run with `run.id` (status, ended_at, output_summary, agent_ids, error).

        Raises: StepRunNotFound when no run has that id."""

    async def get(self, run_id: int) -> StepRun:
        """Raises: StepRunNotFound."""

    async def finish(self, run_id: int, status: StepStatus, ended_at: datetime, output: str, error: str | None) -> bool:
        """Close the run if it is still open (running or waiting), in one statement; False when it was closed
        already or no run has that id (a closed run keeps its first outcome)."""

    async def of_session(self, session_id: str, limit: int = 200) -> list[StepRun]:
        """The newest `limit` runs of the session, oldest first (by id)."""

    async def open_runs(self, session_id: str) -> list[StepRun]:
        """The session's runs still running or waiting, oldest first."""


class WritebackRepository(Protocol):
    """Status writes owed to external trackers (`tracker_writebacks`); see domain/writebacks.py."""

    async def enqueue_for_task(
        self, task_id: str, sources: Sequence[str], status: str, session_id: str | None, reason: str, now: datetime
    ) -> None:
        """A pending row for the task, only if it came from one of these trackers (nothing for other tasks)."""

    async def get(self, writeback_id: int) -> Writeback:
        """Raises: NotFound."""

    async def due(self, now: datetime, limit: int = 100) -> list[Writeback]:
        """Pending rows due at `now`, oldest first."""

    async def list(
        self, *, states: Iterable[str] | None = None, task_ids: Iterable[str] | None = None, limit: int = 100
    ) -> list[Writeback]:
        """Rows, newest first, filtered by state and task."""

    async def claim(self, writeback_id: int, attempts: int, lease_until: datetime, now: datetime) -> bool:
        """Start an attempt (attempts+1, next_attempt_at=lease_until) only if the row is still pending with
        `attempts` attempts: one worker per attempt across processes. False when another got there first."""

    async def finish(
        self,
        writeback_id: int,
        attempts: int,
        state: str,
        error: str | None,
        next_attempt_at: datetime | None,
        now: datetime,
    ) -> bool:
        """Record an attempt's outcome, if the row still has `attempts` attempts and is pending."""

    async def set_state(
        self, writeback_id: int, from_states: Iterable[str], state: str, now: datetime, *, actor: str | None = None
    ) -> bool:
        """Move a row from one of `from_states` to `state` (due now when it becomes pending). False otherwise."""

    async def supersede_older(self, task_id: str, newest_id: int, now: datetime) -> int:
        """Open rows of the task older than `newest_id` become superseded; returns how many."""


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A service process's node as it last heartbeat: `id` (stable per machine and data dir), where it runs, where
    it serves MCP over HTTP (if it does) and when a surviving node found its heartbeat lapsed (None: not found)."""

    id: str
    host: str
    data_dir: str
    pid: int
    version: str
    started_at: datetime
    heartbeat_at: datetime
    url: str | None = None
    down_at: datetime | None = None


class NodeRepository(Protocol):
    async def beat(self, node: NodeRecord) -> None:
        """Record the node's heartbeat (its row is created on the first one, replaced on the next; a beat clears
        `down_at`)."""

    async def get(self, node_id: str) -> NodeRecord | None:
        """The node's row, or None when it never beat."""

    async def list(self) -> list[NodeRecord]:
        """Every node that ever beat, by id."""

    async def live_agents(self) -> dict[str | None, int]:
        """Queued and running agents per node id (None: agents recorded by no node)."""

    async def live_sessions(self) -> dict[str | None, int]:
        """Sessions not in a terminal state per node id (None: sessions recorded by no node)."""

    async def mark_down(self, node_id: str, beat_before: datetime, at: datetime) -> bool:
        """Compare-and-swap: set `down_at = at` when the node is not marked down yet and its last heartbeat is older
        than `beat_before`. True for the one caller that marked it."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds a named lease and until when."""

    name: str
    holder: str
    node_id: str
    acquired_at: datetime
    expires_at: datetime


class LeaseRepository(Protocol):
    async def acquire(self, name: str, holder: str, node_id: str, now: datetime, until: datetime) -> Lease:
        """Take or renew the lease in one statement: it becomes `holder`'s until `until` when it is free, already
        `holder`'s, or expired at `now`. Returns the lease as it stands after (someone else's when refused)."""

    async def release(self, name: str, holder: str) -> None:
        """Give the lease up, if `holder` holds it."""


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
    test_runs: TestRunRepository
    agents: AgentRepository
    deliveries: DeliveryRepository
    step_runs: StepRunRepository
    writebacks: WritebackRepository
    nodes: NodeRepository
    leases: LeaseRepository

    async def __aenter__(self) -> UnitOfWork: ...
    async def __aexit__(self, *exc_info: object) -> None:
        """Rolls back whatever was not committed."""

    async def commit(self) -> None: ...


class UnitOfWorkFactory(Protocol):
    def __call__(self, *, write: bool) -> UnitOfWork: ...


StepClaim = Callable[[UnitOfWork, tuple[str, ...]], Awaitable[None]]
"""The workflow engine's claim of a step (its run row with these agent ids, the stack, the routing that led
there), written inside the agent launcher's own transaction so that the claim and the agents' rows commit
together, before any agent process starts. It may raise ConcurrentModification, which rolls both back."""


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
class WorktreeState:
    """What policies look at in a session worktree: the branch head, uncommitted files, commits not on base."""

    branch: str
    head_commit: str
    dirty: list[str]
    untracked: list[str]
    conflicts: list[str]
    commits: list[CommitInfo]


@dataclass(frozen=True, slots=True)
class BranchChange:
    """What a branch changes against its fork point with base, at one head: the part of `workspace_context`
    an approval records (the head, and the diff its change id is computed from), read with the same git commands
    and the same truncation, so the values are the same."""

    head_commit: str
    diff_stat: list[FileStat]
    patch: str
    patch_truncated: bool


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
    serialised by the adapter; every name and path argument has been validated (see domain/naming.py).

    Nothing runs in a worktree folder that is not the registered worktree of the session's branch: a folder
    that is there but is something else (emptied, a symbolic link, another repository, another branch) raises
    WorktreeMismatch and nothing changes; a folder that is entirely gone is read as empty (and merge recreates
    it from the branch). A session branch deleted outside taskgate raises BranchGone before anything else.
    The base branch only ever moves forward."""

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

    async def reset_worktree(
        self, path: str, commit: str, *, repo_root: str | None = None, branch: str | None = None
    ) -> None:
        """Discard every change in the worktree: hard reset to `commit` and remove untracked files; nothing to
        do when its folder is gone. Give `repo_root` and `branch` (the session's): without them the project
        is the checkout enclosing the worktrees folder and any branch registered at `path` is accepted.

        Raises: WorktreeMismatch (nothing was run there).
        """

    async def workspace_context(
        self, repo_root: str, path: str, branch: str, base: str, *, max_patch_bytes: int = 200_000
    ) -> WorkspaceContext:
        """Diff, commits and worktree state of a session branch against `base`.

        Raises: BranchGone; WorktreeMismatch; VcsError (base missing).
        """

    async def worktree_state(self, repo_root: str, path: str, branch: str, base: str) -> WorktreeState:
        """The cheap subset of `workspace_context` that policies need (no diff). Raises: as workspace_context."""

    async def branch_change(
        self, repo_root: str, path: str, branch: str, base: str, *, max_patch_bytes: int = 200_000
    ) -> BranchChange:
        """The head, diff stat and patch of `workspace_context`, the same values, without the commits, counts and
        worktree status (what an approval records). The worktree is still checked to be the session's.

        Raises: as workspace_context.
        """

    async def merge(
        self, repo_root: str, path: str, branch: str, base: str, *, strategy: str, mode: str
    ) -> MergeOutcome:
        """Bring `base` into the branch if it moved (`strategy` rebase|merge), then merge into `base` (`mode`
        ff-only|no-ff). A conflict aborts and returns the files; nothing is half-applied. `base` moves only by
        a fast-forward from the commit read at the start; where it is checked out, its files follow and
        unrelated local changes there are kept.

        Raises: BranchGone; WorktreeMismatch (the session's worktree, or the base's checkout, is not what it
        should be); VcsError (dirty worktree, local changes in the base's checkout that the merge would
        overwrite, base moved meanwhile, ...). Nothing changed in every case.
        """

    async def base_exists(self, repo_root: str, base: str) -> bool:
        """Whether a worktree can branch from `base`: the local branch, or `origin/<base>`, exists (no fetch)."""

    async def is_merged(self, repo_root: str, commit: str, base: str) -> bool:
        """Whether `commit` is in the history of branch `base` (false when either does not exist)."""

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
    writes_back: bool  # whether task status changes are written to it (Beads' `write_back`)

    async def ready(self, project: Project) -> list[TrackerIssue]:
        """Open issues with no open blocking dependency, by priority then id."""

    async def show(self, project: Project, issue_id: str) -> TrackerIssue:
        """Raises: TaskNotFound."""

    async def list(self, project: Project) -> list[TrackerIssue]: ...
    async def set_status(self, project: Project, issue_id: str, status: TaskStatus, reason: str = "") -> None:
        """Write a task status back to the tracker (a no-op when write-back is off). Raises: TrackerError."""

    async def claim(self, project: Project, issue_id: str, actor: str) -> None:
        """Take the issue for `actor` atomically, so no other orchestrator starts it. Raises: ClaimRefused."""


class Clock(Protocol):
    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` (a fake clock moves its time instead; retries and timers use this, never asyncio)."""

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""


class IdGenerator(Protocol):
    def new_session_id(self) -> str: ...


class AgentRepository(Protocol):
    """The agents of sessions (one row per agent process) and their heartbeats."""

    async def add(self, agent: Agent) -> None: ...
    async def of_session(self, session_id: str) -> list[Agent]:
        """The session's agents, by id."""

    async def many(self, agent_ids: Sequence[str]) -> list[Agent]:
        """The agents with these ids, in the order given; ids of no agent are left out."""

    async def last_run(self, session_id: str) -> int:
        """The highest launch number (`Agent.run`) among the session's agents; 0 when it has none."""

    async def heartbeat(self, agent_id: str, at: datetime) -> bool:
        """Record a sign of life; False when no such agent exists."""

    async def set_status(self, agent_id: str, status: AgentStatus, at: datetime) -> None:
        """Set the status; a status other than queued/running also sets completed_at to `at`."""

    async def update(self, agent: Agent) -> None:
        """Write every field of the agent (status, pid, times, exit code, output tail, error)."""

    async def active(self) -> list[Agent]:
        """Agents queued or running, of every session (what a restarted service must re-attach or fail)."""

    async def of_node(self, node_id: str, statuses: frozenset[AgentStatus]) -> list[Agent]:
        """The node's agents in these statuses, by session then id."""

    async def stale(self, before: datetime) -> list[Agent]:
        """Running agents whose last sign of life (heartbeat_at, else started_at) is older than `before`, by
        session then id. Agents with neither timestamp are left out: nothing says when they were last alive."""


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


@dataclass(frozen=True, slots=True)
class AgentExit:
    """How an agent process ended. `exit_code` is None when it was killed or its status is unknown;
    `reason` is exited | timeout | cancelled | output_limit | start_failed | lost."""

    exit_code: int | None
    reason: str
    output_tail: str


class AgentRunner(Protocol):
    """Starts agent processes (argv lists, never a shell) in their own process group, and watches them."""

    async def start(
        self, command: list[str], cwd: str, env: dict[str, str], output_path: str, inherit: Sequence[str] = ()
    ) -> int:
        """Start the agent; its stdout and stderr go to `output_path`. Returns the process (group) id. `env` is
        added to a built environment; of the service's own environment only a few basics and the variables
        named in `inherit` (the agent type's credentials) pass through.

        Raises: InvalidInput when the program cannot be started (missing, not executable, no cwd).
        """

    def write_private(self, path: str, text: str) -> None:
        """Write a file only the service's user may read (an agent's MCP config, which holds its token)."""

    async def wait(
        self,
        pid: int,
        *,
        output_path: str,
        timeout_s: float,
        max_output_bytes: int,
        stop: asyncio.Event,
        beat: Callable[[], Awaitable[None]],
        beat_every_s: float,
    ) -> AgentExit:
        """Until the agent ends, calling `beat` every `beat_every_s` while it runs. A timeout, `stop` being set
        or the output growing past `max_output_bytes` kills the whole process group. Works for agents started
        by an earlier process too (re-attach after a restart)."""

    def alive(self, pid: int) -> bool: ...
    def ended(self, output_path: str) -> AgentExit | None:
        """How an agent that is gone ended, if its wrapper recorded it (re-attach after a restart)."""

    def started(self, output_path: str | None) -> bool:
        """Whether a process was ever started with this output (a queued agent found at restart that was not
        is started then; one that was, with no pid recorded, is lost)."""

    def has_credential(self, variables: Sequence[str], logins: Sequence[str]) -> bool:
        """Whether one of `variables` is set in the service's environment, or one of `logins` (paths under HOME,
        a CLI's own login) exists."""

    def locate(self, program: str) -> str | None:
        """Where `program` (an agent command's first element) would be run from: its path, or None when it is
        not installed (not on PATH, or not an executable file)."""

    def read_log(self, output_path: str, max_bytes: int) -> str:
        """The last `max_bytes` of the agent's log (its stdout and stderr), decoded leniently; "" when there is none."""


class AgentEndpoint(Protocol):
    """Where agents reach taskgate's MCP tools. The supervisor acquires it before an agent starts (the URL goes to
    the agent) and releases it when the agent's supervision ends, so an endpoint that runs only for its agents
    (a loopback listener of a CLI process) lives exactly as long as they do."""

    async def acquire(self) -> str:
        """The endpoint's URL, started first if need be."""
        ...

    async def release(self) -> None:
        """One acquirer is done with it."""
        ...


class ProjectFiles(Protocol):
    """Files of a project's tree that workflows name (`load:` files, `{config_source}:key` configs). Reads stay
    inside the project's root: a path that leaves it (`..`, an absolute path elsewhere, a symbolic link pointing
    out) is refused, as are files that are not UTF-8 text or are larger than the limit."""

    def read_text(self, root: str, path: str) -> str:
        """The text of `path` (absolute, or relative to `root`). Raises: InvalidInput (missing, not a file, too
        big, not text), Forbidden (outside `root`)."""
        ...

    def config_value(self, root: str, path: str, key: str) -> str:
        """The value of dotted `key` in the YAML or JSON file `path`, as text. Raises: VariableError (no such key,
        not a scalar), and what `read_text` raises."""
        ...


class SessionFolders(Protocol):
    """The session folders (`<data_dir>/agent-outputs/<session id>/`): files agents save, and `manifest.json`.

    Every write stays inside the session's folder: paths are checked by `domain.outputs.output_path`, and the
    adapter follows no symbolic link. Manifest updates are atomic and serialised per session (also across
    processes). Session ids must be UUIDs (InvalidInput otherwise)."""

    limits: OutputLimits

    def path(self, session_id: str) -> str:
        """The folder's absolute path (it may not exist yet)."""

    async def place(self, session_id: str, relative: str) -> str:
        """Put the folder at `relative` under the root (a workflow's `session_folder`), before it exists; returns
        its path. Raises: InvalidInput (a bad path, no session id in it, the folder exists already)."""

    async def ensure(self, session_id: str) -> str:
        """Create the folder if needed; returns its path. Raises: Forbidden when it is a symlink."""

    async def write_output(
        self, session_id: str, relative: str, data: bytes, *, at: datetime, by: str, task: dict[str, Any]
    ) -> OutputRecord:
        """Write `data` to `relative` (atomically replacing an earlier file) and list it in the manifest (created
        with `task` if missing). Raises: InvalidInput for a bad path or a broken limit; Forbidden for a symlink
        or something that is not a regular file or folder on the way."""

    def has_manifest(self, session_id: str) -> bool:
        """Whether the session's folder has a manifest, from a stat or two on the calling thread: for skipping
        work on the many sessions without a folder. A True answer is no promise; read_manifest decides."""

    async def read_manifest(self, session_id: str) -> dict[str, Any] | None:
        """The manifest, or None when the folder has none (or an unreadable one)."""

    async def update_manifest(
        self, session_id: str, mutate: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Replace the manifest with `mutate(current)` (an empty manifest when there is none); returns it."""
