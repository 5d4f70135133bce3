"""How far issue 20's missed rows can go at all: the floor each one has on this machine, whatever taskgate's code.

Each section takes one missed row of issue 20's table, removes taskgate's own code from it, and measures what is
left: the part no change to taskgate's code can remove without dropping a requirement (durable commits, a
structured MCP result, SQLAlchemy, one SQLite writer, one transaction per transition). It prints the floor, the
goal, and the headroom: how much time (or CPU) taskgate's own code may take at most for the row to be met.

- **mcp** (`MCP stdio, state-changing tool ≤ 2× ping`): a bare SDK server (no taskgate code, no database) with two
  tools, `ping` returning taskgate's `Pong` and `fire_shaped` returning a constant of taskgate's `FireOut` (what
  `session_suspend` answers), driven by the SDK client over stdio, alternating; the durable commit of the issue's
  bare transaction (UPDATE + INSERT + COMMIT, raw sqlite3, WAL, `synchronous=FULL`, taskgate's default); and the
  time SQLite itself takes inside taskgate's own suspend/resume (its statements and the COMMIT of the ~10 pages
  they write: the session row, the log row and its five indexes, the event, the chain), fired in-process with
  every driver call timed. A state change answers a `FireOut` after its rows are durable, so it costs at least
  `fire_shaped` plus that; what is left of 2× ping is the budget of taskgate's Python.
- **serve** (`taskgate serve until tools/list ≤ 1.2× a bare MCPServer`): the bare server of `cli_startup.py`
  against the same server that first imports SQLAlchemy with its SQLite dialect and opens the database file
  (`create_engine`, connect, `SELECT 1`): what serve cannot skip before it can answer a tool call that reads state.
  Since issue 43 serve answers `tools/list` before that (its front, from the generated tool table), so this floor
  now bounds its first tool call, not the row; `cli_startup.py` measures both.
- **sqlite** (`200 concurrent sessions, SQLite ≥ 2× the floor`): the real `SessionService.fire` walks of
  `transition_cost.py` (200 sessions × 6 transitions, `asyncio.gather`, commit groups) as shipped, then again with
  every call into the sqlite3 driver timed (a `sqlite3.Connection` subclass as the engine's connection factory, in
  this process only): SQLite's own time per transition (statements, commits, fsyncs shared by a group) against the
  rest (Python, the timing's own included). The
  goal allows `1 / (2 × floor)` per transition in all; what is left of it after SQLite's own time is the budget of
  everything taskgate does in Python (guards, the state machine, SQLAlchemy's bind processing, hashing).
- **pg** (`200 concurrent sessions, PostgreSQL ≥ 2× the floor`): the floor's own work (UPDATE session + INSERT log
  row per transition, asyncpg pool of 30) one transaction per transition, as the row's floor, against the same
  work for `k` sessions at a time in one transaction of two multi-row statements (UPDATE … FROM unnest, INSERT …
  SELECT unnest). Any engine that runs each transition as statements of its own does at least the floor's work per
  transition, so it stays ≤ 1× the floor; only writes shared by several transitions can pass 2×.

Run:  .venv/bin/python benchmarks/hot_path_floors.py [--only mcp,serve,sqlite,pg] [--n 400]
      (~1.5 min on 2 cores; `make bench` runs it)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_support import PG_BENCH_URL

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
SECTIONS = ("mcp", "serve", "sqlite", "pg")

# -- mcp ------------------------------------------------------------------------------------------------------

SHAPED_SERVER = '''"""A bare SDK server answering what taskgate's ping and session_suspend answer, doing nothing."""
from datetime import UTC, datetime

from mcp.server.mcpserver import MCPServer

from taskgate.entrypoints.mcp.models import FireOut, Pong

