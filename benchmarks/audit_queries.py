"""Audit reads on a large transition log: `history`, `state_at` and `AuditService.transitions`.

Builds a database through the real migrations holding `--rows` transition_log rows (default 1,000,000) over
up to 10,000 sessions, one year of timestamps and several actors. Every session's rows form a valid chain of
the transition table (created → initializing → ready → planning → executing → verifying, then loops of
request_changes/work_complete and suspend/resume, some with a WIP-blocked resume, and for most sessions
approve → merge → cleanup_done), with strictly increasing `at`, so `state_at` can replay them. The
replay is checked against the live `sessions` row before anything is timed.

Each query runs through the real service code and, as the baseline, as the same SQL statements on a bare
driver connection (sqlite3; asyncpg for --postgres) fetching raw tuples. Printed: median and p99 per query,
the ratio to its goal (history ≤ 5 ms, state_at ≤ 10 ms, transitions ≤ 20 ms) and to its baseline.

Run:  .venv/bin/python benchmarks/audit_queries.py [--rows 1000000] [--db PATH] [--runs 200] [--postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from bench_support import reset_pg_schema_async
from sqlalchemy import func, insert, select, text

from taskgate.application.audit.queries import AuditService
from taskgate.application.sessions.engine import SessionService
from taskgate.application.sessions.ports import TransitionQuery
from taskgate.bootstrap import build_services
from taskgate.domain.entities import task_status_for
from taskgate.domain.policies.book import default_policies
from taskgate.domain.states import SessionState
from taskgate.infrastructure.db import migrations
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.connections import AnyConnection
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from taskgate.infrastructure.git import GitPythonVcs
from taskgate.infrastructure.system import SystemClock, UuidGenerator

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/taskgate_bench"
GOALS_MS = {"history": 5.0, "state_at": 10.0, "transitions": 20.0}
MAX_SESSIONS = 10_000
SESSIONS_PER_BATCH = 100
TASKS_PER_PLAN = 100
OPERATORS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
SYSTEM = "system"
AUTO_TRIGGERS = {"initialize", "context_discovered", "work_complete", "cleanup_done"}
YEAR_START = datetime(2025, 1, 1, tzinfo=UTC)
WINDOW_ROWS = 100  # target size of one audit-query answer
PASSED = {"passed": True, "severity": "error", "message": "", "suggestion": ""}
START_GUARDS = [{"policy": p, **PASSED} for p in ("wip_limit", "plan_open", "task_unblocked")]
RESUME_GUARDS = [{"policy": "wip_limit", **PASSED}]
BLOCKED_GUARDS = [
    {
        "policy": "wip_limit",
        "passed": False,
        "severity": "error",
        "message": "plan 'plan-1' already has 3 of 3 sessions in progress",
        "suggestion": "finish, suspend or cancel a session of this plan, then start again",
    }
]
GUARDS_BY_TRIGGER = {"start": START_GUARDS, "resume": RESUME_GUARDS}
NO_GUARDS: list[dict[str, Any]] = []
LOG_COLUMNS = (
    'seq, session_id, "trigger", from_state, to_state, outcome, actor, reason, guard_results, session_version, at'
)

Step = tuple[str, str | None, str, str]  # trigger, from_state, to_state, outcome
Call = Callable[[], Awaitable[Any]]


# -- statistics -----------------------------------------------------------------------------------------------


def percentile(samples: list[int], pct: float) -> float:
    """Nearest-rank percentile of nanosecond samples, in milliseconds."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)] / 1e6


def median_ms(samples: list[int]) -> float:
    """Median of nanosecond samples, in milliseconds."""
    return statistics.median(samples) / 1e6


# -- the generated log --------------------------------------------------------------------------------------

PREFIX: list[Step] = [
    ("create", None, "created", "applied"),
    ("initialize", "created", "initializing", "applied"),
    ("context_discovered", "initializing", "ready", "applied"),
    ("start", "ready", "planning", "applied"),
    ("plan_complete", "planning", "executing", "applied"),
    ("work_complete", "executing", "verifying", "applied"),
]
FINISH: list[Step] = [
    ("approve", "verifying", "awaiting_merge", "applied"),
    ("merge", "awaiting_merge", "merged", "applied"),
    ("cleanup_done", "merged", "completed", "applied"),
]
REWORK: list[Step] = [
    ("request_changes", "verifying", "executing", "applied"),
    ("work_complete", "executing", "verifying", "applied"),
]
SUSPEND: Step = ("suspend", "verifying", "suspended", "applied")
RESUME: Step = ("resume", "suspended", "verifying", "applied")
RESUME_BLOCKED: Step = ("resume", "suspended", "suspended", "blocked")


