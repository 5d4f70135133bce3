"""Audit verify throughput on 1,000,000 chained records, next to a plain read of the same rows; bytes per record.

Builds, through the real migrations, a database holding `--rows` audited records (default 1,000,000: 20,000
sessions × 50 records, each session a realistic life: created, initialize … plan_complete, an agent's token and
status, three request_changes rounds (decision, events, rework), tests, approve, merge, cleanup, its token
revoked, and the `task.created` event of its task in the `global:task` chain): 15 transition_log rows, 4
decisions and 31 events per session, with the field shapes the services write. The rows (and their tasks,
sessions, plans, project and operators, so that every foreign key holds) are written directly, not fired: SQLite
with executemany and SQLAlchemy's own bind conversions, PostgreSQL with COPY. Each record's link is computed
with `taskgate.domain.audit.chain` exactly as the linker does (canonical fields, then the link hash over the
previous one), the chains' head rows are written and each table's linker mark set past its records; then
`AuditLedger.checkpoint` signs every head.

Then `--runs` rounds, each phase in a fresh child process (so its peak memory is its own):

- select, the baseline: a plain SELECT of the same rows (the audited columns of the three tables, and the
  links) on the bare driver (sqlite3 / asyncpg), fetched 5,000 at a time;
- links: taskgate's own read of the links with their records (`links_in`: the query and the row conversion
  verify uses), without hashing or walking;
- verify: `AuditLedger.verify(Scope(), record=False)`, which must be ok and cover every record;
- verify-export: `verify_export` of a JSONL export of the same records (`audit_export.export`, written once
  before the rounds).

Printed: records/s and seconds of each, verify ÷ select and verify ÷ links, peak RSS (ru_maxrss) of each child,
and the bytes per record of `audit_links` (+ its indexes), `audit_chains` and `audit_checkpoints` (SQLite:
`dbstat`, as built; PostgreSQL: `pg_total_relation_size` after VACUUM ANALYZE) and of the export file.

With `--prune`, last: `AuditLedger.prune` of every record (all sessions are finished) as a dry run, then for real
(it holds the write lock throughout: the time a service's writers would wait), then a verify of what is left, each
in a child; on SQLite on a copy of the file, so a `--db` file stays as built.

Run:  .venv/bin/python benchmarks/audit_verify.py [--rows 1000000] [--runs 3] [--db PATH] [--postgres [URL]] [--prune]
      (~5 min on SQLite at 1M rows on 2 cores; `--db PATH` keeps the built file and reuses it)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench_support import PG_BENCH_URL, emit_row, reset_pg_schema
from sqlalchemy import insert

from taskgate.application.audit.export import export, verify_export
from taskgate.application.audit.ledger import AuditLedger, Scope, links_in
from taskgate.domain.audit.chain import AUDITED_FIELDS, GENESIS, PRIMARY_KEYS, canonical_fields, chain_of, link_hash
from taskgate.infrastructure.audit.keyring import FileKeyRing
from taskgate.infrastructure.db import migrations
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from taskgate.infrastructure.system import SystemClock

PER_SESSION = 50
SESSIONS_PER_BATCH = 500
TASKS_PER_PLAN = 100
OPERATORS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
BEGIN = datetime(2025, 1, 1, tzinfo=UTC)
PHASES = ("select", "links", "verify", "verify-export")  # `links` only with --links
PRUNE_PHASES = ("prune-dry-run", "prune")  # with --prune, after the rounds
JSON_COLUMNS = {"guard_results", "override_policies", "policy_results", "payload", "state_data", "workflow_stack",
                "config", "roles", "permissions", "labels"}  # fmt: skip


# -- the records of one session -----------------------------------------------------------------------------


def passed(*policies: str) -> list[dict[str, Any]]:
    """Guard results as `GuardResult.as_dict` stores them, every policy passing."""
    return [{"policy": p, "passed": True, "severity": "error", "message": "", "suggestion": ""} for p in policies]


START_GUARDS = passed("wip_limit", "plan_open", "task_unblocked", "one_active_session_per_task")
APPROVE_GUARDS = passed("require_tests", "review_approval", "branch_up_to_date", "no_conflicts")
NO_GUARDS: list[dict[str, Any]] = []
NO_OVERRIDES: dict[str, Any] = {}
INSTRUCTIONS = (
    "The error path of the parser swallows the exception and returns an empty result. Raise a ParseError with the "
    "line number instead, add a test for a truncated file, and keep the public signature as it is."
)


@dataclass
class SessionLife:
    """One session's rows: its task and session rows, and its records in the order they were written."""

    session: dict[str, Any]
    task: dict[str, Any]
    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (table, row without its id)


