"""`BuiltinTracker`: the tracker port over taskgate's own tables, so callers treat built-in and Beads alike."""

from __future__ import annotations

from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.application.trackers.ports import TrackerIssue
from taskgate.domain.entities import Project, Task, TaskStatus
from taskgate.domain.errors import TaskNotFound


class BuiltinTracker:
    """Reads and writes the tasks of a project in taskgate's database. Statuses are taskgate's own words
    (open, in_progress, ..., completed); dependencies are the blocker rows with their recorded type."""

    name = "builtin"
    writes_back = False  # sessions move its tasks themselves

    def __init__(self, uow: UnitOfWorkFactory, clock: Clock) -> None:
        self._uow, self._clock = uow, clock

    async def ready(self, project: Project) -> list[TrackerIssue]:
        """Open tasks without an active session whose blockers are all completed, by priority then id."""
        async with self._uow(write=False) as uow:
            tasks = await uow.tasks.ready(project.id)
            issues = await _issues(uow, tasks)
        return sorted(issues, key=lambda i: (i.priority, i.id))

    async def show(self, project: Project, issue_id: str) -> TrackerIssue:
        """Raises: TaskNotFound (also for a task of another project)."""
        async with self._uow(write=False) as uow:
            task = await _task_of(uow, project, issue_id)
            return (await _issues(uow, [task]))[0]

    async def list(self, project: Project) -> list[TrackerIssue]:
        async with self._uow(write=False) as uow:
            issues = await _issues(uow, await uow.tasks.list(project.id))
        return sorted(issues, key=lambda i: i.id)

    async def claim(self, project: Project, issue_id: str, actor: str) -> None:
        """Nothing to do: a session's start is the claim, under the task's row lock (one_active_session_per_task)."""

    async def set_status(self, project: Project, issue_id: str, status: TaskStatus, reason: str = "") -> None:
        """Set the task's status (sessions already do this as they move; this is for callers of the port).

        Raises: TaskNotFound.
        """
        async with self._uow(write=True) as uow:
            task = await _task_of(uow, project, issue_id)
            if task.status == status:
                return
            await uow.tasks.set_status(task.id, TaskStatus(status))
            payload = {"task": task.id, "from": task.status.value, "to": TaskStatus(status).value, "reason": reason}
            await uow.events.append("task.status_set", self._clock.now(), payload)
            await uow.commit()


async def _task_of(uow: UnitOfWork, project: Project, issue_id: str) -> Task:
    task = await uow.tasks.get(issue_id, with_blockers=False)
    if task.project_id != project.id:
        raise TaskNotFound(issue_id)
    return task


async def _issues(uow: UnitOfWork, tasks: list[Task]) -> list[TrackerIssue]:
    links = await uow.tasks.blocker_links([t.id for t in tasks]) if tasks else {}
    return [
        TrackerIssue(
            id=t.id,
            title=t.title,
            description=t.description,
            status=t.status.value,
            priority=t.priority,
            dependencies=tuple(links.get(t.id, ())),
        )
        for t in tasks
    ]