server = MCPServer("floors")
SID = "4247d2e1-2298-4200-955a-d32972b0b4d5"
SUSPENDED = FireOut(
    summary=f"suspend: executing → suspended (session {SID}, version 7)", session_id=SID, trigger="suspend",
    from_state="executing", to_state="suspended", state="suspended", prior_state="executing", version=7,
    allowed_triggers=["abandon", "cancel", "fail", "resume"], seq=1234, at=datetime.now(UTC),
    actor="operator:alice", reason="benchmark", guard_results=[], then=[], warnings=[],
)


@server.tool()
def ping() -> Pong:
    """Answer pong."""
    return Pong()


@server.tool()
def fire_shaped(session_id: str, reason: str | None = None) -> FireOut:
    """Answer what session_suspend answers, without doing anything."""
    return SUSPENDED


server.run("stdio")
'''


async def shaped_calls(script: Path, n: int) -> dict[str, float]:
    """Median ms of `ping` and `fire_shaped` on the bare server, called alternately `n` times each."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    samples: dict[str, list[int]] = {"ping": [], "fire_shaped": []}
    params = StdioServerParameters(command=PYTHON, args=[str(script)], env=dict(os.environ))
    arguments = {"ping": {}, "fire_shaped": {"session_id": "4247d2e1", "reason": "benchmark"}}
    async with Client(stdio_client(params), cache=None) as client:
        for round_no in range(n + 30):
            for tool in samples:
                started = time.perf_counter_ns()
                result = await client.call_tool(tool, arguments[tool])
                elapsed = time.perf_counter_ns() - started
                if result.is_error:
                    raise RuntimeError(f"{tool} failed: {result.content}")
                if round_no >= 30:
                    samples[tool].append(elapsed)
    return {tool: statistics.median(values) / 1e6 for tool, values in samples.items()}


def durable_commit_ms(folder: Path, n: int) -> float:
    """Median ms of the issue's bare transaction (UPDATE + INSERT + COMMIT) on raw sqlite3, WAL, synchronous=FULL."""
    db = sqlite3.connect(folder / "commit.db", isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=FULL"):
        db.execute(f"PRAGMA {pragma}")
    db.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, state TEXT, version INT, payload TEXT)")
    db.execute("CREATE TABLE log (seq INTEGER PRIMARY KEY, session_id TEXT, state TEXT, at TEXT)")
    db.execute("INSERT INTO sessions VALUES ('s', 'executing', 1, ?)", ("x" * 300,))
    samples = []
    for i in range(n + 30):
        started = time.perf_counter_ns()
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE sessions SET state = ?, version = version + 1 WHERE id = 's'", (f"s{i % 2}",))
        db.execute("INSERT INTO log (session_id, state, at) VALUES ('s', ?, ?)", (f"s{i % 2}", str(time.time())))
        db.execute("COMMIT")
        if i >= 30:
            samples.append(time.perf_counter_ns() - started)
    db.close()
    return statistics.median(samples) / 1e6


async def sqlite_of_state_changes(folder: Path, n: int) -> tuple[float, float]:
    """(SQLite's own ms, all ms) per `suspend` or `resume` fired in-process on one started session: the time inside
    the sqlite3 driver (taskgate's statements and the durable COMMIT of the pages they write), and the whole fire."""
    import transition_cost as tc

    from taskgate.application.sessions.commands import FireTrigger

    with timed_sqlite():
        stack = await tc.open_stack(f"sqlite:///{folder / 'changes.db'}", synchronous="FULL")
    try:
        [session_id] = await tc.ready_sessions(stack, 1)
        await stack.sessions.fire(FireTrigger(session_id, "start", "operator:alice"))
        own, whole = [], []
        for i in range(n + 30):
            spent, started = _TimedConnection.spent, time.perf_counter_ns()
            trigger = "suspend" if i % 2 == 0 else "resume"
            await stack.sessions.fire(FireTrigger(session_id, trigger, "operator:alice", "benchmark"))
            if i >= 30:
                whole.append(time.perf_counter_ns() - started)
                own.append(_TimedConnection.spent - spent)
    finally:
        await stack.database.dispose()
    return statistics.median(own) / 1e6, statistics.median(whole) / 1e6


def section_mcp(folder: Path, n: int) -> None:
    """The floor of a state-changing tool over stdio: a FireOut's round trip plus what SQLite must do."""
    script = folder / "shaped_server.py"
    script.write_text(SHAPED_SERVER)
    calls = asyncio.run(shaped_calls(script, n))
    commit = durable_commit_ms(folder, n)
    own, whole = asyncio.run(sqlite_of_state_changes(folder, n))
    ping, shaped = calls["ping"], calls["fire_shaped"]
    print("\n== mcp: a state-changing tool over stdio, without taskgate's code ==")
    print(f"  ping (bare SDK server, taskgate's Pong)                          {ping:7.3f} ms   1.00×")
    print(f"  fire_shaped (bare SDK server, taskgate's FireOut, no work)       {shaped:7.3f} ms   {shaped / ping:.2f}×")
    print(
        f"  bare durable commit (UPDATE + INSERT + COMMIT, sqlite3, FULL)     {commit:7.3f} ms   {commit / ping:.2f}×"
    )
    print(f"  SQLite's own time in taskgate's suspend/resume (in-process)      {own:7.3f} ms   {own / ping:.2f}×"
          f"   (the whole fire: {whole:.3f} ms)")  # fmt: skip
    goal = 2 * ping
    for label, floor in (("with a bare commit", shaped + commit), ("with taskgate's own rows", shaped + own)):
        left = (goal - floor) * 1000
        print(f"  floor {label:25} fire_shaped + {'commit' if 'bare' in label else 'SQLite':6}   {floor:7.3f} ms   "
              f"{floor / ping:.2f}×: {left:+.0f} µs left for taskgate's Python (goal ≤ 2× ping)")  # fmt: skip
    floor = shaped + own
    print(f"  taskgate's Python per state change now: about {(whole - own) * 1000:.0f} µs in the fire alone")
    print(f"FLOOR|mcp|{floor:.4g}|{ping:.4g}|ms|{floor / ping:.3f}|≤ 2×")


# -- serve ----------------------------------------------------------------------------------------------------

WITH_DATABASE = '''"""The bare server, after what serve cannot skip before it answers: SQLAlchemy, its database."""
import sys

