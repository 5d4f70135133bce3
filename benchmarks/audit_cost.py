"""Cost the audit chains add to a transition (issue 21): the transition itself, and the linker's work per transition.

Since revision 0016 a transition's own transaction does nothing for the chains: its records (the transition row,
its events) are plain INSERTs, linked after the commit by the linker (application/audit/linking.py) that
`taskgate serve` runs every `[audit] link_interval_s`. So the cost chaining adds to a transition is the linker's
work for that transition's records, done in another transaction: this script measures both halves in one run, on
a database built by the real migrations (SQLite synchronous=FULL, the product default; PostgreSQL with
`--postgres`):

- **the transition**: the real `SessionService.fire` of a guarded `start` (ready → planning) and a `plan_complete`
  (planning → executing), as `transition_cost.py` does; the statements it sends are printed (no audit table among
  them). This is also the baseline: without chaining the transition is the same code.
- **the linker**: after every K iterations (K sessions × 2 transitions), one `link_pending` pass links what they
  wrote (its read of what is pending, its tops, its batch, each with their commits); its wall and CPU divided by
  the transitions it linked is the cost chaining adds per transition. K = 1 is a pass per two transitions (an idle
  service: a pass a second for a transition or two), K = 25 and K = 250 passes of 50 and 500 transitions (a
  service doing that many a second). The three K alternate in blocks, so all see the same file and drift.

Printed: per K the linker's wall and CPU per transition and per record; per trigger and K the transition's median
wall and CPU, and the ratio (transition + its share of the linker) / transition (a `ROW` line each, goal ≤ 1.05×).
`--walks N` also runs N concurrent sessions through the whole happy path (`transition_cost.py`'s walk), timing the
walks alone against the walks plus linking everything they wrote, alternating, three rounds each.

`--history N` first stores N other sessions' chains of 50 links each (`add_history`, `add_history_postgres`): the
linker's writes grow with the links already stored.

Run:  .venv/bin/python benchmarks/audit_cost.py [--n 300] [--walks 200] [--history 20000] [--postgres [URL]]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from audit_link_batches import chain_names, link_rows, organic_batches, write_numbered
from bench_support import PG_BENCH_URL, emit_row, run_on_one_store
from transition_cost import WALK, Stack, fire, open_stack, ready_sessions, run_walks, statement_log

from taskgate.application.audit.linking import link_pending

GOAL_RATIO = 1.05
TRIGGERS = ("start", "plan_complete")
PASS_SIZES = (1, 25, 250)  # iterations (sessions, each 2 transitions) per linker pass
BLOCK = 250  # iterations per block; each block runs one K, the blocks rotate through PASS_SIZES


async def timed(action: Callable[[], Awaitable[Any]]) -> tuple[int, int]:
    """(wall, process CPU) nanoseconds of one awaited call, and its result."""
    cpu, wall = time.process_time_ns(), time.perf_counter_ns()
    await action()
    return time.perf_counter_ns() - wall, time.process_time_ns() - cpu


class Measured:
    """Per (trigger, K): the fires' wall and CPU; per K: the passes' wall and CPU, transitions and records linked."""

    def __init__(self) -> None:
        self.fires: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
        self.linker: dict[int, list[int]] = {k: [0, 0, 0, 0] for k in PASS_SIZES}  # wall, CPU, transitions, records

    def link_per_transition(self, k: int) -> tuple[float, float]:
        """The linker's (wall, CPU) ns per transition at K."""
        wall, cpu, transitions, _records = self.linker[k]
        return wall / transitions, cpu / transitions


async def link_pass(stack: Stack, measured: Measured | None, k: int, transitions: int) -> None:
    """One linker pass, timed into `measured` at K (None: untimed)."""
    linked: list[int] = []

    async def run() -> None:
        linked.append(await link_pending(stack.uow))

    wall, cpu = await timed(run)
    if measured is not None:
        totals = measured.linker[k]
        totals[0] += wall
        totals[1] += cpu
        totals[2] += transitions
        totals[3] += linked[0]


