"""Beads read live (`[tracker] kind = "beads"`): every decision that depends on Beads asks `bd` first.

- **ready** (`task ready`, `project_ready_tasks`, the context; the board's Ready column reads what the last call
  mirrored, and `taskgate serve` refreshes it every sweep): `bd ready` decides, by its own rule. Its issues
  are mirrored into the task table (a task per issue, `source = beads`, `external_id` the Beads id, the labels
  that fit the task label rule of domain/workflows/triggers.py) so that sessions can refer to them and dispatch can
  route them; the list is bd's, minus tasks that have an active session here or sit in a closed plan.
- **start**: `BeadsClaim.before` asks `bd ready` whether the issue is still ready and claims it with
  `bd update ID --claim` (Beads' compare-and-swap): two orchestrators never take the same issue. A refusal is
  a blocked `start` row naming bd's words, and nothing else changes.
- **status changes** go back through the write-back outbox (application/trackers/writebacks.py).

Why live rather than a periodic import: `bd ready` is then the same ready set by construction, and the claim is
only safe against Beads' current state. The import (application/trackers/beads_import.py) remains for a snapshot without
`bd`, and applies the same rule (domain/beads.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.commands import EffectRefused, FireTrigger
from taskgate.application.sessions.effects import NoEffects
from taskgate.application.trackers.ports import TrackerIssue, TrackerProvider
from taskgate.domain.beads import OPEN, qualified_id, task_status_for_import
from taskgate.domain.entities import Project, Session, Task, TaskStatus
from taskgate.domain.errors import ClaimRefused, InvalidInput, TaskgateError, TaskNotFound
from taskgate.domain.policies.violations import Severity, Violation
from taskgate.domain.states import Trigger
from taskgate.domain.workflows.triggers import usable_labels

NOT_READY = "not in bd ready (blocked, claimed or held in Beads)"


class TrackerSync:
    """Mirrors what the external tracker says into the task table, just before it is used."""

    def __init__(self, uow: UnitOfWorkFactory, clock: Clock, provider: TrackerProvider) -> None:
        self._uow, self._clock, self.provider = uow, clock, provider

    async def ready(self, project: Project) -> list[str]:
        """`bd ready`, mirrored: the task ids of its issues, in bd's order. Raises: TrackerError."""
        issues = await self.provider.ready(project)
        return await self._mirror(project, issues, ready=True)

    async def issue(self, project: Project, issue_id: str) -> str:
        """`bd show ID`, mirrored: the task id. Raises: TaskNotFound, TrackerError."""
        return (await self._mirror(project, [await self.provider.show(project, issue_id)], ready=False))[0]

    async def _mirror(self, project: Project, issues: Sequence[TrackerIssue], *, ready: bool) -> list[str]:
        """One write: new issues become tasks, known ones get bd's title, priority and status. A ready issue
        has no hold and no stored blockers (bd decided); a shown one is held unless it is open."""
        source = self.provider.name
        async with self._uow(write=True) as uow:
            known = {t.external_id or t.id: t for t in await uow.tasks.of_source(project.id, source)}
            fresh = [i for i in issues if i.id not in known]
            taken = {t.id for t in await uow.tasks.get_many([i.id for i in fresh])}
            new = [self._task(project, issue, ready, issue.id in taken) for issue in fresh]
            await uow.tasks.add_many(new)
            known |= {t.external_id or t.id: t for t in new}
            for issue in issues:
                await self._refresh(uow, known[issue.id], issue, ready)
            if ready:  # what bd ready no longer lists is held, so the board and the context agree with bd
                listed = {i.id for i in issues}
                for external_id, task in known.items():
                    if external_id not in listed and task.hold is None and task.status == TaskStatus.OPEN:
                        await uow.tasks.set_tracker_facts(task.id, tracker_status=task.tracker_status, hold=NOT_READY)
            await uow.commit()
        return [known[i.id].id for i in issues]

    def _task(self, project: Project, issue: TrackerIssue, ready: bool, taken: bool) -> Task:
        task_id = qualified_id(project.key, issue.id) if taken else issue.id
        if task_id is None:
            raise InvalidInput(f"Beads id {issue.id} is taken here and too long to qualify with the project key")
        return Task(id=task_id, project_id=project.id, plan_id=None, title=issue.title[:500] or issue.id,
                    description=issue.description[:20_000], priority=issue.priority,
                    status=task_status_for_import(issue.status), created_at=self._clock.now(),
                    source=self.provider.name, external_id=issue.id, tracker_status=issue.status,
                    hold=_hold(issue, ready), labels=list(usable_labels(issue.labels)))  # fmt: skip

    @staticmethod
    async def _refresh(uow, task: Task, issue: TrackerIssue, ready: bool) -> None:
        title, description = issue.title[:500] or issue.id, issue.description[:20_000]
        labels = list(usable_labels(issue.labels))
        if (task.title, task.description, task.priority, task.labels) != (title, description, issue.priority, labels):
            await uow.tasks.update_details(
                task.id, title=title, description=description, priority=issue.priority, labels=labels
            )
        hold = _hold(issue, ready)
        if (task.tracker_status, task.hold) != (issue.status, hold):
            await uow.tasks.set_tracker_facts(task.id, tracker_status=issue.status, hold=hold)
        if ready and task.blockers:
            await uow.tasks.set_blockers(task.id, [])
        if task_status_for_import(issue.status) == TaskStatus.COMPLETED and task.status == TaskStatus.OPEN:
            await uow.tasks.set_status(task.id, TaskStatus.COMPLETED)


def _hold(issue: TrackerIssue, ready: bool) -> str | None:
    if ready:
        return None
    return None if issue.status == OPEN else f"status {issue.status} in Beads"


class BeadsClaim(NoEffects):
    """The session effect of `start` on a task from the external tracker: still ready there, then claimed."""

    def __init__(self, uow: UnitOfWorkFactory, sync: TrackerSync) -> None:
        self._uow, self._sync = uow, sync

    def wants_before(self, trigger: Trigger) -> bool:
        return trigger == Trigger.START

    async def before(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        async with self._uow(write=False) as uow:
            task = await uow.tasks.get(session.task_id, with_blockers=False)
            project = await uow.projects.get(task.project_id)
        if task.source != self._sync.provider.name:
            return cmd
        issue_id = task.external_id or task.id
        try:
            if task.id not in await self._sync.ready(project):
                raise ClaimRefused(issue_id, "bd ready does not list it (blocked, held or taken in Beads)")
            await self._sync.provider.claim(project, issue_id, cmd.actor)
        except TaskgateError as exc:
            violation = Violation("tracker_claim", str(exc), Severity.ERROR, "see `bd show` for why; start again later")
            raise EffectRefused(exc, [violation]) from None
        return cmd


async def sync_task_if_unknown(uow: UnitOfWorkFactory, sync: TrackerSync | None, task_id: str) -> None:
    """Before starting `task_id`: an id no task has yet, but the tracker knows, is mirrored first (the first
    project whose tracker knows it). Nothing happens without a live tracker or for a known task."""
    if sync is None:
        return
    async with uow(write=False) as read:
        try:
            await read.tasks.get(task_id, with_blockers=False)
            return
        except TaskNotFound:
            projects = await read.projects.list()
    for project in projects:
        try:
            await sync.issue(project, task_id)
            return
        except TaskNotFound:
            continue
