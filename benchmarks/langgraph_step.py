"""Issue 43, PostgreSQL: a guarded taskgate transition against a LangGraph step and a bare asyncpg transaction.

Three rows, all on one PostgreSQL server, measured in the same run:

- **vs LangGraph.** taskgate's `start` (ready → planning: WIP, plan-open and blocker policies evaluated, the session
  and plan rows locked) and `plan_complete` (planning → executing: no policy applies), each through
  `SessionService.fire`, against one LangGraph step. Goal ≤ 0.7×.
- **vs the bare driver.** The same against the minimal transition on a bare asyncpg connection: BEGIN, UPDATE of
  one `sessions` row (version-checked), INSERT of one `transition_log` row, COMMIT (transition_cost.py's). Goal ≤ 2.5×.
- **200 concurrent sessions** walking start → … → cleanup_done against the floor of one transaction per transition
  (an asyncpg pool of 30 running UPDATE + INSERT per transition, the same concurrency). Goal ≥ 1×.

What "a LangGraph step" is here: one `ainvoke` of a compiled one-node `StateGraph` on a thread of its own, with
`AsyncPostgresSaver` as its checkpointer (created by `AsyncPostgresSaver.from_conn_string`, as LangGraph's docs show:
one psycopg connection, autocommit, prepared statements from the first use). The node moves the state to the
trigger's destination and bumps a version, which is what a transition does to a session. Each thread gets two steps,
like each taskgate session gets `start` then `plan_complete`, so the second step reads the checkpoint the first wrote.
Two durabilities, each its own row:

- LangGraph's default, `"async"`: the `ainvoke` loads the thread's latest checkpoint and writes the input's
  checkpoint, the node's writes and the step's checkpoint (~4.5 ms here);
- `"exit"`, the cheapest way LangGraph persists a step: the checkpoint is written once, when the graph exits
  (~2 ms here, the LangGraph figure the issue's own ratios imply).

Either checks nothing and locks nothing: it is the cost of persisting a step, not of a guarded one. The saver's
tables live in a database of their own (`<bench database>_langgraph`, created on first use, emptied each run) on
the same server.

The three calls are interleaved (ours, bare, LangGraph, one after the other per iteration), so they see the same
machine; the load average is printed before and after.

Run:  .venv/bin/python benchmarks/langgraph_step.py [--n 300] [--warmup 30] [--sessions 200] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypedDict

import asyncpg
from bench_support import PG_BENCH_URL, emit_row, reset_pg_schema_async
from transition_cost import (
    WALK,
    Latency,
    bare_pg_transition,
    bare_pg_walk,
    bare_rows,
    collect_setup_garbage,
    count_statements,
    fire,
    median_ms,
    open_stack,
    percentile,
    ready_sessions,
    run_walks,
    timed_cpu,
)

LANGGRAPH_GOAL = "≤ 0.7×"
BARE_GOAL = "≤ 2.5×"
THROUGHPUT_GOAL = "≥ 1×"


class StepState(TypedDict):
    """A LangGraph thread's state: what a session's row holds that a transition changes."""

    state: str
    trigger: str
    version: int


_DESTINATION = {"start": "planning", "plan_complete": "executing"}


def advance(state: StepState) -> dict[str, Any]:
    """The graph's one node: the transition's destination and the next version."""
    return {"state": _DESTINATION[state["trigger"]], "version": state.get("version", 0) + 1}


async def langgraph_database(url: str) -> str:
    """The psycopg URL of the saver's own database beside `url`'s, created on first use and emptied."""
    dsn = url.replace("+asyncpg", "")
    base, _, name = dsn.rpartition("/")
    own = f"{name}_langgraph"
    admin = await asyncpg.connect(f"{base}/postgres")
    try:
        if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", own):
            await admin.execute(f'CREATE DATABASE "{own}"')
    finally:
        await admin.close()
    conn = await asyncpg.connect(f"{base}/{own}")
    try:
        await conn.execute("DROP SCHEMA IF EXISTS public CASCADE; CREATE SCHEMA public")
    finally:
        await conn.close()
    return f"{base}/{own}"


async def measure(url: str, n: int, warmup: int) -> tuple[Latency, list[int], list[int], list[int]]:
    """Interleave ours (start, plan_complete), the bare transaction and a LangGraph step of each durability; returns
    ours and bare (as transition_cost's `Latency`), the default steps' wall and CPU nanoseconds and the "exit" steps'
    wall nanoseconds."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.graph import END, START, StateGraph

    await reset_pg_schema_async(url)
    ours = await open_stack(url)
    conn = await asyncpg.connect(url.replace("+asyncpg", ""))
    builder = StateGraph(StepState)
    builder.add_node("advance", advance)
    builder.add_edge(START, "advance")
    builder.add_edge("advance", END)
    lg_wall: list[int] = []
    lg_cpu: list[int] = []
    lg_exit: list[int] = []
    try:
        async with AsyncPostgresSaver.from_conn_string(await langgraph_database(url)) as saver:
            await saver.setup()
            graph = builder.compile(checkpointer=saver)
            ids = await ready_sessions(ours, n + warmup + 2)
            base_row = (await bare_rows(ours, ids[:1]))[0]
            result = Latency()
            for i, session_id in enumerate(ids[2:]):
                config = {"configurable": {"thread_id": str(uuid.uuid4())}}
                on_exit = {"configurable": {"thread_id": str(uuid.uuid4())}}
                samples = []
                for trigger in ("start", "plan_complete"):
                    ours_sample = await timed_cpu(fire(ours, session_id, trigger))
                    bare_sample = await timed_cpu(lambda: bare_pg_transition(conn, base_row, "ready"))
                    step = {"state": "ready", "trigger": trigger, "version": 0}
                    lg_sample = await timed_cpu(lambda step=step, config=config: graph.ainvoke(step, config))
                    exit_sample = await timed_cpu(
                        lambda step=step, config=on_exit: graph.ainvoke(step, config, durability="exit")
                    )
                    samples.append((ours_sample, bare_sample, (*lg_sample, exit_sample[0])))
                if i < warmup:
                    continue
                for trigger, (ours_sample, bare_sample, lg_sample) in zip(
                    ("start", "plan_complete"), samples, strict=True
                ):
                    getattr(result, trigger).append(ours_sample[0])
                    result.cpu[trigger].append(ours_sample[1])
                    result.baseline.append(bare_sample[0])
                    result.cpu["baseline"].append(bare_sample[1])
                    lg_wall.append(lg_sample[0])
                    lg_cpu.append(lg_sample[1])
                    lg_exit.append(lg_sample[2])
            result.statements = await count_statements(ours, ids[1])
            return result, lg_wall, lg_cpu, lg_exit
    finally:
        await conn.close()
        await ours.database.dispose()


def report(result: Latency, lg_wall: list[int], lg_cpu: list[int], lg_exit: list[int]) -> None:
    """Medians and p99s, the ratios, the CPU of each and the statements of ours; ROW lines for hot_path.py."""
    bare, lang, lang_exit = median_ms(result.baseline), median_ms(lg_wall), median_ms(lg_exit)
    print(f"\n== one transition on PostgreSQL (n={len(result.start)} each), medians (p99) ==")
    print(f"  bare asyncpg UPDATE+INSERT+COMMIT   {bare:7.3f} ms ({percentile(result.baseline, 99):7.3f})"
          f"   CPU {median_ms(result.cpu['baseline']):.3f} ms")  # fmt: skip
    print(f"  LangGraph step (AsyncPostgresSaver) {lang:7.3f} ms ({percentile(lg_wall, 99):7.3f})"
          f"   CPU {median_ms(lg_cpu):.3f} ms")  # fmt: skip
    print(f"  LangGraph step, durability=exit     {lang_exit:7.3f} ms ({percentile(lg_exit, 99):7.3f})")
    for trigger in ("start", "plan_complete"):
        samples = getattr(result, trigger)
        med = median_ms(samples)
        print(
            f"  taskgate {trigger:26} {med:7.3f} ms ({percentile(samples, 99):7.3f})   CPU "
            f"{median_ms(result.cpu[trigger]):.3f} ms   vs LangGraph {med / lang:5.2f}× (exit {med / lang_exit:5.2f}×)"
            f"   vs bare {med / bare:5.2f}×"
        )
        emit_row(f"PostgreSQL: {trigger} vs a LangGraph step (default durability)", med, lang, "ms", LANGGRAPH_GOAL)
        emit_row(f"PostgreSQL: {trigger} vs a LangGraph step (durability=exit)", med, lang_exit, "ms", LANGGRAPH_GOAL)
        emit_row(f"PostgreSQL: {trigger} vs bare asyncpg", med, bare, "ms", BARE_GOAL)
    for trigger, (statements, _trips) in result.statements.items():
        print(f"  {trigger}: {len(statements)} round trips: {', '.join(statements)}")


def server_cpu_s(database: str) -> float:
    """CPU seconds used so far by the PostgreSQL processes serving `database` (its backends; the server's shared
    processes, WAL writer included, are left out: they serve every database of the server)."""
    import psutil

    total = 0.0
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or ())
        if cmdline.startswith("postgres:") and f" {database} " in cmdline:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
    return total


