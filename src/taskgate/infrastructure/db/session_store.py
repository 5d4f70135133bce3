"""Sessions and what is recorded of them: the transition log, the event log, decisions and snapshots.

Transition rows, events and decisions are audited: the linker chains each after its commit
(application/audit/linking.py); writing one here is a plain INSERT.
"""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError

from taskgate.application.sessions.ports import TransitionLocks, TransitionQuery
from taskgate.application.sessions.references import upper_bound
from taskgate.domain.entities import (
    Compensation,
    Decision,
    DecisionKind,
    Outcome,
    Plan,
    PlanStatus,
    Session,
    SessionSnapshot,
    TransitionRecord,
)
from taskgate.domain.errors import AlreadyExists, ConcurrentModification, SessionAlreadyActive, SessionNotFound
from taskgate.domain.states import SessionState
from taskgate.infrastructure.db import read_statements as reads
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.connections import AnyConnection
from taskgate.infrastructure.db.repository_base import TERMINAL, SqlRepository
from taskgate.infrastructure.db.row_maps import session_of


class SqlAlchemySessionRepository(SqlRepository):
    """Sessions. A unit of work's repository remembers the sessions it read or wrote, so that an update writes only
    the columns that changed since (`update`)."""

    def __init__(self, conn: AnyConnection, dialect: str) -> None:
        super().__init__(conn, dialect)
        self._known: dict[str, Session] = {}

    async def add(self, session: Session) -> None:
        try:
            await self._conn.execute(insert(t.sessions).values(**_session_values(session)))
        except IntegrityError as exc:
            raise SessionAlreadyActive(f"task {session.task_id} already has an active session") from exc

    async def get(self, session_id: str, *, lock: bool = False) -> Session:
        """The session; `lock=True` holds its row for this transaction (PostgreSQL: FOR UPDATE; SQLite's unit of
        work holds the write lock already)."""
        row = await self._one(self._pick(sql.SESSION_BY_ID, sql.SESSION_BY_ID_FOR_UPDATE, lock), {"id": session_id})
        if row is None:
            raise SessionNotFound(session_id)
        session = self._known[session_id] = _session(row)
        return session

    async def lock_for_transition(
        self, session_id: str, operator_id: str | None, *, session_operator: bool, plan: bool
    ) -> TransitionLocks:
        """The session, operator and plan rows a transition locks, in that order. PostgreSQL takes the three in one
        statement (`statements.LOCK_FOR_TRANSITION`, which says why the order holds); SQLite's unit of work holds the
        write lock already, so it reads them one by one. Raises: SessionNotFound."""
        if self._dialect != "postgresql" or not (plan or operator_id or session_operator):
            # SQLite; or only the session to lock, which its own statement does for less than the three CTEs
            return await self._lock_one_by_one(session_id, operator_id, session_operator=session_operator, plan=plan)
        params = {"id": session_id, "operator_id": operator_id, "session_operator": session_operator, "plan": plan}
        row = await self._one(sql.LOCK_FOR_TRANSITION, params)
        if row is None:
            raise SessionNotFound(session_id)
        session = self._known[session_id] = _session(row)
        wanted = operator_id or (session.operator_id if session_operator else None)
        locked = None
        if row["p_id"] is not None:
            locked = Plan(row["p_id"], row["p_project_id"], row["p_name"], PlanStatus(row["p_status"]),
                          row["p_created_at"])  # fmt: skip
        return TransitionLocks(session, wanted is None or row["operator_rows"] == 1, locked)

    async def _lock_one_by_one(
        self, session_id: str, operator_id: str | None, *, session_operator: bool, plan: bool
    ) -> TransitionLocks:
        session = await self.get(session_id, lock=True)
        wanted = operator_id or (session.operator_id if session_operator else None)
        found = wanted is None or await self._one(sql.OPERATOR_ID_FOR_UPDATE, {"id": wanted}) is not None
        locked = None
        if plan and session.plan_id is not None:
            row = await self._one(sql.PLAN_BY_ID, {"id": session.plan_id})
            locked = Plan(row["id"], row["project_id"], row["name"], PlanStatus(row["status"]), row["created_at"])
        return TransitionLocks(session, found, locked)

    async def update(self, session: Session, expected_version: int) -> None:
        """Write the session's mutable columns, if its row is still at `expected_version`. Its identity (id, task,
        project, plan, creation time) is written once, by `add`: a SET of the primary key, even to the same
        value, makes SQLite check every table that references sessions for the session's rows (transition log,
        events, tokens, …), a cost that grew with the session's history on every transition.

        Of the scalar columns, only those that differ from the row this unit of work read (or wrote) at
        `expected_version` are written (a transition changes four or five of twelve); the version check guards
        the rest. Without such a read (or given the very object it returned, which may have been changed in
        place), every mutable column is.

        Raises: ConcurrentModification when the row is not at `expected_version`."""
        before = self._known.get(session.id)
        if before is not None and before is not session and before.version == expected_version:
            params = _changed_values(session, before)
        else:
            params = _session_values(session, _MUTABLE_FIELDS)
        params.update(match_id=session.id, match_version=expected_version)

        def conflict() -> ConcurrentModification:
            self._known.pop(session.id, None)
            return ConcurrentModification(
                f"session {session.id} changed concurrently (expected version {expected_version})"
            )

        # On PostgreSQL the check may come with the unit's next write (pg_writes.py), still before its COMMIT
        await self._write(sql.UPDATE_SESSION, params, expect=1, error=conflict)
        self._known[session.id] = session

    async def list(
        self, *, project_id: int | None = None, plan_id: int | None = None, states: set[SessionState] | None = None
    ) -> list[Session]:
        c = t.sessions.c
        if project_id is not None and plan_id is None:  # the CLI's listings: statements shared with its fast path
            if states is None:
                return [_session(r) for r in await self._all(reads.SESSIONS_OF_PROJECT, {"project_id": project_id})]
            params = {"project_id": project_id, "states": [s.value for s in states]}
            return [_session(r) for r in await self._all(reads.SESSIONS_OF_PROJECT_IN, params)]
        stmt = select(t.sessions)
        if project_id is not None:
            stmt = stmt.where(c.project_id == project_id)
        if plan_id is not None:
            stmt = stmt.where(c.plan_id == plan_id)
        if states is not None:
            stmt = stmt.where(c.state.in_([s.value for s in states]))
        return [_session(r) for r in await self._all(stmt.order_by(c.created_at, c.id))]

    async def active_for_task(self, task_id: str) -> list[str]:
        rows = await self._all(sql.ACTIVE_SESSIONS_OF_TASK, {"task_id": task_id, "terminal": TERMINAL})
        return [r["id"] for r in rows]

    async def active_of_node(self, node_id: str) -> list[str]:
        c = t.sessions.c
        stmt = select(c.id).where(c.node_id == node_id, c.state.not_in(TERMINAL)).order_by(c.created_at, c.id)
        return [r["id"] for r in await self._all(stmt)]

    async def ids_with_prefix(self, prefix: str, limit: int) -> list[str]:
        params = {"prefix": prefix, "upper": upper_bound(prefix), "limit": limit}
        return [r["id"] for r in await self._all(reads.SESSION_IDS_WITH_PREFIX, params)]

    async def count_in_states(self, plan_id: int, states: frozenset[SessionState]) -> int:
        params = {"plan_id": plan_id, "states": [s.value for s in states]}
        return (await self._conn.execute(sql.COUNT_PLAN_SESSIONS_IN, params)).scalar_one()

    async def count_of_operator(self, operator_id: str, states: frozenset[SessionState]) -> int:
        c = t.sessions.c
        stmt = select(func.count()).where(c.operator_id == operator_id, c.state.in_([s.value for s in states]))
        return (await self._conn.execute(stmt)).scalar_one()

    async def count_by_state(
        self, project_id: int, *, plan_id: int | None = None, operator_id: str | None = None
    ) -> dict[SessionState, int]:
        """The project's sessions per state, narrowed to a plan and an operator when given: one GROUP BY (the
        board's column counts), covered by `ix_sessions_project_state_updated` when not narrowed."""
        c = t.sessions.c
        stmt = select(c.state, func.count().label("n")).where(*_narrowed(project_id, plan_id, operator_id))
        return {SessionState(r["state"]): int(r["n"]) for r in await self._all(stmt.group_by(c.state))}

    async def page_in_states(
        self,
        project_id: int,
        states: frozenset[SessionState],
        *,
        offset: int,
        limit: int,
        plan_id: int | None = None,
        operator_id: str | None = None,
    ) -> list[Session]:
        """`limit` of the project's sessions in `states` from `offset`, the most recently moved first (`updated_at`,
        then id, descending): one page of a board column."""
        c = t.sessions.c
        stmt = (
            select(t.sessions)
            .where(*_narrowed(project_id, plan_id, operator_id), c.state.in_([s.value for s in states]))
            .order_by(c.updated_at.desc(), c.id.desc())
            .offset(offset)
            .limit(limit)
        )
        return [_session(r) for r in await self._all(stmt)]

    async def count_by_plan(self, project_id: int, states: frozenset[SessionState]) -> dict[int, int]:
        """The project's sessions in `states` per plan (sessions of no plan are left out): one GROUP BY."""
        c = t.sessions.c
        stmt = select(c.plan_id, func.count().label("n")).where(
            c.project_id == project_id, c.plan_id.is_not(None), c.state.in_([s.value for s in states])
        )
        return {int(r["plan_id"]): int(r["n"]) for r in await self._all(stmt.group_by(c.plan_id))}

    async def operators_of_project(self, project_id: int) -> list[str]:
        """The operators holding at least one of the project's sessions, by name."""
        c = t.sessions.c
        stmt = select(c.operator_id).where(c.project_id == project_id, c.operator_id.is_not(None)).distinct()
        return [r["operator_id"] for r in await self._all(stmt.order_by(c.operator_id))]


