"""Migration 0014 on a database that already has a history (issue 21), on SQLite and PostgreSQL: records written
at revision 0013 (with the tables' own column types, as 0013's code wrote them) are linked into their chains in the
order they were written (time, then table, then id), verify unsigned, and are sealed by checkpoint #1 (reason
"seal") at the first start that has the key; taskgate's own writes then extend those chains; a downgrade to
0013 and a second upgrade do it all again. And 0017, which stores the links in the order they are written."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, inspect

from taskgate.application.audit.ledger import Scope
from taskgate.application.audit.linking import link_pending
from taskgate.application.sessions.commands import FireTrigger
from taskgate.infrastructure.db import migrations
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.tables import ALL_TABLES
from tests.audit_support import ledger_of, new_signer, problems, raw, record_count, whole_chains
from tests.builders import fire, seed, start
from tests.conftest import SQL_BACKENDS, Services, wire

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
A = "00000000-0000-4000-8000-00000000000a"  # a session that went as far as an approval, then back to verifying
B = "00000000-0000-4000-8000-00000000000b"  # a session whose start the WIP limit refused
AUDIT_TABLES = {"audit_links", "audit_chains", "audit_marks", "audit_checkpoints"}


@pytest.fixture(params=SQL_BACKENDS)
async def at_0013(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Services]:
    """A database at revision 0013, empty, wired to the services: a new SQLite file, or this test process's
    PostgreSQL database downgraded (and brought back to head afterwards, as test_migrations.py does)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
        database = Database(url)
        await migrations.upgrade(database, "0013")
    else:
        url = request.getfixturevalue("pg_url")
        database = Database(url)
        await migrations.downgrade(database, "0013")
        present = {row[0] for row in await raw(database, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        older = ", ".join(table.name for table in ALL_TABLES if table.name in present)  # the tables 0013 has
        await raw(database, f"TRUNCATE {older} RESTART IDENTITY CASCADE")
    try:
        yield wire(request.param, database, url)
    finally:
        await migrations.upgrade(database)  # leave the shared database at head for the other tests
        await database.dispose()


class History:
    """Rows written at revision 0013, each under a label, inserted in an order of its own (not time order), so
    that the ids do not follow the times: the migration must order by time, then table, then id."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, dict[str, Any]]] = []
        self.ids: dict[tuple[str, int], str] = {}

    def add(self, label: str, table: str, seconds: float, **values: Any) -> None:
        self.rows.append((label, table, {**values, "at": T0 + timedelta(seconds=seconds)}))

    async def write(self, database: Database) -> None:
        async with database.connect() as conn:
            await conn.begin()
            for label, table, values in sorted(self.rows, key=lambda r: _INSERT_ORDER[r[1]]):
                result = await conn.execute(insert(getattr(t, table)).values(**values))
                self.ids[(table, int(result.inserted_primary_key[0]))] = label
            await conn.commit()


_INSERT_ORDER = {"events": 0, "decisions": 1, "transition_log": 2}  # the reverse of the chain's table order


def transition(history: History, label: str, session: str, seconds: float, trigger: str, from_state: str | None,
               to_state: str, version: int, outcome: str = "applied", guards: list | None = None) -> None:  # fmt: skip
    history.add(label, "transition_log", seconds, session_id=session, trigger=trigger, from_state=from_state,
                to_state=to_state, outcome=outcome, actor="operator:alice", reason=None, guard_results=guards or [],
                session_version=version)  # fmt: skip


def event(history: History, label: str, session: str | None, seconds: float, kind: str, payload: dict) -> None:
    history.add(label, "events", seconds, session_id=session, kind=kind, payload=payload)


def the_history() -> History:
    """Two sessions' transitions, a decision and events (several at one instant), and global events."""
    h = History()
    event(h, "operator.added", None, 0, "operator.added", {"operator": "alice", "roles": ["admin"]})
    event(h, "task.added 1", None, 0.5, "task.added", {"task": "SHOP-1"})
    event(h, "task.added 2", None, 0.5, "task.added", {"task": "SHOP-2"})
    for n, (trigger, before, after) in enumerate(
        [("create", None, "created"), ("initialize", "created", "initializing"),
         ("context_discovered", "initializing", "ready"), ("start", "ready", "planning"),
         ("plan_complete", "planning", "executing"), ("work_complete", "executing", "verifying")], 1
    ):  # fmt: skip
        transition(h, f"A {trigger}", A, n, trigger, before, after, n)
        event(h, f"A {trigger} event", A, n, "session.transition", {"trigger": trigger})  # same instant: after its row
    h.add("A approve decision", "decisions", 7, session_id=A, operator_id="alice", decision="approve",
          reason="looks good", instructions=None, override_policies=[], compensation=None, session_version=6,
          policy_results=[], outcome="applied", to_state="awaiting_merge")  # fmt: skip
    transition(h, "A approve", A, 7, "approve", "verifying", "awaiting_merge", 7)  # same instant as its decision
    event(h, "A decision.recorded", A, 7, "decision.recorded", {"operator": "alice", "decision": "approve"})
    transition(h, "A reverify", A, 8, "reverify", "awaiting_merge", "verifying", 8)
    event(h, "token.issued", None, 8, "token.issued", {"token": "t1", "kind": "operator", "label": "ci"})
    for n, (trigger, before, after) in enumerate(
        [("create", None, "created"), ("initialize", "created", "initializing"),
         ("context_discovered", "initializing", "ready")], 1
    ):  # fmt: skip
        transition(h, f"B {trigger}", B, 10 + n, trigger, before, after, n)
    transition(h, "B start blocked", B, 14, "start", "ready", "ready", 3, outcome="blocked",
               guards=[{"policy": "wip_limit", "passed": False, "message": "3 of 3 sessions in progress"}])  # fmt: skip
    return h


# The order each chain must come out in: by time; at one instant transition rows, then decisions, then events.
CHAINS = {
    f"session:{A}": [
        "A create", "A create event", "A initialize", "A initialize event", "A context_discovered",
        "A context_discovered event", "A start", "A start event", "A plan_complete", "A plan_complete event",
        "A work_complete", "A work_complete event", "A approve", "A approve decision", "A decision.recorded",
        "A reverify",
    ],
    f"session:{B}": ["B create", "B initialize", "B context_discovered", "B start blocked"],
    "global:operator": ["operator.added"],
    "global:task": ["task.added 1", "task.added 2"],
    "global:token": ["token.issued"],
}  # fmt: skip


async def write_0013_state(svc: Services, repo: Path) -> History:
    """The project, operator, plan, tasks and sessions the history is about, then the history itself."""
    db = svc.database
    async with db.connect() as conn:
        await conn.begin()
        await conn.execute(insert(t.projects).values(id=1, name="shop", key="SHOP", root_path=str(repo), config={},
                                                     created_at=T0))  # fmt: skip
        await conn.execute(insert(t.operators).values(id="alice", name="alice", roles=["admin"], permissions=[],
                                                      max_active_sessions=5, created_at=T0))  # fmt: skip
        await conn.execute(insert(t.plans).values(id=1, project_id=1, name="Phase 1", status="in_progress",
                                                  created_at=T0))  # fmt: skip
        for n, (session_id, state, version) in enumerate([(A, "verifying", 8), (B, "ready", 3)], 1):
            await conn.execute(insert(t.tasks).values(id=f"SHOP-{n}", project_id=1, plan_id=1, title=f"task {n}",
                                                      priority=2, status="in_progress", created_at=T0))  # fmt: skip
            await conn.execute(insert(t.sessions).values(
                id=session_id, task_id=f"SHOP-{n}", project_id=1, plan_id=1, operator_id="alice", state=state,
                state_data={}, workflow_stack=[], version=version, created_at=T0, updated_at=T0,
            ))  # fmt: skip
        await conn.commit()
    history = the_history()
    await history.write(db)
    return history


async def chain_labels(svc: Services, history: History) -> dict[str, list[str]]:
    """Each chain's records, by label, in seq order."""
    rows = await raw(svc, "SELECT chain_id, record_table, record_id FROM audit_links ORDER BY chain_id, chain_seq")
    chains: dict[str, list[str]] = {}
    for chain, table, record_id in rows:
        chains.setdefault(chain, []).append(history.ids.get((table, record_id), f"{table} {record_id}"))
    return chains


async def tables_of(database: Database) -> set[str]:
    async with database.connect() as conn:
        return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))