class Life:
    """Writes a session's records one after the other, with times that move on and versions that count."""

    def __init__(self, number: int, plan_id: int, project_id: int, rng: random.Random) -> None:
        self.rng, self.id = rng, str(uuid.UUID(int=rng.getrandbits(128), version=4))
        self.operator, self.version, self.state = rng.choice(OPERATORS), 0, None
        self.at = BEGIN + timedelta(seconds=rng.uniform(0, 330 * 86400))
        self.task_id = f"AUD-{number}"
        self.life = SessionLife(session_row(self, plan_id, project_id), task_row(self, number, plan_id, project_id))

    def tick(self) -> datetime:
        """The next record's time: a few seconds to an hour later."""
        self.at += timedelta(seconds=self.rng.uniform(1, 3600))
        return self.at

    def event(self, kind: str, payload: dict[str, Any], *, session: bool = True) -> None:
        """An events row of this session (or of none: a global record)."""
        row = {"session_id": self.id if session else None, "kind": kind, "payload": payload, "at": self.tick()}
        self.life.records.append(("events", row))

    def fire(self, trigger: str, to: str, guards: list[dict[str, Any]] | None = None, system: bool = False) -> None:
        """An applied transition: its transition_log row and its `session.transition` event."""
        self.version += 1
        actor = "system" if system else f"operator:{self.operator}"
        row = {"session_id": self.id, "trigger": trigger, "from_state": self.state, "to_state": to,
               "outcome": "applied", "actor": actor, "reason": None, "guard_results": guards or NO_GUARDS,
               "session_version": self.version, "at": self.tick()}  # fmt: skip
        self.life.records.append(("transition_log", row))
        self.event("session.transition", {"trigger": trigger, "from": self.state, "to": to})
        self.state = to

    def decide(self, decision: str, to: str, reason: str, instructions: str | None) -> None:
        """A decisions row (as `Decision` stores) and its `decision.recorded` event."""
        row = {"session_id": self.id, "operator_id": self.operator, "decision": decision, "reason": reason,
               "instructions": instructions, "override_policies": NO_OVERRIDES, "compensation": None,
               "session_version": self.version, "policy_results": APPROVE_GUARDS, "at": self.tick(),
               "outcome": "applied", "to_state": to}  # fmt: skip
        self.life.records.append(("decisions", row))
        self.event("decision.recorded", {"operator": self.operator, "decision": decision, "reason": reason,
                                         "compensation": None, "to_state": to})  # fmt: skip

    def agent(self, run: int) -> None:
        """An agent launched for a run: its token issued and its status."""
        agent_id = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        self.event(
            "token.issued",
            {
                "token": f"{self.rng.getrandbits(48):012x}",
                "kind": "agent",
                "label": f"agent coder run {run}",
                "session_id": self.id,
                "agent_id": agent_id,
            },
        )
        self.event("agent.status", {"agent": agent_id, "type": "coder", "to": "queued", "run": run})


def session_row(life: Life, plan_id: int, project_id: int) -> dict[str, Any]:
    """The `sessions` row of a completed session."""
    return {"id": life.id, "task_id": life.task_id, "project_id": project_id, "plan_id": plan_id,
            "operator_id": life.operator, "state": "completed", "prior_state": None, "state_data": {},
            "workflow_stack": [], "version": 15, "created_at": life.at, "started_at": life.at,
            "updated_at": life.at, "completed_at": life.at}  # fmt: skip


def task_row(life: Life, number: int, plan_id: int, project_id: int) -> dict[str, Any]:
    """The `tasks` row of the session's task."""
    return {"id": life.task_id, "project_id": project_id, "plan_id": plan_id, "title": f"Audit task {number}",
            "description": "", "priority": 2, "status": "done", "created_at": life.at}  # fmt: skip


