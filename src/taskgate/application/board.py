"""The board (a read model for the operator console): a project's sessions grouped by state, each card with its
task, operator, running agents, age and time in its state; each plan's sessions in progress against its WIP limit;
the tasks ready to start. Reads only.

One board costs a fixed number of queries whatever the number of sessions (sessions, their tasks, the active
agents, the plans, the ready tasks): a card never triggers a query of its own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.engine import SessionService
from taskgate.domain.entities import Plan, Session, Task
from taskgate.domain.policies.rules import WipLimit
from taskgate.domain.states import WIP_STATES, SessionState

S = SessionState

COLUMNS: tuple[tuple[str, str, frozenset[SessionState]], ...] = (
    ("ready", "Ready", frozenset({S.CREATED, S.INITIALIZING, S.READY})),
    ("planning", "Planning", frozenset({S.PLANNING})),
    ("executing", "Executing", frozenset({S.EXECUTING})),
    ("verifying", "Verifying", frozenset({S.VERIFYING})),
    ("awaiting_merge", "Awaiting merge", frozenset({S.AWAITING_MERGE, S.MERGED})),
    ("stopped", "Failed / suspended / timed out", frozenset(
        {S.FAILED, S.SUSPENDED, S.TIMED_OUT, S.ABANDONED, S.ROLLED_BACK})),
    ("done", "Done", frozenset({S.COMPLETED, S.CANCELLED})),
)  # fmt: skip
"""The board's columns in order: key, heading, the states whose sessions it shows."""

DONE_SHOWN = 50  # finished sessions shown (newest first): a board is about what is moving


READY_SHOWN = 100  # a Beads project can have thousands ready: the board shows the most urgent, as bd ready


@dataclass(frozen=True, slots=True)
class Card:
    """One session on the board."""

    session_id: str
    task_id: str
    title: str
    state: str
    version: int
    operator_id: str | None
    plan: str | None
    agents_running: int
    created_at: datetime
    in_state_since: datetime
    escalated: bool


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    title: str
    cards: list[Card]


@dataclass(frozen=True, slots=True)
class PlanLoad:
    """A plan's sessions in progress (planning..awaiting_merge) against its WIP limit (None: no limit enabled)."""

    plan_id: int
    name: str
    status: str
    in_progress: int
    limit: int | None


@dataclass(frozen=True, slots=True)
class BoardFilter:
    plan_id: int | None = None
    operator_id: str | None = None


@dataclass(frozen=True, slots=True)
class Board:
    project_id: int
    project: str
    columns: list[Column]
    plans: list[PlanLoad]
    ready_tasks: list[Task]  # the first READY_SHOWN, most urgent first
    operators: list[str]
    now: datetime
    filters: BoardFilter = field(default_factory=BoardFilter)
    more_ready: bool = False  # more ready tasks than shown (`taskgate task ready --limit 0` lists them all)


class BoardQuery:
    """Builds `Board`s; `high_water` is what a live board polls to know that something moved."""

    def __init__(self, uow: UnitOfWorkFactory, sessions: SessionService, clock: Clock) -> None:
        self._uow, self._sessions, self._clock = uow, sessions, clock

    async def board(self, project_id: int, filters: BoardFilter | None = None) -> Board:
        """The project's board, narrowed by plan and operator when `filters` say so."""
        filters = filters or BoardFilter()
        async with self._uow(write=False) as uow:  # one read transaction: one consistent picture
            project = await uow.projects.get(project_id)
            sessions = await uow.sessions.list(project_id=project_id)
            tasks = {t.id: t for t in await uow.tasks.get_many(sorted({s.task_id for s in sessions}))}
            running = Counter(a.session_id for a in await uow.agents.active())
            plans = await uow.plans.list(project_id)
            ready = await uow.tasks.ready(project_id, None if filters.plan_id else READY_SHOWN + 1)
        shown = [s for s in sessions if _passes(s, filters)]
        ready = [t for t in ready if filters.plan_id is None or t.plan_id == filters.plan_id]
        return Board(
            project_id=project_id,
            project=project.name,
            columns=_columns(shown, tasks, running, {p.id: p.name for p in plans}),
            plans=_loads(plans, sessions, self._wip_limit(project.name)),
            ready_tasks=ready[:READY_SHOWN],
            more_ready=len(ready) > READY_SHOWN,
            operators=sorted({s.operator_id for s in sessions if s.operator_id}),
            now=self._clock.now(),
            filters=filters,
        )

    async def high_water(self) -> int:
        """The newest event's id: every transition, decision and agent status change appends one."""
        async with self._uow(write=False) as uow:
            return await uow.events.high_water()

    def _wip_limit(self, project: str) -> int | None:
        entries = self._sessions.policies(project)
        limits = [e.policy.limit for e in entries if e.enabled and isinstance(e.policy, WipLimit)]
        return min(limits) if limits else None


def _passes(session: Session, filters: BoardFilter) -> bool:
    if filters.plan_id is not None and session.plan_id != filters.plan_id:
        return False
    return filters.operator_id is None or session.operator_id == filters.operator_id


def _columns(sessions: list[Session], tasks: dict[str, Task], running: Counter, plans: dict[int, str]) -> list[Column]:
    columns = []
    for key, title, states in COLUMNS:
        mine = [s for s in sessions if s.state in states]
        mine.sort(key=lambda s: s.updated_at, reverse=key == "done")
        if key == "done":
            mine = mine[:DONE_SHOWN]
        columns.append(Column(key, title, [_card(s, tasks.get(s.task_id), running, plans) for s in mine]))
    return columns


def _card(session: Session, task: Task | None, running: Counter, plans: dict[int, str]) -> Card:
    return Card(
        session_id=session.id,
        task_id=session.task_id,
        title=task.title if task else "",
        state=session.state.value,
        version=session.version,
        operator_id=session.operator_id,
        plan=plans.get(session.plan_id) if session.plan_id is not None else None,
        agents_running=running.get(session.id, 0),
        created_at=session.created_at,
        in_state_since=session.updated_at,
        escalated=session.escalated_at is not None,
    )


def _loads(plans: list[Plan], sessions: list[Session], limit: int | None) -> list[PlanLoad]:
    counts = Counter(s.plan_id for s in sessions if s.state in WIP_STATES)
    return [PlanLoad(p.id, p.name, p.status.value, counts.get(p.id, 0), limit) for p in plans]