async def columns_of(database: Database, table: str) -> set[str]:
    async with database.connect() as conn:
        return {c["name"] for c in await conn.run_sync(lambda c: inspect(c).get_columns(table))}


async def assert_migrated_and_sealed(svc: Services, ledger, history: History) -> None:
    """Every record linked in the documented order, each table's linker mark at its newest record (0016: all of
    them linked already); verified unsigned; sealed once by checkpoint #1; verified."""
    assert await chain_labels(svc, history) == CHAINS
    marks = dict(await raw(svc, "SELECT record_table, linked_upto FROM audit_marks"))
    tops = {table: (await raw(svc, f"SELECT coalesce(max({key}), 0) FROM {table}"))[0][0]
            for table, key in (("transition_log", "seq"), ("decisions", "id"), ("events", "id"))}  # fmt: skip
    assert marks == tops and all(tops.values())
    lengths = await whole_chains(svc)
    unsigned = await ledger.verify(Scope(), record=False)
    assert unsigned.ok, problems(unsigned)
    assert (unsigned.records, unsigned.unsigned, unsigned.checkpoints) == (await record_count(svc),) * 2 + (0,)
    heads = await raw(svc, "SELECT l.chain_id, l.chain_seq, l.hash FROM audit_links l JOIN audit_chains h "
                           "ON h.chain_id = l.chain_id AND h.seq = l.chain_seq")  # fmt: skip
    assert await ledger_of(svc, None).seal_if_unsealed() is None  # a process without the key leaves it unsealed

    cp = await ledger.seal_if_unsealed()

    assert cp is not None and (cp.number, cp.reason, cp.anchors) == (1, "seal", {})
    assert dict(cp.heads) == {chain: (seq, hash_) for chain, seq, hash_ in heads}
    assert {chain: seq for chain, (seq, _h) in cp.heads.items()} == lengths
    sealed = await ledger.verify(Scope(), record=False)
    assert sealed.ok and sealed.unsigned == 0 and sealed.checkpoints == 1, problems(sealed)
    before = await svc.snapshot()
    assert await ledger.seal_if_unsealed() is None
    assert await svc.snapshot() == before


