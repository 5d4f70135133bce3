"""PostgreSQL's write units on asyncpg (infrastructure/db/pg_writes.py): the hot statements read and write exactly what
SQLAlchemy's own execution does; the writes held for the next one are sent with it as one statement, their row counts
checked before COMMIT, never merged with a read; driver errors reach callers as SQLAlchemy's (and the unit of work's)
errors; a unit left open rolls back. The concurrency tests (tests/integration/sessions/test_concurrency.py) run the
whole transition path on it with many callers."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.exc import IntegrityError

from taskgate.application.sessions.commands import StartTask
from taskgate.application.trackers.builtin import AddTask
from taskgate.domain.errors import ConcurrentModification, PolicyViolation
from taskgate.domain.states import WIP_STATES
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.pg_writes import PgWriteConnection
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from tests.conftest import Services

T0 = datetime(2026, 11, 29, 6, 30, 15, 123456, tzinfo=UTC)
WIP = [s.value for s in WIP_STATES]


@pytest.fixture
async def db(pg_url: str):
    database = Database(pg_url)
    yield database
    await database.dispose()


@pytest.fixture
async def conn(db: Database):
    """A write connection with seed rows, rolled back at the end (the database is shared by the module's tests)."""
    connection = await db.open_pg_writer()
    await seed(connection)
    yield connection
    await connection.rollback()
    await connection.close()


async def seed(conn: PgWriteConnection) -> None:
    run = conn.exec_driver_sql
    await run(
        "INSERT INTO projects (id, name, key, root_path, config, task_seq, created_at) VALUES "
        """(9001, 'pgw', 'PGW', '/tmp/pgw', '{"a": [1, 2]}', 3, '2026-11-29 06:30:15.123456+00')"""
    )
    await run("INSERT INTO plans (id, project_id, name, status, created_at) VALUES (9001, 9001, 'p', 'open', now())")
    for tid, status in (("W-1", "completed"), ("W-2", "open"), ("W-3", "open")):
        await run(
            "INSERT INTO tasks (id, project_id, plan_id, title, description, priority, status, created_at, labels) "
            f"VALUES ('{tid}', 9001, 9001, 't', '', 2, '{status}', now(), '[]')"
        )
    await run("INSERT INTO task_dependencies (task_id, depends_on_id, type) VALUES ('W-3', 'W-2', 'blocks')")
    await run(
        "INSERT INTO operators (id, name, email, roles, permissions, max_active_sessions, created_at) VALUES "
        """('pgw-op', 'Op', NULL, '["operator"]', '{"approve": true}', 3, now())"""
    )
    for sid, tid, state in (("w-s-1", "W-1", "executing"), ("w-s-2", "W-2", "planning")):
        await run(
            "INSERT INTO sessions (id, task_id, project_id, plan_id, state, state_data, workflow_stack, version, "
            f"created_at, updated_at) VALUES ('{sid}', '{tid}', 9001, 9001, '{state}', "
            """'{"k": {"n": 1}}', '[]', 4, '2026-11-29 06:30:15.123456+00', now())"""
        )


async def through_sqlalchemy(conn: PgWriteConnection, statement, params) -> list[dict]:
    return [dict(r) for r in (await conn._conn.execute(statement, params)).mappings().all()]


def statements_sent(conn: PgWriteConnection) -> list[str]:
    """Every query the connection sends from now on (asyncpg's query logger), first words only."""
    seen: list[str] = []
    conn._raw.add_query_logger(lambda record: seen.append(record.query.split(" (")[0][:40]))
    return seen


@pytest.mark.parametrize(
    ("statement", "params"),
    [
        (sql.SESSION_BY_ID, {"id": "w-s-1"}),
        (sql.SESSION_BY_ID_FOR_UPDATE, {"id": "w-s-2"}),
        (sql.SESSION_BY_ID_FOR_UPDATE, {"id": "nope"}),
        (sql.PLAN_BY_ID_FOR_UPDATE, {"id": 9001}),
        (sql.PROJECT_BY_ID, {"id": 9001}),
        (sql.OPERATOR_ID_FOR_UPDATE, {"id": "pgw-op"}),
        (sql.COUNT_PLAN_SESSIONS_IN, {"plan_id": 9001, "states": WIP}),
        (sql.TASK_FACTS, {"task_id": "W-3", "plan_id": 9001, "states": WIP}),
        (sql.TASK_FACTS, {"task_id": "W-1", "plan_id": 9001, "states": ["planning"]}),
        (sql.COUNT_UNFINISHED_TASKS, {"plan_id": 9001, "finished": "completed"}),
    ],
)
async def test_a_hot_read_on_asyncpg_returns_what_sqlalchemy_returns(conn: PgWriteConnection, statement, params):
    expected = await through_sqlalchemy(conn, statement, params)
    got = (await conn.execute(statement, params)).mappings().all()
    assert got == expected
    assert all(type(got_row[k]) is type(exp_row[k]) for got_row, exp_row in zip(got, expected, strict=True)
               for k in exp_row)  # fmt: skip


async def test_hot_writes_on_asyncpg_store_what_sqlalchemy_stores(conn: PgWriteConnection) -> None:
    event = {"kind": "k", "at": T0, "payload": {"x": [1, {"y": None}]}, "session_id": "w-s-1"}
    await conn.execute(sql.INSERT_EVENT, event)
    await conn._conn.execute(sql.INSERT_EVENT, {**event, "kind": "k2"})
    rows = (await conn.exec_driver_sql("SELECT at, payload, session_id FROM events WHERE session_id = 'w-s-1'")).all()
    assert len(rows) == 2 and tuple(rows[0]) == tuple(rows[1])
    record = {
        "session_id": "w-s-1", "trigger": "suspend", "from_state": "executing", "to_state": "suspended",
        "outcome": "applied", "actor": "op", "reason": None,
        "guard_results": [{"policy": "wip_limit", "passed": True}], "session_version": 5, "at": T0,
    }  # fmt: skip
    first = await conn.execute(sql.INSERT_TRANSITION, record)
    second = await conn._conn.execute(sql.INSERT_TRANSITION, record)
    assert first.inserted_primary_key[0] + 1 == second.inserted_primary_key[0]
    stored = (await conn.exec_driver_sql("SELECT * FROM transition_log WHERE session_id = 'w-s-1' ORDER BY seq")).all()
    assert tuple(stored[0])[1:] == tuple(stored[1])[1:]


async def test_held_writes_go_with_the_next_write_as_one_statement_and_their_counts_are_checked(
    conn: PgWriteConnection,
) -> None:
    sent = statements_sent(conn)
    changes = {"state": "suspended", "version": 5, "updated_at": T0, "state_data": {"k": 1}}
    assert await conn.defer(sql.UPDATE_SESSION, {**changes, "match_id": "w-s-1", "match_version": 4}, 1, RuntimeError)
    assert await conn.defer(sql.SET_TASK_STATUS, {"match_id": "W-1", "status": "open"})
    assert await conn.defer(sql.INSERT_EVENT, {"kind": "k", "at": T0, "payload": {}, "session_id": "w-s-1"})
    assert sent == []  # nothing sent yet
    record = {
        "session_id": "w-s-1", "trigger": "suspend", "from_state": "executing", "to_state": "suspended",
        "outcome": "applied", "actor": "op", "reason": None, "guard_results": [], "session_version": 5, "at": T0,
    }  # fmt: skip
    seq = (await conn.execute(sql.INSERT_TRANSITION, record)).inserted_primary_key[0]
    await asyncio.sleep(0.01)  # asyncpg calls query loggers soon after the query
    assert len(sent) == 1 and sent[0].startswith("WITH w0 AS")
    row = (await through_sqlalchemy(conn, sql.SESSION_BY_ID, {"id": "w-s-1"}))[0]
    assert (row["state"], row["version"], row["updated_at"], row["state_data"]) == ("suspended", 5, T0, {"k": 1})
    status = await conn.exec_driver_sql("SELECT status FROM tasks WHERE id = 'W-1'")
    assert status.scalar_one() == "open"
    logged = await conn.exec_driver_sql(f"SELECT session_version FROM transition_log WHERE seq = {seq}")
    assert logged.scalar_one() == 5


async def test_a_held_version_checked_update_that_matches_no_row_raises_its_error_before_commit(db: Database) -> None:
    writer = await db.open_pg_writer()
    try:
        await seed(writer)
        stale = {"state": "suspended", "version": 5, "match_id": "w-s-1", "match_version": 3}
        conflict = ConcurrentModification("stale")
        assert await writer.defer(sql.UPDATE_SESSION, stale, 1, lambda: conflict)
        event = {"kind": "k", "at": T0, "payload": {}, "session_id": "w-s-1"}
        with pytest.raises(ConcurrentModification) as raised:
            await writer.execute(sql.INSERT_EVENT, event)  # sent with the stale update: one statement, then checked
        assert raised.value is conflict
    finally:
        await writer.close()  # rolls back: the seed rows are gone too
    async with db.connect() as check:
        assert (await check.exec_driver_sql("SELECT count(*) FROM sessions WHERE id = 'w-s-1'")).scalar_one() == 0


async def test_a_read_after_held_writes_sees_them_and_is_never_merged_with_them(conn: PgWriteConnection) -> None:
    sent = statements_sent(conn)
    assert await conn.defer(sql.SET_TASK_STATUS, {"match_id": "W-2", "status": "completed"})
    assert await conn.defer(sql.SET_TASK_STATUS, {"match_id": "W-3", "status": "completed"})  # sends the first
    unfinished = await conn.execute(sql.COUNT_UNFINISHED_TASKS, {"plan_id": 9001, "finished": "completed"})
    assert unfinished.scalar_one() == 0
    await asyncio.sleep(0.01)
    assert [s.split(" ")[0] for s in sent] == ["UPDATE", "UPDATE", "SELECT"]


async def test_two_held_writes_to_one_row_apply_in_order(conn: PgWriteConnection) -> None:
    await conn.defer(sql.SET_TASK_STATUS, {"match_id": "W-2", "status": "in_progress"})
    await conn.defer(sql.SET_TASK_STATUS, {"match_id": "W-2", "status": "pending_review"})
    await conn.flush()
    assert (await conn.exec_driver_sql("SELECT status FROM tasks WHERE id = 'W-2'")).scalar_one() == "pending_review"


async def test_a_write_run_now_after_a_held_one_of_its_kind_is_not_merged_with_it(conn: PgWriteConnection) -> None:
    sent = statements_sent(conn)
    await conn.defer(sql.SET_TASK_STATUS, {"match_id": "W-2", "status": "in_progress"})
    result = await conn.execute(sql.SET_TASK_STATUS, {"match_id": "W-2", "status": "pending_review"})
    assert result.rowcount == 1
    await asyncio.sleep(0.01)
    assert [s.split(" ")[0] for s in sent] == ["UPDATE", "UPDATE"]
    assert (await conn.exec_driver_sql("SELECT status FROM tasks WHERE id = 'W-2'")).scalar_one() == "pending_review"


async def test_a_driver_error_is_raised_as_sqlalchemy_raises_it(conn: PgWriteConnection) -> None:
    record = {
        "session_id": "no-such-session", "trigger": "suspend", "from_state": "executing", "to_state": "suspended",
        "outcome": "applied", "actor": "op", "reason": None, "guard_results": [], "session_version": 5, "at": T0,
    }  # fmt: skip
    with pytest.raises(IntegrityError) as raised:
        await conn.execute(sql.INSERT_TRANSITION, record)  # transition_log.session_id references sessions
    assert isinstance(raised.value.orig, asyncpg.ForeignKeyViolationError)


async def test_a_row_lock_not_granted_in_time_is_a_concurrent_modification(db: Database, pg_url: str) -> None:
    setup = await db.open_pg_writer()
    await seed(setup)
    await setup.commit()
    await setup.close()
    holder = await asyncpg.connect(pg_url.replace("+asyncpg", ""))
    try:
        await holder.execute("BEGIN; SELECT 1 FROM sessions WHERE id = 'w-s-1' FOR UPDATE")
        unit = SqlAlchemyUnitOfWork(db, write=True)
        with pytest.raises(ConcurrentModification):
            async with unit:
                await unit._conn.exec_driver_sql("SET LOCAL lock_timeout = '100ms'")
                await unit.sessions.get("w-s-1", lock=True)
        await holder.execute("ROLLBACK")
    finally:
        await holder.execute("DELETE FROM sessions WHERE project_id = 9001; DELETE FROM task_dependencies "
                             "WHERE task_id LIKE 'W-%'; DELETE FROM tasks WHERE project_id = 9001; "
                             "DELETE FROM plans WHERE id = 9001; DELETE FROM projects WHERE id = 9001; "
                             "DELETE FROM operators WHERE id = 'pgw-op'")  # fmt: skip
        await holder.close()


async def test_a_unit_left_without_commit_rolls_back_and_its_connection_goes_back_clean(db: Database) -> None:
    unit = SqlAlchemyUnitOfWork(db, write=True)
    async with unit:
        await seed(unit._conn)
        raw = unit._conn._raw
    assert not raw.is_in_transaction()
    async with db.connect() as check:
        assert (await check.exec_driver_sql("SELECT count(*) FROM projects WHERE id = 9001")).scalar_one() == 0


@pytest.mark.parametrize("sql_services", ["postgresql"], indirect=True)
async def test_concurrent_starts_commit_each_event_with_its_log_row(sql_services: Services, git_repo: Path) -> None:
    """Fifty concurrent starts on a plan with WIP limit 3, on PostgreSQL: each applied start's log row, session row,
    task status and event went as one statement; each refusal's log row and event as another. Every row is there,
    once, and the WIP limit held."""
    svc = sql_services
    project = await svc.tracker.init_project(str(git_repo))
    await svc.tracker.ensure_operator("op-1")
    plan = await svc.tracker.add_plan(project.id, "merged")
    tasks = [(await svc.tracker.add_task(AddTask(project.id, f"t{i}", plan_id=plan.id))).id for i in range(50)]
    results = await asyncio.gather(
        *(svc.sessions.start_task(StartTask(t, "alice", "op-1")) for t in tasks), return_exceptions=True
    )
    assert all(not isinstance(r, BaseException) or isinstance(r, PolicyViolation) for r in results), results
    started = [r for r in results if not isinstance(r, BaseException)]
    assert len(started) == 3
    async with svc.database.connect() as check:
        log = Counter(tuple(r) for r in (await check.exec_driver_sql(
            "SELECT trigger, outcome FROM transition_log WHERE trigger = 'start'")).all())  # fmt: skip
        events = Counter(r[0] for r in (await check.exec_driver_sql(
            "SELECT kind FROM events WHERE kind IN ('session.transition', 'session.blocked') "
            "AND payload->>'trigger' = 'start'")).all())  # fmt: skip
        in_progress = (await check.exec_driver_sql("SELECT count(*) FROM tasks WHERE status = 'in_progress'")).scalar()
    assert log == {("start", "applied"): 3, ("start", "blocked"): 47}
    assert events == {"session.transition": 3, "session.blocked": 47}
    assert in_progress == 3


async def test_a_unit_whose_connection_was_lost_is_not_put_back_into_the_pool(db: Database) -> None:
    unit = SqlAlchemyUnitOfWork(db, write=True)
    with pytest.raises(Exception):  # noqa: B017 - whatever the lost connection raises; the pool is what is checked
        async with unit:
            unit._conn._raw.terminate()
    assert db.engine.pool.checkedout() == 0
    async with SqlAlchemyUnitOfWork(db, write=True) as again:  # the pool serves a working connection
        assert await again.events.high_water() >= 0
        await again.commit()


async def _holds(check: asyncpg.Connection, table: str, key: str) -> bool:
    """Whether another transaction holds the row's lock (a FOR UPDATE NOWAIT from `check` is refused)."""
    async with check.transaction():
        try:
            await check.execute(f"SELECT 1 FROM {table} WHERE id = {key} FOR UPDATE NOWAIT")
        except asyncpg.LockNotAvailableError:
            return True
    return False


@pytest.mark.parametrize(
    ("held", "expected"),
    [
        # the statement waits for the row another transaction holds, and holds exactly the locks before it
        (("sessions", "'w-s-2'"), {"sessions": False, "operators": False, "plans": False}),
        (("operators", "'pgw-op'"), {"sessions": True, "operators": False, "plans": False}),
        (("plans", "9001"), {"sessions": True, "operators": True, "plans": False}),
    ],
)
async def test_a_transition_takes_its_row_locks_in_one_statement_in_the_one_lock_order(
    db: Database, pg_url: str, held: tuple[str, str], expected: dict[str, bool]
) -> None:
    setup = await db.open_pg_writer()
    await seed(setup)
    await setup.commit()
    await setup.close()
    dsn = pg_url.replace("+asyncpg", "")
    holder, check = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    writer = await db.open_pg_writer()
    try:
        await holder.execute(f"BEGIN; SELECT 1 FROM {held[0]} WHERE id = {held[1]} FOR UPDATE")
        params = {"id": "w-s-2", "operator_id": "pgw-op", "session_operator": False, "plan": True}
        locking = asyncio.create_task(writer.execute(sql.LOCK_FOR_TRANSITION, params))
        for _ in range(100):  # until it waits on the held row's lock
            waiting = await check.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH locked_%'"
            )
            if waiting:
                break
            await asyncio.sleep(0.02)
        assert waiting == 1 and not locking.done()
        others = {("sessions", "'w-s-2'"), ("operators", "'pgw-op'"), ("plans", "9001")} - {held}
        assert {table: await _holds(check, table, key) for table, key in others} == {
            table: wanted for table, wanted in expected.items() if table != held[0]
        }
        await holder.execute("ROLLBACK")
        row = (await locking).mappings().first()
        assert (row["id"], row["operator_rows"], row["p_id"]) == ("w-s-2", 1, 9001)
        assert all([await _holds(check, table, key) for table, key in others | {held}])  # all three now
    finally:
        await writer.close()
        await holder.execute("ROLLBACK")  # a no-op when it rolled back already
        await holder.execute("DELETE FROM sessions WHERE project_id = 9001; DELETE FROM task_dependencies "
                             "WHERE task_id LIKE 'W-%'; DELETE FROM tasks WHERE project_id = 9001; "
                             "DELETE FROM plans WHERE id = 9001; DELETE FROM projects WHERE id = 9001; "
                             "DELETE FROM operators WHERE id = 'pgw-op'")  # fmt: skip
        await holder.close()
        await check.close()