from sqlalchemy import create_engine, text
from sqlalchemy.dialects import sqlite  # noqa: F401 (serve's dialect)

engine = create_engine(f"sqlite:///{sys.argv[1]}")
with engine.connect() as conn:
    conn.execute(text("SELECT 1")).scalar_one()
'''


def section_serve(folder: Path, n: int) -> None:
    """A bare MCPServer until tools/list, with and without SQLAlchemy and the database opened first."""
    from cli_startup import BARE_SERVER, run_to_tools

    bare = folder / "bare_server.py"
    bare.write_text(BARE_SERVER)
    with_db = folder / "bare_server_with_db.py"
    with_db.write_text(WITH_DATABASE + BARE_SERVER.split('"""', 2)[2])
    database = folder / "serve.db"
    sqlite3.connect(database).close()
    env = dict(os.environ)
    runs: dict[str, list[float]] = {"bare": [], "with_db": []}
    for _ in range(n + 1):  # the first run of each warms the page cache and bytecode
        runs["bare"].append(run_to_tools([PYTHON, str(bare)], env, folder)[0])
        runs["with_db"].append(run_to_tools([PYTHON, str(with_db), str(database)], env, folder)[0])
    bare_ms, db_ms = (statistics.median(v[1:]) * 1000 for v in (runs["bare"], runs["with_db"]))
    print("\n== serve: a bare MCPServer until tools/list, with SQLAlchemy and the database opened first ==")
    print(f"  bare MCPServer (one tool)                              {bare_ms:7.1f} ms   1.00×")
    print(f"  + SQLAlchemy, its SQLite dialect, the database opened  {db_ms:7.1f} ms   {db_ms / bare_ms:.2f}×")
    print(f"  goal ≤ 1.2× = {1.2 * bare_ms:.1f} ms: headroom {1.2 * bare_ms - db_ms:+.1f} ms for taskgate's own start")
    print(f"FLOOR|serve|{db_ms:.4g}|{bare_ms:.4g}|ms|{db_ms / bare_ms:.3f}|≤ 1.2×")


# -- sqlite ---------------------------------------------------------------------------------------------------


@contextmanager
def _spending() -> Iterator[None]:
    """Add the time of the block to `_TimedConnection.spent`."""
    started = time.perf_counter_ns()
    try:
        yield
    finally:
        _TimedConnection.spent += time.perf_counter_ns() - started


class _TimedConnection(sqlite3.Connection):
    """A sqlite3 connection that adds the time of every call into the driver to `spent` (class-wide)."""

    spent = 0

    def execute(self, *args: Any) -> Any:
        with _spending():
            return _TimedCursor(super().execute(*args))

    def cursor(self, *args: Any) -> Any:
        return _TimedCursor(super().cursor(*args))

    def commit(self) -> None:
        with _spending():
            super().commit()

    def rollback(self) -> None:
        with _spending():
            super().rollback()


class _TimedCursor:
    """A cursor whose statements and fetches are timed into `_TimedConnection.spent`; the rest is passed through."""

    _TIMED = frozenset({"execute", "executemany", "fetchone", "fetchall", "fetchmany"})

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._cursor, name)
        if name not in self._TIMED:
            return found

        def timed(*args: Any) -> Any:
            with _spending():
                result = found(*args)
            return self if result is self._cursor else result  # execute() returns the cursor: keep timing it

        return timed

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


@contextmanager
def timed_sqlite() -> Iterator[None]:
    """Every SQLite engine taskgate creates in this process connects through `_TimedConnection`."""
    from taskgate.infrastructure.db import engine as engine_module

    original = engine_module.create_engine

    def create(url: Any, **kwargs: Any) -> Any:
        kwargs["connect_args"] = {**kwargs.get("connect_args", {}), "factory": _TimedConnection}
        return original(url, **kwargs)

    engine_module.create_engine = create
    try:
        yield
    finally:
        engine_module.create_engine = original


async def _walks(folder: Path, name: str, sessions: int, timed: bool) -> tuple[float, int, list[Any]]:
    """200 (`sessions`) concurrent walks on a fresh file: (seconds, driver nanoseconds spent, the rows walked)."""
    import transition_cost as tc

    with timed_sqlite() if timed else contextlib.nullcontext():
        stack = await tc.open_stack(f"sqlite:///{folder / name}", synchronous="FULL")
    try:
        ids = await tc.ready_sessions(stack, sessions)
        spent = _TimedConnection.spent
        elapsed, failed = await tc.run_walks(stack, ids)
        spent = _TimedConnection.spent - spent
        rows = await tc.bare_rows(stack, ids)
    finally:
        await stack.database.dispose()
    if failed:
        raise RuntimeError(f"{failed} walks failed")
    return elapsed, spent, rows


async def sqlite_split(folder: Path, sessions: int) -> dict[str, float]:
    """Concurrent walks through the real code as shipped (ours), the same walks with every driver call timed
    (SQLite's own share: the timing adds some Python of its own, so the split is taken from this run and ours from
    the other), and the floor of bare commits on the walked file."""
    import transition_cost as tc

    elapsed, _spent, rows = await _walks(folder, "walks.db", sessions, timed=False)
    timed_elapsed, spent, _rows = await _walks(folder, "timed-walks.db", sessions, timed=True)
    bare = await tc.open_bare_sqlite(folder / "walks.db", "FULL")
    try:
        tc.collect_setup_garbage()
        begin = time.perf_counter()
        for _ in tc.WALK:
            for row in rows:
                await tc.bare_sqlite_transition(bare, row)
        floor_elapsed = time.perf_counter() - begin
    finally:
        await bare.close()
    total = sessions * len(tc.WALK)
    return {"ours": total / elapsed, "floor": total / floor_elapsed, "wall_us": timed_elapsed / total * 1e6,
            "sqlite_us": spent / total / 1000}  # fmt: skip


def section_sqlite(folder: Path, sessions: int) -> None:
    """Where the time of a concurrent transition goes, and what the 2× goal leaves for Python."""
    split = asyncio.run(sqlite_split(folder, sessions))
    budget = 1e6 / (2 * split["floor"])
    python = split["wall_us"] - split["sqlite_us"]
    print(f"\n== sqlite: {sessions} concurrent sessions × 6 transitions, synchronous=FULL, commit groups ==")
    print(f"  floor (bare commits back to back)      {split['floor']:7.0f} tx/s")
    print(f"  ours                                   {split['ours']:7.0f} tx/s   {split['ours'] / split['floor']:.2f}×")
    own = split["sqlite_us"]
    print(f"  per transition (the walks with every driver call timed): {split['wall_us']:.0f} µs in all = SQLite's "
          f"own {own:.0f} µs (statements, shared commits, fsyncs) + {python:.0f} µs of Python")  # fmt: skip
    ceiling = 1e6 / split["sqlite_us"]
    print(f"  with no Python at all: {ceiling:.0f} tx/s = {ceiling / split['floor']:.2f}× the floor")
    print(f"  goal ≥ 2× = {2 * split['floor']:.0f} tx/s = {budget:.0f} µs per transition in all: "
          f"{budget - split['sqlite_us']:+.0f} µs left for Python, which takes {python:.0f} µs now")  # fmt: skip
    print(f"FLOOR|sqlite|{ceiling:.4g}|{split['floor']:.4g}|tx/s|{ceiling / split['floor']:.3f}|≥ 2×")


# -- pg -------------------------------------------------------------------------------------------------------

_PG_SCHEMA = """
CREATE TABLE floor_sessions (id text PRIMARY KEY, state text, version int, state_data json, updated_at timestamptz);
CREATE TABLE floor_log (seq bigserial PRIMARY KEY, session_id text, trigger text, from_state text, to_state text,
                        actor text, guard_results json, session_version int, at timestamptz);
CREATE INDEX ON floor_log (session_id, seq); CREATE INDEX ON floor_log (at); CREATE INDEX ON floor_log (actor, at);
CREATE INDEX ON floor_log (to_state, at);
"""
_ONE_UPDATE = "UPDATE floor_sessions SET state = $2, version = version + 1, updated_at = $3 WHERE id = $1"
_ONE_INSERT = (
    "INSERT INTO floor_log (session_id, trigger, from_state, to_state, actor, guard_results, session_version, at) "
    "VALUES ($1, 'step', 'before', $2, 'operator:alice', $3::json, 1, $4) RETURNING seq"
)
_MANY_UPDATE = (
    "UPDATE floor_sessions s SET state = v.state, version = s.version + 1, updated_at = v.at "
    "FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS v (id, state, at) WHERE s.id = v.id"
)
_MANY_INSERT = (
    "INSERT INTO floor_log (session_id, trigger, from_state, to_state, actor, guard_results, session_version, at) "
    "SELECT v.id, 'step', 'before', v.state, 'operator:alice', v.guards::json, 1, v.at "
    "FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[]) AS v (id, state, guards, at) RETURNING seq"
)
_GUARDS = json.dumps([{"policy": "wip_limit", "passed": True, "severity": "error", "message": "", "suggestion": ""}])


async def pg_batches(url: str, sessions: int, sizes: tuple[int, ...], steps: int = 6) -> dict[int, float]:
    """Transitions per second of the floor's work: k = 1 one transaction per transition, else k per transaction."""
    import asyncpg
    from bench_support import reset_pg_schema_async

    await reset_pg_schema_async(url)
    dsn = url.replace("+asyncpg", "")
    ids = [str(uuid.uuid4()) for _ in range(sessions)]
    setup = await asyncpg.connect(dsn)
    try:
        await setup.execute(_PG_SCHEMA)
        await setup.executemany("INSERT INTO floor_sessions VALUES ($1, 'ready', 1, '{}', now())", [(i,) for i in ids])
    finally:
        await setup.close()
    pool = await asyncpg.create_pool(dsn, min_size=10, max_size=30)

    async def one_by_one(session_id: str) -> None:
        for step in range(steps):
            async with pool.acquire() as conn, conn.transaction():
                now = datetime.now(UTC)
                await conn.execute(_ONE_UPDATE, session_id, f"s{step}", now)
                await conn.fetchval(_ONE_INSERT, session_id, f"s{step}", _GUARDS, now)

    async def together(chunk: list[str]) -> None:
        for step in range(steps):
            async with pool.acquire() as conn, conn.transaction():
                now, k = datetime.now(UTC), len(chunk)
                await conn.execute(_MANY_UPDATE, chunk, [f"s{step}"] * k, [now] * k)
                await conn.fetch(_MANY_INSERT, chunk, [f"s{step}"] * k, [_GUARDS] * k, [now] * k)

    rates: dict[int, float] = {}
    try:
        for size in sizes:
            started = time.perf_counter()
            if size == 1:
                await asyncio.gather(*(one_by_one(i) for i in ids))
            else:
                await asyncio.gather(*(together(ids[at : at + size]) for at in range(0, sessions, size)))
            rates[size] = sessions * steps / (time.perf_counter() - started)
    finally:
        await pool.close()
    return rates


def section_pg(url: str, sessions: int) -> None:
    """The floor's own work one transaction per transition, and k transitions per transaction."""
    sizes = (1, 2, 4, 8, 16, 32)
    rates = asyncio.run(pg_batches(url, sessions, sizes))
    floor = rates[1]
    print(f"\n== pg: {sessions} sessions × 6 steps of the floor's own work (UPDATE session + INSERT log row) ==")
    for size in sizes:
        label = "one transaction per transition (the floor)" if size == 1 else f"{size} transitions per transaction"
        print(f"  {label:45} {rates[size]:8.0f} tx/s   {rates[size] / floor:5.2f}×")
    print("  an engine running each transition as statements of its own does at least the floor's work per "
          "transition: ≤ 1×; ≥ 2× needs writes shared by several transitions")  # fmt: skip
    print(f"FLOOR|pg|{rates[sizes[-1]]:.4g}|{floor:.4g}|tx/s|{rates[sizes[-1]] / floor:.3f}|≥ 2×")


def main() -> None:
    """Run the chosen sections, with the load average before and after."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run, of {','.join(SECTIONS)}")
    parser.add_argument("--n", type=int, default=400, help="calls per MCP tool and durable commits (400)")
    parser.add_argument("--starts", type=int, default=9, help="server starts of each kind (9)")
    parser.add_argument("--sessions", type=int, default=200, help="concurrent sessions (200)")
    parser.add_argument("--pg-url", default=PG_BENCH_URL, help=f"PostgreSQL database to reset and use ({PG_BENCH_URL})")
    args = parser.parse_args()
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory(prefix="taskgate-floors-") as tmp:
        folder = Path(tmp)
        for section in chosen:
            if section == "mcp":
                section_mcp(folder, args.n)
            elif section == "serve":
                section_serve(folder, args.starts)
            elif section == "sqlite":
                section_sqlite(folder, args.sessions)
            else:
                section_pg(args.pg_url, args.sessions)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    sys.exit(main())