async def test_0014_links_a_0013_history_in_written_order_and_the_first_start_seals_it(at_0013, git_repo, tmp_path):
    history = await write_0013_state(at_0013, git_repo)
    ledger = ledger_of(at_0013, new_signer(tmp_path / "keys"))
    assert not AUDIT_TABLES & await tables_of(at_0013.database)

    await migrations.upgrade(at_0013.database)

    await assert_migrated_and_sealed(at_0013, ledger, history)
    # taskgate's own writes go on from the migrated heads
    await at_0013.sessions.fire(FireTrigger(A, "suspend", "operator:alice"))
    grown = await ledger.verify(Scope(), record=False)
    assert grown.ok and grown.unsigned == 2, problems(grown)  # the transition row and its event
    chain = (await chain_labels(at_0013, history))[f"session:{A}"]
    assert chain[: len(CHAINS[f"session:{A}"])] == CHAINS[f"session:{A}"] and len(chain) == 18


async def test_a_downgrade_to_0013_and_a_second_upgrade_link_and_seal_the_history_again(at_0013, git_repo, tmp_path):
    history = await write_0013_state(at_0013, git_repo)
    ledger = ledger_of(at_0013, new_signer(tmp_path / "keys"))
    await migrations.upgrade(at_0013.database)
    await ledger.seal_if_unsealed()

    await migrations.downgrade(at_0013.database, "0013")
    assert not AUDIT_TABLES & await tables_of(at_0013.database)
    assert await record_count(at_0013) == len(history.rows)  # the records themselves stay
    await migrations.upgrade(at_0013.database)

    assert await migrations.current_revision(at_0013.database) == migrations.head_revision()
    await assert_migrated_and_sealed(at_0013, ledger, history)


