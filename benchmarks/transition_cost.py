"""Cost of one guarded, persisted transition (`SessionService.fire`) against a bare-driver baseline.

Latency: on a fresh SQLite file built by the real migrations, time `start` (ready → planning: WIP, plan-open
and blocker policies evaluated, plan row locked) and `plan_complete` (planning → executing: no policy applies)
one at a time. Interleaved with them, a bare `aiosqlite` connection on a second migrated file with the same
PRAGMAs writes what one transition must write at minimum: BEGIN IMMEDIATE, UPDATE of one `sessions` row (all
columns, version-checked), INSERT of one `transition_log` row, COMMIT. Ratio = ours / baseline (goal ≤ 1.5×).

Throughput: 200 sessions walk start → plan_complete → work_complete → approve → merge → cleanup_done
concurrently (`asyncio.gather`), on SQLite and PostgreSQL, next to the bare driver doing the same number of
UPDATE+INSERT transactions (sequentially on one aiosqlite connection; concurrently on an asyncpg pool).

Run:  .venv/bin/python benchmarks/transition_cost.py [--n 400] [--sessions 200] [--synchronous both] [--skip-pg]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import re
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiosqlite
import aiosqlite.core
import asyncpg
from bench_support import emit_row, reset_pg_schema_async
from sqlalchemy import event

from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sessions.engine import SessionService
from taskgate.bootstrap import build_services
from taskgate.domain.entities import Outcome, Session, Task, TaskStatus, TransitionRecord
from taskgate.domain.policies.book import default_policies
from taskgate.domain.states import SessionState
from taskgate.infrastructure.db import migrations
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from taskgate.infrastructure.git import GitPythonVcs
from taskgate.infrastructure.system import SystemClock, UuidGenerator

GOAL_RATIO = 1.5
PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/taskgate_bench"
ACTOR = "bench"
TASKS_PER_PLAN = 10
PREPARE = (
    ("create", None, "created"),
    ("initialize", "created", "initializing"),
    ("context_discovered", "initializing", "ready"),
)
WALK = ("start", "plan_complete", "work_complete", "approve", "merge", "cleanup_done")
WALK_STATES = ("planning", "executing", "verifying", "awaiting_merge", "merged", "completed")
GUARD_RESULTS = [
    {"policy": name, "passed": True, "severity": "error", "message": "", "suggestion": ""}
    for name in ("wip_limit", "plan_open", "task_unblocked")
]


# -- statistics -----------------------------------------------------------------------------------------------


def percentile(samples: list[int], pct: float) -> float:
    """Nearest-rank percentile of nanosecond samples, in milliseconds."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)] / 1e6


def median_ms(samples: list[int]) -> float:
    """Median of nanosecond samples, in milliseconds."""
    return statistics.median(samples) / 1e6


def verdict(ratio: float, goal: float) -> str:
    """'met' or 'MISSED' against a goal ratio."""
    return "met" if ratio <= goal else "MISSED"


async def timed(action: Callable[[], Awaitable[Any]]) -> int:
    """Nanoseconds one awaited call takes."""
    begin = time.perf_counter_ns()
    await action()
    return time.perf_counter_ns() - begin


async def timed_cpu(action: Callable[[], Awaitable[Any]]) -> tuple[int, int]:
    """(wall, event-loop-thread CPU) nanoseconds of one awaited call (CPU of driver threads not included)."""
    cpu = time.thread_time_ns()
    wall = await timed(action)
    return wall, time.thread_time_ns() - cpu


# -- taskgate side ------------------------------------------------------------------------------------------


@dataclass
class Stack:
    """A migrated database and the real services wired to it (as `bootstrap` does, minus settings)."""

    database: Database
    sessions: SessionService
    uow: Callable[..., SqlAlchemyUnitOfWork]


