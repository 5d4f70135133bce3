"""The hot statements run on SQLite's driver (infrastructure/db/driver_statements.py) read and write exactly what
SQLAlchemy's own execution reads and writes: same rows, same converted values (aware datetimes, JSON), same
counts, same error types. Each case runs the statement both ways on one connection and compares."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError

from taskgate.domain.states import WIP_STATES, SessionState
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db.connections import InlineConnection
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.session_store import SqlAlchemySessionRepository

T0 = datetime(2026, 11, 25, 6, 30, 15, 123456, tzinfo=UTC)


@pytest.fixture
async def conn(sqlite_template: Path, tmp_path: Path):
    target = tmp_path / "driver.db"
    shutil.copy(sqlite_template, target)
    db = Database(f"sqlite:///{target}")
    connection = await db.open(write=True)
    assert isinstance(connection, InlineConnection)
    await seed(connection)
    yield connection
    await connection.rollback()
    await connection.close()
    await db.dispose()


async def seed(conn: InlineConnection) -> None:
    run = conn.sync_connection.exec_driver_sql
    run(
        "INSERT INTO projects (id, name, key, root_path, config, task_seq, created_at) "
        """VALUES (1, 'demo', 'DEMO', '/tmp/demo', '{"a": [1, 2]}', 3, '2026-11-25 06:30:15.123456')"""
    )
    run(
        "INSERT INTO plans (id, project_id, name, status, created_at) VALUES (1, 1, 'p', 'open', '2026-11-25 06:30:15')"
    )
    for tid, status in (("D-1", "completed"), ("D-2", "open"), ("D-3", "open")):
        run(
            "INSERT INTO tasks (id, project_id, plan_id, title, description, priority, status, created_at, labels) "
            f"VALUES ('{tid}', 1, 1, 't', '', 2, '{status}', '2026-11-25 06:30:15', '[]')"
        )
    run("INSERT INTO task_dependencies (task_id, depends_on_id, type) VALUES ('D-3', 'D-2', 'blocks')")
    run("INSERT INTO task_dependencies (task_id, depends_on_id, type) VALUES ('D-3', 'D-1', 'blocks')")
    run(
        "INSERT INTO operators (id, name, email, roles, permissions, max_active_sessions, created_at) VALUES "
        """('alice', 'Alice', NULL, '["operator"]', '{"approve": true}', 3, '2026-11-25 06:30:15.5')"""
    )
    for sid, tid, state in (("s-1", "D-1", "executing"), ("s-2", "D-2", "planning")):
        run(
            "INSERT INTO sessions (id, task_id, project_id, plan_id, state, state_data, workflow_stack, version, "
            f"created_at, updated_at) VALUES ('{sid}', '{tid}', 1, 1, '{state}', "
            """'{"k": {"n": 1}}', '[]', 4, '2026-11-25 06:30:15.123456', '2026-11-25 06:30:16')"""
        )
    run(f"INSERT INTO audit_chains (chain_id, seq, hash, signed_seq) VALUES ('session:s-2', 7, '{'ab' * 32}', 0)")
    for tid, sid in (("t-1", "s-1"), ("t-2", "s-1"), ("t-3", "s-2")):
        run(
            "INSERT INTO api_tokens (id, token_hash, kind, session_id, label, created_at) "
            f"VALUES ('{tid}', 'h-{tid}', 'agent', '{sid}', '', '2026-11-25 06:30:15')"
        )


def through_sqlalchemy(conn: InlineConnection, statement, params) -> list[dict]:
    return [dict(r) for r in conn.sync_connection.execute(statement, params).mappings().all()]


@pytest.mark.parametrize(
    ("statement", "params"),
    [
        (sql.SESSION_BY_ID, {"id": "s-1"}),
        (sql.SESSION_BY_ID, {"id": "nope"}),
        (sql.PLAN_BY_ID, {"id": 1}),
        (sql.PROJECT_BY_ID, {"id": 1}),
        (sql.COUNT_PLAN_SESSIONS_IN, {"plan_id": 1, "states": [s.value for s in WIP_STATES]}),
        (sql.TASK_FACTS, {"task_id": "D-3", "plan_id": 1, "states": [s.value for s in WIP_STATES]}),
        (sql.TASK_FACTS, {"task_id": "D-1", "plan_id": 1, "states": ["planning"]}),
        (sql.OPERATOR_BY_ID, {"id": "alice"}),
        (sql.DECISIONS_OF_VERIFICATION, {"session_id": "s-1", "session_version": 4}),
        (sql.COUNT_UNFINISHED_TASKS, {"plan_id": 1, "finished": "completed"}),
    ],
)
async def test_a_hot_read_returns_what_sqlalchemy_returns(conn: InlineConnection, statement, params) -> None:
    expected = through_sqlalchemy(conn, statement, params)
    got = (await conn.execute(statement, params)).mappings().all()
    assert got == expected
    assert all(type(got_row[k]) is type(exp_row[k]) for got_row, exp_row in zip(got, expected, strict=True)
               for k in exp_row)  # fmt: skip


async def test_hot_writes_store_what_sqlalchemy_stores(conn: InlineConnection) -> None:
    event = {"kind": "k", "at": T0, "payload": {"x": [1, {"y": None}]}, "session_id": "s-1"}
    await conn.execute(sql.INSERT_EVENT, event)
    conn.sync_connection.execute(sql.INSERT_EVENT, {**event, "kind": "k2"})
    rows = conn.sync_connection.exec_driver_sql("SELECT kind, at, payload, session_id FROM events ORDER BY id").all()
    assert [tuple(r[1:]) for r in rows] == [tuple(rows[1][1:])] * 2  # identical stored values, both ways
    record = {
        "session_id": "s-1", "trigger": "suspend", "from_state": "executing", "to_state": "suspended",
        "outcome": "applied", "actor": "alice", "reason": None,
        "guard_results": [{"policy": "wip_limit", "passed": True}], "session_version": 5, "at": T0,
    }  # fmt: skip
    first = await conn.execute(sql.INSERT_TRANSITION, record)
    second = conn.sync_connection.execute(sql.INSERT_TRANSITION, record)
    assert first.inserted_primary_key[0] + 1 == second.inserted_primary_key[0]
    stored = conn.sync_connection.exec_driver_sql("SELECT * FROM transition_log ORDER BY seq").all()
    assert tuple(stored[0])[1:] == tuple(stored[1])[1:]


async def test_revoking_a_sessions_tokens_stores_and_counts_what_sqlalchemy_does(conn: InlineConnection) -> None:
    first = await conn.execute(sql.REVOKE_SESSION_TOKENS, {"match_session": "s-1", "revoked_at": T0})
    assert first.rowcount == 2
    again = await conn.execute(sql.REVOKE_SESSION_TOKENS, {"match_session": "s-1", "revoked_at": T0})
    assert again.rowcount == 0  # already revoked: the first revocation's time stays
    assert (
        conn.sync_connection.execute(sql.REVOKE_SESSION_TOKENS, {"match_session": "s-2", "revoked_at": T0}).rowcount
        == 1
    )
    stored = conn.sync_connection.exec_driver_sql("SELECT revoked_at FROM api_tokens ORDER BY id").all()
    assert len({row[0] for row in stored}) == 1  # the same text both ways


async def test_a_version_checked_update_counts_rows_as_sqlalchemy_does(conn: InlineConnection) -> None:
    changes = {"state": "suspended", "version": 5, "updated_at": T0, "state_data": {"k": 1}}
    stale = await conn.execute(sql.UPDATE_SESSION, {**changes, "match_id": "s-1", "match_version": 3})
    assert stale.rowcount == 0
    applied = await conn.execute(sql.UPDATE_SESSION, {**changes, "match_id": "s-1", "match_version": 4})
    assert applied.rowcount == 1
    row = through_sqlalchemy(conn, sql.SESSION_BY_ID, {"id": "s-1"})[0]
    assert (row["state"], row["version"], row["updated_at"], row["state_data"]) == ("suspended", 5, T0, {"k": 1})


async def test_a_driver_error_is_raised_as_sqlalchemy_raises_it(conn: InlineConnection) -> None:
    record = {
        "session_id": "no-such-session", "trigger": "start", "from_state": "ready", "to_state": "planning",
        "outcome": "applied", "actor": "alice", "reason": None, "guard_results": [], "session_version": 2, "at": T0,
    }  # fmt: skip
    with pytest.raises(IntegrityError, match="FOREIGN KEY"):
        await conn.execute(sql.INSERT_TRANSITION, record)


async def test_outside_a_transaction_a_hot_statement_goes_through_sqlalchemy(sqlite_template, tmp_path) -> None:
    """No transaction begun: the driver would autocommit a write, so SQLAlchemy (which autobegins) runs it."""
    target = tmp_path / "plain.db"
    shutil.copy(sqlite_template, target)
    db = Database(f"sqlite:///{target}")
    try:
        async with db.connect() as plain:
            assert not plain.in_transaction()
            result = await plain.execute(sql.SESSION_BY_ID, {"id": "nope"})
            assert type(result).__name__ == "CursorResult"
    finally:
        await db.dispose()


async def test_in_lists_of_every_length_in_turn_read_what_sqlalchemy_reads(conn: InlineConnection) -> None:
    # The driver keeps each IN-list rendering per tuple of lengths: lengths that come back after others, an empty
    # list and a list longer than any before must each read exactly what SQLAlchemy reads.
    runs = [["planning"], [s.value for s in WIP_STATES], [], ["executing", "planning"], ["planning"], ["x"] * 9]
    for states in runs:
        for statement, params in (
            (sql.COUNT_PLAN_SESSIONS_IN, {"plan_id": 1, "states": states}),
            (sql.TASK_FACTS, {"task_id": "D-3", "plan_id": 1, "states": states}),
        ):
            assert (await conn.execute(statement, params)).mappings().all() == through_sqlalchemy(
                conn, statement, params
            ), states


async def test_an_in_list_beside_the_statements_own_literal_reads_what_sqlalchemy_reads(
    conn: InlineConnection,
) -> None:
    conn.sync_connection.exec_driver_sql(
        "INSERT INTO step_runs (session_id, depth, frame, step_id, attempt, status, agent_ids, started_at) "
        "VALUES ('s-1', 1, 'wf', 'a', 1, 'running', '[]', '2026-11-25 06:30:15')"
    )
    run_id = conn.sync_connection.exec_driver_sql("SELECT max(id) FROM step_runs").scalar_one()
    close = {"status": "succeeded", "ended_at": T0, "match_id": run_id}
    assert (await conn.execute(sql.FINISH_OPEN_STEP_RUN, {**close, "open_statuses": ["waiting"]})).rowcount == 0
    assert (await conn.execute(sql.FINISH_OPEN_STEP_RUN, {**close, "open_statuses": ["running", "waiting"]})).rowcount
    stored = through_sqlalchemy(conn, sql.STEP_RUN_BY_ID, {"id": run_id})[0]
    assert (stored["status"], stored["ended_at"]) == ("succeeded", T0)


async def test_a_session_update_does_not_look_up_the_sessions_rows_in_the_tables_that_reference_it(
    conn: InlineConnection,
) -> None:
    """A SET of sessions.id, even to the same value, makes SQLite look up the session's rows in every table with a
    foreign key to sessions (FkCounter steps in the statement's program): a transition then cost more the longer
    the session's history (64 µs after 2,000 transitions of one session, 10 µs without). The repository writes
    the mutable columns only."""
    repository = SqlAlchemySessionRepository(conn, "sqlite")
    session = await repository.get("s-1")
    sent: list[str] = []
    dbapi = conn.sync_connection.connection.dbapi_connection
    dbapi.set_trace_callback(sent.append)
    try:
        await repository.update(replace(session, state=SessionState.SUSPENDED, version=5), expected_version=4)
    finally:
        dbapi.set_trace_callback(None)
    [update] = [s for s in sent if s.startswith("UPDATE sessions")]
    children = _tables_referencing(conn, "sessions")
    assert {"transition_log", "decisions", "api_tokens"} <= children
    assert not _tables_opened(conn, update) & children, update
    assert _tables_opened(conn, "UPDATE sessions SET id = id WHERE id = 's-1'") & children  # what the check catches
    assert (await repository.get("s-1")).state == SessionState.SUSPENDED


def _tables_referencing(conn: InlineConnection, parent: str) -> set[str]:
    run = conn.sync_connection.exec_driver_sql
    tables = [row[0] for row in run("SELECT name FROM sqlite_master WHERE type = 'table'").all()]
    return {name for name in tables if any(fk[2] == parent for fk in run(f"PRAGMA foreign_key_list('{name}')"))}


def _tables_opened(conn: InlineConnection, statement: str) -> set[str]:
    """The tables whose b-trees (the table's own or an index's) the statement's program opens."""
    run = conn.sync_connection.exec_driver_sql
    owner = {row[0]: row[1] for row in run("SELECT rootpage, tbl_name FROM sqlite_master WHERE rootpage > 0").all()}
    program = run(f"EXPLAIN {statement}").all()
    return {owner[row[3]] for row in program if row[1] in ("OpenRead", "OpenWrite") and row[3] in owner}


async def test_a_write_lock_held_by_another_connection_is_waited_for_then_named(sqlite_template, tmp_path) -> None:
    """BEGIN IMMEDIATE runs on the driver from the begin listener: SQLITE_BUSY must still come back as the
    OperationalError the writer retries on, and a lock held past the busy timeout as ConcurrentModification."""
    import sqlite3

    from taskgate.domain.errors import ConcurrentModification

    target = tmp_path / "locked.db"
    shutil.copy(sqlite_template, target)
    other = sqlite3.connect(target, isolation_level=None)
    db = Database(f"sqlite:///{target}", busy_timeout_ms=200)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(ConcurrentModification, match="stayed locked"):
            await db.open(write=True)
        opening = asyncio.ensure_future(db.open(write=True))
        await asyncio.sleep(0.02)
        assert not opening.done()  # still retrying while the other connection holds the lock
        other.execute("COMMIT")
        conn = await asyncio.wait_for(opening, timeout=5)
        assert conn.in_transaction()
        await conn.rollback()
        await conn.close()
    finally:
        other.close()
        await db.dispose()


async def test_a_session_update_writes_only_the_scalars_that_changed_since_the_unit_read_it(
    conn: InlineConnection,
) -> None:
    """After a read in the same unit of work, an update sets only the scalar columns that differ from it, the JSON
    columns and the version; without one, every mutable column. Either way the stored row is the session given."""
    read_first = SqlAlchemySessionRepository(conn, "sqlite")
    session = await read_first.get("s-1")
    moved = replace(session, state=SessionState.SUSPENDED, prior_state=SessionState.EXECUTING, version=5, updated_at=T0)
    assert _set_columns(await _sent_update(conn, read_first.update(moved, expected_version=4))) == {
        "state", "prior_state", "version", "updated_at", "state_data", "workflow_stack"
    }  # fmt: skip
    back = replace(moved, state=SessionState.EXECUTING, prior_state=None, version=6, state_data={"k": 2})
    assert _set_columns(await _sent_update(conn, read_first.update(back, expected_version=5))) == {
        "state", "prior_state", "version", "state_data", "workflow_stack"
    }  # fmt: skip
    blind = SqlAlchemySessionRepository(conn, "sqlite")  # never read it: writes every mutable column
    last = replace(back, version=7, branch_name="tg/s-1")
    written = _set_columns(await _sent_update(conn, blind.update(last, expected_version=6)))
    assert {"state", "state_data", "workflow_stack", "branch_name", "version", "node_id"} <= written
    assert await SqlAlchemySessionRepository(conn, "sqlite").get("s-1") == last


async def test_a_json_column_changed_in_place_after_the_read_is_written(conn: InlineConnection) -> None:
    """A workflow frame holds its stack entry's own lists: a change made in place reaches the session the unit
    read as well, so comparing with that read would find nothing to write."""
    repository = SqlAlchemySessionRepository(conn, "sqlite")
    session = await repository.get("s-1")
    session.state_data["k"]["n"] = 2  # in place: the repository's read shares this dict
    await repository.update(replace(session, version=5), expected_version=4)
    assert (await SqlAlchemySessionRepository(conn, "sqlite").get("s-1")).state_data == {"k": {"n": 2}}


async def _sent_update(conn: InlineConnection, update) -> str:
    sent: list[str] = []
    dbapi = conn.sync_connection.connection.dbapi_connection
    dbapi.set_trace_callback(sent.append)
    try:
        await update
    finally:
        dbapi.set_trace_callback(None)
    [statement] = [s for s in sent if s.startswith("UPDATE sessions")]
    return statement


def _set_columns(statement: str) -> set[str]:
    assignments = statement.split(" SET ", 1)[1].split(" WHERE ", 1)[0]
    return {part.split("=", 1)[0].strip() for part in assignments.split(", ") if "=" in part}


async def test_the_very_session_the_unit_read_changed_in_place_is_written_whole(conn: InlineConnection) -> None:
    repository = SqlAlchemySessionRepository(conn, "sqlite")
    session = await repository.get("s-1")
    session.branch_name = "tg/s-1"  # the object the repository remembers, changed in place; the version stays (as
    await repository.update(session, expected_version=4)  # an annotation's does), so only identity tells
    assert (await SqlAlchemySessionRepository(conn, "sqlite").get("s-1")).branch_name == "tg/s-1"