async def test_0017_numbers_the_links_in_chain_order_and_a_downgrade_keys_them_by_chain_again(sql_services, git_repo,
                                                                                              tmp_path):  # fmt: skip
    # 0017 stores links in the order they are written. The links already there are numbered chain by chain, each
    # chain's in seq order; a link after a gap (where a prune resumed a chain) follows no `prev_no`.
    svc = sql_services
    seeded = await seed(svc, git_repo, tasks=3)
    for task in seeded.tasks:
        await fire(svc, await start(svc, task), "plan_complete", "suspend", "resume")
    ledger = ledger_of(svc, new_signer(tmp_path / "keys"))
    await ledger.checkpoint()
    lengths = await whole_chains(svc)
    try:
        await migrations.downgrade(svc.database, "0016")
        assert "link_no" not in await columns_of(svc.database, "audit_links")
        gapped = next(chain for chain, length in sorted(lengths.items()) if length > 3)
        await raw(svc, "DELETE FROM audit_links WHERE chain_id = :c AND chain_seq = 2", c=gapped)
    finally:
        await migrations.upgrade(svc.database)

    links = await raw(svc, "SELECT chain_id, chain_seq, link_no, prev_no FROM audit_links ORDER BY link_no")
    assert [(chain, seq) for chain, seq, _n, _p in links] == sorted((c, s) for c, s, _n, _p in links)
    assert [number for _c, _s, number, _p in links] == list(range(1, len(links) + 1))
    numbers = {(chain, seq): number for chain, seq, number, _p in links}
    for chain, seq, _number, prev in links:
        assert prev == numbers.get((chain, seq - 1)), f"{chain} #{seq} follows {prev}"
    assert numbers.get((gapped, 2)) is None and numbers[(gapped, 3)] > numbers[(gapped, 1)]
    heads = dict(await raw(svc, "SELECT chain_id, link_no FROM audit_chains WHERE link_no IS NOT NULL"))
    assert heads == {chain: numbers[(chain, length)] for chain, length in lengths.items()}
    if svc.database.url.startswith("sqlite"):  # the heads' rows in the order their chains last grew
        stored = [chain for (chain,) in await raw(svc, "SELECT chain_id FROM audit_chains ORDER BY rowid")]
        assert stored[1:] == sorted(heads, key=heads.__getitem__) and stored[0] == "!checkpoints"
    report = await ledger.verify(Scope(), record=False)
    assert [f.seq for f in report.findings if f.chain == gapped] == [3], problems(report)  # the record after the gap

    # the linker numbers on from the largest, each chain after its head
    session = next(chain for chain in sorted(lengths) if chain.startswith("session:") and chain != gapped)
    await svc.sessions.fire(FireTrigger(session.removeprefix("session:"), "suspend", "operator:alice"))
    await link_pending(svc.uow)
    grown = await raw(svc, "SELECT chain_id, chain_seq, link_no, prev_no FROM audit_links WHERE link_no > :n "
                           "ORDER BY link_no", n=len(links))  # fmt: skip
    first = next(link for link in grown if link[0] == session)
    assert tuple(first) == (session, lengths[session] + 1, len(links) + 1, heads[session])