async def measure(stack: Stack, ids: list[str], n: int, warmup: int) -> Measured:
    """`n` timed iterations after `warmup` untimed ones: each fires `start` and `plan_complete` on a session of its
    own; a linker pass after every K of them, K changing by block."""
    measured, since = Measured(), 0
    await link_pass(stack, None, 1, 0)  # the setup's records (the sessions' history) are linked before timing
    for i, session_id in enumerate(ids[: n + warmup]):
        keep = measured if i >= warmup else None
        k = PASS_SIZES[(i // BLOCK) % len(PASS_SIZES)]
        for trigger in TRIGGERS:
            sample = await timed(fire(stack, session_id, trigger))
            if keep is not None:
                keep.fires[(trigger, k)].append(sample)
        since += 1
        if since == k or (i + 1) % BLOCK == 0:  # a block ends with a pass: the next block starts with none pending
            await link_pass(stack, keep, k, 2 * since)
            since = 0
    return measured


def median_ms(samples: list[tuple[int, int]], index: int) -> float:
    """Median wall (0) or CPU (1) of `samples`, in milliseconds."""
    return statistics.median(s[index] for s in samples) / 1e6


def report(store: str, measured: Measured, statements: dict[str, list[str]]) -> None:
    """The linker per K, the transitions, the ratios (ROW lines)."""
    print(f"\n== the linker, {store}: one pass after every K iterations (2 transitions each) ==")
    for k in PASS_SIZES:
        wall, cpu, transitions, records = measured.linker[k]
        if not transitions:
            continue
        print(f"  K = {k:3}: {transitions:5} transitions, {records:5} records linked; per transition "
              f"{wall / transitions / 1e3:7.1f} µs wall, {cpu / transitions / 1e3:7.1f} µs CPU; per record "
              f"{wall / records / 1e3:6.1f} µs wall, {cpu / records / 1e3:6.1f} µs CPU")  # fmt: skip
    print(f"\n== one transition, {store}: alone, and with its share of the linker (ratio; goal ≤ {GOAL_RATIO}×) ==")
    for trigger in TRIGGERS:
        print(f"  {trigger}: {', '.join(statements[trigger])}")
        for k in PASS_SIZES:
            samples = measured.fires[(trigger, k)]
            if not samples or not measured.linker[k][2]:
                continue
            wall, cpu = median_ms(samples, 0), median_ms(samples, 1)
            link_wall, link_cpu = (x / 1e6 for x in measured.link_per_transition(k))
            print(f"    K = {k:3} (n={len(samples)}): transition {wall:6.3f} ms wall {cpu:6.3f} ms CPU; + linker "
                  f"{link_wall * 1e3:6.1f} µs wall {link_cpu * 1e3:6.1f} µs CPU: {(wall + link_wall) / wall:5.3f}× "
                  f"wall, {(cpu + link_cpu) / cpu:5.3f}× CPU")  # fmt: skip
            emit_row(f"{store}: {trigger} + its linking, passes of {2 * k} transitions, vs alone", wall + link_wall,
                     wall, "ms", f"≤ {GOAL_RATIO}×")  # fmt: skip


async def fire_statements(stack: Stack, session_id: str) -> dict[str, list[str]]:
    """The statements each trigger's transaction sends (its own, without the linker's)."""
    found = {}
    for trigger in TRIGGERS:
        with statement_log(stack.database) as log:
            await fire(stack, session_id, trigger)()
        found[trigger] = list(log)
    return found


async def walks(stack: Stack, ready: list[str], count: int, rounds: int) -> None:
    """`count` concurrent happy-path walks of sessions from `ready`: alone, against walks plus linking all they
    wrote, alternating."""
    print(
        f"\n== {count} concurrent walks (the whole happy path each), alone and with their linking, {rounds} rounds =="
    )
    timings: dict[str, list[float]] = {"alone": [], "+ linking": []}
    transitions = 0
    for round_ in range(2 * rounds):
        mode = ("alone", "+ linking")[round_ % 2]
        ids = ready[round_ * count : (round_ + 1) * count]
        await link_pass(stack, None, 1, 0)  # the setup's records are not this round's
        begin = time.perf_counter()
        _seconds, failed = await run_walks(stack, ids)
        if mode == "+ linking":
            await link_pass(stack, None, 1, 0)
        timings[mode].append(time.perf_counter() - begin)
        transitions = count * len(WALK) - failed
        if mode == "alone":
            await link_pass(stack, None, 1, 0)  # untimed: the next round starts with nothing pending
    alone, linked = statistics.median(timings["alone"]), statistics.median(timings["+ linking"])
    print(f"  alone: {transitions / alone:7.0f} transitions/s; + linking: {transitions / linked:7.0f} transitions/s; "
          f"time ratio {linked / alone:5.3f}×")  # fmt: skip
    emit_row(f"{count} concurrent walks + their linking vs alone", linked, alone, "s", f"≤ {GOAL_RATIO}×")


def parse_args() -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1500, help="timed iterations (each: start + plan_complete)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed iterations first")
    parser.add_argument("--walks", type=int, default=200, help="concurrent walks (0: none)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of walks per mode")
    parser.add_argument("--history", type=int, default=0, metavar="SESSIONS",
                        help="that many other sessions' chains (50 links each) stored first")  # fmt: skip
    parser.add_argument(
        "--postgres", nargs="?", const=PG_BENCH_URL, default=None, metavar="URL",
        help=f"run on PostgreSQL (schema public reset first; default {PG_BENCH_URL})",
    )  # fmt: skip
    return parser.parse_args()


def add_history(url: str, sessions: int, per_session: int = 50) -> None:
    """`sessions` other sessions' chains, `per_session` links each, written straight into `audit_links` and
    `audit_chains` of the SQLite file at `url` (their records are not there: the linker never reads an old link,
    only the heads of the chains it grows; nothing here verifies). They grow organically, 200 at a time, 500
    links a transaction (`audit_link_batches.organic_batches`), as a service's history would fill the b-tree."""
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    seqs: dict[str, int] = {}
    numbers: dict[str, int] = {}
    next_id = 10**12  # ids (and link numbers) far above the benchmark's own records
    for counts in organic_batches(chain_names(sessions, seed=sessions), per_session, 200, seed=sessions):
        links = link_rows(counts, seqs, next_id)
        next_id += len(links)
        conn.execute("BEGIN IMMEDIATE")
        write_numbered(conn, links, counts, seqs, numbers)
        conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    print(f"history: {sessions:,} other sessions' chains, {sessions * per_session:,} links, in the database first")


# PostgreSQL: the same history in two statements, the chains' links interleaved (every session's first link, then
# every session's second, ...), numbered in that order, as many chains growing at once would leave them.
_PG_HISTORY = (
    "INSERT INTO audit_links (link_no, chain_id, chain_seq, record_table, record_id, hash, prev_no) "
    "SELECT 1000000000000 + (n - 1) * {sessions} + s, 'session:' || md5(s::text)::uuid, n, 'events', "
    "1000000000000 + (n - 1) * {sessions} + s, repeat('ab', 32), "
    "CASE WHEN n > 1 THEN 1000000000000 + (n - 2) * {sessions} + s END "
    "FROM generate_series(1, {per_session}) n, generate_series(1, {sessions}) s ORDER BY 1",
    "INSERT INTO audit_chains (chain_id, seq, hash, signed_seq, link_no) SELECT 'session:' || md5(s::text)::uuid, "
    "{per_session}, repeat('ab', 32), 0, 1000000000000 + ({per_session} - 1) * {sessions} + s "
    "FROM generate_series(1, {sessions}) s",
)


async def add_history_postgres(stack: Stack, sessions: int, per_session: int = 50) -> None:
    """`add_history` on PostgreSQL (then VACUUM ANALYZE, as a service's autovacuum would have)."""
    engine: Any = stack.database.engine  # an AsyncEngine on PostgreSQL
    async with engine.begin() as conn:
        for statement in _PG_HISTORY:  # integers from the command line, formatted in
            await conn.exec_driver_sql(statement.format(sessions=int(sessions), per_session=int(per_session)))
    async with engine.connect() as conn:
        await (await conn.execution_options(isolation_level="AUTOCOMMIT")).exec_driver_sql(
            "VACUUM ANALYZE audit_links, audit_chains"
        )
    print(f"history: {sessions:,} other sessions' chains, {sessions * per_session:,} links, in the database first")


async def run(url: str, store: str, args: argparse.Namespace) -> None:
    """Measure and report on one migrated database."""
    stack = await open_stack(url, synchronous="FULL")
    if args.history and url.startswith("sqlite:///"):
        add_history(url, args.history)
    elif args.history:
        await add_history_postgres(stack, args.history)
    try:
        walking = 2 * args.rounds * args.walks
        ids = await ready_sessions(stack, args.n + args.warmup + 1 + walking)
        statements = await fire_statements(stack, ids.pop())
        report(store, await measure(stack, ids[walking:], args.n, args.warmup), statements)
        if args.walks:
            await walks(stack, ids[:walking], args.walks, args.rounds)
    finally:
        await stack.database.dispose()


def main() -> None:
    """One run on SQLite (FULL) or on PostgreSQL, with the load average before and after."""
    args = parse_args()
    run_on_one_store(args.postgres, "taskgate-audit-cost-", lambda url, store: run(url, store, args))


if __name__ == "__main__":
    main()
