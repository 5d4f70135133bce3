"""The built-in tracker: projects, plans, tasks with priorities and blockers, and operators.

A plan closes by itself when its last task completes (application/sessions/records.py). A task added to a closed plan
reopens it, in the transaction that adds the task (event `plan.reopened`): the plan only closed because it had
run out of work, and a closed plan's task could never start (`plan_open`). The plan row is locked while a
task is added, so an addition and the completion of the plan's last task cannot both miss each other.
`ready` never lists a task of a closed plan.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.application.trackers.ports import TrackerPoll
from taskgate.application.trackers.project_choice import choose_project, key_of, numeric_ref
from taskgate.application.trackers.sync import TrackerSync, sync_task_if_unknown
from taskgate.application.workspaces.ports import VcsProvider
from taskgate.domain.bounds import IDS, PRIORITIES, ROW_LIMITS
from taskgate.domain.entities import Operator, Permission, Plan, PlanStatus, Project, Role, Task, TaskStatus
from taskgate.domain.errors import AlreadyExists, InvalidInput, ProjectArchived, ProjectNotFound
from taskgate.domain.states import TERMINAL_STATES, SessionState
from taskgate.domain.workflows.triggers import check_labels

MAX_TITLE = 500
MAX_DESCRIPTION = 20_000
_NAME_RE = re.compile(r"^[\w][\w .:/+-]{0,99}$")


@dataclass(frozen=True, slots=True)
class AddTask:
    project_id: int
    title: str
    description: str = ""
    plan_id: int | None = None
    priority: int = 2
    blocked_by: list[str] = field(default_factory=list)
    actor: str = "system"
    labels: Sequence[
        str
    ] = ()  # task labels (domain/workflows/triggers.py): what `label:<name>` workflow triggers match

    def __post_init__(self) -> None:
        """Raises: InvalidInput for an integer out of its range (domain/bounds.py) or a bad label, before any I/O."""
        IDS.check("project_id", self.project_id)
        IDS.check("plan_id", self.plan_id)
        PRIORITIES.check("priority", self.priority)
        object.__setattr__(self, "labels", check_labels(self.labels))


@dataclass(frozen=True, slots=True)
class TaskAdded:
    """A task just added. `reopened`: the closed plan it went into, open again because of it."""

    task: Task
    reopened: Plan | None = None

    def note(self) -> str:
        """What happened to the plan, for the reply ("" when nothing did)."""
        if self.reopened is None:
            return ""
        return f"plan {self.reopened.id} '{self.reopened.name}' was closed and is open again"


def check_project_name(name: str) -> str:
    """The project name, stripped. Raises: InvalidInput naming what a name may hold."""
    return _check_name("project", name)


def _check_name(kind: str, name: str) -> str:
    cleaned = name.strip()
    if not _NAME_RE.match(cleaned):
        raise InvalidInput(
            f"{kind} name {name!r} is invalid: 1-100 characters, letters, digits, space and . _ : / + - only"
        )
    return cleaned


def _project_key(name: str) -> str:
    key = re.sub(r"[^A-Za-z0-9]", "", name).upper()[:8]
    return key if key and key[0].isalpha() else f"P{key}"[:8]


class TrackerService:
    """Use cases of the built-in tracker. Every write checks the project is not archived."""

    def __init__(self, uow: UnitOfWorkFactory, clock: Clock, vcs: VcsProvider) -> None:
        self._uow, self._clock, self._vcs = uow, clock, vcs
        self._sync: TrackerSync | None = None

    def use_sync(self, sync: TrackerSync) -> None:
        """Read an external tracker live (application/trackers/sync.py): `ready_tasks` asks it first."""
        self._sync = sync

    @property
    def sync(self) -> TrackerSync | None:
        """The live tracker sync, when any project reads an external tracker."""
        return self._sync

    async def refresh_ready(self) -> None:
        """Mirror the live tracker's ready list of every project (the sweeper does, for the board)."""
        if self._sync is not None:
            for project in await self.list_projects():
                if project.archived_at is None and self._sync.trackers.spec(project) is not None:
                    await self._sync.ready(project)

    async def polls(self) -> list[tuple[Project, TrackerPoll]]:
        """Each project's last tracker poll (written by the process holding the sweeper's lease), by project name."""
        async with self._uow(write=False) as uow:
            projects = {p.id: p for p in await uow.projects.list()}
            polls = await uow.tracker_polls.list()
        return sorted(((projects[p.project_id], p) for p in polls), key=lambda pair: pair[0].name)

    async def prepare_start(self, task_id: str) -> None:
        """Before a start: a task the live tracker knows but taskgate has not seen yet is mirrored first."""
        await sync_task_if_unknown(self._uow, self._sync, task_id)

    async def init_project(self, path: str, name: str | None = None, actor: str = "system") -> Project:
        """Register the git repository containing `path` as a project.

        Raises: InvalidInput (not a git repository, bad name), AlreadyExists (repository or name taken).
        """
        info = await self._vcs.inspect_repository(path)
        name = _check_name("project", name or Path(info.root).name)
        async with self._uow(write=True) as uow:
            if await uow.projects.find(root_path=info.root):
                raise AlreadyExists(f"repository {info.root} is already registered as a project")
            if await uow.projects.find(name=name):
                raise AlreadyExists(f"a project named '{name}' already exists; pass --name")
            project = await uow.projects.add(name, await self._free_key(uow, name), info.root, self._clock.now())
            await self._record(uow, "project.registered", actor, project=project.id, root=info.root)
            await uow.commit()
        return project

    async def register_project(self, path: str, name: str | None = None, actor: str = "system") -> tuple[Project, bool]:
        """`init_project`, idempotent: the project already registered for the repository holding `path` is
        returned as it is (False: nothing was written) unless `name` names another project.

        Raises: InvalidInput (not a git repository, bad name), AlreadyExists (the repository is registered under
        another name, or the name is taken by another repository).
        """
        info = await self._vcs.inspect_repository(path)
        if name is not None:
            name = _check_name("project", name)
        async with self._uow(write=False) as uow:
            existing = await uow.projects.find(root_path=info.root)
        if existing is None:
            return await self.init_project(path, name, actor), True
        if name is not None and name != existing.name:
            raise AlreadyExists(
                f"repository {info.root} is already registered as project '{existing.name}' (key {existing.key}); "
                f"run init without --name, or archive that project first"
            )
        return existing, False

    async def archive_project(self, project_id: int, actor: str = "system") -> Project:
        """Make a project read-only. Raises: ProjectNotFound, InvalidInput while it has active sessions."""
        async with self._uow(write=True) as uow:
            project = await uow.projects.get(project_id)
            active = await uow.sessions.list(project_id=project_id, states=set(SessionState) - TERMINAL_STATES)
            if active:
                raise InvalidInput(
                    f"project '{project.name}' has {len(active)} active session(s); cancel or finish them first"
                )
            await uow.projects.archive(project_id, self._clock.now())
            await self._record(uow, "project.archived", actor, project=project_id)
            await uow.commit()
            return await self._reload(project_id)

    async def resolve_project(self, ref: str | None, cwd: str | None = None) -> Project:
        """The project named by `ref` (id, name or key); without one, the only project or the one holding `cwd`.

        Raises: ProjectNotFound, InvalidInput when several projects match.
        """
        async with self._uow(write=False) as uow:
            if ref is not None:
                return await self._find_ref(uow, ref)
            projects = await uow.projects.list()
        return choose_project(projects, cwd)

    async def list_projects(self) -> list[Project]:
        async with self._uow(write=False) as uow:
            return await uow.projects.list()

    async def add_plan(self, project_id: int, name: str, actor: str = "system") -> Plan:
        """Raises: ProjectNotFound, ProjectArchived, InvalidInput."""
        name = _check_name("plan", name)
        async with self._uow(write=True) as uow:
            await self._writable(uow, project_id)
            plan = await uow.plans.add(project_id, name, self._clock.now())
            await self._record(uow, "plan.added", actor, project=project_id, plan=plan.id)
            await uow.commit()
        return plan

    async def close_plan(self, plan_id: int, actor: str = "system", reason: str = "") -> Plan:
        """Close a plan by hand: no task of it starts or is listed ready any more (plan_open) until a task is added
        to it, which reopens it. Sessions already running go on. Closing a closed plan changes nothing.

        Raises: PlanNotFound, ProjectArchived; InvalidInput for an id out of range.
        """
        IDS.check("plan_id", plan_id)
        async with self._uow(write=True) as uow:
            plan = await uow.plans.get(plan_id, lock=True)  # as adding a task locks it: one order, no lost reopen
            await self._writable(uow, plan.project_id)
            if plan.status == PlanStatus.CLOSED:
                return plan
            await uow.plans.set_status(plan.id, PlanStatus.CLOSED)
            await self._record(uow, "plan.closed", actor, project=plan.project_id, plan=plan.id, reason=reason)
            await uow.commit()
        return replace(plan, status=PlanStatus.CLOSED)

    async def list_plans(self, project_id: int) -> list[Plan]:
        async with self._uow(write=False) as uow:
            await uow.projects.get(project_id)
            return await uow.plans.list(project_id)

    async def add_task(self, cmd: AddTask) -> Task:
        """`add`, for callers that only want the task. Raises: as `add`."""
        return (await self.add(cmd)).task

    async def add(self, cmd: AddTask) -> TaskAdded:
        """Add a task to the project (and plan); blockers must be tasks of the same project. A closed plan is
        reopened by it (see the module docstring).

        Raises: ProjectNotFound, ProjectArchived, PlanNotFound, TaskNotFound (blocker), InvalidInput.
        """
        title, description = self._validated_text(cmd)
        async with self._uow(write=True) as uow:
            project = await self._writable(uow, cmd.project_id)
            plan = await self._check_plan_and_blockers(uow, cmd)
            number = await uow.projects.allocate_task_number(project.id)
            task = Task(
                id=f"{project.key}-{number}",
                project_id=project.id,
                plan_id=cmd.plan_id,
                title=title,
                description=description,
                priority=cmd.priority,
                status=TaskStatus.OPEN,
                created_at=self._clock.now(),
                blockers=list(dict.fromkeys(cmd.blocked_by)),
                labels=list(cmd.labels),
            )
            await uow.tasks.add(task)
            await self._record(uow, "task.added", cmd.actor, project=project.id, task=task.id)
            reopened = await reopen_for(uow, plan, [task.id], cmd.actor, self._clock.now())
            await uow.commit()
        return TaskAdded(task, reopened)

    async def list_tasks(self, project_id: int, plan_id: int | None = None, status: str | None = None) -> list[Task]:
        """Raises: ProjectNotFound, InvalidInput for an unknown status or a plan id out of range."""
        IDS.check("plan_id", plan_id)
        wanted = _parse_status(status)
        async with self._uow(write=False) as uow:
            await uow.projects.get(project_id)
            return await uow.tasks.list(project_id, plan_id=plan_id, status=wanted)

    async def task(self, task_id: str) -> Task:
        """One task, with its blockers. Raises: TaskNotFound."""
        async with self._uow(write=False) as uow:
            return await uow.tasks.get(task_id)

    async def ready_tasks(self, project_id: int, limit: int | None = None) -> list[Task]:
        """Open tasks without an active session whose blockers are all completed, most urgent first (the first
        `limit` of them). With a live tracker (Beads), its own ready list decides, in its order (see
        application/trackers/sync.py).

        Raises: ProjectNotFound; InvalidInput for a limit outside 1..100,000; TrackerError when the live tracker
        cannot be read.
        """
        ROW_LIMITS.check("limit", limit)
        async with self._uow(write=False) as uow:
            project = await uow.projects.get(project_id)
            if self._sync is None or self._sync.trackers.spec(project) is None:
                return await uow.tasks.ready(project_id, limit)
        order = {task_id: n for n, task_id in enumerate(await self._sync.ready(project) or [])}
        async with self._uow(write=False) as uow:
            startable = [t for t in await uow.tasks.ready(project_id) if t.id in order]
        return sorted(startable, key=lambda t: order[t.id])[:limit]

    async def ensure_operator(self, operator_id: str, name: str | None = None) -> Operator:
        """The operator `operator_id`, created with the admin role if it does not exist yet."""
        _check_name("operator", operator_id)
        async with self._uow(write=True) as uow:
            existing = await uow.operators.find(operator_id)
            if existing is not None:
                return existing
            operator = Operator(
                id=operator_id,
                name=name or operator_id,
                email=None,
                roles=[Role.ADMIN.value],
                permissions=[p.value for p in Permission],
                max_active_sessions=10,
                created_at=self._clock.now(),
            )
            await uow.operators.add(operator)
            await uow.commit()
        return operator

    async def list_operators(self) -> list[Operator]:
        async with self._uow(write=False) as uow:
            return await uow.operators.list()

    # -- internals ---------------------------------------------------------------------------------------------

    async def _record(self, uow: UnitOfWork, kind: str, actor: str, **details: object) -> None:
        """Who changed the tracker, in the events log (session transitions have their own log)."""
        await uow.events.append(kind, self._clock.now(), {"actor": actor, **details})

    @staticmethod
    def _validated_text(cmd: AddTask) -> tuple[str, str]:
        title = cmd.title.strip()
        if not title or len(title) > MAX_TITLE or "\x00" in title:
            raise InvalidInput(f"task title must be 1-{MAX_TITLE} characters without NUL")
        if len(cmd.description) > MAX_DESCRIPTION or "\x00" in cmd.description:
            raise InvalidInput(f"task description must be at most {MAX_DESCRIPTION} characters without NUL")
        return title, cmd.description

    @staticmethod
    async def _check_plan_and_blockers(uow: UnitOfWork, cmd: AddTask) -> Plan | None:
        """The task's plan, locked (see the module docstring)."""
        plan = None
        if cmd.plan_id is not None:
            plan = await uow.plans.get(cmd.plan_id, lock=True)
            if plan.project_id != cmd.project_id:
                raise InvalidInput(f"plan {plan.id} belongs to another project")
        for blocker_id in cmd.blocked_by:
            blocker = await uow.tasks.get(blocker_id)
            if blocker.project_id != cmd.project_id:
                raise InvalidInput(f"blocker {blocker_id} belongs to another project")
        return plan

    @staticmethod
    async def _writable(uow: UnitOfWork, project_id: int) -> Project:
        project = await uow.projects.get(project_id)
        if project.archived_at is not None:
            raise ProjectArchived(project.name)
        return project

    @staticmethod
    async def _free_key(uow: UnitOfWork, name: str) -> str:
        base = _project_key(name)
        key, n = base, 1
        while await uow.projects.find(key=key):
            n += 1
            key = f"{base[:6]}{n}"
        return key

    async def _reload(self, project_id: int) -> Project:
        async with self._uow(write=False) as uow:
            return await uow.projects.get(project_id)

    @staticmethod
    async def _find_ref(uow: UnitOfWork, ref: str) -> Project:
        if (ident := numeric_ref(ref)) is not None:
            return await uow.projects.get(ident)
        found = await uow.projects.find(name=ref) or await uow.projects.find(key=key_of(ref))
        if found is None:
            raise ProjectNotFound(ref)
        return found


async def reopen_for(uow: UnitOfWork, plan: Plan | None, task_ids: list[str], actor: str, now: datetime) -> Plan | None:
    """Reopen `plan` (locked by the caller) if it is closed, because the open tasks `task_ids` were just put
    into it: status open and a `plan.reopened` event, in the caller's transaction. Returns the reopened plan."""
    if plan is None or plan.status != PlanStatus.CLOSED or not task_ids:
        return None
    await uow.plans.set_status(plan.id, PlanStatus.OPEN)
    payload = {"actor": actor, "project": plan.project_id, "plan": plan.id, "tasks": task_ids,
               "reason": "open tasks were added to the closed plan"}  # fmt: skip
    await uow.events.append("plan.reopened", now, payload)
    return replace(plan, status=PlanStatus.OPEN)


def _parse_status(status: str | None) -> TaskStatus | None:
    if status is None:
        return None
    try:
        return TaskStatus(status)
    except ValueError:
        raise InvalidInput(f"unknown task status '{status}'; valid: {', '.join(s.value for s in TaskStatus)}") from None