class SqlAlchemyTransitionLog(SqlRepository):
    async def append(self, record: TransitionRecord) -> int:
        values = _record_values(record)
        return (await self._conn.execute(sql.INSERT_TRANSITION, values)).inserted_primary_key[0]

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
        await self._write(sql.INSERT_EVENT, values)

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


def _session_values(session: Session, names: tuple[str, ...] = _SESSION_FIELDS) -> dict[str, Any]:
    values = {name: getattr(session, name) for name in names}
    values["state"] = session.state.value
    values["prior_state"] = session.prior_state.value if session.prior_state else None
    return values


_IDENTITY = frozenset({"id", "task_id", "project_id", "plan_id", "created_at"})  # written once, by `add`
_MUTABLE_FIELDS = tuple(name for name in _SESSION_FIELDS if name not in _IDENTITY)
_SCALAR_FIELDS = tuple(name for name in _MUTABLE_FIELDS if name not in {"state_data", "workflow_stack"})


def _changed_values(session: Session, before: Session) -> dict[str, Any]:
    """The scalar columns of `session` that differ from `before`, its JSON columns, and the version (always set).

    The JSON columns are always written: their dicts and lists may be shared with what the unit read and changed in
    place since (a workflow frame holds its stack entry's lists), so `before` may hold the change as well."""
    old = _session_values(before, _SCALAR_FIELDS)
    values = {name: value for name, value in _session_values(session, _SCALAR_FIELDS).items() if value != old[name]}
    values.update(version=session.version, state_data=session.state_data, workflow_stack=session.workflow_stack)
    return values


def _narrowed(project_id: int, plan_id: int | None, operator_id: str | None) -> list[Any]:
    c = t.sessions.c
    where = [c.project_id == project_id]
    if plan_id is not None:
        where.append(c.plan_id == plan_id)
    if operator_id is not None:
        where.append(c.operator_id == operator_id)
    return where


_session = session_of  # rows in, records out: shared with the engine-free read path (row_maps.py)


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
