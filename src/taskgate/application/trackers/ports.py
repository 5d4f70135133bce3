"""The trackers' ports: the built-in tracker's projects, plans and tasks, an external tracker (Beads) and the outbox of
status written back to it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from taskgate.domain.entities import (
    Plan,
    PlanStatus,
    Project,
    Task,
    TaskStatus,
)
from taskgate.domain.policies.facts import BlockerFact
from taskgate.domain.states import SessionState
from taskgate.domain.writebacks import Writeback


class ProjectRepository(Protocol):
    async def add(self, name: str, key: str, root_path: str, created_at: datetime) -> Project: ...
    async def get(self, project_id: int, *, lock: bool = False) -> Project:
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
class TrackerPoll:
    """The last poll of a project's external tracker (`tracker_polls`): what it cost and found, and what dispatch
    made of it. `report` holds `ready` (task ids), `held` ({task id: why}), `claimed` (task ids with an active
    session), `dispatch` ([{task, outcome, detail, session}]), `dry_run` and `gone` ({task id: why})."""

    project_id: int
    provider: str
    describe: str
    polled_at: datetime
    error: str | None
    calls: int
    not_modified: int
    seconds: float
    report: dict[str, Any]


class TrackerPollRepository(Protocol):
    async def save(self, poll: TrackerPoll) -> None:
        """Insert or replace the project's row."""

    async def list(self) -> list[TrackerPoll]:
        """Every project's last poll, by project id."""


@dataclass(frozen=True, slots=True)
class TrackerIssue:
    """An issue as a tracker reports it. `status` is the tracker's own word (Beads: open, in_progress,
    blocked, deferred, closed; GitHub: open, closed; Linear: the workflow state's name); `dependencies` are
    (depends_on_id, type) pairs. `assignees` are the tracker's logins (GitHub) or user ids (Linear); `hold` says
    why the tracker's own ready rule keeps the issue out of ready (None: ready by that rule, or not asked)."""

    id: str
    title: str
    description: str = ""
    status: str = "open"
    priority: int = 2
    issue_type: str = "task"
    labels: tuple[str, ...] = ()
    dependencies: tuple[tuple[str, str], ...] = ()
    assignees: tuple[str, ...] = ()
    url: str | None = None
    hold: str | None = None
    closed: bool = False  # done or dropped in the tracker (GitHub closed, Linear completed or canceled)
    # why the issue is no longer taskgate's whatever state taskgate moved it to (closed, the label removed, assigned
    # to someone else, archived, moved to another team); None while it is ours. What reconcile acts on.
    lost: str | None = None


class TrackerProvider(Protocol):
    """Where a project's tasks come from. Built-in (our tables), Beads (`bd … --json`), GitHub Issues (REST through
    githubkit) or Linear (GraphQL)."""

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
        """Take the issue for `actor` atomically where the tracker allows (and re-read to check it was won), so no
        other orchestrator starts it. Raises: ClaimRefused (someone else has it), TrackerError."""


class PolledTracker(TrackerProvider, Protocol):
    """A tracker reached over an HTTP API (GitHub Issues, Linear): what a poll reports about its cost and the
    ready rule's filter, for `taskgate tracker status` and the benchmarks."""

    calls: int  # HTTP requests made so far (every page, every retry)
    not_modified: int  # of them, answered 304 from the cache's ETag (GitHub does not count those)

    def describe(self) -> str:
        """One line: where it reads and the filter that makes an issue taskgate's (`github acme/shop label
        taskgate`)."""