def session_life(number: int, plan_id: int, project_id: int, rng: random.Random) -> SessionLife:
    """The 50 records of one session's life (see the module docstring), in the order they were written."""
    life = Life(number, plan_id, project_id, rng)
    life.event("task.created", {"actor": f"operator:{life.operator}", "task": life.task_id}, session=False)
    life.event("session.created", {"task_id": life.task_id})
    life.fire("create", "created")
    life.fire("initialize", "initializing", system=True)
    life.fire("context_discovered", "ready", system=True)
    life.fire("start", "planning", START_GUARDS)
    life.fire("plan_complete", "executing")
    life.agent(1)
    life.fire("work_complete", "verifying", system=True)
    for run in (2, 3, 4):
        life.decide("request_changes", "executing", "not yet: see the instructions", INSTRUCTIONS)
        life.fire("request_changes", "executing")
        life.agent(run)
        life.fire("work_complete", "verifying", system=True)
    life.event("tests.run", {"command": ["pytest", "-q"], "exit_code": 0, "timed_out": False, "duration_ms": 8123,
                             "head_commit": f"{rng.getrandbits(160):040x}"})  # fmt: skip
    life.decide("approve", "awaiting_merge", "reviewed the diff: good to merge", None)
    life.fire("approve", "awaiting_merge", APPROVE_GUARDS)
    life.fire("merge", "merged")
    life.fire("cleanup_done", "completed", system=True)
    life.event("token.revoked", {"why": "session ended"})
    assert len(life.life.records) == PER_SESSION
    return life.life


# -- ids and links ------------------------------------------------------------------------------------------


@dataclass
class Chainer:
    """Gives records their ids and links them, as the linker does after their commit, chain by chain."""

    next_id: dict[str, int] = field(default_factory=lambda: dict.fromkeys(AUDITED_FIELDS, 1))
    heads: dict[str, tuple[int, str]] = field(default_factory=dict)
    numbers: dict[str, int] = field(default_factory=dict)  # each chain's last link number
    next_no: int = 1

    def link(self, table: str, row: dict[str, Any]) -> dict[str, Any]:
        """Give `row` its id; its link row, numbered on (the chain's head moves on)."""
        record_id = self.next_id[table]
        self.next_id[table] += 1
        row[PRIMARY_KEYS[table]] = record_id
        fields = canonical_fields(table, row)
        chain = chain_of(table, fields)
        seq, prev = self.heads.get(chain, (0, GENESIS))
        digest = link_hash(chain, seq + 1, prev, table, fields)
        self.heads[chain] = (seq + 1, digest)
        number, prev_no = self.next_no, self.numbers.get(chain)
        self.next_no, self.numbers[chain] = number + 1, number
        return {"link_no": number, "chain_id": chain, "chain_seq": seq + 1, "record_table": table,
                "record_id": record_id, "hash": digest, "prev_no": prev_no}  # fmt: skip


def batch_rows(lives: list[SessionLife], chainer: Chainer) -> dict[str, list[dict[str, Any]]]:
    """The rows of a batch of sessions, by table, records linked."""
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in ("tasks", "sessions", *AUDITED_FIELDS)}
    rows["audit_links"] = []
    for life in lives:
        rows["tasks"].append(life.task)
        rows["sessions"].append(life.session)
        for table, row in life.records:
            rows["audit_links"].append(chainer.link(table, row))
            rows[table].append(row)
    return rows


# -- writers ------------------------------------------------------------------------------------------------


class SqliteWriter:
    """Rows written with sqlite3's executemany, stored as SQLAlchemy stores them: its compiled insert, and its bind
    conversions, done here by faster equivalents that are checked against SQLAlchemy's own on each table's first
    rows (JSON text, UTC datetimes as naive ISO text); a JSON value shared by many rows is encoded once."""

    CHECKED = 50

    def __init__(self, path: Path, database: Database) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None)
        for pragma in ("synchronous=OFF", "foreign_keys=ON", "cache_size=-524288"):  # 512 MiB: the indexes fit
            self._conn.execute(f"PRAGMA {pragma}")
        self._dialect = database.engine.dialect
        self._checked: set[str] = set()
        self._shared: dict[int, tuple[Any, str]] = {}

    async def write(self, batch: dict[str, list[dict[str, Any]]]) -> None:
        """One transaction per batch."""
        self._conn.execute("BEGIN")
        for name, rows in batch.items():
            if rows:
                sql, keys, processors = self._prepared(name, tuple(rows[0]))
                if name not in self._checked:
                    self._check(name, rows[: self.CHECKED], keys, processors)
                self._conn.executemany(sql, (self._convert(row, keys) for row in rows))
        self._conn.execute("COMMIT")

    def _prepared(self, name: str, keys: tuple[str, ...]) -> tuple[str, list[str], list[Any]]:
        compiled: Any = insert(t.metadata.tables[name]).compile(dialect=self._dialect, column_keys=list(keys))
        order = list(compiled.positiontup)
        return compiled.string, order, [compiled._bind_processors.get(key) for key in order]

    def _convert(self, row: dict[str, Any], keys: list[str]) -> tuple[Any, ...]:
        return tuple(self._value(row[key], key in JSON_COLUMNS) for key in keys)

    def _value(self, value: Any, is_json: bool) -> Any:
        if is_json:
            shared = self._shared.get(id(value))
            if shared is not None and shared[0] is value:
                return shared[1]
            return json.dumps(value)
        if isinstance(value, datetime):
            return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")
        return value

    def _check(self, name: str, rows: list[dict[str, Any]], keys: list[str], processors: list[Any]) -> None:
        """Raises: AssertionError where a fast conversion stores otherwise than SQLAlchemy's."""
        for row in rows:
            ours = self._convert(row, keys)
            theirs = tuple(p(row[k]) if p else row[k] for k, p in zip(keys, processors, strict=True))
            assert ours == theirs, f"{name}: {ours} != {theirs}"
        self._checked.add(name)

    def share(self, *values: Any) -> None:
        """JSON values that many rows hold (the same object): encoded once."""
        self._shared.update({id(v): (v, json.dumps(v)) for v in values})

    async def close(self) -> None:
        """Fold the WAL into the file."""
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._conn.close()


