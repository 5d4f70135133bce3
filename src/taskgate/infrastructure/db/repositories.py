"""Repositories over SQLAlchemy Core: rows in, domain dataclasses out, no ORM identity map or lazy loads.

Each repository works on the connection of its unit of work. `lock=True` adds `FOR UPDATE` on PostgreSQL;
on SQLite the unit of work already holds the database write lock (`BEGIN IMMEDIATE`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Integer,
    Select,
    String,
    Text,
    and_,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from taskgate.application.ports import Delivery, Lease, NodeRecord, OutboxEvent, TaskFacts, TransitionQuery
from taskgate.domain import writebacks as wb
from taskgate.domain.beads import WAITS_FOR_ANY
from taskgate.domain.entities import (
    OPEN_STEP_STATUSES,
    Agent,
    AgentStatus,
    ApiToken,
    Compensation,
    Decision,
    DecisionKind,
    Operator,
    Outcome,
    Plan,
    PlanStatus,
    Project,
    Session,
    SessionSnapshot,
    StepRun,
    StepStatus,
    Task,
    TaskStatus,
    TransitionRecord,
)
from taskgate.domain.errors import (
    AlreadyExists,
    ConcurrentModification,
    OperatorNotFound,
    PlanNotFound,
    ProjectNotFound,
    SessionAlreadyActive,
    SessionNotFound,
    StepRunNotFound,
    StorageError,
    TaskNotFound,
    WritebackNotFound,
)
from taskgate.domain.policies import BlockerFact, TestRun
from taskgate.domain.states import TERMINAL_STATES, SessionState
from taskgate.domain.writebacks import Writeback
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.engine import AnyConnection

if TYPE_CHECKING:
    from taskgate.infrastructure.db.audit_trail import AuditTrail

_TERMINAL = [s.value for s in TERMINAL_STATES]
_INTEGER_IDS = range(-(2**31), 2**31)  # INTEGER id columns: 32-bit on PostgreSQL, 64-bit on SQLite


def _storable(ident: int) -> bool:
    """Whether an INTEGER id column could hold `ident`. One it cannot names nothing, and must not reach the
    driver: sqlite3 raises OverflowError past 64 bits, asyncpg a DataError past 32."""
    return ident in _INTEGER_IDS


class SqlRepository:
    """The base of every repository on SQLAlchemy here (audit_store.py's too): the unit of work's connection and
    dialect, its audit trail, and the few helpers every repository uses to run its statements."""

    def __init__(self, conn: AnyConnection, dialect: str, trail: AuditTrail | None = None) -> None:
        self._conn, self._dialect = conn, dialect
        self._trail = trail  # where an audited record goes to be chained at commit (audit_trail.py)

    def _audited(self, table: str, record_id: int, values: dict[str, Any]) -> None:
        if self._trail is None:
            raise StorageError(f"{type(self).__name__} appends audited records: it needs its unit of work's trail")
        self._trail.add(table, record_id, values)

    def _pick(self, plain: Select[Any], for_update: Select[Any], lock: bool) -> Select[Any]:
        return for_update if lock and self._dialect == "postgresql" else plain

    async def _one(self, stmt: Any, params: dict[str, Any] | None = None) -> Any:
        return (await self._conn.execute(stmt, params)).mappings().first()

    async def _all(self, stmt: Any, params: dict[str, Any] | None = None) -> list[Any]:
        return list((await self._conn.execute(stmt, params)).mappings().all())


class SqlAlchemyProjectRepository(SqlRepository):
    async def add(self, name: str, key: str, root_path: str, created_at: datetime) -> Project:
        values = {"name": name, "key": key, "root_path": root_path, "config": {}, "created_at": created_at}
        result = await self._conn.execute(insert(t.projects).values(**values))
        return Project(
            id=result.inserted_primary_key[0], name=name, key=key, root_path=root_path, created_at=created_at
        )

    async def get(self, project_id: int) -> Project:
        if not _storable(project_id):
            raise ProjectNotFound(project_id)
        row = await self._one(sql.PROJECT_BY_ID, {"id": project_id})
        if row is None:
            raise ProjectNotFound(project_id)
        return _project(row)

    async def find(self, *, name: str | None = None, root_path: str | None = None, key: str | None = None):
        c = t.projects.c
        column, value = (c.name, name) if name is not None else (c.root_path, root_path) if root_path else (c.key, key)
        row = await self._one(select(t.projects).where(column == value))
        return _project(row) if row else None

    async def list(self) -> list[Project]:
        return [_project(r) for r in await self._all(select(t.projects).order_by(t.projects.c.id))]

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
        if not _storable(plan_id):
            raise PlanNotFound(plan_id)
        row = await self._one(self._pick(sql.PLAN_BY_ID, sql.PLAN_BY_ID_FOR_UPDATE, lock), {"id": plan_id})
        if row is None:
            raise PlanNotFound(plan_id)
        return Plan(row["id"], row["project_id"], row["name"], PlanStatus(row["status"]), row["created_at"])

    async def list(self, project_id: int) -> list[Plan]:
        rows = await self._all(select(t.plans).where(t.plans.c.project_id == project_id).order_by(t.plans.c.id))
        return [Plan(r["id"], r["project_id"], r["name"], PlanStatus(r["status"]), r["created_at"]) for r in rows]

    async def set_status(self, plan_id: int, status: PlanStatus) -> None:
        await self._conn.execute(sql.SET_PLAN_STATUS, {"match_id": plan_id, "status": status.value})


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
        if plan_id is not None and not _storable(plan_id):
            return []
        if plan_id is not None:
            stmt = stmt.where(t.tasks.c.plan_id == plan_id)
        if status is not None:
            stmt = stmt.where(t.tasks.c.status == status.value)
        return await self._with_blockers(await self._all(stmt.order_by(t.tasks.c.created_at, t.tasks.c.id)))

    async def ready(self, project_id: int, limit: int | None = None) -> list[Task]:
        tk, dep, s, pl = t.tasks, t.task_dependencies, t.sessions, t.plans
        blocker = t.tasks.alias("blocker")
        has_active_session = exists().where(and_(s.c.task_id == tk.c.id, s.c.state.not_in(_TERMINAL)))
        in_closed_plan = exists().where(and_(pl.c.id == tk.c.plan_id, pl.c.status == PlanStatus.CLOSED.value))
        # An any-children gate (Beads' waits-for with gate any-children) opens once one of its children is done:
        # its rows block only while none of them is completed. Every other row blocks while its task is open.
        dep_any, done_any = t.task_dependencies.alias("dep_any"), t.tasks.alias("done_any")
        gate_open = exists().where(
            and_(
                dep_any.c.task_id == tk.c.id,
                dep_any.c.type == WAITS_FOR_ANY,
                dep_any.c.depends_on_id == done_any.c.id,
                done_any.c.status == TaskStatus.COMPLETED.value,
            )
        )
        has_open_blocker = exists().where(
            and_(
                dep.c.task_id == tk.c.id,
                dep.c.depends_on_id == blocker.c.id,
                blocker.c.status != TaskStatus.COMPLETED.value,
                or_(dep.c.type != WAITS_FOR_ANY, ~gate_open),
            )
        )
        stmt = (
            select(tk)
            .where(
                tk.c.project_id == project_id,
                tk.c.status == TaskStatus.OPEN.value,
                tk.c.hold.is_(None),  # the tracker keeps it out of its ready set (hooked, pinned, an epic, …)
                ~has_active_session,
                ~has_open_blocker,
                ~in_closed_plan,  # plan_open refuses to start them
            )
            .order_by(tk.c.priority, tk.c.created_at, tk.c.id)
        )
        if limit is not None:
            stmt = stmt.limit(limit)  # a top-N sort in the database: the first page of 80,000 issues stays fast
        return await self._with_blockers(await self._all(stmt))

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
        await self._conn.execute(sql.SET_TASK_STATUS, {"match_id": task_id, "status": status.value})

    async def count_unfinished(self, plan_id: int) -> int:
        stmt = (
            select(func.count())
            .select_from(t.tasks)
            .where(t.tasks.c.plan_id == plan_id, t.tasks.c.status != TaskStatus.COMPLETED.value)
        )
        return (await self._conn.execute(stmt)).scalar_one()

    async def _with_blockers(self, rows: list[Any]) -> list[Task]:
        if not rows:
            return []
        links = await self._all(sql.BLOCKER_IDS, {"ids": [r["id"] for r in rows]})
        blockers: dict[str, list[str]] = {}
        for link in links:
            blockers.setdefault(link["task_id"], []).append(link["depends_on_id"])
        return [_task(r, sorted(blockers.get(r["id"], []))) for r in rows]

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


class SqlAlchemyOperatorRepository(SqlRepository):
    async def add(self, operator: Operator) -> None:
        await self._conn.execute(insert(t.operators), {f.name: getattr(operator, f.name) for f in fields(operator)})

    async def get(self, operator_id: str) -> Operator:
        found = await self.find(operator_id)
        if found is None:
            raise OperatorNotFound(operator_id)
        return found

    async def find(self, operator_id: str) -> Operator | None:
        row = await self._one(sql.OPERATOR_BY_ID, {"id": operator_id})
        return Operator(**dict(row)) if row else None

    async def list(self) -> list[Operator]:
        return [Operator(**dict(r)) for r in await self._all(select(t.operators).order_by(t.operators.c.id))]

    async def update(self, operator: Operator) -> None:
        values = {f.name: getattr(operator, f.name) for f in fields(operator) if f.name not in {"id", "created_at"}}
        await self._conn.execute(update(t.operators).where(t.operators.c.id == operator.id).values(**values))

    async def lock(self, operator_id: str) -> None:
        """Hold the operator's row until the unit of work ends (one decision at a time per operator)."""
        if await self._one(sql.OPERATOR_ID_FOR_UPDATE, {"id": operator_id}) is None:
            raise OperatorNotFound(operator_id)


class SqlAlchemySessionRepository(SqlRepository):
    async def add(self, session: Session) -> None:
        try:
            await self._conn.execute(insert(t.sessions).values(**_session_values(session)))
        except IntegrityError as exc:
            raise SessionAlreadyActive(f"task {session.task_id} already has an active session") from exc

    async def get(self, session_id: str, *, lock: bool = False) -> Session:
        row = await self._one(self._pick(sql.SESSION_BY_ID, sql.SESSION_BY_ID_FOR_UPDATE, lock), {"id": session_id})
        if row is None:
            raise SessionNotFound(session_id)
        return _session(row)

    async def update(self, session: Session, expected_version: int) -> None:
        params = {**_session_values(session), "match_id": session.id, "match_version": expected_version}
        if (await self._conn.execute(sql.UPDATE_SESSION, params)).rowcount != 1:
            raise ConcurrentModification(
                f"session {session.id} changed concurrently (expected version {expected_version})"
            )

    async def list(
        self, *, project_id: int | None = None, plan_id: int | None = None, states: set[SessionState] | None = None
    ) -> list[Session]:
        c = t.sessions.c
        stmt = select(t.sessions)
        if project_id is not None:
            stmt = stmt.where(c.project_id == project_id)
        if plan_id is not None:
            stmt = stmt.where(c.plan_id == plan_id)
        if states is not None:
            stmt = stmt.where(c.state.in_([s.value for s in states]))
        return [_session(r) for r in await self._all(stmt.order_by(c.created_at, c.id))]

    async def active_for_task(self, task_id: str) -> list[str]:
        rows = await self._all(sql.ACTIVE_SESSIONS_OF_TASK, {"task_id": task_id, "terminal": _TERMINAL})
        return [r["id"] for r in rows]

    async def active_of_node(self, node_id: str) -> list[str]:
        c = t.sessions.c
        stmt = select(c.id).where(c.node_id == node_id, c.state.not_in(_TERMINAL)).order_by(c.created_at, c.id)
        return [r["id"] for r in await self._all(stmt)]

    async def ids_with_prefix(self, prefix: str, limit: int) -> list[str]:
        c = t.sessions.c
        upper = prefix + "\uffff"  # a range scan on the primary key instead of LIKE (no wildcard escaping)
        rows = await self._all(select(c.id).where(c.id >= prefix, c.id < upper).order_by(c.id).limit(limit))
        return [r["id"] for r in rows]

    async def count_in_states(self, plan_id: int, states: frozenset[SessionState]) -> int:
        params = {"plan_id": plan_id, "states": [s.value for s in states]}
        return (await self._conn.execute(sql.COUNT_PLAN_SESSIONS_IN, params)).scalar_one()

    async def count_of_operator(self, operator_id: str, states: frozenset[SessionState]) -> int:
        c = t.sessions.c
        stmt = select(func.count()).where(c.operator_id == operator_id, c.state.in_([s.value for s in states]))
        return (await self._conn.execute(stmt)).scalar_one()


class SqlAlchemyTransitionLog(SqlRepository):
    async def append(self, record: TransitionRecord) -> int:
        values = _record_values(record)
        seq = (await self._conn.execute(sql.INSERT_TRANSITION, values)).inserted_primary_key[0]
        self._audited("transition_log", seq, values)
        return seq

    async def history(self, session_id: str, *, limit: int) -> list[TransitionRecord]:
        rows = (await self._conn.execute(sql.HISTORY, {"session_id": session_id, "limit": limit})).all()
        return _records(reversed(rows))

    async def applied_until(self, session_id: str, at: datetime) -> list[TransitionRecord]:
        return _records((await self._conn.execute(sql.APPLIED_UNTIL, {"session_id": session_id, "at": at})).all())

    async def query(self, query: TransitionQuery) -> list[TransitionRecord]:
        c = t.transition_log.c
        conditions = [
            cond
            for cond in (
                c.session_id == query.session_id if query.session_id else None,
                c.actor == query.actor if query.actor else None,
                c.to_state == query.state if query.state else None,
                c.outcome == query.outcome if query.outcome else None,
                c.at >= query.since if query.since else None,
                c.at <= query.until if query.until else None,
            )
            if cond is not None
        ]
        stmt = select(t.transition_log).where(*conditions).order_by(c.at, c.seq).limit(query.limit)
        return _records((await self._conn.execute(stmt)).all())


class SqlAlchemyEventLog(SqlRepository):
    async def append(self, kind: str, at: datetime, payload: dict[str, Any], session_id: str | None = None) -> None:
        values = {"kind": kind, "at": at, "payload": payload, "session_id": session_id}
        self._audited("events", (await self._conn.execute(sql.INSERT_EVENT, values)).inserted_primary_key[0], values)

    async def list(self, session_id=None, limit=100, *, kind=None, since=None, until=None) -> list[dict[str, Any]]:
        c = t.events.c
        stmt = select(t.events).order_by(c.id.desc()).limit(limit)
        if session_id is not None:
            stmt = stmt.where(c.session_id == session_id)
        if kind is not None:
            stmt = stmt.where(c.kind.startswith(kind, autoescape=True) if kind.endswith(".") else c.kind == kind)
        if since is not None:
            stmt = stmt.where(c.at >= since)
        if until is not None:
            stmt = stmt.where(c.at <= until)
        return [dict(r) for r in reversed(await self._all(stmt))]

    async def high_water(self) -> int:
        row = await self._one(select(func.max(t.events.c.id).label("top")))
        return int(row["top"] or 0) if row else 0


class SqlAlchemyDecisionRepository(SqlRepository):
    async def add(self, decision: Decision) -> int:
        values = {f.name: getattr(decision, f.name) for f in fields(decision) if f.name != "id"}
        values["decision"] = decision.decision.value
        values["compensation"] = decision.compensation.value if decision.compensation else None
        stmt = insert(t.decisions).returning(t.decisions.c.id)
        try:
            decision_id = int((await self._conn.execute(stmt, values)).scalar_one())
        except IntegrityError as exc:
            raise AlreadyExists(
                f"operator {decision.operator_id} already decided session {decision.session_id} "
                f"at version {decision.session_version}"
            ) from exc
        self._audited("decisions", decision_id, values)
        return decision_id

    async def for_verification(self, session_id: str, session_version: int) -> list[Decision]:
        params = {"session_id": session_id, "session_version": session_version}
        return [_decision(r) for r in await self._all(sql.DECISIONS_OF_VERIFICATION, params)]

    async def of_session(self, session_id: str, limit: int = 100) -> list[Decision]:
        c = t.decisions.c
        stmt = select(t.decisions).where(c.session_id == session_id).order_by(c.id.desc()).limit(limit)
        return [_decision(r) for r in reversed(await self._all(stmt))]

    async def approvals(self, session_id: str, session_version: int) -> list[str]:
        c = t.decisions.c
        stmt = select(c.operator_id).where(
            c.session_id == session_id, c.session_version == session_version, c.decision == DecisionKind.APPROVE.value
        )
        return sorted(r["operator_id"] for r in await self._all(stmt))


def _decision(row: Any) -> Decision:
    values = dict(row)
    values["decision"] = DecisionKind(values["decision"])
    values["compensation"] = Compensation(values["compensation"]) if values["compensation"] else None
    return Decision(**values)


class SqlAlchemySnapshotRepository(SqlRepository):
    async def add(self, snapshot: SessionSnapshot) -> int:
        values = {f.name: getattr(snapshot, f.name) for f in fields(snapshot) if f.name != "id"}
        result = await self._conn.execute(insert(t.session_snapshots).returning(t.session_snapshots.c.id), values)
        return int(result.scalar_one())

    async def list(self, session_id: str, *, kind: str | None = None, limit: int = 50) -> list[SessionSnapshot]:
        c = t.session_snapshots.c
        stmt = select(t.session_snapshots).where(c.session_id == session_id)
        if kind is not None:
            stmt = stmt.where(c.kind == kind)
        return [SessionSnapshot(**r) for r in await self._all(stmt.order_by(c.id.desc()).limit(limit))]


class SqlAlchemyTokenRepository(SqlRepository):
    async def add(self, token: ApiToken) -> None:
        await self._conn.execute(insert(t.api_tokens), {f.name: getattr(token, f.name) for f in fields(token)})

    async def find_by_hash(self, token_hash: str) -> ApiToken | None:
        row = await self._one(sql.TOKEN_BY_HASH, {"token_hash": token_hash})
        return ApiToken(**row) if row else None

    async def get(self, token_id: str) -> ApiToken | None:
        row = await self._one(sql.TOKEN_BY_ID, {"id": token_id})
        return ApiToken(**row) if row else None

    async def list(self) -> list[ApiToken]:
        rows = await self._all(select(t.api_tokens).order_by(t.api_tokens.c.created_at, t.api_tokens.c.id))
        return [ApiToken(**r) for r in rows]

    async def revoke(self, token_id: str, at: datetime) -> bool:
        stmt = update(t.api_tokens).where(t.api_tokens.c.id == token_id).values(revoked_at=at)
        return (await self._conn.execute(stmt)).rowcount == 1

    async def revoke_for_agent(self, agent_id: str, at: datetime) -> int:
        c = t.api_tokens.c
        stmt = update(t.api_tokens).where(c.agent_id == agent_id, c.revoked_at.is_(None)).values(revoked_at=at)
        return (await self._conn.execute(stmt)).rowcount

    async def revoke_for_session(self, session_id: str, at: datetime) -> int:
        c = t.api_tokens.c
        stmt = update(t.api_tokens).where(c.session_id == session_id, c.revoked_at.is_(None)).values(revoked_at=at)
        return (await self._conn.execute(stmt)).rowcount

    async def revoke_dangling(self, at: datetime) -> list[str]:
        c, a, s = t.api_tokens.c, t.agents.c, t.sessions.c
        # a lost agent (its node is down) may still run on its machine: its token lives until its node settles it
        live_agents = select(a.id).where(a.status.in_(("queued", "running", "lost")))
        ended_sessions = select(s.id).where(s.state.in_(("completed", "cancelled")))
        dangling = and_(
            c.kind == "agent",
            c.revoked_at.is_(None),
            or_(and_(c.agent_id.is_not(None), c.agent_id.not_in(live_agents)), c.session_id.in_(ended_sessions)),
        )
        ids = [r[0] for r in (await self._conn.execute(select(c.id).where(dangling))).all()]
        if ids:
            await self._conn.execute(update(t.api_tokens).where(c.id.in_(ids)).values(revoked_at=at))
        return ids


def _project(row: Any) -> Project:
    values = {name: row[name] for name in _PROJECT_FIELDS}
    return Project(**values, config=row["config"] or {})


_PROJECT_FIELDS = ("id", "name", "key", "root_path", "created_at", "archived_at")


_TASK_COLUMNS = tuple(f.name for f in fields(Task) if f.name != "blockers")  # blockers live in task_dependencies


def _task(row: Any, blockers: list[str]) -> Task:
    return Task(**{**row, "status": TaskStatus(row["status"]), "blockers": blockers})


_SESSION_FIELDS = (
    "id",
    "task_id",
    "project_id",
    "plan_id",
    "operator_id",
    "version",
    "state_data",
    "workflow_stack",
    "branch_name",
    "worktree_path",
    "compensation_plan",
    "created_at",
    "started_at",
    "updated_at",
    "completed_at",
    "deadline",
    "node_id",
)


def _session_values(session: Session) -> dict[str, Any]:
    values = {name: getattr(session, name) for name in _SESSION_FIELDS}
    values["state"] = session.state.value
    values["prior_state"] = session.prior_state.value if session.prior_state else None
    return values


def _session(row: Any) -> Session:
    values = {name: row[name] for name in _SESSION_FIELDS}
    prior = row["prior_state"]
    return Session(state=SessionState(row["state"]), prior_state=SessionState(prior) if prior else None, **values)


_RECORD_FIELDS = tuple(f.name for f in fields(TransitionRecord) if f.name != "seq")


def _record_values(record: TransitionRecord) -> dict[str, Any]:
    values = {name: getattr(record, name) for name in _RECORD_FIELDS}
    values["outcome"] = record.outcome.value
    return values


_OUTCOMES = {outcome.value: outcome for outcome in Outcome}


def _records(rows: Any) -> list[TransitionRecord]:
    """Log rows (plain tuples, in table column order == TransitionRecord field order) as records.

    Positional on purpose: audit reads return hundreds of rows, and going through a RowMapping per row cost
    more than the query (a test checks the two orders agree).
    """
    return [
        TransitionRecord(seq, sid, trig, src, dst, _OUTCOMES[outcome], actor, reason, guards, version, at)
        for seq, sid, trig, src, dst, outcome, actor, reason, guards, version, at in rows
    ]


_AGENT_FIELDS = tuple(f.name for f in fields(Agent))


def _agent(row: Any) -> Agent:
    return Agent(**{**{name: row[name] for name in _AGENT_FIELDS}, "status": AgentStatus(row["status"])})


class SqlAlchemyAgentRepository(SqlRepository):
    async def add(self, agent: Agent) -> None:
        values = {name: getattr(agent, name) for name in _AGENT_FIELDS}
        await self._conn.execute(insert(t.agents), {**values, "status": agent.status.value})

    async def of_session(self, session_id: str) -> list[Agent]:
        c = t.agents.c
        stmt = select(t.agents).where(c.session_id == session_id).order_by(c.id)
        return [_agent(r) for r in await self._all(stmt)]

    async def many(self, agent_ids: Sequence[str]) -> list[Agent]:
        if not agent_ids:
            return []
        found = {r["id"]: _agent(r) for r in await self._all(sql.AGENTS_BY_IDS, {"ids": list(agent_ids)})}
        return [found[i] for i in agent_ids if i in found]

    async def last_run(self, session_id: str) -> int:
        stmt = select(func.max(t.agents.c.run)).where(t.agents.c.session_id == session_id)
        return int((await self._conn.execute(stmt)).scalar() or 0)

    async def heartbeat(self, agent_id: str, at: datetime) -> bool:
        stmt = update(t.agents).where(t.agents.c.id == agent_id).values(heartbeat_at=at)
        return (await self._conn.execute(stmt)).rowcount == 1

    async def set_status(self, agent_id: str, status: AgentStatus, at: datetime) -> None:
        done = status not in (AgentStatus.QUEUED, AgentStatus.RUNNING)
        values: dict[str, Any] = {"status": status.value, "completed_at": at if done else None}
        await self._conn.execute(update(t.agents).where(t.agents.c.id == agent_id).values(**values))

    async def update(self, agent: Agent) -> None:
        values = {name: getattr(agent, name) for name in _AGENT_FIELDS if name != "id"}
        await self._conn.execute(
            update(t.agents).where(t.agents.c.id == agent.id).values(**{**values, "status": agent.status.value})
        )

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


class SqlAlchemyNodeRepository(SqlRepository):
    async def beat(self, node: NodeRecord) -> None:
        values = {f.name: getattr(node, f.name) for f in fields(NodeRecord)}
        values["down_at"] = None  # a node that beats is not down, whatever a survivor found meanwhile
        # one statement, INSERT … ON CONFLICT DO UPDATE: two processes of one node id (the same machine and data
        # dir, e.g. `serve` and a CLI that launches agents) beating at once leave one row, the later beat
        stmt = _dialect_insert(self._dialect)(t.nodes).values(values)
        changed = {k: v for k, v in values.items() if k != "id"}
        await self._conn.execute(stmt.on_conflict_do_update(index_elements=[t.nodes.c.id], set_=changed))

    async def get(self, node_id: str) -> NodeRecord | None:
        rows = await self._all(select(t.nodes).where(t.nodes.c.id == node_id))
        return _node(rows[0]) if rows else None

    async def list(self) -> list[NodeRecord]:
        return [_node(r) for r in await self._all(select(t.nodes).order_by(t.nodes.c.id))]

    async def live_agents(self) -> dict[str | None, int]:
        c = t.agents.c
        live = (AgentStatus.QUEUED.value, AgentStatus.RUNNING.value)
        stmt = select(c.node_id, func.count()).where(c.status.in_(live)).group_by(c.node_id)
        return {row[0]: row[1] for row in (await self._conn.execute(stmt)).all()}

    async def live_sessions(self) -> dict[str | None, int]:
        c = t.sessions.c
        stmt = select(c.node_id, func.count()).where(c.state.not_in(_TERMINAL)).group_by(c.node_id)
        return {row[0]: row[1] for row in (await self._conn.execute(stmt)).all()}

    async def mark_down(self, node_id: str, beat_before: datetime, at: datetime) -> bool:
        c = t.nodes.c
        # the compare-and-swap: of several survivors finding the same lapse, one updates the row, the rest 0 rows
        stmt = (
            update(t.nodes).where(c.id == node_id, c.down_at.is_(None), c.heartbeat_at < beat_before).values(down_at=at)
        )
        return (await self._conn.execute(stmt)).rowcount == 1


def _node(row: Any) -> NodeRecord:
    return NodeRecord(**{f.name: row[f.name] for f in fields(NodeRecord)})


class SqlAlchemyLeaseRepository(SqlRepository):
    async def acquire(self, name: str, holder: str, node_id: str, now: datetime, until: datetime) -> Lease:
        c = t.leases.c
        stmt = _dialect_insert(self._dialect)(t.leases).values(
            name=name, holder=holder, node_id=node_id, acquired_at=now, expires_at=until
        )
        # One statement decides: the row is created, or updated only when it is the holder's own (a renewal) or
        # has expired. PostgreSQL locks the conflicting row and re-checks the WHERE against its latest committed
        # version, SQLite runs write transactions one at a time: two nodes never both take it.
        taken = stmt.on_conflict_do_update(
            index_elements=[c.name],
            set_={
                "holder": stmt.excluded.holder,
                "node_id": stmt.excluded.node_id,
                "acquired_at": case((c.holder == stmt.excluded.holder, c.acquired_at), else_=stmt.excluded.acquired_at),
                "expires_at": stmt.excluded.expires_at,
            },
            where=or_(c.holder == stmt.excluded.holder, c.expires_at < now),
        )
        await self._conn.execute(taken)
        row = (await self._all(select(t.leases).where(c.name == name)))[0]
        return Lease(row["name"], row["holder"], row["node_id"], row["acquired_at"], row["expires_at"])

    async def release(self, name: str, holder: str) -> None:
        c = t.leases.c
        await self._conn.execute(delete(t.leases).where(c.name == name, c.holder == holder))


_DELIVERY_MARKERS = ("skipped", "start")


class SqlAlchemyDeliveryRepository(SqlRepository):
    """Webhook delivery rows. `skipped` and `start` rows are cursor markers (see application/outbox.py), never
    deliveries."""

    _LOCK_TIMEOUT = "5s"  # how long the enqueuer waits for PostgreSQL's event writers to finish

    async def committed_high_water(self) -> int:
        if self._dialect == "postgresql":
            # Ids come from a sequence before commit: a SHARE lock waits for every transaction inserting events,
            # so no smaller id can commit after this read. SQLite has one writer and needs nothing.
            await self._conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{self._LOCK_TIMEOUT}'")
            await self._conn.exec_driver_sql("LOCK TABLE events IN SHARE MODE")
        row = await self._one(select(func.max(t.events.c.id).label("top")))
        return int(row["top"] or 0) if row else 0

    async def cursor(self, subscriber: str) -> int:
        c = t.webhook_deliveries.c
        stmt = select(c.event_id).where(c.subscriber == subscriber).order_by(c.event_id.desc()).limit(1)
        row = await self._one(stmt)
        return int(row["event_id"]) if row else 0

    async def events_after(self, after_id: int, upto_id: int, limit: int) -> list[OutboxEvent]:
        c = t.events.c
        stmt = select(t.events).where(c.id > after_id, c.id <= upto_id).order_by(c.id).limit(limit)
        return [OutboxEvent(r["id"], r["kind"], r["session_id"], r["at"], r["payload"]) for r in await self._all(stmt)]

    async def enqueue(self, subscriber: str, event_ids: list[int], at: datetime) -> int:
        if not event_ids:
            return 0
        row = {"subscriber": subscriber, "status": "pending", "next_attempt_at": at}
        rows = [{"event_id": event_id, **row} for event_id in event_ids]
        inserted = await self._conn.execute(self._insert_new(rows).returning(t.webhook_deliveries.c.id))
        return len(inserted.all())

    async def move_cursor(self, subscriber: str, event_id: int) -> None:
        c = t.webhook_deliveries.c
        await self._conn.execute(t.webhook_deliveries.delete().where(c.subscriber == subscriber, c.status == "skipped"))
        marker = {"event_id": event_id, "subscriber": subscriber, "status": "skipped"}
        await self._conn.execute(self._insert_new([marker]))

    async def mark_start(self, subscriber: str, event_id: int) -> None:
        marker = {"event_id": event_id, "subscriber": subscriber, "status": "start"}
        await self._conn.execute(self._insert_new([marker]))

    async def start(self, subscriber: str) -> int | None:
        c = t.webhook_deliveries.c
        row = await self._one(select(c.event_id).where(c.subscriber == subscriber, c.status == "start").limit(1))
        return int(row["event_id"]) if row else None

    def _insert_new(self, rows: list[dict[str, Any]]) -> Any:
        """INSERT … ON CONFLICT DO NOTHING: a concurrent enqueuer may have added the same rows."""
        dialect_insert = _dialect_insert(self._dialect)
        return dialect_insert(t.webhook_deliveries).values(rows).on_conflict_do_nothing()

    async def head(self, subscriber: str) -> Delivery | None:
        d, e = t.webhook_deliveries.c, t.events.c
        stmt = (
            select(t.webhook_deliveries, e.kind, e.session_id, e.at, e.payload)
            .join(t.events, e.id == d.event_id)
            .where(d.subscriber == subscriber, d.status == "pending")
            .order_by(d.event_id)
            .limit(1)
        )
        row = await self._one(stmt)
        if row is None:
            return None
        event = OutboxEvent(row["event_id"], row["kind"], row["session_id"], row["at"], row["payload"])
        return _delivery(row, event)

    async def claim(self, delivery_id: int, attempts: int, now: datetime, lease_until: datetime) -> bool:
        c = t.webhook_deliveries.c
        due = (c.next_attempt_at.is_(None)) | (c.next_attempt_at <= now)
        stmt = (
            update(t.webhook_deliveries)
            .where(c.id == delivery_id, c.status == "pending", c.attempts == attempts, due)
            .values(attempts=attempts + 1, next_attempt_at=lease_until)
        )
        return (await self._conn.execute(stmt)).rowcount == 1

    async def mark_delivered(self, delivery_id: int, at: datetime) -> bool:
        c = t.webhook_deliveries.c
        stmt = (
            update(t.webhook_deliveries)
            .where(c.id == delivery_id, c.status == "pending")
            .values(status="delivered", delivered_at=at, next_attempt_at=None, last_error=None)
        )
        return (await self._conn.execute(stmt)).rowcount == 1

    async def mark_retry(self, delivery_id: int, attempts: int, error: str, next_attempt_at: datetime) -> bool:
        return await self._finish_attempt(delivery_id, attempts, last_error=error, next_attempt_at=next_attempt_at)

    async def mark_failed(self, delivery_id: int, attempts: int, error: str) -> bool:
        failed = {"status": "failed", "last_error": error, "next_attempt_at": None}
        return await self._finish_attempt(delivery_id, attempts, **failed)

    async def _finish_attempt(self, delivery_id: int, attempts: int, **values: Any) -> bool:
        c = t.webhook_deliveries.c
        stmt = (
            update(t.webhook_deliveries)
            .where(c.id == delivery_id, c.status == "pending", c.attempts == attempts)
            .values(**values)
        )
        return (await self._conn.execute(stmt)).rowcount == 1

    async def counts(self) -> dict[tuple[str, str], int]:
        c = t.webhook_deliveries.c
        stmt = (
            select(c.subscriber, c.status, func.count().label("n"))
            .where(c.status.not_in(_DELIVERY_MARKERS))
            .group_by(c.subscriber, c.status)
        )
        return {(r["subscriber"], r["status"]): int(r["n"]) for r in await self._all(stmt)}

    async def list(self, subscriber: str | None = None, status: str | None = None, limit: int = 100) -> list[Delivery]:
        c = t.webhook_deliveries.c
        stmt = select(t.webhook_deliveries).where(c.status.not_in(_DELIVERY_MARKERS))
        if subscriber is not None:
            stmt = stmt.where(c.subscriber == subscriber)
        if status is not None:
            stmt = stmt.where(c.status == status)
        return [_delivery(r, None) for r in await self._all(stmt.order_by(c.event_id, c.subscriber).limit(limit))]


def _delivery(row: Any, event: OutboxEvent | None) -> Delivery:
    names = ("id", "event_id", "subscriber", "status", "attempts", "next_attempt_at", "last_error", "delivered_at")
    return Delivery(**{name: row[name] for name in names}, event=event)


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
        if run.id is None or not _storable(run.id):
            raise StepRunNotFound(run.id)
        values = _step_run_values({name: getattr(run, name) for name in _STEP_RUN_CHANGES})
        stmt = update(t.step_runs).where(t.step_runs.c.id == run.id).values(**values)
        if (await self._conn.execute(stmt)).rowcount != 1:
            raise StepRunNotFound(run.id)

    async def get(self, run_id: int) -> StepRun:
        row = await self._one(sql.STEP_RUN_BY_ID, {"id": run_id}) if _storable(run_id) else None
        if row is None:
            raise StepRunNotFound(run_id)
        return _step_run(row)

    async def finish(self, run_id: int, status: StepStatus, ended_at: datetime, output: str, error: str | None) -> bool:
        if not _storable(run_id):
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


class SqlAlchemyWritebackRepository(SqlRepository):
    """Status writes owed to external trackers (`tracker_writebacks`); see domain/writebacks.py."""

    async def enqueue_for_task(
        self, task_id: str, sources: Sequence[str], status: str, session_id: str | None, reason: str, now: datetime
    ) -> None:
        # INSERT … SELECT: one statement, and nothing at all for a built-in task (no read first on the hot path).
        tk = t.tasks.c
        source = select(
            tk.project_id, tk.id, literal(session_id, String), tk.source, literal(status, String),
            literal(reason, Text), literal(wb.PENDING, String), literal(0, Integer), literal(now, t.UtcDateTime),
            literal(now, t.UtcDateTime), literal(now, t.UtcDateTime),
        ).where(tk.id == task_id, tk.source.in_(list(sources)))  # fmt: skip
        columns = ["project_id", "task_id", "session_id", "tracker", "status", "reason", "state", "attempts",
                   "next_attempt_at", "created_at", "updated_at"]  # fmt: skip
        await self._conn.execute(insert(t.tracker_writebacks).from_select(columns, source))

    async def get(self, writeback_id: int) -> Writeback:
        if not _storable(writeback_id):
            raise WritebackNotFound(writeback_id)
        row = await self._one(select(t.tracker_writebacks).where(t.tracker_writebacks.c.id == writeback_id))
        if row is None:
            raise WritebackNotFound(writeback_id)
        return Writeback(**row)

    async def due(self, now: datetime, limit: int = 100) -> list[Writeback]:
        c = t.tracker_writebacks.c
        stmt = (
            select(t.tracker_writebacks)
            .where(c.state == wb.PENDING, or_(c.next_attempt_at.is_(None), c.next_attempt_at <= now))
            .order_by(c.id)
            .limit(limit)
        )
        return [Writeback(**r) for r in await self._all(stmt)]

    async def list(self, *, states=None, task_ids=None, limit: int = 100) -> list[Writeback]:
        c = t.tracker_writebacks.c
        stmt = select(t.tracker_writebacks)
        if states is not None:
            stmt = stmt.where(c.state.in_(list(states)))
        if task_ids is not None:
            stmt = stmt.where(c.task_id.in_(list(task_ids)))
        return [Writeback(**r) for r in await self._all(stmt.order_by(c.id.desc()).limit(limit))]

    async def claim(self, writeback_id: int, attempts: int, lease_until: datetime, now: datetime) -> bool:
        c = t.tracker_writebacks.c
        stmt = (
            update(t.tracker_writebacks)
            .where(c.id == writeback_id, c.state == wb.PENDING, c.attempts == attempts)
            .values(attempts=attempts + 1, next_attempt_at=lease_until, updated_at=now)
        )
        return (await self._conn.execute(stmt)).rowcount == 1

    async def finish(self, writeback_id, attempts, state, error, next_attempt_at, now) -> bool:
        c = t.tracker_writebacks.c
        stmt = (
            update(t.tracker_writebacks)
            .where(c.id == writeback_id, c.state == wb.PENDING, c.attempts == attempts)
            .values(state=state, last_error=error, next_attempt_at=next_attempt_at, updated_at=now)
        )
        return (await self._conn.execute(stmt)).rowcount == 1

    async def set_state(self, writeback_id, from_states, state, now, *, actor=None) -> bool:
        c = t.tracker_writebacks.c
        values: dict[str, Any] = {"state": state, "updated_at": now, "resolved_by": actor}
        if state == wb.PENDING:
            values["next_attempt_at"] = now
            values["attempts"] = 0  # an operator's retry gets the full series of attempts again
        stmt = update(t.tracker_writebacks).where(c.id == writeback_id, c.state.in_(list(from_states))).values(**values)
        return (await self._conn.execute(stmt)).rowcount == 1

    async def supersede_older(self, task_id: str, newest_id: int, now: datetime) -> int:
        c = t.tracker_writebacks.c
        stmt = (
            update(t.tracker_writebacks)
            .where(c.task_id == task_id, c.id < newest_id, c.state.in_(list(wb.OPEN_STATES)))
            .values(state=wb.SUPERSEDED, updated_at=now, next_attempt_at=None)
        )
        return (await self._conn.execute(stmt)).rowcount


_dialect_insert = sql.dialect_insert