@dataclass
class Run:
    """One side of the concurrent row: transitions per second, and CPU per transition of the client's one thread
    (the event loop) and of the database's backends, in milliseconds."""

    rate: float
    client_ms: float
    server_ms: float


async def concurrent(url: str, sessions: int) -> tuple[Run, Run, int]:
    """Ours (200 walks through `SessionService.fire`, asyncio.gather) and the floor (the same number of UPDATE +
    INSERT transactions on an asyncpg pool of 30, the same concurrency), each with its CPU per transition."""
    await reset_pg_schema_async(url)
    database = url.rsplit("/", 1)[1]
    stack = await open_stack(url)
    total = sessions * len(WALK)
    try:
        ids = await ready_sessions(stack, sessions)
        cpu, server = time.thread_time(), server_cpu_s(database)
        elapsed, failed = await run_walks(stack, ids)
        ours = Run(total / elapsed, (time.thread_time() - cpu) / total * 1e3,
                   (server_cpu_s(database) - server) / total * 1e3)  # fmt: skip
        rows = await bare_rows(stack, ids)
    finally:
        await stack.database.dispose()
    created = datetime.now(UTC)
    pool = await asyncpg.create_pool(url.replace("+asyncpg", ""), min_size=10, max_size=30)
    try:
        collect_setup_garbage()
        cpu, server = time.thread_time(), server_cpu_s(database)
        begin = time.perf_counter()
        await asyncio.gather(*(bare_pg_walk(pool, row, created) for row in rows))
        elapsed = time.perf_counter() - begin
        floor = Run(total / elapsed, (time.thread_time() - cpu) / total * 1e3,
                    (server_cpu_s(database) - server) / total * 1e3)  # fmt: skip
    finally:
        await pool.close()
    return ours, floor, failed


