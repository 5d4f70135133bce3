"""Statements of the hot paths, built once at import.

Building a Core statement per call (`where(col == value)`, `.values(**row)`) coerces every value into a new
bind parameter and regenerates the statement's cache key: measured, that was most of a transition's cost.
Prebuilt statements with `bindparam` placeholders compile once and take their values as parameters.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Boolean, String, bindparam, case, func, insert, literal, literal_column, select, true, update

from taskgate.domain.audit.chain import GENESIS
from taskgate.infrastructure.db import tables as t

_s, _p, _t, _log, _dep = t.sessions.c, t.plans.c, t.tasks.c, t.transition_log.c, t.task_dependencies.c

SESSION_BY_ID = select(t.sessions).where(_s.id == bindparam("id"))
SESSION_BY_ID_FOR_UPDATE = SESSION_BY_ID.with_for_update()
# The WHERE placeholders must not share a name with a column: the other parameter keys become the SET clause.
UPDATE_SESSION = update(t.sessions).where(_s.id == bindparam("match_id"), _s.version == bindparam("match_version"))
COUNT_PLAN_SESSIONS_IN = select(func.count()).where(
    _s.plan_id == bindparam("plan_id"), _s.state.in_(bindparam("states", expanding=True))
)
ACTIVE_SESSIONS_OF_TASK = select(_s.id).where(
    _s.task_id == bindparam("task_id"), _s.state.not_in(bindparam("terminal", expanding=True))
)

PLAN_BY_ID = select(t.plans).where(_p.id == bindparam("id"))
PLAN_BY_ID_FOR_UPDATE = PLAN_BY_ID.with_for_update()
SET_PLAN_STATUS = update(t.plans).where(_p.id == bindparam("match_id"))

PROJECT_BY_ID = select(t.projects).where(t.projects.c.id == bindparam("id"))
PROJECT_BY_ID_FOR_UPDATE = PROJECT_BY_ID.with_for_update()

TASK_BY_ID = select(t.tasks).where(_t.id == bindparam("id"))
TASK_BY_ID_FOR_UPDATE = TASK_BY_ID.with_for_update()
SET_TASK_STATUS = update(t.tasks).where(_t.id == bindparam("match_id"))
BLOCKER_IDS = select(_dep.task_id, _dep.depends_on_id).where(_dep.task_id.in_(bindparam("ids", expanding=True)))
_blocker = t.tasks.alias("blocker")
# The guard facts of a transition in one statement: the task, its project (columns prefixed `p_`), the count of
# the plan's sessions in the given states, and one row per blocker with its status (one row with NULLs when
# the task has none). It replaces four statements (task, project, count, blockers) on every guarded trigger.
TASK_FACTS = (
    select(
        t.tasks,
        *(c.label(f"p_{c.name}") for c in t.projects.c),
        COUNT_PLAN_SESSIONS_IN.scalar_subquery().label("plan_sessions_in"),
        _blocker.c.id.label("blocker_id"),
        _blocker.c.status.label("blocker_status"),
    )
    .select_from(
        t.tasks.join(t.projects, t.projects.c.id == _t.project_id)
        .outerjoin(t.task_dependencies, _dep.task_id == _t.id)
        .outerjoin(_blocker, _blocker.c.id == _dep.depends_on_id)
    )
    .where(_t.id == bindparam("task_id"))
    .order_by(_blocker.c.id)
)
BLOCKERS_WITH_STATUS = (
    select(_t.id, _t.status)
    .join(t.task_dependencies, _dep.depends_on_id == _t.id)
    .where(_dep.task_id == bindparam("task_id"))
    .order_by(_t.id)
)

INSERT_TRANSITION = insert(t.transition_log)
INSERT_EVENT = insert(t.events)
HISTORY = (
    select(t.transition_log)
    .where(_log.session_id == bindparam("session_id"))
    .order_by(_log.seq.desc())
    .limit(bindparam("limit"))
)
APPLIED_UNTIL = (
    select(t.transition_log)
    .where(_log.session_id == bindparam("session_id"), _log.at <= bindparam("at"), _log.outcome == "applied")
    .order_by(_log.seq)
)

# -- The MCP call path: authorisation, tokens, decisions (issue 20) ------------------------------------------------
# Every MCP call reads its operator's row to authorise it, every HTTP request its token, every decision the
# decisions of its verification: prebuilt like the statements above so that none of them is rebuilt per call.

_op, _tok, _dec = t.operators.c, t.api_tokens.c, t.decisions.c

OPERATOR_BY_ID = select(t.operators).where(_op.id == bindparam("id"))
OPERATOR_ID_FOR_UPDATE = select(_op.id).where(_op.id == bindparam("id")).with_for_update()
TOKEN_BY_HASH = select(t.api_tokens).where(_tok.token_hash == bindparam("token_hash"))
TOKEN_BY_ID = select(t.api_tokens).where(_tok.id == bindparam("id"))
DECISIONS_OF_VERIFICATION = (
    select(t.decisions)
    .where(_dec.session_id == bindparam("session_id"), _dec.session_version == bindparam("session_version"))
    .order_by(_dec.id)
)

# -- The workflow engine's step runs (issue 20) ---------------------------------------------------------------------
# An agent step closes its run and opens the next one's in the same claim transaction, and a driver pass that read
# its session afresh reads the current run: prebuilt like the statements above, so none of them is rebuilt per step.

_run = t.step_runs.c

STEP_RUN_BY_ID = select(t.step_runs).where(_run.id == bindparam("id"))
INSERT_STEP_RUN = insert(t.step_runs).returning(_run.id)
# Closes a run only while it is open (running or waiting): a run closed already keeps its first outcome. The SET
# values are the other parameter keys (status, ended_at, output_summary, error).
FINISH_OPEN_STEP_RUN = update(t.step_runs).where(
    _run.id == bindparam("match_id"), _run.status.in_(bindparam("open_statuses", expanding=True))
)

AGENTS_BY_IDS = select(t.agents).where(t.agents.c.id.in_(bindparam("ids", expanding=True)))  # a workflow step's

# A session's end: its plan closes when no task of it is left unfinished, and its agents' tokens are revoked.
COUNT_UNFINISHED_TASKS = select(func.count()).where(
    t.tasks.c.plan_id == bindparam("plan_id"), t.tasks.c.status != bindparam("finished")
)
REVOKE_SESSION_TOKENS = (
    update(t.api_tokens)
    .where(t.api_tokens.c.session_id == bindparam("match_session"), t.api_tokens.c.revoked_at.is_(None))
    .values(revoked_at=bindparam("revoked_at"))
)

# -- The audit chains (issue 21): the linker inserts a batch's links and moves their chains' heads
# (application/audit/linking.py, infrastructure/db/audit_store.py). Writers of audited records send none of these.

INSERT_LINK = insert(t.audit_links)
ADVANCE_CHAIN = update(t.audit_chains).where(t.audit_chains.c.chain_id == bindparam("match_id"))


def dialect_insert(dialect: str) -> Any:
    """The dialect's `insert` (with ON CONFLICT); PostgreSQL's dialect module loads only when it is used."""
    if dialect == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert
    from sqlalchemy.dialects import sqlite

    return sqlite.insert


@cache
def lock_chain(dialect: str) -> Any:
    """Create-or-lock a chain's head row and return it: one statement. A chain's first appender creates it at the
    genesis hash; on PostgreSQL the no-op update of ON CONFLICT locks the row until commit, so appenders of one
    chain take turns (SQLite's writers already do)."""
    c = t.audit_chains.c
    stmt = dialect_insert(dialect)(t.audit_chains).values(
        chain_id=bindparam("chain_id"), seq=literal(0), hash=literal(GENESIS), signed_seq=literal(0)
    )
    return stmt.on_conflict_do_update(index_elements=[c.chain_id], set_={"seq": c.seq}).returning(c.seq, c.hash)


@cache
def set_chain_head(dialect: str) -> Any:
    """Create or move a chain's head to `seq`/`hash`/`link_no` (its `signed_seq` left as it is): one statement,
    run for a batch's chains at once (executemany)."""
    stmt = dialect_insert(dialect)(t.audit_chains).values(
        chain_id=bindparam("chain_id"),
        seq=bindparam("seq"),
        hash=bindparam("hash"),
        signed_seq=literal_column("0"),
        link_no=bindparam("link_no"),
    )
    moved = {"seq": stmt.excluded.seq, "hash": stmt.excluded.hash, "link_no": stmt.excluded.link_no}
    return stmt.on_conflict_do_update(index_elements=[t.audit_chains.c.chain_id], set_=moved)


# Run on SQLite's driver directly inside a transaction (driver_statements.py): a transition's statements.
HOT = (
    SESSION_BY_ID,
    UPDATE_SESSION,
    COUNT_PLAN_SESSIONS_IN,
    PLAN_BY_ID,
    SET_PLAN_STATUS,
    PROJECT_BY_ID,
    SET_TASK_STATUS,
    TASK_FACTS,
    INSERT_TRANSITION,
    INSERT_EVENT,
    AGENTS_BY_IDS,
    OPERATOR_BY_ID,  # every operator's call is authorised with it, in the call's own transaction
    DECISIONS_OF_VERIFICATION,
    STEP_RUN_BY_ID,
    FINISH_OPEN_STEP_RUN,
    COUNT_UNFINISHED_TASKS,
    REVOKE_SESSION_TOKENS,
)


def hot_statements() -> tuple[Any, ...]:
    """The statements SQLite's driver runs directly (`HOT`)."""
    return HOT


def _lock_for_transition() -> Any:
    """PostgreSQL: a transition's row locks in one statement, in the one lock order: the session, then the operator
    (`operator_id`, else the session's own when `session_operator`), then the session's plan (when `plan`); returns
    the session's row, how many operator rows it locked, and the plan's row (`p_*`, NULLs without one).

    Why the order holds: each lock is taken by the LockRows node of its own MATERIALIZED CTE, and each CTE's rows
    need the one before it. The operator's and the plan's CTEs join the session's CTE, so no operator or plan row
    comes out of them (to be locked) before the session's CTE has run and locked its row; the plan's CTE has a
    one-time filter on the count of the operator's CTE, which the executor evaluates before it reads a plan row. A
    wait on any lock re-reads that row at its newest version (EvalPlanQual), as separate statements would.
    tests/integration/db/test_pg_writes.py holds each row from another connection and checks which locks the
    statement holds while it waits."""
    session = SESSION_BY_ID_FOR_UPDATE.cte("locked_session").prefix_with("MATERIALIZED")
    own = case((bindparam("session_operator", type_=Boolean), session.c.operator_id))
    wanted = func.coalesce(bindparam("operator_id", type_=String), own)
    operator = (
        select(_op.id)
        .select_from(t.operators.join(session, _op.id == wanted))
        .with_for_update(of=t.operators)
        .cte("locked_operator")
        .prefix_with("MATERIALIZED")
    )
    operator_rows = select(func.count()).select_from(operator).scalar_subquery()
    plan = (
        select(t.plans)
        .select_from(t.plans.join(session, _p.id == session.c.plan_id))
        .where(bindparam("plan", type_=Boolean), operator_rows >= literal_column("0"))
        .with_for_update(of=t.plans)
        .cte("locked_plan")
        .prefix_with("MATERIALIZED")
    )
    return select(session, operator_rows.label("operator_rows"), *(c.label(f"p_{c.name}") for c in plan.c)).select_from(
        session.outerjoin(plan, true())
    )


LOCK_FOR_TRANSITION = _lock_for_transition()

# Run on asyncpg directly inside a PostgreSQL write unit of work (pg_writes.py): a transition's statements, with the
# row locks it takes on PostgreSQL (SQLite's write lock needs none).
PG_HOT = (
    *HOT,
    SESSION_BY_ID_FOR_UPDATE,
    PLAN_BY_ID_FOR_UPDATE,
    OPERATOR_ID_FOR_UPDATE,
    PROJECT_BY_ID_FOR_UPDATE,
    LOCK_FOR_TRANSITION,
)


def pg_hot_statements() -> tuple[Any, ...]:
    """The statements a PostgreSQL write unit of work runs on asyncpg directly (`PG_HOT`)."""
    return PG_HOT