def test_a_merged_statement_locks_the_audited_tables_in_the_linkers_order() -> None:
    """The event is written before the log row, but the statement names transition_log's CTE first: PostgreSQL
    locks a statement's tables in CTE order, and the linker's LOCK TABLE takes transition_log before events (the
    other order deadlocked with it). Each write keeps its number and its own parameters."""
    from taskgate.infrastructure.db.pg_writes import _Deferred, _merge

    held = [
        _Deferred(None, "UPDATE sessions SET version = $1 WHERE id = $2", [2, "s"], 1, None),
        _Deferred(None, "INSERT INTO events (kind) VALUES ($1)", ["session.transition"], None, None),
        _Deferred(None, "INSERT INTO decisions (kind) VALUES ($1)", ["approve"], None, None),
        _Deferred(None, "INSERT INTO transition_log (trigger) VALUES ($1)", ["start"], None, None),
    ]
    sql, args = _merge(held, None, None, None)
    assert args == [2, "s", "session.transition", "approve", "start"]
    positions = [sql.index(f"INSERT INTO {table}") for table in ("transition_log", "decisions", "events")]
    assert positions == sorted(positions) and sql.index("UPDATE sessions") < positions[0]
    assert "w1 AS (INSERT INTO events (kind) VALUES ($3)" in sql and "w3 AS (INSERT INTO transition_log" in sql
    assert sql.endswith("SELECT (SELECT count(*) FROM w0) AS n0, (SELECT count(*) FROM w1) AS n1, "
                        "(SELECT count(*) FROM w2) AS n2, (SELECT count(*) FROM w3) AS n3")  # fmt: skip