async def open_stack(url: str, *, synchronous: str = "FULL", wip_limit: int = TASKS_PER_PLAN) -> Stack:
    """Migrate `url` with the real Alembic chain and wire `SessionService` with the default policies."""
    database = Database(url, synchronous=synchronous)
    await migrations.upgrade(database)

    def uow(*, write: bool) -> SqlAlchemyUnitOfWork:
        return SqlAlchemyUnitOfWork(database, write=write)

    sessions, _tracker, _audit, _access = build_services(
        uow, clock=SystemClock(), ids=UuidGenerator(), vcs=GitPythonVcs(), policies=default_policies(wip_limit)
    )
    return Stack(database, sessions, uow)


async def ready_sessions(stack: Stack, count: int) -> list[str]:
    """`count` sessions in `ready`, in plans of TASKS_PER_PLAN tasks, written in one transaction.

    The rows are the ones `create_session` + `initialize` + `context_discovered` leave (session at version 3,
    three log rows), written with the repositories directly so that setup stays cheap; every timed transition
    goes through `SessionService.fire`.
    """
    now, ids = datetime.now(UTC), []
    async with stack.uow(write=True) as uow:
        project = await uow.projects.add("bench", "BENCH", "/nonexistent/bench", now)
        plan_id = 0
        for number in range(count):
            if number % TASKS_PER_PLAN == 0:
                plan_id = (await uow.plans.add(project.id, f"plan-{number}", now)).id
            task = Task(f"BENCH-{number}", project.id, plan_id, f"task {number}", "", 2, TaskStatus.OPEN, now)
            await uow.tasks.add(task)
            session = Session(str(uuid.uuid4()), task.id, project.id, plan_id, None, SessionState.READY, 3, now, now)
            await uow.sessions.add(session)
            for version, (trigger, src, dest) in enumerate(PREPARE, 1):
                await uow.transitions.append(
                    TransitionRecord(
                        None, session.id, trigger, src, dest, Outcome.APPLIED, ACTOR, None, [], version, now
                    )
                )
            ids.append(session.id)
        await uow.commit()
    return ids


def fire(stack: Stack, session_id: str, trigger: str) -> Callable[[], Awaitable[Any]]:
    """A zero-argument call that fires `trigger` on the session."""
    return lambda: stack.sessions.fire(FireTrigger(session_id, trigger, ACTOR))


def describe_sql(statement: str) -> str:
    """'SELECT sessions', 'UPDATE tasks', 'BEGIN IMMEDIATE', ...: the verb and the table it names first."""
    words = statement.replace("(", " ").split()
    verb = words[0].upper()
    if verb == "WITH":  # PostgreSQL's merged locks and writes: name each CTE (pg_writes.py, statements.py)
        inner = [describe_sql(part) for part in re.split(r" AS (?:MATERIALIZED\s*)?\(", statement)[1:]]
        return "WITH " + " + ".join(inner)
    marker = {"SELECT": "FROM", "INSERT": "INTO", "UPDATE": "UPDATE", "DELETE": "FROM"}.get(verb)
    upper = [w.upper() for w in words]
    if marker is None or marker not in upper:
        return " ".join(words[:2])
    return f"{verb} {words[upper.index(marker) + 1]}"


