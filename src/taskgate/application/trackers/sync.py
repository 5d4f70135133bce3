"""External trackers read live (`[tracker] kind = "beads" | "github" | "linear"`): every decision that depends on
the tracker asks it first. Written for Beads first; GitHub Issues and Linear follow the same steps, with their own
ready rule (docs/trackers.md), and a poll that lists every candidate issue with why each is held.

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
from taskgate.application.trackers.routing import Trackers, polled
from taskgate.domain.beads import OPEN, qualified_id, task_status_for_import
from taskgate.domain.entities import Project, Session, Task, TaskStatus
from taskgate.domain.errors import ClaimRefused, InvalidInput, TaskgateError, TaskNotFound
from taskgate.domain.policies.violations import Severity, Violation
from taskgate.domain.states import Trigger
from taskgate.domain.workflows.triggers import usable_labels

NOT_READY = "not in bd ready (blocked, claimed or held in Beads)"


class TrackerSync:
    """Mirrors what the external tracker says into the task table, just before it is used."""

    def __init__(self, uow: UnitOfWorkFactory, clock: Clock, trackers: Trackers) -> None:
        self._uow, self._clock, self.trackers = uow, clock, trackers

    def provider(self, project: Project) -> TrackerProvider | None:
        """The project's external tracker, or None for the built-in one. Raises: TrackerError."""
        return self.trackers.of(project)

    async def ready(self, project: Project) -> list[str] | None:
        """The tracker's ready list, mirrored: the task ids of its issues, in its order; None when the project reads
        the built-in tracker. A polled tracker (GitHub, Linear) is asked for every candidate, so the mirror also
        says why each of the others is held. Raises: TrackerError."""
        provider = self.provider(project)
        if provider is None:
            return None
        if not polled(provider):
            return await self._mirror(project, provider, await provider.ready(project), ready=True)
        candidates = await provider.list(project)
        ids = await self._mirror(project, provider, candidates, ready=True)
        return [task_id for task_id, issue in zip(ids, candidates, strict=True) if issue.hold is None]

    async def polled(self, project: Project) -> tuple[TrackerProvider, list[TrackerIssue], list[str]] | None:
        """One poll of a project's tracker for the poller: the provider, every candidate issue (with holds) and
        their task ids, mirrored. None for the built-in tracker. Raises: TrackerError."""
        provider = self.provider(project)
        if provider is None:
            return None
        candidates = await (provider.list(project) if polled(provider) else provider.ready(project))
        return provider, candidates, await self._mirror(project, provider, candidates, ready=True)

    async def issue(self, project: Project, issue_id: str) -> str:
        """The tracker's issue (`bd show ID`), mirrored: the task id. Raises: TaskNotFound, TrackerError."""
        provider = self.provider(project)
        if provider is None:
            raise TaskNotFound(issue_id)
        return (await self._mirror(project, provider, [await provider.show(project, issue_id)], ready=False))[0]

    async def refresh(self, project: Project, issue: TrackerIssue) -> str:
        """An issue just read (`show`) mirrored as it is now: the task id."""
        provider = self.provider(project)
        assert provider is not None
        return (await self._mirror(project, provider, [issue], ready=False))[0]

    async def _mirror(
        self, project: Project, provider: TrackerProvider, issues: Sequence[TrackerIssue], *, ready: bool
    ) -> list[str]:
        """One write: new issues become tasks, known ones get the tracker's title, priority and status. A ready
        issue has no hold and no stored blockers (the tracker decided); a shown one is held unless it is open."""
        source = provider.name
        async with self._uow(write=True) as uow:
            known = {t.external_id or t.id: t for t in await uow.tasks.of_source(project.id, source)}
            fresh = [i for i in issues if i.id not in known]
            taken = {t.id for t in await uow.tasks.get_many([i.id for i in fresh])}
            new = [self._task(project, source, issue, ready, issue.id in taken) for issue in fresh]
            await uow.tasks.add_many(new)
            known |= {t.external_id or t.id: t for t in new}
            for issue in issues:
                await self._refresh(uow, known[issue.id], issue, ready, source)
            if ready:  # what the ready list no longer has is held, so the board and the context agree with it
                listed, gone = {i.id for i in issues}, _not_listed(provider)
                for external_id, task in known.items():
                    if external_id not in listed and task.hold is None and task.status == TaskStatus.OPEN:
                        await uow.tasks.set_tracker_facts(task.id, tracker_status=task.tracker_status, hold=gone)
            await uow.commit()
        return [known[i.id].id for i in issues]

    def _task(self, project: Project, source: str, issue: TrackerIssue, ready: bool, taken: bool) -> Task:
        task_id = qualified_id(project.key, issue.id) if taken else issue.id
        if task_id is None:
            raise InvalidInput(f"{source} id {issue.id} is taken here and too long to qualify with the project key")
        return Task(id=task_id, project_id=project.id, plan_id=None, title=issue.title[:500] or issue.id,
                    description=issue.description[:20_000], priority=issue.priority,
                    status=_status_for_import(issue), created_at=self._clock.now(),
                    source=source, external_id=issue.id, tracker_status=issue.status,
                    hold=_hold(issue, ready, source), labels=list(usable_labels(issue.labels)))  # fmt: skip

    @staticmethod
    async def _refresh(uow, task: Task, issue: TrackerIssue, ready: bool, source: str) -> None:
        title, description = issue.title[:500] or issue.id, issue.description[:20_000]
        labels = list(usable_labels(issue.labels))
        if (task.title, task.description, task.priority, task.labels) != (title, description, issue.priority, labels):
            await uow.tasks.update_details(
                task.id, title=title, description=description, priority=issue.priority, labels=labels
            )
        hold = _hold(issue, ready, source)
        if (task.tracker_status, task.hold) != (issue.status, hold):
            await uow.tasks.set_tracker_facts(task.id, tracker_status=issue.status, hold=hold)
        if ready and task.blockers:
            await uow.tasks.set_blockers(task.id, [])
        if _status_for_import(issue) == TaskStatus.COMPLETED and task.status == TaskStatus.OPEN:
            await uow.tasks.set_status(task.id, TaskStatus.COMPLETED)


