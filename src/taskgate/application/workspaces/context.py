"""The context scout: what an operator or agent needs to know about a project before acting on it.

`discover` returns the repository's git context and the tracker's context, with the age of the snapshot.
Snapshots are cached per project for `ttl_seconds`. Our own writes invalidate them at once: every write of
taskgate appends to the `events` table, so a snapshot is reused only while the events high-water mark is
unchanged (one indexed MAX read, which also sees writes made by other taskgate processes). Changes made
outside taskgate (a commit by hand) show up when the TTL runs out, or with `refresh=True`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.application.trackers.sync import TrackerSync
from taskgate.application.workspaces.ports import VcsProvider
from taskgate.domain.entities import Plan, PlanStatus, Task, TaskStatus
from taskgate.domain.errors import InvalidInput, VcsError


@dataclass(frozen=True, slots=True)
class ProjectContext:
    """One context snapshot of a project. `git` and `tracker` are plain JSON-ready dicts."""

    project_id: int
    project_name: str
    git: dict[str, Any]
    tracker: dict[str, Any]
    taken_at: datetime
    age_seconds: float
    cached: bool

    def as_dict(self) -> dict[str, Any]:
        return jsonable(self)


def jsonable(value: Any) -> Any:
    """Dataclasses, enums and datetimes as JSON-ready values (for snapshots stored in JSON columns)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    return value


@dataclass(slots=True)
class _Cached:
    context: ProjectContext
    high_water: int


class ContextScout:
    """Builds and caches project context snapshots (see the module docstring for the cache rule)."""

    def __init__(self, uow: UnitOfWorkFactory, vcs: VcsProvider, clock: Clock, ttl_seconds: float = 30.0) -> None:
        if ttl_seconds < 0:
            raise InvalidInput(f"context TTL must be >= 0 seconds, got {ttl_seconds}")
        self._uow, self._vcs, self._clock, self._ttl = uow, vcs, clock, ttl_seconds
        self._cache: dict[int, _Cached] = {}
        self._sync: TrackerSync | None = None

    def use_sync(self, sync: TrackerSync) -> None:
        """Read a live tracker (Beads) before each snapshot it builds: its ready list is mirrored first."""
        self._sync = sync

    async def discover(self, project_id: int, *, refresh: bool = False) -> ProjectContext:
        """The project's git and tracker context, from the cache when still valid.

        Raises: ProjectNotFound.
        """
        async with self._uow(write=False) as uow:
            project = await uow.projects.get(project_id)
            high_water = await uow.events.high_water()
            hit = self._fresh(project_id, high_water) if not refresh else None
            if hit is not None:
                return hit
        if self._sync is not None:  # the tracker decides what is ready: ask it now (outside any transaction)
            await self._sync.ready(project)
        async with self._uow(write=False) as uow:
            tracker = await _tracker_context(uow, project_id)
        git = await self._git_context(project.root_path)
        now = self._clock.now()
        context = ProjectContext(project.id, project.name, git, tracker, now, 0.0, cached=False)
        self._cache[project_id] = _Cached(context, high_water)
        return context

    def _fresh(self, project_id: int, high_water: int) -> ProjectContext | None:
        entry = self._cache.get(project_id)
        if entry is None or entry.high_water != high_water:
            return None
        age = (self._clock.now() - entry.context.taken_at).total_seconds()
        if age >= self._ttl:
            return None
        return dataclasses.replace(entry.context, age_seconds=round(age, 3), cached=True)

    async def _git_context(self, root: str) -> dict[str, Any]:
        try:
            return jsonable(await self._vcs.repo_context(root))
        except VcsError as exc:  # the repository moved or broke: report it instead of failing the whole context
            return {"error": str(exc)}


async def _tracker_context(uow: UnitOfWork, project_id: int) -> dict[str, Any]:
    tasks = await uow.tasks.list(project_id)
    status = {t.id: t.status for t in tasks}
    ready = {t.id for t in await uow.tasks.ready(project_id)}
    counts = {s.value: 0 for s in TaskStatus}
    for task in tasks:
        counts[task.status.value] += 1
    blocked = [t.id for t in tasks if t.status == TaskStatus.OPEN and _has_open_blocker(t, status)]
    return {
        "total": len(tasks),
        "by_status": counts,
        "open": counts[TaskStatus.OPEN.value],
        "in_progress": len(tasks) - counts[TaskStatus.OPEN.value] - counts[TaskStatus.COMPLETED.value],
        "ready": len(ready),
        "ready_ids": sorted(ready)[:50],
        "blocked": len(blocked),
        "blocked_ids": blocked[:50],
        "current_plan": _plan_progress(await uow.plans.list(project_id), tasks),
    }


def _has_open_blocker(task: Task, status: dict[str, TaskStatus]) -> bool:
    return any(status.get(b) != TaskStatus.COMPLETED for b in task.blockers)


def _plan_progress(plans: list[Plan], tasks: list[Task]) -> dict[str, Any] | None:
    """The plan in progress (else the first open one) with how many of its tasks are completed."""
    current = next((p for p in plans if p.status == PlanStatus.IN_PROGRESS), None) or next(
        (p for p in plans if p.status == PlanStatus.OPEN), None
    )
    if current is None:
        return None
    own = [t for t in tasks if t.plan_id == current.id]
    done = sum(1 for t in own if t.status == TaskStatus.COMPLETED)
    percent = round(100 * done / len(own)) if own else 0
    return {
        "id": current.id,
        "name": current.name,
        "status": current.status.value,
        "done": done,
        "total": len(own),
        "percent": percent,
    }
