"""Agents and the runs of a session: its agents, require_tests' test runs and its workflow step runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError

from taskgate.domain.entities import OPEN_STEP_STATUSES, Agent, AgentStatus, StepRun, StepStatus
from taskgate.domain.errors import SessionNotFound, StepRunNotFound
from taskgate.domain.policies.facts import TestRun
from taskgate.infrastructure.db import read_statements as reads
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.repository_base import SqlRepository, storable
from taskgate.infrastructure.db.row_maps import agent_of

_AGENT_FIELDS = tuple(f.name for f in fields(Agent))
# Not ended: a lost agent (its node was marked down) may still run under a supervisor that was only slow to beat
_UNENDED = (AgentStatus.QUEUED.value, AgentStatus.RUNNING.value, AgentStatus.LOST.value)


_agent = agent_of  # rows in, records out: shared with the engine-free read path (row_maps.py)


class SqlAlchemyAgentRepository(SqlRepository):
    async def add(self, agent: Agent) -> None:
        values = {name: getattr(agent, name) for name in _AGENT_FIELDS}
        await self._conn.execute(insert(t.agents), {**values, "status": agent.status.value})

    async def of_session(self, session_id: str) -> list[Agent]:
        return [_agent(r) for r in await self._all(reads.AGENTS_OF_SESSION, {"session_id": session_id})]

    async def many(self, agent_ids: Sequence[str]) -> list[Agent]:
        if not agent_ids:
            return []
        found = {r["id"]: _agent(r) for r in await self._all(sql.AGENTS_BY_IDS, {"ids": list(agent_ids)})}
        return [found[i] for i in agent_ids if i in found]

    async def last_run(self, session_id: str) -> int:
        stmt = select(func.max(t.agents.c.run)).where(t.agents.c.session_id == session_id)
        return int((await self._conn.execute(stmt)).scalar() or 0)

    async def heartbeat(self, agent_id: str, at: datetime) -> bool:
        c = t.agents.c
        stmt = update(t.agents).where(c.id == agent_id, c.status.in_(_UNENDED)).values(heartbeat_at=at)
        return (await self._conn.execute(stmt)).rowcount == 1

    async def record_signal(self, agent_id: str, signal: str) -> bool:
        c = t.agents.c
        stmt = update(t.agents).where(c.id == agent_id, c.ended_by.is_(None)).values(ended_by=signal)
        return (await self._conn.execute(stmt)).rowcount == 1

    async def set_status(self, agent_id: str, status: AgentStatus, at: datetime) -> None:
        done = status not in (AgentStatus.QUEUED, AgentStatus.RUNNING)
        values: dict[str, Any] = {"status": status.value, "completed_at": at if done else None}
        await self._conn.execute(update(t.agents).where(t.agents.c.id == agent_id).values(**values))

    async def update(self, agent: Agent, *, only_unended: bool = False) -> bool:
        values = {name: getattr(agent, name) for name in _AGENT_FIELDS if name != "id"}
        stmt = update(t.agents).where(t.agents.c.id == agent.id)
        if only_unended:  # one statement: of two writers ending the same agent, the first wins (see the port)
            stmt = stmt.where(t.agents.c.status.in_(_UNENDED))
        return (await self._conn.execute(stmt.values(**{**values, "status": agent.status.value}))).rowcount == 1

    async def active(self) -> list[Agent]:
        c = t.agents.c
        live = (AgentStatus.QUEUED.value, AgentStatus.RUNNING.value)
        return [_agent(r) for r in await self._all(select(t.agents).where(c.status.in_(live)).order_by(c.id))]

    async def of_node(self, node_id: str, statuses: frozenset[AgentStatus]) -> list[Agent]:
        c = t.agents.c
        stmt = select(t.agents).where(c.node_id == node_id, c.status.in_([s.value for s in statuses]))
        return [_agent(r) for r in await self._all(stmt.order_by(c.session_id, c.id))]

    async def stale(self, before: datetime) -> list[Agent]:
        c = t.agents.c
        last_seen = func.coalesce(c.heartbeat_at, c.started_at)
        stmt = select(t.agents).where(c.status == AgentStatus.RUNNING.value, last_seen < before)
        return [_agent(r) for r in await self._all(stmt.order_by(c.session_id, c.id))]

    async def of_project(self, project_id: int) -> list[tuple[Agent, str]]:
        c, s = t.agents.c, t.sessions.c
        stmt = select(t.agents, s.task_id.label("of_task")).join(t.sessions, s.id == c.session_id)
        stmt = stmt.where(s.project_id == project_id)
        return [(_agent(r), r["of_task"]) for r in await self._all(stmt.order_by(c.id))]

    async def ended(self, *, project_id: int | None = None, since: datetime | None = None) -> list[tuple[Agent, str]]:
        c, s = t.agents.c, t.sessions.c
        stmt = select(t.agents, s.task_id.label("of_task")).join(t.sessions, s.id == c.session_id)
        stmt = stmt.where(c.completed_at.is_not(None))
        if project_id is not None:
            stmt = stmt.where(s.project_id == project_id)
        if since is not None:
            stmt = stmt.where(c.completed_at >= since)
        return [(_agent(r), r["of_task"]) for r in await self._all(stmt.order_by(c.completed_at, c.id))]


class SqlAlchemyTestRunRepository(SqlRepository):
    """Runs of require_tests' command (`test_runs`)."""

    __test__ = False  # not a pytest class

    async def add(self, run: TestRun) -> int:
        values = {f.name: getattr(run, f.name) for f in fields(run) if f.name != "id"}
        values["command"] = list(run.command)
        return int((await self._conn.execute(insert(t.test_runs).returning(t.test_runs.c.id), values)).scalar_one())

    async def latest(self, session_id: str, head_commit: str, command: tuple[str, ...]) -> TestRun | None:
        c = t.test_runs.c
        stmt = select(t.test_runs).where(c.session_id == session_id, c.head_commit == head_commit)
        for row in await self._all(stmt.order_by(c.id.desc()).limit(20)):
            if tuple(row["command"]) == tuple(command):  # JSON columns do not compare portably in SQL
                return _test_run(row)
        return None

    async def of_session(self, session_id: str, limit: int = 20) -> list[TestRun]:
        c = t.test_runs.c
        stmt = select(t.test_runs).where(c.session_id == session_id).order_by(c.id.desc()).limit(limit)
        return [_test_run(r) for r in await self._all(stmt)]


