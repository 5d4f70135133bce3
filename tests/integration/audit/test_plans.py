"""How SQLite plans the reads of one session's audit links (issue 21, 0017): nothing is indexed by chain, so they
must start from the session's records (their `session_id` indexes) and look each link up by its record, never
read the record index by table alone (a third of all links per table: 0.5 s for one session on 1,000,000 links).
SQLite plans without statistics here, as on a user's database that was never analysed."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import sqlite

from taskgate.application.audit.ports import LinkQuery
from taskgate.infrastructure.db import audit_store, migrations
from taskgate.infrastructure.db.engine import Database

pytestmark = pytest.mark.asyncio
SESSION = "00000000-0000-4000-8000-000000000001"


async def plan_of(tmp_path, stmt) -> list[str]:
    path = tmp_path / "plans.db"
    database = Database(f"sqlite:///{path}")
    await migrations.upgrade(database)
    await database.dispose()
    sql = str(stmt.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))
    conn = sqlite3.connect(path)
    try:
        return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
    finally:
        conn.close()


def assert_starts_from_the_records(plan: list[str]) -> None:
    on_index = [step for step in plan if "uq_audit_links_record" in step]
    assert on_index and all("record_id=?" in step for step in on_index), plan
    for index in ("ix_transition_log_session", "ix_decisions_session_id", "ix_events_session_id"):
        assert any(index in step for step in plan), (index, plan)


async def test_a_sessions_verify_reads_its_links_from_its_records(tmp_path):
    chain = f"session:{SESSION}"
    query = LinkQuery(0, chain, None, 5000)
    stmt = audit_store._JOINED.where(
        audit_store._links.c.link_no > query.after,
        audit_store._links.c.chain_id == chain,
        audit_store._links.c.link_no.in_(audit_store._chain_link_nos(chain, "sqlite")),
    )
    assert_starts_from_the_records(await plan_of(tmp_path, stmt))


async def test_a_prune_reads_its_sessions_links_from_their_records(tmp_path):
    found = audit_store._session_links([SESSION], "sqlite")
    assert_starts_from_the_records(await plan_of(tmp_path, select(found.c.link_no, found.c.chain_seq)))