class PgWriter:
    """Rows written with COPY (asyncpg), JSON columns as their text."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    @staticmethod
    async def open(url: str) -> PgWriter:
        import asyncpg

        return PgWriter(await asyncpg.connect(url.replace("+asyncpg", "")))

    async def write(self, batch: dict[str, list[dict[str, Any]]]) -> None:
        """One transaction per batch."""
        async with self._conn.transaction():
            for name, rows in batch.items():
                if rows:
                    keys = tuple(rows[0])
                    records = [tuple(json.dumps(r[k]) if k in JSON_COLUMNS else r[k] for k in keys) for r in rows]
                    await self._conn.copy_records_to_table(name, records=records, columns=keys)

    async def close(self) -> None:
        """Move the id sequences past the ids written, then close."""
        for table, key in (*PRIMARY_KEYS.items(), ("plans", "id"), ("projects", "id")):
            await self._conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', '{key}'), (SELECT max({key}) FROM {table}))"
            )
        await self._conn.close()


# -- building -----------------------------------------------------------------------------------------------


async def seed_owners(database: Database, plans: int) -> tuple[int, list[int]]:
    """The project, its plans and the operators the rows point at (through SQLAlchemy: a few hundred rows)."""
    now = datetime.now(UTC)
    conn = await database.open(write=True)
    try:
        project = await conn.execute(insert(t.projects).values(name="audit", key="AUD", root_path="/nonexistent/aud",
                                                               config={}, created_at=now))  # fmt: skip
        project_id = project.inserted_primary_key[0]
        await conn.execute(insert(t.operators), [{"id": op, "name": op.title(), "email": f"{op}@example.invalid",
                           "roles": ["reviewer"], "permissions": ["decide"], "max_active_sessions": 10,
                           "created_at": now} for op in OPERATORS])  # fmt: skip
        rows = [{"project_id": project_id, "name": f"plan-{n}", "status": "done", "created_at": now}
                for n in range(plans)]  # fmt: skip
        plan_ids = [(await conn.execute(insert(t.plans).values(**row))).inserted_primary_key[0] for row in rows]
        await conn.commit()
    finally:
        await conn.close()
    return project_id, plan_ids


async def mark_linked(database: Database) -> None:
    """Every record written here has its link: each table's linker mark goes to its largest id (as migration 0016
    sets it), so the checkpoint's linker finds nothing to link."""
    conn = await database.open(write=True)
    try:
        for table, key in PRIMARY_KEYS.items():
            top = f"(SELECT coalesce(max({key}), 0) FROM {table})"
            await conn.exec_driver_sql(f"UPDATE audit_marks SET linked_upto = {top} WHERE record_table = '{table}'")
        await conn.commit()
    finally:
        await conn.close()


