"""What runs now, as dispatch counts it for its caps, and how often each task's dispatched attempts failed: read
once per dispatch pass (domain/dispatching.py has the rules over these counts)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from taskgate.application.ports import UnitOfWork
from taskgate.domain.dispatching import AWAITING_DECISION, RUNNING, Load
from taskgate.domain.dispatching import FAILED as FAILED_STATES
from taskgate.domain.entities import Outcome, Session, Task, TaskStatus
from taskgate.domain.states import SessionState

DISPATCHED = "dispatched"  # state_data key of a session dispatch created: workflow, trigger, operator, waiting_since


async def current_load(
    uow: UnitOfWork, project_ids: set[int], agents_of: Callable[[dict | None], list[str]]
) -> tuple[Load, dict[str, tuple[int, datetime]]]:
    """Running sessions by project, task label and agent preset (`agents_of` a dispatch mark), the sessions
    awaiting a decision, and each task's failed dispatched attempts (count, when the last one ended)."""
    states = set(RUNNING | AWAITING_DECISION | FAILED_STATES) | {SessionState.COMPLETED}
    found = [s for s in await uow.sessions.list(states=states) if s.project_id in project_ids]
    found = [s for s in found if s.state != SessionState.COMPLETED or _mark(s) is not None]
    tasks = {t.id: t for t in await uow.tasks.get_many(sorted({s.task_id for s in found}))}
    rolled_back = await _rolled_back(uow, found, tasks)
    load, failures = Load(), {}
    for session in found:
        mark = _mark(session)
        if session.state in AWAITING_DECISION:
            load.awaiting += 1
        elif session.state in RUNNING:
            task = tasks.get(session.task_id)
            load.add(session.project_id, task.labels if task else (), agents_of(mark))
        elif mark is not None and (session.state in FAILED_STATES or session.id in rolled_back):
            count, last = failures.get(session.task_id, (0, None))
            ended = session.completed_at or session.updated_at
            failures[session.task_id] = (count + 1, ended if last is None or ended > last else last)
    return load, failures


async def _rolled_back(uow: UnitOfWork, sessions: list[Session], tasks: dict[str, Task]) -> set[str]:
    """A failed attempt rolled back (compensate, then cleanup_done) ends completed and frees its task: still a failure
    to count. A merged one completed its task, so only completed sessions of unfinished tasks are read."""
    found = set()
    for session in sessions:
        task = tasks.get(session.task_id)
        if session.state == SessionState.COMPLETED and task and task.status != TaskStatus.COMPLETED:
            rows = await uow.transitions.history(session.id, limit=10)
            if any(r.to_state == SessionState.ROLLED_BACK.value and r.outcome == Outcome.APPLIED for r in rows):
                found.add(session.id)
    return found


def _mark(session: Session) -> dict | None:
    mark = session.state_data.get(DISPATCHED)
    return mark if isinstance(mark, dict) else None
