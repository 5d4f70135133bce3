"""Status write-back to an external tracker: a session effect (see application/effects.py).

When a transition changes the status of a task that came from the external tracker (task.source equals the
provider's name, e.g. "beads"), the new status is written back through the `TrackerProvider` after the
transition committed. A tracker that fails or hangs never undoes or blocks a transition: the failure is
recorded as a `tracker.writeback_failed` event (with the command's error), and the next status change
writes the then-current status again.
"""

from __future__ import annotations

from taskgate.application.effects import NOTHING, Aftermath, NoEffects
from taskgate.application.ports import Clock, TrackerProvider, UnitOfWorkFactory
from taskgate.application.sessions import FireResult, FireTrigger
from taskgate.domain.entities import TaskStatus, task_status_for
from taskgate.domain.errors import TaskgateError
from taskgate.domain.states import SessionState


class TrackerWriteBack(NoEffects):
    """Writes task status changes of tracker-sourced tasks back to the tracker."""

    def __init__(self, uow: UnitOfWorkFactory, clock: Clock, provider: TrackerProvider) -> None:
        self._uow, self._clock, self._provider = uow, clock, provider

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        status = _changed_status(result)
        if status is None:
            return NOTHING
        async with self._uow(write=False) as uow:
            task = await uow.tasks.get(result.session.task_id, with_blockers=False)
            project = await uow.projects.get(task.project_id)
        if task.source != self._provider.name:
            return NOTHING
        reason = f"taskgate session {result.session.id[:8]}: {result.record.trigger}"
        try:
            await self._provider.set_status(project, task.id, status, reason)
        except TaskgateError as exc:
            await self._record_failure(result.session.id, task.id, status, exc)
        return NOTHING

    async def _record_failure(self, session_id: str, task_id: str, status: TaskStatus, exc: TaskgateError) -> None:
        payload = {"tracker": self._provider.name, "task": task_id, "status": status.value, "error": str(exc)}
        async with self._uow(write=True) as uow:
            await uow.events.append("tracker.writeback_failed", self._clock.now(), payload, session_id)
            await uow.commit()


def _changed_status(result: FireResult) -> TaskStatus | None:
    """The task status this transition set, or None when it left the task as it was (mirrors the engine)."""
    record = result.record
    before = SessionState(record.from_state) if record.from_state else None
    status = task_status_for(SessionState(record.to_state), before)
    if status is None or (before is not None and status == task_status_for(before, None)):
        return None
    return status