def middle_loops(count: int, rng: random.Random) -> Iterator[Step]:
    """`count` steps that leave and re-enter `verifying` (or end suspended when one step is left over)."""
    while count > 0:
        if count == 1:
            yield SUSPEND
            return
        if count % 2 == 1:
            yield from (SUSPEND, RESUME_BLOCKED, RESUME)
            count -= 3
        else:
            yield from REWORK if rng.random() < 0.6 else (SUSPEND, RESUME)
            count -= 2


def session_chain(length: int, rng: random.Random) -> list[Step]:
    """A valid walk of the transition table with exactly `length` (≥ 6) log rows."""
    finish = rng.random() < 0.7 and length - len(PREFIX) - len(FINISH) != 1 and length >= len(PREFIX) + 3
    tail = FINISH if finish else []
    return [*PREFIX, *middle_loops(length - len(PREFIX) - len(tail), rng), *tail]


def guards_for(step: Step) -> list[dict[str, Any]]:
    """The guard results the engine would store with this row."""
    trigger, _src, _dest, outcome = step
    if outcome == "blocked":
        return BLOCKED_GUARDS
    return GUARDS_BY_TRIGGER.get(trigger, NO_GUARDS)


@dataclass
class GeneratedSession:
    """One session's rows plus the `sessions`/`tasks` rows its final state implies."""

    log: list[dict[str, Any]]
    session: dict[str, Any]
    task: dict[str, Any]


def generate_session(number: int, length: int, plan_id: int, project_id: int, rng: random.Random) -> GeneratedSession:
    """Log rows of session `number` (timestamps strictly increasing, version +1 per applied row)."""
    session_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    operator = rng.choice(OPERATORS)
    at = YEAR_START + timedelta(seconds=rng.uniform(0, 330 * 86400))
    created, version, log = at, 0, []
    for step in session_chain(length, rng):
        trigger, src, dest, outcome = step
        version += outcome == "applied"
        log.append(
            {
                "session_id": session_id,
                "trigger": trigger,
                "from_state": src,
                "to_state": dest,
                "outcome": outcome,
                "actor": SYSTEM if trigger in AUTO_TRIGGERS else operator,
                "reason": None,
                "guard_results": guards_for(step),
                "session_version": version,
                "at": at,
            }
        )
        at += timedelta(seconds=rng.uniform(60, 4 * 3600))
    return finish_session(number, session_id, operator, created, log, plan_id, project_id)


def finish_session(
    number: int,
    session_id: str,
    operator: str,
    created: datetime,
    log: list[dict[str, Any]],
    plan_id: int,
    project_id: int,
) -> GeneratedSession:
    """The `sessions` and `tasks` rows matching the end of `log`."""
    applied = [row for row in log if row["outcome"] == "applied"]
    last, state = applied[-1], SessionState(applied[-1]["to_state"])
    task_id = f"AUDIT-{number}"
    status = task_status_for(state, SessionState(last["from_state"])) or "in_progress"
    session = {
        "id": session_id,
        "task_id": task_id,
        "project_id": project_id,
        "plan_id": plan_id,
        "operator_id": operator,
        "state": state.value,
        "prior_state": "verifying" if state == SessionState.SUSPENDED else None,
        "state_data": {},
        "workflow_stack": [],
        "version": last["session_version"],
        "created_at": created,
        "started_at": applied[3]["at"],
        "updated_at": last["at"],
        "completed_at": last["at"] if state == SessionState.COMPLETED else None,
    }
    task = {
        "id": task_id,
        "project_id": project_id,
        "plan_id": plan_id,
        "title": f"audit task {number}",
        "description": "",
        "priority": 2,
        "status": str(status),
        "created_at": created,
    }
    return GeneratedSession(log, session, task)


# -- building the database ----------------------------------------------------------------------------------


@asynccontextmanager
async def write_transaction(database: Database) -> AsyncIterator[AnyConnection]:
    """A connection inside a real write transaction, committed on success.

    `Database.open(write=True)` takes SQLite's write lock up front, as taskgate's own writes do.
    """
    conn = await database.open(write=True)
    try:
        yield conn
        await conn.commit()
    finally:
        await conn.close()