@contextmanager
def statement_log(database: Database) -> Iterator[list[str]]:
    """Collect the SQL statements sent to the driver while the block runs (first words only).

    On SQLite, sqlite3's own trace callback sees every statement, the hot ones taskgate runs on the driver
    directly and BEGIN/COMMIT included. On PostgreSQL each statement is one round trip, seen in one of two places:
    asyncpg's query loggers (`add_query_logger`, on each connection checked out meanwhile or kept by the write
    units: pg_kept.py) see what is sent through `Connection.execute`/`fetch` (BEGIN and COMMIT, and the statements
    taskgate runs on asyncpg directly), and SQLAlchemy's `before_cursor_execute` what its adapter sends (on prepared
    statements, which asyncpg does not log).
    The list gives the first group, then the second: asyncpg calls its loggers soon after a query, not in it, so the
    order across the two is not kept.
    """
    seen: list[str] = []
    engine = getattr(database.engine, "sync_engine", database.engine)  # async (PostgreSQL) or inline (SQLite)
    if not database.is_sqlite:
        logged: list[Any] = []
        through_sqlalchemy: list[str] = []

        def record(query: Any) -> None:
            seen.append(describe_sql(query.query.strip().rstrip(";")))

        def on_pg_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
            raw = dbapi_connection.driver_connection
            raw.add_query_logger(record)
            logged.append(raw)

        def on_cursor(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            through_sqlalchemy.append(f"{describe_sql(statement)} (SQLAlchemy)")

        for raw in database._pg_writers.drivers():  # write units' connections kept checked out (pg_kept.py)
            raw.add_query_logger(record)
            logged.append(raw)
        event.listen(engine, "checkout", on_pg_checkout)
        event.listen(engine, "before_cursor_execute", on_cursor)
        try:
            yield seen
        finally:
            event.remove(engine, "checkout", on_pg_checkout)
            event.remove(engine, "before_cursor_execute", on_cursor)
            for raw in logged:
                raw.remove_query_logger(record)
            seen.extend(through_sqlalchemy)
        return

    def trace(statement: str) -> None:
        seen.append(describe_sql(statement))

    traced: list[Any] = []

    def on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        dbapi_connection.set_trace_callback(trace)
        traced.append(dbapi_connection)

    writer = database._writer  # the commit groups' connection stays checked out
    if writer is not None:
        on_checkout(writer.sync_connection.connection.dbapi_connection, None, None)
    event.listen(engine, "checkout", on_checkout)
    try:
        yield seen
    finally:
        event.remove(engine, "checkout", on_checkout)
        for dbapi_connection in traced:
            dbapi_connection.set_trace_callback(None)


# -- bare-driver baseline -----------------------------------------------------------------------------------


def sqlite_ts(moment: datetime) -> str:
    """A UTC timestamp in the text form SQLAlchemy stores in SQLite."""
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


UPDATE_SESSION_SQL = (
    "UPDATE sessions SET task_id=?, project_id=?, plan_id=?, operator_id=?, version=?, state_data=?, "
    "workflow_stack=?, branch_name=?, worktree_path=?, compensation_plan=?, created_at=?, started_at=?, "
    "updated_at=?, completed_at=?, deadline=?, state=?, prior_state=? WHERE id=? AND version=?"
)
INSERT_LOG_SQL = (
    "INSERT INTO transition_log (session_id, trigger, from_state, to_state, outcome, actor, reason, "
    "guard_results, session_version, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

UPDATE_TASK_SQL = "UPDATE tasks SET status=? WHERE id=?"
INSERT_EVENT_SQL = "INSERT INTO events (session_id, kind, payload, at) VALUES (?, ?, ?, ?)"
EVENT_PAYLOAD = '{"trigger": "start", "from": "ready", "to": "planning"}'


@dataclass
class BareRow:
    """The one `sessions` row a baseline transaction rewrites, with its version tracked client-side."""

    session_id: str
    task_id: str
    project_id: int
    plan_id: int | None
    version: int
    created: str
    step: int = 0

    def next_params(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """UPDATE and INSERT parameters of the next transition (same column shapes as `fire` writes)."""
        now = sqlite_ts(datetime.now(UTC))
        before, after = WALK_STATES[self.step % 2], WALK_STATES[(self.step + 1) % 2]
        self.step += 1
        update = (
            self.task_id,
            self.project_id,
            self.plan_id,
            None,
            self.version + 1,
            "{}",
            "[]",
            None,
            None,
            None,
            self.created,
            now,
            now,
            None,
            None,
            after,
            None,
            self.session_id,
            self.version,
        )
        insert = (
            self.session_id,
            "start",
            before,
            after,
            "applied",
            ACTOR,
            None,
            json.dumps(GUARD_RESULTS),
            self.version + 1,
            now,
        )
        self.version += 1
        return update, insert


async def open_bare_sqlite(path: Path, synchronous: str) -> aiosqlite.Connection:
    """A bare aiosqlite connection with taskgate's PRAGMAs and autocommit (explicit BEGIN)."""
    conn = await aiosqlite.connect(path, isolation_level=None)
    for pragma in ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=30000", f"synchronous={synchronous}"):
        await conn.execute(f"PRAGMA {pragma}")
    return conn


async def bare_sqlite_transition(
    conn: aiosqlite.Connection, row: BareRow, *, event: bool = False, task_status: str | None = None
) -> None:
    """BEGIN IMMEDIATE; UPDATE sessions; [UPDATE tasks]; INSERT transition_log; [INSERT events]; COMMIT.

    Without the options: the minimal transition. With them: the same rows a taskgate transition writes
    (its event row always, its task row when the task's status changes, as on `start`).
    """
    update, insert = row.next_params()
    await conn.execute("BEGIN IMMEDIATE")
    cursor = await conn.execute(UPDATE_SESSION_SQL, update)
    assert cursor.rowcount == 1
    if task_status is not None:
        await conn.execute(UPDATE_TASK_SQL, (task_status, row.task_id))
    await conn.execute(INSERT_LOG_SQL, insert)
    if event:
        await conn.execute(INSERT_EVENT_SQL, (row.session_id, "session.transition", EVENT_PAYLOAD, insert[-1]))
    await conn.execute("COMMIT")


async def bare_rows(stack: Stack, ids: list[str]) -> list[BareRow]:
    """The baseline's view of existing session rows."""
    async with stack.uow(write=False) as uow:
        found = [await uow.sessions.get(session_id) for session_id in ids]
    return [BareRow(s.id, s.task_id, s.project_id, s.plan_id, s.version, sqlite_ts(s.created_at)) for s in found]


# -- latency ------------------------------------------------------------------------------------------------


@dataclass
class Latency:
    """Nanosecond samples of one latency run."""

    start: list[int] = field(default_factory=list)
    plan_complete: list[int] = field(default_factory=list)
    baseline: list[int] = field(default_factory=list)
    same_rows_start: list[int] = field(default_factory=list)
    same_rows_plan_complete: list[int] = field(default_factory=list)
    cpu: dict[str, list[int]] = field(
        default_factory=lambda: {
            name: [] for name in ("start", "plan_complete", "baseline", "same_rows_start", "same_rows_plan_complete")
        }
    )
    statements: dict[str, tuple[list[str], Counter[str]]] = field(default_factory=dict)
    round_trip: list[int] = field(default_factory=list)


def clean(path: Path) -> Path:
    """Remove a SQLite file and its WAL/SHM companions; returns the path."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


async def measure_latency(workdir: Path, synchronous: str, n: int, warmup: int) -> Latency:
    """Interleave ours (start, plan_complete) with the bare baseline, one transaction at a time."""
    ours = await open_stack(f"sqlite:///{clean(workdir / f'ours-{synchronous}.db')}", synchronous=synchronous)
    base_stack = await open_stack(f"sqlite:///{clean(workdir / f'base-{synchronous}.db')}")
    base_row = (await bare_rows(base_stack, await ready_sessions(base_stack, 1)))[0]
    await base_stack.database.dispose()
    bare = await open_bare_sqlite(workdir / f"base-{synchronous}.db", synchronous)
    try:
        ids = await ready_sessions(ours, n + warmup + 1)
        result = Latency()
        for i, session_id in enumerate(ids[1:]):
            samples = [
                await timed_cpu(fire(ours, session_id, "start")),
                await timed_cpu(lambda: bare_sqlite_transition(bare, base_row)),
                await timed_cpu(lambda: bare_sqlite_transition(bare, base_row, event=True, task_status="in_progress")),
                await timed_cpu(fire(ours, session_id, "plan_complete")),
                await timed_cpu(lambda: bare_sqlite_transition(bare, base_row)),
                await timed_cpu(lambda: bare_sqlite_transition(bare, base_row, event=True)),
            ]
            if i >= warmup:
                record_samples(result, samples)
        result.statements = await count_statements(ours, ids[0])  # its plan is in progress, like most starts
        result.round_trip = await round_trip_ns(workdir / f"base-{synchronous}.db")
        return result
    finally:
        await bare.close()
        await ours.database.dispose()


@contextmanager
def round_trips() -> Iterator[Counter[str]]:
    """Count calls the aiosqlite worker thread runs (each is one event-loop ↔ thread round trip), by name.

    Patches the private `aiosqlite.core.Connection._execute` for the duration of the block only.
    """
    counts: Counter[str] = Counter()
    original = aiosqlite.core.Connection._execute

    async def counting(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        counts[getattr(getattr(fn, "func", fn), "__name__", "call")] += 1
        return await original(self, fn, *args, **kwargs)

    aiosqlite.core.Connection._execute = counting
    try:
        yield counts
    finally:
        aiosqlite.core.Connection._execute = original


def record_samples(result: Latency, samples: list[tuple[int, int]]) -> None:
    """Store one iteration (see `measure_latency` for the order) as (wall, cpu) pairs."""
    names = ("start", "baseline", "same_rows_start", "plan_complete", "baseline", "same_rows_plan_complete")
    for name, (wall, cpu) in zip(names, samples, strict=True):
        getattr(result, name).append(wall)
        result.cpu[name].append(cpu)


async def count_statements(stack: Stack, session_id: str) -> dict[str, tuple[list[str], Counter[str]]]:
    """Statements and driver round trips of one `start` and one `plan_complete` (COMMIT listed by hand)."""
    found = {}
    for trigger in ("start", "plan_complete"):
        with statement_log(stack.database) as seen, round_trips() as trips:
            await fire(stack, session_id, trigger)()
            await asyncio.sleep(0.01)  # asyncpg calls its query loggers soon after the query, not in it
        found[trigger] = (seen, trips)
    return found


async def round_trip_ns(path: Path, count: int = 500) -> list[int]:
    """Latency of one bare aiosqlite round trip (`SELECT 1`), the unit most of our overhead is made of."""
    conn = await aiosqlite.connect(path)
    try:
        for _ in range(50):
            await conn.execute("SELECT 1")
        return [await timed(lambda: conn.execute("SELECT 1")) for _ in range(count)]
    finally:
        await conn.close()


def report_latency(synchronous: str, result: Latency) -> None:
    """Print median/p99 of each transition, the baseline, and the ratios against the goal."""
    base_med, base_p99 = median_ms(result.baseline), percentile(result.baseline, 99)
    print(f"\n== one transition, SQLite synchronous={synchronous} (n={len(result.start)} each) ==")
    print(f"  {'':44} {'median':>9} {'p99':>9}   ratios med (p99); goal ≤ {GOAL_RATIO}× the minimal baseline")
    for label, samples, same in (
        ("start (guarded: WIP, plan open, blockers)", result.start, result.same_rows_start),
        ("plan_complete (no policy applies)", result.plan_complete, result.same_rows_plan_complete),
    ):
        med, p99 = median_ms(samples), percentile(samples, 99)
        same_med, same_p99 = median_ms(same), percentile(same, 99)
        print(
            f"  {label:44} {med:8.3f}ms {p99:8.3f}ms   vs minimal {med / base_med:5.2f}× ({p99 / base_p99:5.2f}×) "
            f"{verdict(med / base_med, GOAL_RATIO)};  vs same rows {med / same_med:5.2f}× ({p99 / same_p99:5.2f}×)"
        )
        print(f"    baseline, same rows as {label.split()[0]}: {same_med:8.3f}ms {same_p99:8.3f}ms")
        emit_row(f"SQLite {synchronous}: {label.split()[0]}", med, base_med, "ms", f"≤ {GOAL_RATIO}×")
    print(f"  {'baseline, minimal: UPDATE session+INSERT log':44} {base_med:8.3f}ms {base_p99:8.3f}ms")
    print("  where the time goes:")
    cpu = ", ".join(f"{name} {median_ms(samples):.3f} ms" for name, samples in result.cpu.items())
    print(f"    median CPU of the event-loop thread per call (Python; excludes the driver thread): {cpu}")
    for trigger, (statements, trips) in result.statements.items():
        calls = ", ".join(f"{name} {n}" for name, n in trips.most_common())
        print(f"    {trigger}: {len(statements)} statements: {', '.join(statements)}")
        print(f"    {trigger}: {sum(trips.values())} aiosqlite thread round trips ({calls})")
    print(
        "    minimal baseline: 4 statements (BEGIN IMMEDIATE, UPDATE sessions, INSERT transition_log, COMMIT); "
        "same-rows baselines add INSERT events, and UPDATE tasks for start"
    )
    print(
        f"    one bare aiosqlite round trip (SELECT 1): median {median_ms(result.round_trip) * 1000:.0f} µs, "
        f"p99 {percentile(result.round_trip, 99) * 1000:.0f} µs"
    )


# -- throughput ---------------------------------------------------------------------------------------------


async def walk(stack: Stack, session_id: str) -> None:
    """One session through the whole happy path, one fire after the other."""
    for trigger in WALK:
        await stack.sessions.fire(FireTrigger(session_id, trigger, ACTOR))


def collect_setup_garbage() -> None:
    """Collect what the setup left (the sessions just built, an earlier phase's objects) before a timed part: a full
    collection of it landed in the third of a second 200 walks take, or did not, and moved ours by ~25% from one
    run to the next. The timed part's own collections are timed."""
    gc.collect()


async def run_walks(stack: Stack, ids: list[str]) -> tuple[float, int]:
    """All walks concurrently; returns (seconds, failed walks)."""
    collect_setup_garbage()
    begin = time.perf_counter_ns()
    outcomes = await asyncio.gather(*(walk(stack, sid) for sid in ids), return_exceptions=True)
    elapsed = (time.perf_counter_ns() - begin) / 1e9
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    for failure in failures[:3]:
        print(f"  walk failed: {type(failure).__name__}: {failure}")
    return elapsed, len(failures)


async def sqlite_throughput(workdir: Path, synchronous: str, sessions: int) -> tuple[float, float, int]:
    """(ours tx/s, baseline tx/s, failures) on one SQLite file: ours concurrently, then bare sequentially."""
    path = clean(workdir / f"tput-{synchronous}.db")
    stack = await open_stack(f"sqlite:///{path}", synchronous=synchronous)
    try:
        ids = await ready_sessions(stack, sessions)
        elapsed, failed = await run_walks(stack, ids)
        rows = await bare_rows(stack, ids)
    finally:
        await stack.database.dispose()
    bare = await open_bare_sqlite(path, synchronous)
    try:
        collect_setup_garbage()
        begin = time.perf_counter_ns()
        for _ in WALK:
            for row in rows:
                await bare_sqlite_transition(bare, row)
        base_elapsed = (time.perf_counter_ns() - begin) / 1e9
    finally:
        await bare.close()
    total = sessions * len(WALK)
    return total / elapsed, total / base_elapsed, failed


PG_UPDATE_SQL = (
    "UPDATE sessions SET task_id=$1, project_id=$2, plan_id=$3, operator_id=$4, version=$5, state_data=$6::json, "
    "workflow_stack=$7::json, branch_name=$8, worktree_path=$9, compensation_plan=$10, created_at=$11, "
    "started_at=$12, updated_at=$13, completed_at=$14, deadline=$15, state=$16, prior_state=$17 "
    "WHERE id=$18 AND version=$19"
)
PG_INSERT_SQL = (
    "INSERT INTO transition_log (session_id, trigger, from_state, to_state, outcome, actor, reason, guard_results, "
    "session_version, at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8::json, $9, $10) RETURNING seq"
)


async def bare_pg_walk(pool: asyncpg.Pool, row: BareRow, created: datetime) -> None:
    """The baseline of one walk: len(WALK) transactions of UPDATE sessions + INSERT transition_log."""
    for step, state in enumerate(WALK_STATES):
        now = datetime.now(UTC)
        async with pool.acquire() as conn, conn.transaction():
            status = await conn.execute(
                PG_UPDATE_SQL,
                row.task_id,
                row.project_id,
                row.plan_id,
                None,
                row.version + 1,
                "{}",
                "[]",
                None,
                None,
                None,
                created,
                now,
                now,
                None,
                None,
                state,
                None,
                row.session_id,
                row.version,
            )
            assert status == "UPDATE 1"
            await conn.fetchval(
                PG_INSERT_SQL,
                row.session_id,
                WALK[step],
                ("ready", *WALK_STATES)[step],
                state,
                "applied",
                ACTOR,
                None,
                json.dumps(GUARD_RESULTS),
                row.version + 1,
                now,
            )
        row.version += 1


async def bare_pg_transition(conn: asyncpg.Connection, row: BareRow, state: str) -> None:
    """The minimal transition on a bare asyncpg connection: BEGIN, UPDATE sessions, INSERT transition_log, COMMIT."""
    now = datetime.now(UTC)
    async with conn.transaction():
        status = await conn.execute(
            PG_UPDATE_SQL, row.task_id, row.project_id, row.plan_id, None, row.version + 1, "{}", "[]", None, None,
            None, now, now, now, None, None, state, None, row.session_id, row.version,
        )  # fmt: skip
        assert status == "UPDATE 1"
        await conn.fetchval(
            PG_INSERT_SQL, row.session_id, "suspend", "ready", state, "applied", ACTOR, None,
            json.dumps(GUARD_RESULTS), row.version + 1, now,
        )  # fmt: skip
    row.version += 1


async def measure_pg_latency(url: str, n: int, warmup: int) -> Latency:
    """As `measure_latency`, on PostgreSQL: ours through SessionService, the minimal baseline on asyncpg."""
    await reset_pg_schema_async(url)
    ours = await open_stack(url)
    conn = await asyncpg.connect(url.replace("+asyncpg", ""))
    try:
        ids = await ready_sessions(ours, n + warmup + 2)
        base_row = (await bare_rows(ours, ids[:1]))[0]
        result = Latency()
        for i, session_id in enumerate(ids[2:]):
            samples = [
                await timed_cpu(fire(ours, session_id, "start")),
                await timed_cpu(lambda: bare_pg_transition(conn, base_row, "ready")),
                await timed_cpu(lambda: bare_pg_transition(conn, base_row, "ready")),
                await timed_cpu(fire(ours, session_id, "plan_complete")),
                await timed_cpu(lambda: bare_pg_transition(conn, base_row, "ready")),
                await timed_cpu(lambda: bare_pg_transition(conn, base_row, "ready")),
            ]
            if i >= warmup:
                record_samples(result, samples)
        result.statements = await count_statements(ours, ids[1])
        return result
    finally:
        await conn.close()
        await ours.database.dispose()


def report_pg_latency(result: Latency) -> None:
    """Median/p99 of start and plan_complete on PostgreSQL against the minimal asyncpg transaction."""
    base_med, base_p99 = median_ms(result.baseline), percentile(result.baseline, 99)
    print(f"\n== one transition, PostgreSQL (n={len(result.start)} each) ==")
    for label, samples in (("start (guarded)", result.start), ("plan_complete", result.plan_complete)):
        med, p99 = median_ms(samples), percentile(samples, 99)
        print(
            f"  {label:44} {med:8.3f}ms {p99:8.3f}ms   vs minimal {med / base_med:5.2f}× ({p99 / base_p99:5.2f}×) "
            f"{verdict(med / base_med, GOAL_RATIO)}"
        )
        emit_row(f"PostgreSQL: {label.split()[0]}", med, base_med, "ms", f"≤ {GOAL_RATIO}×")
    print(f"  {'baseline, minimal (asyncpg): UPDATE session+INSERT log':44} {base_med:8.3f}ms {base_p99:8.3f}ms")
    cpu = ", ".join(f"{name} {median_ms(samples):.3f} ms" for name, samples in result.cpu.items())
    print(f"    median CPU of the event-loop thread per call: {cpu}")
    for trigger, (statements, _trips) in result.statements.items():
        print(f"    {trigger}: {len(statements)} statements (round trips): {', '.join(statements)}")


async def pg_throughput(url: str, sessions: int) -> tuple[float, float, int]:
    """(ours tx/s, baseline tx/s, failures) on PostgreSQL; baseline = asyncpg pool of the same size (30)."""
    await reset_pg_schema_async(url)
    stack = await open_stack(url)
    try:
        ids = await ready_sessions(stack, sessions)
        elapsed, failed = await run_walks(stack, ids)
        rows = await bare_rows(stack, ids)
    finally:
        await stack.database.dispose()
    created = datetime.now(UTC)
    pool = await asyncpg.create_pool(url.replace("+asyncpg", ""), min_size=10, max_size=30)
    try:
        collect_setup_garbage()
        begin = time.perf_counter_ns()
        await asyncio.gather(*(bare_pg_walk(pool, row, created) for row in rows))
        base_elapsed = (time.perf_counter_ns() - begin) / 1e9
    finally:
        await pool.close()
    total = sessions * len(WALK)
    return total / elapsed, total / base_elapsed, failed


THROUGHPUT_GOAL = 2.0  # issue 20: concurrent transitions at least twice the floor of bare commits


def report_throughput(label: str, ours: float, base: float, failed: int, sessions: int) -> None:
    """Print one throughput line with the ratio ours ÷ floor (the baseline's transactions per second)."""
    ratio = ours / base
    met = "met" if ratio >= THROUGHPUT_GOAL else "MISSED"
    print(
        f"  {label:28} ours {ours:7.0f} transitions/s   floor {base:7.0f} tx/s   "
        f"ours ÷ floor {ratio:5.2f}× (goal ≥ {THROUGHPUT_GOAL}×: {met})   failed walks {failed}/{sessions}"
    )
    emit_row(f"{sessions} concurrent sessions, {label}", ours, base, "tx/s", f"≥ {THROUGHPUT_GOAL}×")


# -- main ---------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="timed iterations per transition (default 400)")
    parser.add_argument("--warmup", type=int, default=30, help="untimed iterations first (default 30)")
    parser.add_argument("--sessions", type=int, default=200, help="concurrent sessions for throughput (200)")
    parser.add_argument(
        "--synchronous",
        choices=("FULL", "NORMAL", "both"),
        default="both",
        help="SQLite synchronous level(s) to run (default both)",
    )
    parser.add_argument("--skip-pg", action="store_true", help="skip the PostgreSQL runs")
    parser.add_argument("--pg-url", default=PG_URL, help=f"PostgreSQL database to reset and use ({PG_URL})")
    return parser.parse_args()


async def main() -> None:
    """Run latency and throughput for each synchronous level, then PostgreSQL throughput."""
    args = parse_args()
    levels = ("FULL", "NORMAL") if args.synchronous == "both" else (args.synchronous,)
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory(prefix="taskgate-bench-") as tmp:
        workdir = Path(tmp)
        for level in levels:
            report_latency(level, await measure_latency(workdir, level, args.n, args.warmup))
        print(
            f"\n== throughput: {args.sessions} sessions × {len(WALK)} transitions ({' → '.join(WALK)}), "
            "asyncio.gather =="
        )
        for level in levels:
            report_throughput(
                f"SQLite synchronous={level}", *await sqlite_throughput(workdir, level, args.sessions), args.sessions
            )
    if not args.skip_pg:
        report_pg_latency(await measure_pg_latency(args.pg_url, args.n, args.warmup))
        report_throughput("PostgreSQL", *await pg_throughput(args.pg_url, args.sessions), args.sessions)
    print(
        "\n(baselines: SQLite = one bare aiosqlite connection, transactions back to back (one writer anyway); "
        "PostgreSQL = asyncpg pool of 30, same concurrency)"
    )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
