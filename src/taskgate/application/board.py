"""The board (a read model for the operator console): a project's sessions grouped by state, each card with its
task, operator, running agents, age and time in its state; each plan's sessions in progress against its WIP limit;
the tasks ready to start. Reads only.

The board pages its columns in SQL: each column shows one page of `PAGE_SIZE` cards, the most recently moved
first, and its count comes from one GROUP BY over the project's sessions; no session outside a shown page is read.
One board costs a fixed number of queries whatever the number of sessions (the counts, a page per column, the
cards' tasks, the active agents, the plans and their loads, the operators, the ready tasks): a card never triggers
a query of its own.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.engine import SessionService
from taskgate.domain.entities import Session, Task
from taskgate.domain.errors import InvalidInput
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

PAGE_SIZE = 50  # cards a column shows at once; the rest a page at a time (`ColumnPage`)

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
    """One column: its cards on the page shown (`page`, from 1), out of `count` sessions."""

    key: str
    title: str
    cards: list[Card]
    count: int = 0
    page: int = 1

    @property
    def pages(self) -> int:
        """How many pages the column has (at least one, empty or not)."""
        return _last_page(self.count)

    @property
    def first(self) -> int:
        """The position (from 1) in the column of the first card shown."""
        return (self.page - 1) * PAGE_SIZE + 1


@dataclass(frozen=True, slots=True)
class ColumnPage:
    """Which page (from 1) of which column (its key) to show; the other columns show their first page."""

    column: str
    page: int


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
    paged: ColumnPage | None = None
    more_ready: bool = False  # more ready tasks than shown (`taskgate task ready --limit 0` lists them all)


class BoardQuery:
    """Builds `Board`s; `high_water` is what a live board polls to know that something moved."""

    def __init__(self, uow: UnitOfWorkFactory, sessions: SessionService, clock: Clock) -> None:
        self._uow, self._sessions, self._clock = uow, sessions, clock

    async def board(
        self, project_id: int, filters: BoardFilter | None = None, paged: ColumnPage | None = None
    ) -> Board:
        """The project's board, narrowed by plan and operator when `filters` say so, with the page `paged` of one
        column (the others on their first page).

        Raises: InvalidInput when `paged` names no column or a page before the first (a page past the column's
        last shows its last); NotFound when there is no such project."""
        filters = filters or BoardFilter()
        narrow = {"plan_id": filters.plan_id, "operator_id": filters.operator_id}
        async with self._uow(write=False) as uow:  # one read transaction: one consistent picture
            project = await uow.projects.get(project_id)
            counts = await uow.sessions.count_by_state(project_id, **narrow)
            pages = _pages(counts, paged)
            shown = {key: await uow.sessions.page_in_states(project_id, states, offset=(pages[key] - 1) * PAGE_SIZE,
                                                            limit=PAGE_SIZE, **narrow)
                     for key, _title, states in COLUMNS}  # fmt: skip
            on_cards = sorted({s.task_id for column in shown.values() for s in column})
            tasks = {t.id: t for t in await uow.tasks.get_many(on_cards)}
            running = Counter(a.session_id for a in await uow.agents.active())
            plans = await uow.plans.list(project_id)
            loads = await uow.sessions.count_by_plan(project_id, WIP_STATES)
            operators = await uow.sessions.operators_of_project(project_id)
            ready = await uow.tasks.ready(project_id, None if filters.plan_id else READY_SHOWN + 1)
        ready = [t for t in ready if filters.plan_id is None or t.plan_id == filters.plan_id]
        names, limit = {p.id: p.name for p in plans}, self._wip_limit(project.name)
        sizes = {key: _count(counts, states) for key, _title, states in COLUMNS}
        cards = {key: [_card(s, tasks.get(s.task_id), running, names) for s in mine] for key, mine in shown.items()}
        return Board(
            project_id=project_id,
            project=project.name,
            columns=[Column(key, title, cards[key], sizes[key], pages[key]) for key, title, _states in COLUMNS],
            plans=[PlanLoad(p.id, p.name, p.status.value, loads.get(p.id, 0), limit) for p in plans],
            ready_tasks=ready[:READY_SHOWN],
            more_ready=len(ready) > READY_SHOWN,
            operators=operators,
            now=self._clock.now(),
            filters=filters,
            paged=paged,
        )

    async def high_water(self) -> int:
        """The newest event's id: every transition, decision and agent status change appends one."""
        async with self._uow(write=False) as uow:
            return await uow.events.high_water()

    def _wip_limit(self, project: str) -> int | None:
        entries = self._sessions.policies(project)
        limits = [e.policy.limit for e in entries if e.enabled and isinstance(e.policy, WipLimit)]
        return min(limits) if limits else None


def _count(counts: dict[SessionState, int], states: frozenset[SessionState]) -> int:
    return sum(counts.get(state, 0) for state in states)


def _pages(counts: dict[SessionState, int], paged: ColumnPage | None) -> dict[str, int]:
    """The page each column shows: the first, but for `paged`'s column. Raises: InvalidInput (see `board`)."""
    pages = {key: 1 for key, _title, _states in COLUMNS}
    if paged is None:
        return pages
    found = next(((key, title, states) for key, title, states in COLUMNS if key == paged.column), None)
    if found is None:
        keys = ", ".join(key for key, _title, _states in COLUMNS)
        raise InvalidInput(f"the board has no column {paged.column[:40]!r} (its columns: {keys})")
    key, title, states = found
    last = _last_page(_count(counts, states))
    if paged.page < 1:
        raise InvalidInput(f"column {title!r} has {last} page(s) of {PAGE_SIZE} cards: there is no page {paged.page}")
    # past the last: the last. A column shrinks under the page an operator watches (the live refresh fetches the
    # same address again), and an old link outlives its column's size: both show what is left, not an error
    pages[key] = min(paged.page, last)
    return pages


def _last_page(count: int) -> int:
    return max(1, math.ceil(count / PAGE_SIZE))


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