def _status_for_import(issue: TrackerIssue) -> TaskStatus:
    """The task status a new mirror row gets: Beads' statuses map as the import does; an issue closed in GitHub or
    Linear is completed, any other is open (taskgate's sessions move it from there)."""
    if issue.closed:
        return TaskStatus.COMPLETED
    return task_status_for_import(issue.status) if issue.status in _BEADS_WORDS else TaskStatus.OPEN


_BEADS_WORDS = frozenset({"open", "in_progress", "blocked", "deferred", "closed", "hooked", "pinned"})


def _hold(issue: TrackerIssue, ready: bool, source: str) -> str | None:
    """Why the mirrored task is not ready: the tracker's own words for a polled tracker; for Beads, bd ready
    decided (listed: no hold) or the issue's status says (shown)."""
    if issue.hold is not None:
        return issue.hold
    if issue.closed:
        return f"closed in {source}"
    if ready or source != "beads":
        return None
    return None if issue.status == OPEN else f"status {issue.status} in Beads"


def _not_listed(provider: TrackerProvider) -> str:
    if polled(provider):
        return f"no longer a candidate in {provider.describe()}"  # type: ignore[attr-defined]
    return NOT_READY


class TrackerClaim(NoEffects):
    """The session effect of `start` on a task from the external tracker: still ready there, then claimed."""

    def __init__(self, uow: UnitOfWorkFactory, sync: TrackerSync) -> None:
        self._uow, self._sync = uow, sync

    def wants_before(self, trigger: Trigger) -> bool:
        return trigger == Trigger.START

    async def before(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        async with self._uow(write=False) as uow:
            task = await uow.tasks.get(session.task_id, with_blockers=False)
            project = await uow.projects.get(task.project_id)
        try:
            provider = self._sync.provider(project)
            if provider is None or task.source != provider.name:
                return cmd
            await self._still_ready(project, provider, task)
            await provider.claim(project, task.external_id or task.id, cmd.actor)
        except TaskgateError as exc:
            hint = "see `bd show` for why" if task.source == "beads" else f"see the issue in {task.source} for why"
            violation = Violation("tracker_claim", str(exc), Severity.ERROR, f"{hint}; start again later")
            raise EffectRefused(exc, [violation]) from None
        return cmd

    async def _still_ready(self, project: Project, provider: TrackerProvider, task: Task) -> None:
        """Beads: `bd ready` lists it. A polled tracker: the issue as it is now is open and held by nothing (one
        read, not a whole poll), mirrored so the task shows what was found."""
        issue_id = task.external_id or task.id
        if not polled(provider):
            if task.id not in (await self._sync.ready(project) or []):
                raise ClaimRefused(issue_id, "bd ready does not list it (blocked, held or taken in Beads)")
            return
        issue = await provider.show(project, issue_id)
        await self._sync.refresh(project, issue)
        if issue.closed or issue.hold is not None:
            raise ClaimRefused(issue_id, "closed" if issue.closed else str(issue.hold))


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
