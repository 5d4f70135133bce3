"""The PostgreSQL read path (infrastructure/db/pg_reads.py) on a real server: one read-only snapshot, a schema it
was not compiled for or a server it cannot reach is `Unavailable` (the full path answers), and the remembered
settings never hold the database's password (infrastructure/quick_reads.py)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from taskgate.infrastructure.db.fast_reads import Unavailable
from taskgate.infrastructure.db.pg_reads import PgReads, connect_kwargs, numbered
from taskgate.infrastructure.db.read_sql import SCHEMA_HEAD
from taskgate.infrastructure.quick_reads import facts_of, with_password, without_password
from tests.conftest import migrate_pg, pg_admin, pg_database_url


@pytest.fixture(scope="module")
def migrated(pg_url: str):
    """A fresh database of this module's, migrated to the head, to write behind the reader's back."""
    name = f"{pg_url.rsplit('/', 1)[1]}_reads"
    url = pg_database_url(name)
    pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    pg_admin(f'CREATE DATABASE "{name}"')
    migrate_pg(url)
    yield url
    pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def scratch(migrated: str):
    """The migrated database with no projects and at the schema head."""
    _sql(migrated, "TRUNCATE projects CASCADE", f"UPDATE alembic_version SET version_num = '{SCHEMA_HEAD}'")
    return migrated


def _sql(url: str, *statements: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(**connect_kwargs(url))
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


_PROJECT = ("INSERT INTO projects (name, key, root_path, config, task_seq, created_at) "
            "VALUES ('{0}', '{0}', '/{0}', '{{}}', 0, now())")  # fmt: skip


def test_all_reads_of_a_command_see_one_snapshot(scratch: str) -> None:
    reads = PgReads(scratch)
    try:
        assert reads.rows("projects") == []
        _sql(scratch, _PROJECT.format("P"))  # committed by another client while the command reads
        assert reads.rows("projects") == []  # REPEATABLE READ: the command's snapshot
    finally:
        reads.close()
    fresh = PgReads(scratch)
    try:
        [row] = fresh.rows("projects")
        assert row["key"] == "P" and row["config"] == {} and row["created_at"].utcoffset().total_seconds() == 0
    finally:
        fresh.close()


def test_the_reader_cannot_write(scratch: str) -> None:
    reads = PgReads(scratch)
    try:
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            reads._run(reads._conn.execute(_PROJECT.format("W")))  # the transaction itself is READ ONLY
    finally:
        reads.close()


def test_a_schema_not_at_the_head_or_no_server_is_unavailable(scratch: str) -> None:
    _sql(scratch, "UPDATE alembic_version SET version_num = '0001'")
    with pytest.raises(Unavailable, match=f"schema 0001 is not {SCHEMA_HEAD}"):
        PgReads(scratch)
    with pytest.raises(Unavailable, match="cannot read the PostgreSQL database"):
        PgReads("postgresql+asyncpg://postgres@127.0.0.1:1/nothing", connect_timeout_s=2)
    for url in ("postgresql+asyncpg://u@h/d?ssl=require", "postgresql+asyncpg://u@h1,h2/d", "mysql://u@h/d"):
        with pytest.raises(Unavailable):
            connect_kwargs(url)


def test_parameters_are_numbered_in_order_of_first_use_and_casts_are_left_alone() -> None:
    text, args = numbered("a = :x::INTEGER AND b = :y AND c >= :x", {"x": 1, "y": "two"})
    assert text == "a = $1::INTEGER AND b = $2 AND c >= $1" and args == [1, "two"]
    with pytest.raises(Unavailable, match="no value for parameter z"):
        numbered("a = :z", {})


def test_connect_keywords_are_the_urls_parts_unquoted() -> None:
    assert connect_kwargs("postgresql+asyncpg://al%40ice:p%3Ass@db.example:6543/task%20gate") == {
        "user": "al@ice", "password": "p:ss", "host": "db.example", "port": 6543, "database": "task gate"}  # fmt: skip
    assert connect_kwargs("postgresql+asyncpg:///taskgate") == {"database": "taskgate"}  # the PG* variables, .pgpass


class _Settings:
    def __init__(self, url: str) -> None:
        self.resolved_database_url = url
        self.sqlite = type("S", (), {"busy_timeout_ms": 100})()
        self.tracker = type("T", (), {"kind": "builtin"})()
        self.projects = {}


def test_the_password_is_never_remembered_and_comes_back_only_from_taskgate_database_url(monkeypatch) -> None:
    url = "postgresql+asyncpg://alice:s3cr%40t@db:5432/tg"
    facts = facts_of(_Settings(url))
    assert "s3cr" not in str(facts) and facts["database_url"] == "postgresql+asyncpg://alice:***@db:5432/tg"
    monkeypatch.delenv("TASKGATE_DATABASE_URL", raising=False)
    with pytest.raises(Unavailable, match="not in TASKGATE_DATABASE_URL"):
        with_password(facts["database_url"])  # the password was in the config file: the full path reads it
    monkeypatch.setenv("taskgate_database_url", url)  # the settings read the variable whatever its case
    assert with_password(facts["database_url"]) == url
    monkeypatch.setenv("taskgate_database_url", url.replace("@db:", "@other:"))  # not the remembered URL
    with pytest.raises(Unavailable):
        with_password(facts["database_url"])
    for plain in ("sqlite:////tmp/x.db", "postgresql+asyncpg://alice@db/tg"):
        assert without_password(plain) == plain and with_password(plain) == plain