def _test_run(row: Any) -> TestRun:
    return TestRun(**{**dict(row), "command": tuple(row["command"])})


_STEP_RUN_CHANGES = ("status", "ended_at", "output_summary", "agent_ids", "error")  # what `update` overwrites
_OPEN_STEP_STATUSES = [s.value for s in OPEN_STEP_STATUSES]


class SqlAlchemyStepRunRepository(SqlRepository):
    """Workflow step runs (`step_runs`): a row per attempt, added when it starts and updated as it ends."""

    async def add(self, run: StepRun) -> int:
        """Insert `run` (its `id` is ignored); returns the new id.

        Raises: SessionNotFound when `run.session_id` names no session."""
        values = {f.name: getattr(run, f.name) for f in fields(run) if f.name != "id"}
        try:
            return int((await self._conn.execute(sql.INSERT_STEP_RUN, _step_run_values(values))).scalar_one())
        except IntegrityError as exc:
            if _foreign_key_failed(exc):
                raise SessionNotFound(run.session_id) from exc
            raise

    async def update(self, run: StepRun) -> None:
        if run.id is None or not storable(run.id):
            raise StepRunNotFound(run.id)
        values = _step_run_values({name: getattr(run, name) for name in _STEP_RUN_CHANGES})
        stmt = update(t.step_runs).where(t.step_runs.c.id == run.id).values(**values)
        if (await self._conn.execute(stmt)).rowcount != 1:
            raise StepRunNotFound(run.id)

    async def get(self, run_id: int) -> StepRun:
        row = await self._one(sql.STEP_RUN_BY_ID, {"id": run_id}) if storable(run_id) else None
        if row is None:
            raise StepRunNotFound(run_id)
        return _step_run(row)

    async def finish(self, run_id: int, status: StepStatus, ended_at: datetime, output: str, error: str | None) -> bool:
        if not storable(run_id):
            return False
        params = {"match_id": run_id, "open_statuses": _OPEN_STEP_STATUSES, "status": StepStatus(status).value,
                  "ended_at": ended_at, "output_summary": output, "error": error}  # fmt: skip
        return (await self._conn.execute(sql.FINISH_OPEN_STEP_RUN, params)).rowcount == 1

    async def of_session(self, session_id: str, limit: int = 200) -> list[StepRun]:
        c = t.step_runs.c
        stmt = select(t.step_runs).where(c.session_id == session_id).order_by(c.id.desc()).limit(limit)
        return [_step_run(r) for r in reversed(await self._all(stmt))]

    async def open_runs(self, session_id: str) -> list[StepRun]:
        c = t.step_runs.c
        live = [s.value for s in OPEN_STEP_STATUSES]
        stmt = select(t.step_runs).where(c.session_id == session_id, c.status.in_(live)).order_by(c.id)
        return [_step_run(r) for r in await self._all(stmt)]


def _step_run_values(values: dict[str, Any]) -> dict[str, Any]:
    return {**values, "status": StepStatus(values["status"]).value, "agent_ids": list(values["agent_ids"])}


def _step_run(row: Any) -> StepRun:
    return StepRun(**{**dict(row), "status": StepStatus(row["status"]), "agent_ids": tuple(row["agent_ids"])})


def _foreign_key_failed(exc: IntegrityError) -> bool:
    """A foreign key violation: SQLSTATE 23503 on PostgreSQL; SQLite has no codes, only the message."""
    orig = exc.orig
    return getattr(orig, "sqlstate", None) == "23503" or "FOREIGN KEY constraint failed" in str(orig)
