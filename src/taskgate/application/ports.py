"""The ports every concept shares: the unit of work (one database transaction, carrying each concept's
repositories), the events log, the clock and ids, and a workflow step's claim written in an agent launch.

Each concept's own ports live with it (`sessions/ports.py`, `trackers/ports.py`, `agents/ports.py`, …; the
workflows' stored ones in `workflows/storage.py`). Adapters live in `taskgate.infrastructure`; in-memory twins in
`tests/fakes.py`, and `tests/contract` runs one suite against both so the fakes stay honest.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol

from taskgate.application.agents.ports import AgentRepository
from taskgate.application.forge.ports import PullRequestRepository
from taskgate.application.nodes.ports import LeaseRepository, NodeRepository
from taskgate.application.notifications.ports import NotificationRepository
from taskgate.application.operators.ports import OperatorRepository, QuestionRepository, TokenRepository
from taskgate.application.sessions.ports import (
    DecisionRepository,
    SessionRepository,
    SnapshotRepository,
    TestRunRepository,
    TransitionLog,
)
from taskgate.application.trackers.ports import (
    PlanRepository,
    ProjectRepository,
    TaskRepository,
    TrackerPollRepository,
    WritebackRepository,
)
from taskgate.application.webhooks.ports import DeliveryRepository
from taskgate.application.workflows.storage import StepRunRepository


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
    pull_requests: PullRequestRepository
    tracker_polls: TrackerPollRepository
    questions: QuestionRepository
    notifications: NotificationRepository

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


class Clock(Protocol):
    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` (a fake clock moves its time instead; retries and timers use this, never asyncio)."""

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""


class IdGenerator(Protocol):
    def new_session_id(self) -> str: ...