def report_concurrent(sessions: int, ours: Run, floor: Run, failed: int) -> None:
    """The row, and what bounds each side: at most one core for the client's one event loop, two for everything."""
    print(f"\n== {sessions} concurrent sessions × {len(WALK)} transitions ==")
    for name, run in (("ours", ours), ("floor", floor)):
        both = run.client_ms + run.server_ms
        print(
            f"  {name:5} {run.rate:7.0f} transitions/s   CPU per transition: client {run.client_ms:.3f} ms, "
            f"PostgreSQL backends {run.server_ms:.3f} ms   → bound by one client core {1e3 / run.client_ms:6.0f}/s, "
            f"by both cores {2e3 / both:6.0f}/s"
        )
    print(f"  ours ÷ floor {ours.rate / floor.rate:5.2f}×   failed walks {failed}/{sessions}")
    emit_row(f"{sessions} concurrent sessions, PostgreSQL, vs one tx per transition", ours.rate, floor.rate, "tx/s",
             THROUGHPUT_GOAL)  # fmt: skip


def main() -> None:
    """Latency rows, then the 200-concurrent row, with the load average around them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="timed iterations (each: start and plan_complete)")
    parser.add_argument("--warmup", type=int, default=30, help="untimed iterations first")
    parser.add_argument("--sessions", type=int, default=200, help="concurrent sessions (0: skip that row)")
    parser.add_argument("--pg-url", default=PG_BENCH_URL, help=f"PostgreSQL database to reset and use ({PG_BENCH_URL})")
    args = parser.parse_args()
    started = time.monotonic()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    report(*asyncio.run(measure(args.pg_url, args.n, args.warmup)))
    if args.sessions:
        report_concurrent(args.sessions, *asyncio.run(concurrent(args.pg_url, args.sessions)))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average after: {load}; total {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