async def seed_owners(database: Database, plans: int) -> tuple[int, list[int]]:
    """The project, its plans and the operators every generated row points at."""
    now = datetime.now(UTC)
    async with write_transaction(database) as conn:
        project = await conn.execute(
            insert(t.projects).values(
                name="audit", key="AUDIT", root_path="/nonexistent/audit", config={}, created_at=now
            )
        )
        project_id = project.inserted_primary_key[0]
        await conn.execute(
            insert(t.operators),
            [
                {
                    "id": op,
                    "name": op,
                    "email": None,
                    "roles": ["admin"],
                    "permissions": ["read"],
                    "max_active_sessions": 10,
                    "created_at": now,
                }
                for op in OPERATORS
            ],
        )
        plan_ids = []
        for number in range(plans):
            result = await conn.execute(
                insert(t.plans).values(
                    project_id=project_id, name=f"plan-{number}", status="in_progress", created_at=now
                )
            )
            plan_ids.append(result.inserted_primary_key[0])
    return project_id, plan_ids


async def insert_batch(database: Database, batch: list[GeneratedSession]) -> int:
    """Insert one batch of tasks, sessions and log rows with executemany; returns the log rows written."""
    log = [row for generated in batch for row in generated.log]
    async with write_transaction(database) as conn:
        await conn.execute(insert(t.tasks), [g.task for g in batch])
        await conn.execute(insert(t.sessions), [g.session for g in batch])
        await conn.execute(insert(t.transition_log), log)
    return len(log)


