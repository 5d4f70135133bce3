"""The Alembic chain: creates exactly the schema the code declares, downgrades cleanly, tolerates racing starts."""

from __future__ import annotations

import asyncio

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from taskgate.domain.errors import InvalidInput, StorageError
from taskgate.infrastructure.db import migrations
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.tables import ALL_TABLES, metadata


def _schema_diff(connection) -> list:
    return compare_metadata(MigrationContext.configure(connection), metadata)


def _table_names(connection) -> set[str]:
    return set(inspect(connection).get_table_names())


async def _fresh_database(backend, request, tmp_path) -> Database:
    if backend == "sqlite":
        return Database(f"sqlite:///{tmp_path / 'fresh.db'}")
    return Database(request.getfixturevalue("pg_url"))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_the_migrated_schema_matches_the_declared_tables(backend, request, tmp_path):
    db = await _fresh_database(backend, request, tmp_path)
    try:
        if backend == "sqlite":
            await migrations.upgrade(db)
        async with db.connect() as conn:
            assert await conn.run_sync(_schema_diff) == []
        assert await migrations.current_revision(db) == migrations.head_revision()
    finally:
        await db.dispose()


async def test_upgrade_downgrade_upgrade_round_trips_on_sqlite(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'trip.db'}")
    try:
        await migrations.upgrade(db)
        await migrations.downgrade(db, "base")
        async with db.connect() as conn:
            assert await conn.run_sync(_table_names) <= {"alembic_version"}
        await migrations.upgrade(db)
        async with db.connect() as conn:
            assert {t.name for t in ALL_TABLES} <= await conn.run_sync(_table_names)
    finally:
        await db.dispose()


async def test_upgrade_downgrade_upgrade_round_trips_on_postgresql(pg_url):
    db = Database(pg_url)
    try:
        await migrations.downgrade(db, "base")
        async with db.connect() as conn:
            assert await conn.run_sync(_table_names) <= {"alembic_version"}
    finally:
        await migrations.upgrade(db)  # leave the shared run database at head for the other tests
        await db.dispose()


async def test_many_processes_starting_at_once_migrate_once(tmp_path):
    target = tmp_path / "race.db"
    url = f"sqlite:///{target}"
    handles = [Database(url) for _ in range(5)]  # separate engines: as separate processes would be
    try:
        await asyncio.gather(*(migrations.upgrade(db) for db in handles))
        assert {await migrations.current_revision(db) for db in handles} == {migrations.head_revision()}
    finally:
        for db in handles:
            await db.dispose()


async def test_an_unreachable_database_is_a_clear_storage_error():
    db = Database("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    try:
        with pytest.raises(StorageError, match=r"cannot open database postgresql\+asyncpg://nobody@127.0.0.1:1/none"):
            await migrations.upgrade(db)
    finally:
        await db.dispose()


def test_the_fast_start_up_check_names_the_real_head_revision():
    assert migrations.head_revision() == migrations.SCHEMA_HEAD


def test_an_unsupported_database_url_is_refused_by_name():
    with pytest.raises(InvalidInput, match="unsupported database URL driver 'mysql'"):
        Database("mysql://root@localhost/x")


async def test_0007_adopts_old_agent_tokens_and_0008_reopens_plans_that_closed_over_unfinished_tasks(tmp_path):
    """Data migrations: tokens issued before 0007 name their agent in the label only; plans closed before tasks
    added to them reopened it hold tasks that could never start."""
    db = Database(f"sqlite:///{tmp_path / 'data.db'}")
    agent = "0123abcd-0000-4000-8000-000000000001"
    try:
        await migrations.upgrade(db, "0006")
        async with db.connect() as conn:
            for sql in (
                "INSERT INTO projects (id, name, key, root_path, config, created_at) VALUES (1, 'p', 'P', '/r', '{}',"
                " '2026-01-01')",
                "INSERT INTO plans (id, project_id, name, status, created_at) VALUES"
                " (1, 1, 'a', 'closed', '2026-01-01'), (2, 1, 'b', 'closed', '2026-01-01')",
                "INSERT INTO tasks (id, project_id, plan_id, title, description, status, priority, created_at) VALUES"
                " ('P-1', 1, 1, 'done', '', 'completed', 2, '2026-01-01'),"
                " ('P-2', 1, 2, 'done', '', 'completed', 2, '2026-01-01'),"
                " ('P-3', 1, 2, 'stranded', '', 'open', 2, '2026-01-01')",
                "INSERT INTO api_tokens (id, token_hash, kind, label, created_at) VALUES"
                f" ('t1', 'h1', 'agent', 'agent {agent}', '2026-01-01'),"
                " ('t2', 'h2', 'agent', 'by hand', '2026-01-01')",
            ):
                await conn.exec_driver_sql(sql)
            await conn.commit()
        await migrations.upgrade(db)
        async with db.connect() as conn:
            plans = dict((await conn.exec_driver_sql("SELECT id, status FROM plans")).all())
            tokens = dict((await conn.exec_driver_sql("SELECT id, agent_id FROM api_tokens")).all())
        assert plans == {1: "closed", 2: "open"}
        assert tokens == {"t1": agent, "t2": None}
    finally:
        await db.dispose()


async def test_0009_gives_agents_a_null_report_and_downgrades_without_it(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'reports.db'}")
    try:
        await migrations.upgrade(db, "0008")
        async with db.connect() as conn:
            for sql in (
                "INSERT INTO projects (id, name, key, root_path, config, created_at) VALUES (1, 'p', 'P', '/r', '{}',"
                " '2026-01-01')",
                "INSERT INTO tasks (id, project_id, title, description, status, priority, created_at) VALUES"
                " ('P-1', 1, 'old', '', 'in_progress', 2, '2026-01-01')",
                "INSERT INTO sessions (id, project_id, task_id, state, version, state_data, workflow_stack, created_at,"
                " updated_at) VALUES ('s1', 1, 'P-1', 'executing', 3, '{}', '[]', '2026-01-01', '2026-01-01')",
                "INSERT INTO agents (id, session_id, agent_type, command, status) VALUES"
                " ('a1', 's1', 'claude', '[\"claude\"]', 'completed')",
            ):
                await conn.exec_driver_sql(sql)
            await conn.commit()
        await migrations.upgrade(db)
        async with db.connect() as conn:
            assert (await conn.exec_driver_sql("SELECT id, report FROM agents")).all() == [("a1", None)]
        await migrations.downgrade(db, "0008")
        async with db.connect() as conn:
            columns = await conn.run_sync(lambda c: {col["name"] for col in inspect(c).get_columns("agents")})
        assert "report" not in columns and "error" in columns
    finally:
        await db.dispose()
