"""Projects, plans and tasks (with their blocker links, `task_dependencies`): the work that sessions take on."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update

from taskgate.application.trackers.ports import TaskFacts
from taskgate.domain.entities import Plan, PlanStatus, Project, Task, TaskStatus
from taskgate.domain.errors import PlanNotFound, ProjectNotFound, TaskNotFound
from taskgate.domain.policies.facts import BlockerFact
from taskgate.domain.states import SessionState
from taskgate.infrastructure.db import read_statements as reads
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.repository_base import SqlRepository, storable
from taskgate.infrastructure.db.row_maps import PROJECT_FIELDS, TASK_COLUMNS, project_of, task_of, with_blockers


class SqlAlchemyProjectRepository(SqlRepository):
    async def add(self, name: str, key: str, root_path: str, created_at: datetime) -> Project:
        values = {"name": name, "key": key, "root_path": root_path, "config": {}, "created_at": created_at}
        result = await self._conn.execute(insert(t.projects).values(**values))
        return Project(
            id=result.inserted_primary_key[0], name=name, key=key, root_path=root_path, created_at=created_at
        )

    async def get(self, project_id: int, *, lock: bool = False) -> Project:
        if not storable(project_id):
            raise ProjectNotFound(project_id)
        row = await self._one(self._pick(sql.PROJECT_BY_ID, sql.PROJECT_BY_ID_FOR_UPDATE, lock), {"id": project_id})
        if row is None:
            raise ProjectNotFound(project_id)
        return _project(row)

    async def find(self, *, name: str | None = None, root_path: str | None = None, key: str | None = None):
        stmt, value = (
            (reads.PROJECT_BY_NAME, name)
            if name is not None
            else (reads.PROJECT_BY_ROOT, root_path)
            if root_path
            else (reads.PROJECT_BY_KEY, key)
        )
        row = await self._one(stmt, {"value": value})
        return _project(row) if row else None

    async def list(self) -> list[Project]:
        return [_project(r) for r in await self._all(reads.PROJECTS)]

    async def archive(self, project_id: int, at: datetime) -> None:
        await self._conn.execute(update(t.projects).where(t.projects.c.id == project_id).values(archived_at=at))

    async def allocate_task_number(self, project_id: int) -> int:
        stmt = (
            update(t.projects)
            .where(t.projects.c.id == project_id)
            .values(task_seq=t.projects.c.task_seq + 1)
            .returning(t.projects.c.task_seq)
        )
        number = (await self._conn.execute(stmt)).scalar_one_or_none()
        if number is None:
            raise ProjectNotFound(project_id)
        return number


class SqlAlchemyPlanRepository(SqlRepository):
    async def add(self, project_id: int, name: str, created_at: datetime) -> Plan:
        values = {"project_id": project_id, "name": name, "status": PlanStatus.OPEN.value, "created_at": created_at}
        result = await self._conn.execute(insert(t.plans).values(**values))
        return Plan(result.inserted_primary_key[0], project_id, name, PlanStatus.OPEN, created_at)

    async def get(self, plan_id: int, *, lock: bool = False) -> Plan:
        if not storable(plan_id):
            raise PlanNotFound(plan_id)
        row = await self._one(self._pick(sql.PLAN_BY_ID, sql.PLAN_BY_ID_FOR_UPDATE, lock), {"id": plan_id})
        if row is None:
            raise PlanNotFound(plan_id)
        return Plan(row["id"], row["project_id"], row["name"], PlanStatus(row["status"]), row["created_at"])

    async def list(self, project_id: int) -> list[Plan]:
        rows = await self._all(select(t.plans).where(t.plans.c.project_id == project_id).order_by(t.plans.c.id))
        return [Plan(r["id"], r["project_id"], r["name"], PlanStatus(r["status"]), r["created_at"]) for r in rows]

    async def set_status(self, plan_id: int, status: PlanStatus) -> None:
        await self._write(sql.SET_PLAN_STATUS, {"match_id": plan_id, "status": status.value})


class SqlAlchemyTaskRepository(SqlRepository):
    async def add(self, task: Task) -> None:
        row = {name: getattr(task, name) for name in _TASK_COLUMNS}
        await self._conn.execute(insert(t.tasks), {**row, "status": task.status.value})
        if task.blockers:
            await self._conn.execute(
                insert(t.task_dependencies),
                [{"task_id": task.id, "depends_on_id": b, "type": "blocks"} for b in task.blockers],
            )

    async def get(self, task_id: str, *, lock: bool = False, with_blockers: bool = True) -> Task:
        row = await self._one(self._pick(sql.TASK_BY_ID, sql.TASK_BY_ID_FOR_UPDATE, lock), {"id": task_id})
        if row is None:
            raise TaskNotFound(task_id)
        return (await self._with_blockers([row]))[0] if with_blockers else _task(row, [])

    async def list(self, project_id: int, *, plan_id: int | None = None, status: TaskStatus | None = None):
        stmt = select(t.tasks).where(t.tasks.c.project_id == project_id)
        if plan_id is not None and not storable(plan_id):
            return []
        if plan_id is not None:
            stmt = stmt.where(t.tasks.c.plan_id == plan_id)
        if status is not None:
            stmt = stmt.where(t.tasks.c.status == status.value)
        return await self._with_blockers(await self._all(stmt.order_by(t.tasks.c.created_at, t.tasks.c.id)))

    async def ready(self, project_id: int, limit: int | None = None) -> list[Task]:
        """Open tasks without an active session whose blockers are all completed (read_statements.READY_TASKS)."""
        if limit is None:
            rows = await self._all(reads.READY_TASKS, {"project_id": project_id})
        else:
            rows = await self._all(reads.READY_TASKS_FIRST, {"project_id": project_id, "limit": limit})
        return await self._with_blockers(rows)

    async def facts(self, task_id: str, plan_id: int | None, states: frozenset[SessionState]) -> TaskFacts:
        params = {"task_id": task_id, "plan_id": plan_id, "states": [s.value for s in states]}
        rows = await self._all(sql.TASK_FACTS, params)
        if not rows:
            raise TaskNotFound(task_id)
        first = rows[0]
        task = _task({name: first[name] for name in _TASK_COLUMNS}, [])
        project = _project({name: first[f"p_{name}"] for name in (*_PROJECT_FIELDS, "config")})
        blockers = tuple(
            BlockerFact(r["blocker_id"], TaskStatus(r["blocker_status"])) for r in rows if r["blocker_id"] is not None
        )
        return TaskFacts(task, project, blockers, first["plan_sessions_in"] if plan_id is not None else 0)

    async def blockers_of(self, task_id: str) -> list[BlockerFact]:
        rows = await self._all(sql.BLOCKERS_WITH_STATUS, {"task_id": task_id})
        return [BlockerFact(r["id"], TaskStatus(r["status"])) for r in rows]

    async def set_status(self, task_id: str, status: TaskStatus) -> None:
        await self._write(sql.SET_TASK_STATUS, {"match_id": task_id, "status": status.value})

    async def count_unfinished(self, plan_id: int) -> int:
        params = {"plan_id": plan_id, "finished": TaskStatus.COMPLETED.value}
        return (await self._conn.execute(sql.COUNT_UNFINISHED_TASKS, params)).scalar_one()

    async def _with_blockers(self, rows: list[Any]) -> list[Task]:
        if not rows:
            return []
        return with_blockers(rows, await self._all(sql.BLOCKER_IDS, {"ids": [r["id"] for r in rows]}))

    async def get_many(self, task_ids: list[str]) -> list[Task]:
        rows = []
        for start in range(0, len(task_ids), 500):
            chunk = task_ids[start : start + 500]
            rows += await self._all(select(t.tasks).where(t.tasks.c.id.in_(chunk)))
        return await self._with_blockers(sorted(rows, key=lambda r: r["id"]))

    async def update_details(
        self, task_id: str, *, title: str, description: str, priority: int, labels: Sequence[str] | None = None
    ) -> None:
        values: dict[str, Any] = {"title": title, "description": description, "priority": priority}
        if labels is not None:
            values["labels"] = list(labels)
        await self._conn.execute(update(t.tasks).where(t.tasks.c.id == task_id).values(**values))

    async def set_tracker_facts(self, task_id: str, *, tracker_status: str | None, hold: str | None) -> None:
        values = {"tracker_status": tracker_status, "hold": hold}
        await self._conn.execute(update(t.tasks).where(t.tasks.c.id == task_id).values(**values))

    async def of_source(self, project_id: int, source: str) -> list[Task]:
        stmt = select(t.tasks).where(t.tasks.c.project_id == project_id, t.tasks.c.source == source)
        return [_task(r, []) for r in await self._all(stmt.order_by(t.tasks.c.id))]

    async def add_many(self, tasks: Sequence[Task]) -> None:
        rows = [
            {**{name: getattr(task, name) for name in _TASK_COLUMNS}, "status": task.status.value} for task in tasks
        ]
        for start in range(0, len(rows), 2000):  # Core executemany in slices: bounded statement memory
            await self._conn.execute(insert(t.tasks), rows[start : start + 2000])

    async def add_links(self, links: Sequence[tuple[str, str, str]]) -> None:
        rows = [{"task_id": task_id, "depends_on_id": target, "type": kind} for task_id, target, kind in links]
        for start in range(0, len(rows), 2000):
            await self._conn.execute(insert(t.task_dependencies), rows[start : start + 2000])

    async def set_blockers(self, task_id: str, blockers: list[tuple[str, str]]) -> None:
        dep = t.task_dependencies
        await self._conn.execute(dep.delete().where(dep.c.task_id == task_id))
        if blockers:
            rows = [{"task_id": task_id, "depends_on_id": b, "type": kind} for b, kind in blockers]
            await self._conn.execute(insert(dep), rows)

    async def blocker_links(self, task_ids: list[str]) -> dict[str, list[tuple[str, str]]]:
        dep, links = t.task_dependencies, {}
        for start in range(0, len(task_ids), 500):
            stmt = select(dep).where(dep.c.task_id.in_(task_ids[start : start + 500]))
            for row in await self._all(stmt.order_by(dep.c.task_id, dep.c.depends_on_id)):
                links.setdefault(row["task_id"], []).append((row["depends_on_id"], row["type"]))
        return links


# Rows in, records out: shared with the engine-free read path (row_maps.py).
_project, _task, _PROJECT_FIELDS, _TASK_COLUMNS = project_of, task_of, PROJECT_FIELDS, TASK_COLUMNS