async def build(database: Database, rows: int, seed: int) -> None:
    """Fill a migrated, empty database with `rows` log rows, printing progress."""
    sessions = max(1, min(MAX_SESSIONS, rows // 100))
    per_session, extra = divmod(rows, sessions)
    rng = random.Random(seed)
    project_id, plan_ids = await seed_owners(database, math.ceil(sessions / TASKS_PER_PLAN))
    begin, written, batch, next_report = time.perf_counter(), 0, [], rows / 10
    for number in range(sessions):
        length = per_session + (number < extra)
        batch.append(generate_session(number, length, plan_ids[number // TASKS_PER_PLAN], project_id, rng))
        if len(batch) == SESSIONS_PER_BATCH or number == sessions - 1:
            written += await insert_batch(database, batch)
            batch = []
            if written >= next_report:
                next_report += rows / 10
                elapsed = time.perf_counter() - begin
                print(f"  built {written:>9,} / {rows:,} rows ({written / elapsed:,.0f} rows/s)", flush=True)
    print(f"  built in {time.perf_counter() - begin:.1f} s ({sessions:,} sessions, {per_session}+ rows each)")
    if not database.is_sqlite:
        async with write_transaction(database) as conn:
            await conn.execute(text("ANALYZE"))


async def prepare_sqlite(path: Path | None, rows: int, seed: int) -> Path:
    """The SQLite file to measure: reused if `path` exists, else migrated and built (in `path` or a temp dir)."""
    if path is not None and path.exists():
        print(f"reusing {path}")
        return path
    target = path or Path(tempfile.mkdtemp(prefix="taskgate-audit-")) / f"audit-{rows}.db"
    print(f"building {target} through the migrations")
    # synchronous=OFF for the build only, set by the engine on every new connection: a PRAGMA sent on a connection
    # that has begun a transaction fails ("Safety level may not be changed inside a transaction")
    database = Database(f"sqlite:///{target}", synchronous="OFF")
    try:
        await migrations.upgrade(database)
        await build(database, rows, seed)
    except BaseException:
        await database.dispose()
        for leftover in (target, target.with_name(target.name + "-wal"), target.with_name(target.name + "-shm")):
            leftover.unlink(missing_ok=True)  # a half-built file would be "reused" by the next run
        raise
    await database.dispose()
    checkpoint(target)
    return target


def checkpoint(path: Path) -> None:
    """Fold the WAL into the main file and refresh planner statistics, as a long-running service would."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA optimize")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


async def prepare_postgres(url: str, rows: int, seed: int) -> None:
    """Drop and recreate schema public, migrate, and build the same rows on PostgreSQL."""
    database = Database(url)
    try:
        await reset_pg_schema_async(url)
        await migrations.upgrade(database)
        print(f"building {rows:,} rows on PostgreSQL")
        await build(database, rows, seed)
    finally:
        await database.dispose()


# -- what to query ------------------------------------------------------------------------------------------


@dataclass
class Probe:
    """Query parameters drawn from the database itself (so a reused file works the same)."""

    session_ids: list[str]
    moments: list[datetime]  # one instant inside each sampled session's life
    windows: list[tuple[str, datetime, datetime]]  # actor, since, until
    total_rows: int


async def draw_probe(database: Database, runs: int, seed: int) -> Probe:
    """Sample sessions, instants and actor windows sized to return about WINDOW_ROWS rows."""
    rng = random.Random(seed + 1)
    c = t.transition_log.c
    async with database.connect() as conn:
        ids = sorted((await conn.execute(select(t.sessions.c.id))).scalars())
        counts = dict((await conn.execute(select(c.actor, func.count()).group_by(c.actor))).all())
        first, last = (await conn.execute(select(func.min(c.at), func.max(c.at)))).one()
        sample = rng.sample(ids, min(runs, len(ids)))
        spans = {
            sid: (await conn.execute(select(func.min(c.at), func.max(c.at)).where(c.session_id == sid))).one()
            for sid in sample
        }
    first, last = _aware(first), _aware(last)
    moments = [_aware(lo) + (_aware(hi) - _aware(lo)) * rng.random() for lo, hi in spans.values()]
    return Probe(sample, moments, _windows(counts, first, last, runs, rng), sum(counts.values()))


def _aware(moment: datetime) -> datetime:
    """The instant as an aware UTC datetime."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _windows(
    counts: dict[str, int], first: datetime, last: datetime, runs: int, rng: random.Random
) -> list[tuple[str, datetime, datetime]]:
    """(actor, since, until) ranges each expected to hold about WINDOW_ROWS rows of that actor."""
    operators = [a for a in counts if a != SYSTEM] or list(counts)
    span = last - first
    windows = []
    for _ in range(runs):
        actor = rng.choice(operators)
        width = span * min(1.0, WINDOW_ROWS / counts[actor])
        since = first + (span - width) * rng.random()
        windows.append((actor, since, since + width))
    return windows


# -- services and checks ------------------------------------------------------------------------------------


def wire(database: Database) -> tuple[SessionService, AuditService]:
    """The real services over `database`, as bootstrap wires them."""

    def uow(*, write: bool) -> SqlAlchemyUnitOfWork:
        return SqlAlchemyUnitOfWork(database, write=write)

    sessions, _tracker, audit, _access = build_services(
        uow, clock=SystemClock(), ids=UuidGenerator(), vcs=GitPythonVcs(), policies=default_policies()
    )
    return sessions, audit


async def verify_replay(sessions: SessionService, probe: Probe, checks: int = 50) -> None:
    """Prove state_at replays right: now == the live row, and at every applied row's instant == its to_state."""
    later = datetime.now(UTC) + timedelta(days=1)
    mid_checks = 0
    for session_id in probe.session_ids[:checks]:
        live = (await sessions.get(session_id)).state
        replayed = await sessions.state_at(session_id, later)
        assert replayed == live, f"{session_id}: replay says {replayed}, sessions row says {live}"
        for record in (await sessions.history(session_id, limit=100))[-5:]:
            if record.outcome.value == "applied":
                assert await sessions.state_at(session_id, record.at) == record.to_state
                mid_checks += 1
    print(
        f"  replay check: state_at(now) == live sessions.state for {min(checks, len(probe.session_ids))} "
        f"sessions; state_at(row.at) == row.to_state for {mid_checks} rows: OK"
    )


# -- baselines ----------------------------------------------------------------------------------------------


def sqlite_ts(moment: datetime) -> str:
    """A UTC timestamp in the text form SQLAlchemy stores in SQLite."""
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


HISTORY_SQL = f"SELECT {LOG_COLUMNS} FROM transition_log WHERE session_id = ? ORDER BY seq DESC LIMIT ?"
UNTIL_SQL = f"SELECT {LOG_COLUMNS} FROM transition_log WHERE session_id = ? AND at <= ? AND outcome = ? ORDER BY seq"
QUERY_SQL = f"SELECT {LOG_COLUMNS} FROM transition_log WHERE actor = ? AND at >= ? AND at <= ? ORDER BY at, seq LIMIT ?"
SESSION_SQL = "SELECT * FROM sessions WHERE id = ?"


def pg_sql(sql: str) -> str:
    """The statement with $1, $2, ... placeholders."""
    parts = sql.split("?")
    return "".join(f"{part}${i}" if i < len(parts) else part for i, part in enumerate(parts, 1))


class SqliteBaseline:
    """The same statements the services send (session lookup + log query), on a bare sqlite3 connection."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)

    async def history(self, session_id: str) -> list[Any]:
        """What `SessionService.history(limit=100)` sends."""
        self.conn.execute(SESSION_SQL, (session_id,)).fetchall()
        return self.conn.execute(HISTORY_SQL, (session_id, 100)).fetchall()

    async def state_at(self, session_id: str, at: datetime) -> list[Any]:
        """What `SessionService.state_at` sends (no replay: the raw rows only)."""
        self.conn.execute(SESSION_SQL, (session_id,)).fetchall()
        return self.conn.execute(UNTIL_SQL, (session_id, sqlite_ts(at), "applied")).fetchall()

    async def transitions(self, actor: str, since: datetime, until: datetime) -> list[Any]:
        """What `AuditService.transitions` sends for an actor and a time range (limit 1000)."""
        return self.conn.execute(QUERY_SQL, (actor, sqlite_ts(since), sqlite_ts(until), 1000)).fetchall()

    def plans(self, probe: Probe) -> dict[str, str]:
        """EXPLAIN QUERY PLAN of each log query, for the report."""
        actor, since, until = probe.windows[0]
        args = {
            "history": (HISTORY_SQL, (probe.session_ids[0], 100)),
            "state_at": (UNTIL_SQL, (probe.session_ids[0], sqlite_ts(probe.moments[0]), "applied")),
            "transitions": (QUERY_SQL, (actor, sqlite_ts(since), sqlite_ts(until), 1000)),
        }
        return {
            name: "; ".join(r[-1] for r in self.conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
            for name, (sql, params) in args.items()
        }

    async def close(self) -> None:
        """Close the connection."""
        self.conn.close()


class PgBaseline:
    """The same statements on one bare asyncpg connection."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def history(self, session_id: str) -> list[Any]:
        """What `SessionService.history(limit=100)` sends."""
        await self.conn.fetch(pg_sql(SESSION_SQL), session_id)
        return await self.conn.fetch(pg_sql(HISTORY_SQL), session_id, 100)

    async def state_at(self, session_id: str, at: datetime) -> list[Any]:
        """What `SessionService.state_at` sends (no replay: the raw rows only)."""
        await self.conn.fetch(pg_sql(SESSION_SQL), session_id)
        return await self.conn.fetch(pg_sql(UNTIL_SQL), session_id, at, "applied")

    async def transitions(self, actor: str, since: datetime, until: datetime) -> list[Any]:
        """What `AuditService.transitions` sends for an actor and a time range (limit 1000)."""
        return await self.conn.fetch(pg_sql(QUERY_SQL), actor, since, until, 1000)

    def plans(self, _probe: Probe) -> dict[str, str]:
        """No plans printed for PostgreSQL."""
        return {}

    async def close(self) -> None:
        """Close the connection."""
        await self.conn.close()


# -- measuring ----------------------------------------------------------------------------------------------


@dataclass
class Samples:
    """Nanoseconds per run: ours (wall and event-loop-thread CPU) and the baseline (wall)."""

    ours: list[int]
    ours_cpu: list[int]
    base: list[int]
    rows: int  # rows the log query returned, summed over the runs


async def sample(ours: list[Call], base: list[Call], warmup: int) -> Samples:
    """Time ours and the baseline call by call, alternating (after `warmup` untimed pairs)."""
    for call in (*ours[:warmup], *base[:warmup]):
        await call()
    result = Samples([], [], [], 0)
    for mine, theirs in zip(ours, base, strict=True):
        cpu, begin = time.thread_time_ns(), time.perf_counter_ns()
        await mine()
        result.ours.append(time.perf_counter_ns() - begin)
        result.ours_cpu.append(time.thread_time_ns() - cpu)
        begin = time.perf_counter_ns()
        result.rows += len(await theirs())
        result.base.append(time.perf_counter_ns() - begin)
    return result


def query_calls(
    sessions: SessionService, audit: AuditService, base: Any, probe: Probe
) -> dict[str, tuple[list[Call], list[Call]]]:
    """Per query: (our calls, baseline calls), one per run, with the same parameters."""
    pairs = list(zip(probe.session_ids, probe.moments, strict=True))
    return {
        "history": (
            [lambda s=s: sessions.history(s, limit=100) for s in probe.session_ids],
            [lambda s=s: base.history(s) for s in probe.session_ids],
        ),
        "state_at": (
            [lambda s=s, m=m: sessions.state_at(s, m) for s, m in pairs],
            [lambda s=s, m=m: base.state_at(s, m) for s, m in pairs],
        ),
        "transitions": (
            [lambda w=w: audit.transitions(TransitionQuery(actor=w[0], since=w[1], until=w[2])) for w in probe.windows],
            [lambda w=w: base.transitions(*w) for w in probe.windows],
        ),
    }


async def measure(label: str, database: Database, base: Any, runs: int, seed: int) -> None:
    """Verify the replay, then time every query, ours and baseline alternating per query, and report."""
    sessions, audit = wire(database)
    probe = await draw_probe(database, runs, seed)
    print(f"\n== audit queries on {label}: {probe.total_rows:,} log rows, {len(probe.session_ids)} runs each ==")
    await verify_replay(sessions, probe)
    print(
        f"  {'query':13} {'median':>9} {'p99':>9} {'goal':>7}  ratio-to-goal   "
        f"{'baseline med':>12} {'p99':>9}  ratio med (p99)  rows/run  loop CPU"
    )
    for name, (ours_calls, base_calls) in query_calls(sessions, audit, base, probe).items():
        report_line(name, await sample(ours_calls, base_calls, warmup=20))
    for name, plan in base.plans(probe).items():
        print(f"  plan {name}: {plan}")


def report_line(name: str, found: Samples) -> None:
    """One row of the table: ours against the goal, and against the baseline."""
    med, p99, goal = median_ms(found.ours), percentile(found.ours, 99), GOALS_MS[name]
    base_med, base_p99 = median_ms(found.base), percentile(found.base, 99)
    met = "met" if p99 <= goal else ("median met" if med <= goal else "MISSED")
    print(
        f"  {name:13} {med:8.3f}ms {p99:8.3f}ms {goal:5.0f}ms  {med / goal:4.2f} ({p99 / goal:4.2f}) {met:10} "
        f"{base_med:10.3f}ms {base_p99:8.3f}ms  {med / base_med:5.1f}× ({p99 / base_p99:5.1f}×)  "
        f"{found.rows / len(found.ours):7.1f} {median_ms(found.ours_cpu):8.3f}ms"
    )


# -- main ---------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="transition_log rows to build (1,000,000)")
    parser.add_argument("--db", type=Path, help="SQLite file: reused if it exists, else built there and kept")
    parser.add_argument("--runs", type=int, default=200, help="timed runs per query (200)")
    parser.add_argument("--seed", type=int, default=7, help="random seed of the generated data")
    parser.add_argument("--postgres", action="store_true", help="also build and measure on PostgreSQL")
    parser.add_argument("--pg-url", default=PG_URL, help=f"PostgreSQL database to reset and use ({PG_URL})")
    args = parser.parse_args()
    if args.rows < 1000:
        parser.error("--rows must be at least 1000")
    return args


async def run_sqlite(args: argparse.Namespace) -> None:
    """Build or reuse the SQLite file and measure on it; a temporary file is deleted afterwards."""
    path = await prepare_sqlite(args.db, args.rows, args.seed)
    database, base = Database(f"sqlite:///{path}"), SqliteBaseline(path)
    try:
        await measure(f"SQLite ({path.stat().st_size / 2**20:,.0f} MiB)", database, base, args.runs, args.seed)
    finally:
        await base.close()
        await database.dispose()
        if args.db is None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            path.parent.rmdir()


async def run_postgres(args: argparse.Namespace) -> None:
    """Build the same rows on PostgreSQL and measure there."""
    await prepare_postgres(args.pg_url, args.rows, args.seed)
    database = Database(args.pg_url)
    base = PgBaseline(await asyncpg.connect(args.pg_url.replace("+asyncpg", "")))
    try:
        await measure("PostgreSQL", database, base, args.runs, args.seed)
    finally:
        await base.close()
        await database.dispose()


async def main() -> None:
    """SQLite always; PostgreSQL with --postgres."""
    args = parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} (2 cores)")
    await run_sqlite(args)
    if args.postgres:
        await run_postgres(args)
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