async def build(database: Database, writer: Any, sessions: int, seed: int) -> Chainer:
    """Write `sessions` sessions' lives in batches, printing progress; the chains' heads rows last."""
    rng, chainer = random.Random(seed), Chainer()
    project_id, plan_ids = await seed_owners(database, -(-sessions // TASKS_PER_PLAN))
    begin, batch = time.perf_counter(), []
    for number in range(sessions):
        batch.append(session_life(number, plan_ids[number // TASKS_PER_PLAN], project_id, rng))
        if len(batch) == SESSIONS_PER_BATCH or number == sessions - 1:
            await writer.write(batch_rows(batch, chainer))
            batch, done = [], (number + 1) * PER_SESSION
            if (number + 1) % (sessions // 5 or 1) == 0:
                print(f"  built {done:>9,} records ({done / (time.perf_counter() - begin):,.0f} records/s)", flush=True)
    heads = [{"chain_id": c, "seq": s, "hash": h, "signed_seq": 0, "link_no": chainer.numbers[c]}
             for c, (s, h) in sorted(chainer.heads.items())]  # fmt: skip
    await writer.write({"audit_chains": heads})
    await writer.close()
    await mark_linked(database)
    print(f"  built in {time.perf_counter() - begin:.1f} s: {sessions:,} sessions, {len(heads):,} chains")
    return chainer


async def sign(url: str, key: Path) -> float:
    """`AuditLedger.checkpoint` over every chain; its seconds."""
    database = Database(url)
    try:
        ledger = AuditLedger(lambda *, write: SqlAlchemyUnitOfWork(database, write=write), SystemClock(),
                             FileKeyRing(key))  # fmt: skip
        begin = time.perf_counter()
        checkpoint = await ledger.checkpoint("bench")
        assert checkpoint is not None
        return time.perf_counter() - begin
    finally:
        await database.dispose()


async def prepare(url: str, key: Path, sessions: int, seed: int) -> None:
    """Migrate an empty database, build the records, sign a checkpoint; the key is created at `key`."""
    from taskgate.infrastructure.audit.keys import create_key

    create_key(key)
    database = Database(url, synchronous="OFF")
    try:
        await migrations.upgrade(database)
        if database.is_sqlite:
            writer: Any = SqliteWriter(Path(url.removeprefix("sqlite:///")), database)
            writer.share(START_GUARDS, APPROVE_GUARDS, NO_GUARDS, NO_OVERRIDES)
        else:
            writer = await PgWriter.open(url)
        await build(database, writer, sessions, seed)
    finally:
        await database.dispose()
    print(f"  checkpoint signing every chain's head: {await sign(url, key):.1f} s")
    if not url.startswith("sqlite"):
        await pg_execute(url, "VACUUM ANALYZE")


async def pg_execute(url: str, statement: str) -> list[Any]:
    """One statement on a bare asyncpg connection (outside a transaction: VACUUM)."""
    import asyncpg

    conn = await asyncpg.connect(url.replace("+asyncpg", ""))
    try:
        return list(await conn.fetch(statement))
    finally:
        await conn.close()


# -- the phases, each in a child process ---------------------------------------------------------------------

LINK_COLUMNS = ("link_no", "chain_id", "chain_seq", "record_table", "record_id", "hash", "prev_no")


def plain_queries() -> Iterator[tuple[str, str]]:
    """(table, SELECT) of every row verify reads: the records' audited columns, and the links."""
    for table, names in (*AUDITED_FIELDS.items(), ("audit_links", LINK_COLUMNS)):
        yield table, f"SELECT {', '.join(f'{chr(34)}{n}{chr(34)}' for n in names)} FROM {table}"


async def phase_select(url: str) -> dict[str, Any]:
    """The baseline: every row of `plain_queries`, fetched 5,000 at a time on the bare driver."""
    counts: dict[str, int] = {}
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        for table, query in plain_queries():
            cursor, counts[table] = conn.execute(query), 0
            while rows := cursor.fetchmany(5000):
                counts[table] += len(rows)
        conn.close()
    else:
        import asyncpg

        pg = await asyncpg.connect(url.replace("+asyncpg", ""))
        async with pg.transaction():
            for table, query in plain_queries():
                cursor, counts[table] = await pg.cursor(query), 0
                while rows := await cursor.fetch(5000):
                    counts[table] += len(rows)
        await pg.close()
    return {"records": sum(n for table, n in counts.items() if table != "audit_links"), "links": counts["audit_links"]}


def uow_factory(database: Database) -> Callable[..., SqlAlchemyUnitOfWork]:
    """Units of work on `database`, as bootstrap makes them."""
    return lambda *, write: SqlAlchemyUnitOfWork(database, write=write)


async def phase_links(database: Database) -> dict[str, Any]:
    """taskgate's own read of the links with their records, as verify reads them, without the walk."""
    count = 0
    async with uow_factory(database)(write=False) as unit:
        async for _link in links_in(unit, Scope()):
            count += 1
    return {"records": count}


async def phase_verify(database: Database, key: Path) -> dict[str, Any]:
    """`AuditLedger.verify` of everything, as `taskgate audit verify` runs it (without recording the event)."""
    report = await AuditLedger(uow_factory(database), SystemClock(), FileKeyRing(key)).verify(Scope(), record=False)
    first = report.findings[0].describe() if report.findings else None
    return {"records": report.records, "ok": report.ok, "chains": report.chains, "unsigned": report.unsigned,
            "first": first}  # fmt: skip


async def phase_export(database: Database, key: Path, path: Path) -> dict[str, Any]:
    """A JSONL export of everything to `path`."""
    public = FileKeyRing(key).public()
    assert public is not None
    with path.open("w") as out:
        counts = await export(uow_factory(database), SystemClock(), Scope(), public.key_id,
                              lambda line: out.write(line + "\n"))  # fmt: skip
    return {"records": counts["records"], "bytes": path.stat().st_size}


def phase_verify_export(key: Path, path: Path) -> dict[str, Any]:
    """`verify_export` of the file, as `taskgate audit verify --file` runs it."""
    public = FileKeyRing(key).public()
    assert public is not None
    with path.open() as lines:
        report = verify_export(lines, public, str(path))
    first = report.findings[0].describe() if report.findings else None
    return {"records": report.records, "ok": report.ok, "first": first}


PRUNE_BEFORE = datetime(2100, 1, 1, tzinfo=UTC)  # after every record: a prune removes every finished session's


async def phase_prune(database: Database, key: Path, *, dry_run: bool) -> dict[str, Any]:
    """`AuditLedger.prune` of every record written before PRUNE_BEFORE, as `taskgate audit prune` runs it."""
    ledger = AuditLedger(uow_factory(database), SystemClock(), FileKeyRing(key))
    report = await ledger.prune(PRUNE_BEFORE, dry_run=dry_run, actor="benchmark")
    return {"records": sum(report.records.values()), "sessions": report.sessions}


async def run_phase(phase: str, url: str, key: Path, export_file: Path) -> dict[str, Any]:
    """One phase, timed."""
    if phase == "verify-export":
        begin = time.perf_counter()
        return {**phase_verify_export(key, export_file), "seconds": time.perf_counter() - begin}
    database = Database(url)
    try:
        begin = time.perf_counter()
        if phase == "select":
            found = await phase_select(url)
        elif phase == "links":
            found = await phase_links(database)
        elif phase == "verify":
            found = await phase_verify(database, key)
        elif phase in PRUNE_PHASES:
            found = await phase_prune(database, key, dry_run=phase == "prune-dry-run")
        else:
            found = await phase_export(database, key, export_file)
        return {**found, "seconds": time.perf_counter() - begin}
    finally:
        await database.dispose()


def peak_rss_mib() -> float:
    """This process's peak resident set, MiB: `VmHWM` on Linux (ru_maxrss there keeps the parent's peak across
    fork and exec, so a child would report the builder's), else ru_maxrss."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) / 1024


def child(args: argparse.Namespace) -> None:
    """Run one phase and print its result as one `RESULT {json}` line, with the peak RSS before and after it."""
    before = peak_rss_mib()
    found = asyncio.run(run_phase(args.phase, args.url, args.key, args.export_file))
    print("RESULT " + json.dumps({**found, "rss_before_mib": before, "peak_rss_mib": peak_rss_mib()}), flush=True)


def in_child(phase: str, url: str, key: Path, export_file: Path) -> dict[str, Any]:
    """Run `phase` in a fresh interpreter; its result."""
    command = [sys.executable, __file__, "--phase", phase, "--url", url, "--key", str(key),
               "--export-file", str(export_file)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).parent)
    if done.returncode != 0:
        raise SystemExit(f"phase {phase} failed:\n{done.stderr[-3000:]}")
    line = next(x for x in reversed(done.stdout.splitlines()) if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


# -- sizes --------------------------------------------------------------------------------------------------

SIZED = ("audit_links", "audit_chains", "audit_checkpoints", *AUDITED_FIELDS)


def sqlite_sizes(path: Path) -> dict[str, tuple[int, int]]:
    """(table bytes, its indexes' bytes) of each table of SIZED, from SQLite's `dbstat` (pages as built)."""
    conn = sqlite3.connect(path)
    try:
        owner = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')"))
        sizes = {name: [0, 0] for name in SIZED}
        for name, size in conn.execute("SELECT name, pgsize FROM dbstat WHERE aggregate = TRUE"):
            table = owner.get(name)
            if table in sizes:
                sizes[table][name != table] += size
    finally:
        conn.close()
    return {name: (table, indexes) for name, (table, indexes) in sizes.items()}


async def pg_sizes(url: str) -> dict[str, tuple[int, int]]:
    """(table bytes with its TOAST and maps, its indexes' bytes) of each table of SIZED, after VACUUM ANALYZE."""
    rows = await pg_execute(url, "SELECT relname, pg_total_relation_size(oid) - pg_indexes_size(oid), "
                            f"pg_indexes_size(oid) FROM pg_class WHERE relkind = 'r' AND relname IN "
                            f"({', '.join(repr(n) for n in SIZED)})")  # fmt: skip
    return {row[0]: (int(row[1]), int(row[2])) for row in rows}


def report_sizes(sizes: dict[str, tuple[int, int]], records: int, export_bytes: int) -> None:
    """Bytes per record of each audit table (and of the records' own tables, for scale) and of the export."""
    print(f"\n== bytes per record ({records:,} records) ==")
    for name in SIZED:
        table, indexes = sizes[name]
        print(
            f"  {name:18} table {table / records:7.1f} B   indexes {indexes / records:7.1f} B   "
            f"total {(table + indexes) / records:7.1f} B/record   ({(table + indexes) / 2**20:8.1f} MiB)"
        )
    added = sum(sum(sizes[name]) for name in SIZED[:3])
    own = sum(sum(sizes[name]) for name in AUDITED_FIELDS)
    print(
        f"  chaining adds {added / records:.1f} B/record (links, heads, checkpoints), {added / own:.0%} of the "
        f"records' own {own / records:.1f} B/record with their indexes"
    )
    print(f"  export (JSONL): {export_bytes / records:.1f} B/record ({export_bytes / 2**20:.1f} MiB)")


# -- rounds and report --------------------------------------------------------------------------------------


def load() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def rounds(url: str, key: Path, export_file: Path, runs: int, expect: int, phases: tuple[str, ...]) -> dict[str, Any]:
    """`runs` rounds of the phases, each in a child, the load average noted before each; every result checked."""
    found: dict[str, list[dict[str, Any]]] = {phase: [] for phase in phases}
    for number in range(runs):
        for phase in phases:
            before = load()
            result = {**in_child(phase, url, key, export_file), "load": before}
            print(f"  run {number + 1}, {phase:13} {result['records'] / result['seconds']:>10,.0f} records/s  "
                  f"{result['seconds']:6.1f} s  peak RSS {result['peak_rss_mib']:6.0f} MiB  (load {before:.2f})",
                  flush=True)  # fmt: skip
            check(phase, result, expect)
            found[phase].append(result)
    return found


def check(phase: str, result: dict[str, Any], expect: int) -> None:
    """A verify that is not ok, or that saw another number of records, ends the benchmark."""
    if result["records"] != expect or not result.get("ok", True):
        raise SystemExit(f"{phase}: {result['records']:,} records (expected {expect:,}), first finding: "
                         f"{result.get('first')}")  # fmt: skip


def report(store: str, found: dict[str, list[dict[str, Any]]], records: int) -> None:
    """Per phase: records/s of each run and the median, seconds, peak RSS; the ratios; ROW lines."""
    rate = {phase: [r["records"] / r["seconds"] for r in results] for phase, results in found.items()}
    print(f"\n== {store}: {records:,} records, records/s per run (median), seconds, peak RSS of the process ==")
    for phase, results in found.items():
        runs = "  ".join(f"{x:>9,.0f}" for x in rate[phase])
        print(f"  {phase:13} {runs}   ({statistics.median(rate[phase]):>9,.0f})   "
              f"{statistics.median(r['seconds'] for r in results):6.1f} s   "
              f"{max(r['peak_rss_mib'] for r in results):6.0f} MiB (of which {results[0]['rss_before_mib']:.0f} "
              "before the phase)")  # fmt: skip
    print_ratios("verify ÷ plain SELECT", rate["verify"], rate["select"])
    if "links" in rate:
        print_ratios("verify ÷ taskgate's read without hashing (links)", rate["verify"], rate["links"])
    print_ratios("verify --file (export) ÷ plain SELECT", rate["verify-export"], rate["select"])
    for name, phase in (("verify", "verify"), ("verify --file (export)", "verify-export")):
        for ours, base in zip(rate[phase], rate["select"], strict=True):
            emit_row(f"audit {name}, {records:,} records ({store}) vs a plain SELECT", ours, base, "records/s", "—")


def print_ratios(label: str, ours: list[float], base: list[float]) -> None:
    """One line: the ratio of each run."""
    print(f"  {label}: {', '.join(f'{a / b:.3f}×' for a, b in zip(ours, base, strict=True))}")


# -- main ---------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """Command-line flags (the `--phase` ones are for the children)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help=f"records (a multiple of {PER_SESSION})")
    parser.add_argument("--runs", type=int, default=1, help="rounds of every phase (default 1; make bench: 3)")
    parser.add_argument("--links", action="store_true", help="also time taskgate's read of the links, no hashing")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--db", type=Path, help="SQLite file: built there and kept, or reused when it exists")
    parser.add_argument(
        "--postgres", nargs="?", const=PG_BENCH_URL, default=None, metavar="URL",
        help=f"build and verify on PostgreSQL (schema public reset first; default {PG_BENCH_URL})",
    )  # fmt: skip
    parser.add_argument("--prune", action="store_true", help="last, time a prune of every record (on a copy)")
    parser.add_argument("--phase", choices=(*PHASES, *PRUNE_PHASES, "export"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--key", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--export-file", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def database_of(args: argparse.Namespace, workdir: Path) -> tuple[str, Path]:
    """The database URL and key to measure, built unless `--db` names a built file (with its key beside it)."""
    sessions = max(1, args.rows // PER_SESSION)
    if args.postgres:
        reset_pg_schema(args.postgres)
        url, key = args.postgres, workdir / "audit-key" / "signing-key.pem"
    else:
        path = args.db or workdir / "audit.db"
        url, key = f"sqlite:///{path}", path.with_name(path.name + ".audit-key") / "signing-key.pem"
        if path.exists() and key.exists():
            print(f"reusing {path}")
            return url, key
    print(f"building {sessions * PER_SESSION:,} records ({sessions:,} sessions × {PER_SESSION}) on {url}")
    asyncio.run(prepare(url, key, sessions, args.seed))
    return url, key


def sqlite_copy(url: str, workdir: Path) -> str:
    """A copy of the SQLite file at `url` in `workdir` (a `--db` file stays as built); its URL."""
    copy = workdir / "pruned.db"
    shutil.copyfile(url.removeprefix("sqlite:///"), copy)
    return f"sqlite:///{copy}"


def prune_all(url: str, key: Path, export_file: Path) -> None:
    """A dry run, the prune, and a verify of what is left, each in a child, with the load before each."""
    print("\n== prune of every record (every session is finished) ==")
    for phase in (*PRUNE_PHASES, "verify"):
        before = load()
        found = in_child(phase, url, key, export_file)
        what = (f"{found['records']:,} records of {found['sessions']:,} sessions" if phase in PRUNE_PHASES
                else f"ok={found['ok']}, {found['records']:,} records left")  # fmt: skip
        print(f"  {phase:14} {found['seconds']:7.2f} s   {what}   (load {before:.2f})")


def main() -> None:
    """Build (or reuse), export once, run the rounds, report throughput and sizes, with the load average."""
    args = parse_args()
    if args.phase:
        return child(args)
    started = time.monotonic()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory(prefix="taskgate-audit-verify-") as tmp:
        workdir = Path(tmp)
        url, key = database_of(args, workdir)
        export_file = workdir / "export.jsonl"
        exported = in_child("export", url, key, export_file)
        records = exported["records"]
        print(f"  export: {records:,} records in {exported['seconds']:.1f} s ({records / exported['seconds']:,.0f} "
              f"records/s), {exported['bytes'] / 2**20:.0f} MiB")  # fmt: skip
        phases = tuple(p for p in PHASES if args.links or p != "links")
        found = rounds(url, key, export_file, args.runs, records, phases)
        store = "PostgreSQL" if args.postgres else "SQLite"
        report(store, found, records)
        sizes = asyncio.run(pg_sizes(url)) if args.postgres else sqlite_sizes(Path(url.removeprefix("sqlite:///")))
        report_sizes(sizes, records, exported["bytes"])
        if args.prune:
            prune_all(url if args.postgres else sqlite_copy(url, workdir), key, export_file)
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average after: {load_after}; total {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
