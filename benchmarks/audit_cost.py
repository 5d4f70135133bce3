"""Cost the audit chains add to one transition (issue 21): chaining on against chaining off, in the same run.

On a database built by the real migrations (SQLite synchronous=FULL, the product default; PostgreSQL with
`--postgres`), the real `SessionService.fire` runs a guarded `start` (ready → planning) and a `plan_complete`
(planning → executing), as `transition_cost.py` does, each chaining its transition row and its event into the
session's chain at commit ("on": the normal code). "Off" is the same code with `AuditTrail.add` and
`AuditTrail.seal` replaced by no-ops **in this process only**, for the calls of the off half: the records are
written, not linked. A third mode, "hashes only", is the floor of any layout that stores a hash per record: every
record is noted and hashed in its chain as "on" does, the session is read alone, and nothing is stored (no head,
no link). The three modes alternate call by call, on three sessions per iteration (the order rotates), in the
same database, so all see the same file, cache, WAL and machine drift.

Printed: per transition the median and p99 wall time on and off, the ratio (goal ≤ 1.05×: a `ROW` line each),
the floor's ratio to off (a `FLOOR|…` line each: what is left for storage under the goal),
the CPU time of the process per transition on and off (`time.process_time`), the statements each sends on and
off (sqlite3's trace callback; SQLAlchemy's cursor events on PostgreSQL) and the ones chaining adds, and where
the added time goes: over `--profile-n` more iterations (on and off alternating as above), the median wall time
per transition of the whole fire and of its COMMIT on and off, of `AuditTrail.add` (and its canonical fields)
and of `AuditTrail.seal` (and inside it the link hashes, the move of the head read with the session, a head read
again when another writer moved it, the link inserts and the head update),
timed by wrapping those functions and the trail's connection (cProfile misreads coroutines).

Run:  .venv/bin/python benchmarks/audit_cost.py [--n 400] [--warmup 40] [--profile-n 200] [--postgres [URL]]
      (~1 min on SQLite, ~1.5 min on PostgreSQL, on 2 cores)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench_support import PG_BENCH_URL, emit_row, run_on_one_store
from transition_cost import Stack, fire, open_stack, percentile, ready_sessions, statement_log

from taskgate.infrastructure.db import audit_trail
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db.audit_trail import AuditTrail
from taskgate.infrastructure.db.session_store import SqlAlchemySessionRepository
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork

GOAL_RATIO = 1.05
TRIGGERS = ("start", "plan_complete")
_ADD, _SEAL = AuditTrail.add, AuditTrail.seal
_WITH_HEAD = SqlAlchemySessionRepository._with_head
_ON: dict[str, Any] = {"add": _ADD, "seal": _SEAL}  # what "on" installs: the product's own, or timing wrappers
_MODE = ["on"]  # the mode the process is in now
MODES = ("on", "hashes", "off")


# -- chaining on and off ------------------------------------------------------------------------------------


def _no_add(_self: AuditTrail, _table: str, _record_id: int, _values: dict[str, Any]) -> None:
    """`AuditTrail.add` when chaining is off: the record is not noted."""


async def _no_seal(_self: AuditTrail) -> int:
    """`AuditTrail.seal` when chaining is off: nothing is linked."""
    return 0


async def _hash_only_seal(trail: AuditTrail) -> int:
    """`AuditTrail.seal` in the floor mode: each chain's links hashed from a head as "on" would, nothing stored."""
    pending, trail._pending, trail._known = trail._pending, [], {}
    by_chain = audit_trail._by_chain(pending)
    for chain in sorted(by_chain):
        audit_trail._linked(chain, 0, audit_trail.GENESIS, by_chain[chain])
    return len(pending)


async def _plain_lock(repo: SqlAlchemySessionRepository, session_id: str, _trail: AuditTrail) -> Any:
    """The session lock's read when chaining is off: the session alone, without its chain's head."""
    stmt = sql.SESSION_BY_ID_FOR_UPDATE if repo._dialect == "postgresql" else sql.SESSION_BY_ID
    return await repo._one(stmt, {"id": session_id})


def set_chaining(on: bool | str) -> None:
    """Chaining on (the product's own `add`, `seal` and head read with the session lock), off (no-ops, and the
    session read alone) or "hashes" (the product's `add`, a seal that hashes and stores nothing, the session read
    alone), for this process."""
    mode = "on" if on is True else "off" if on is False else on
    _MODE[0] = mode
    AuditTrail.add = _no_add if mode == "off" else _ON["add"]  # type: ignore[method-assign]
    AuditTrail.seal = {"on": _ON["seal"], "off": _no_seal, "hashes": _hash_only_seal}[mode]  # type: ignore[method-assign]
    SqlAlchemySessionRepository._with_head = _WITH_HEAD if mode == "on" else _plain_lock  # type: ignore[method-assign]


@contextmanager
def chaining(on: bool | str) -> Iterator[None]:
    """Chaining on, off or "hashes" for the block; on again afterwards."""
    set_chaining(on)
    try:
        yield
    finally:
        set_chaining(True)


# -- measuring ------------------------------------------------------------------------------------------------


@dataclass
class Samples:
    """Nanoseconds per (trigger, mode): wall and process CPU; the statements of one call per (trigger, mode)."""

    wall: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(list))
    cpu: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(list))
    statements: dict[tuple[str, str], list[str]] = field(default_factory=dict)


async def timed(action: Callable[[], Awaitable[Any]]) -> tuple[int, int]:
    """(wall, process CPU) nanoseconds of one awaited call."""
    cpu, wall = time.process_time_ns(), time.perf_counter_ns()
    await action()
    return time.perf_counter_ns() - wall, time.process_time_ns() - cpu


async def one_iteration(stack: Stack, trio: dict[str, str], order: tuple[str, ...], keep: Samples | None) -> None:
    """`start` then `plan_complete` on each mode's session of `trio`, alternating modes in `order`."""
    for trigger in TRIGGERS:
        for mode in order:
            with chaining(mode):
                wall, cpu = await timed(fire(stack, trio[mode], trigger))
            if keep is not None:
                keep.wall[(trigger, mode)].append(wall)
                keep.cpu[(trigger, mode)].append(cpu)


def rotated(i: int) -> tuple[str, ...]:
    """The modes in iteration `i`'s order: each goes first, second and last equally often."""
    k = i % len(MODES)
    return MODES[k:] + MODES[:k]


async def measure(stack: Stack, ids: list[str], n: int, warmup: int) -> Samples:
    """`warmup + n` iterations on `ids[4:]`, the three modes alternating call by call; then one traced call per
    trigger with chaining on and off, on `ids[2]` and `ids[3]` (their plan is in progress by then, as for most
    starts: no plan row update)."""
    samples = Samples()
    for i in range(n + warmup):
        trio = dict(zip(MODES, ids[4 + 3 * i : 7 + 3 * i], strict=True))
        await one_iteration(stack, trio, rotated(i), samples if i >= warmup else None)
    traced = {"on": ids[2], "off": ids[3]}
    for trigger in TRIGGERS:
        for mode, session_id in traced.items():
            with chaining(mode == "on"), statement_log(stack.database) as seen:
                await fire(stack, session_id, trigger)()
            samples.statements[(trigger, mode)] = seen if stack.database.is_sqlite else [*seen, "COMMIT"]
    return samples


# -- where the time goes ------------------------------------------------------------------------------------


_MOVE, _READ, _LINKS, _ADVANCE = (
    "seal: move the head read with the session (+ links on PostgreSQL)",
    "seal: read (lock) the head again",
    "seal: insert the links",
    "seal: advance the head row",
)
_SEAL_PART_NAMES = (_MOVE, _READ, _LINKS, _ADVANCE)


def seal_part(statement: Any) -> str:
    """Which part of `seal` a statement is: the known head's move, a head read, a link insert or a head move."""
    counts = range(1, sql.MULTI_LINK_INSERTS + 1)
    if statement in (sql.move_known_head("sqlite"), sql.move_known_head("postgresql"),
                     *(sql.seal_known_chain_postgresql(n) for n in counts)):  # fmt: skip
        return _MOVE
    if statement in (sql.CHAIN_HEAD, sql.lock_chain("sqlite"), sql.lock_chain("postgresql")):
        return _READ
    if statement in (sql.INSERT_LINK, *(sql.insert_links_sqlite(n) for n in counts)):
        return _LINKS
    return _ADVANCE  # ADVANCE_CHAIN, set_chain_head_sqlite, seal_chain_postgresql (links and head together)


class TimedConnection:
    """The trail's connection during `seal`, timing each statement by what it does."""

    def __init__(self, conn: Any, totals: Counter[str]) -> None:
        self._conn, self._totals = conn, totals

    async def execute(self, statement: Any, parameters: Any = None) -> Any:
        """Run the statement on the real connection; add its wall time to its part."""
        begin = time.perf_counter_ns()
        try:
            return await self._conn.execute(statement, parameters)
        finally:
            part = seal_part(statement)
            self._totals[part] += time.perf_counter_ns() - begin


def _timed(totals: Counter[str], part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, adding its wall time to `totals[part]`."""

    def timed_call(*args: Any) -> Any:
        begin = time.perf_counter_ns()
        try:
            return fn(*args)
        finally:
            totals[part] += time.perf_counter_ns() - begin

    return timed_call


@contextmanager
def breakdown() -> Iterator[Counter[str]]:
    """Wall nanoseconds spent while the block runs, by part: `add` (and its canonical fields) and `seal` (its head
    lock, link hashes, link inserts, head update) when chaining is on; the unit of work's commit in either mode."""
    totals: Counter[str] = Counter()

    async def seal(trail: AuditTrail) -> int:
        sealer = trail._sealer
        conn, sealer._conn = sealer._conn, TimedConnection(sealer._conn, totals)  # type: ignore[assignment]
        begin = time.perf_counter_ns()
        try:
            return await _SEAL(trail)
        finally:
            totals["seal"] += time.perf_counter_ns() - begin
            sealer._conn = conn

    async def commit(uow: SqlAlchemyUnitOfWork) -> None:
        begin = time.perf_counter_ns()
        try:
            await commit_of_uow(uow)
        finally:
            totals[f"commit ({_MODE[0]})"] += time.perf_counter_ns() - begin

    patched = {"link_hash": _timed(totals, "seal: link hashes", audit_trail.link_hash),
               "appended_fields": _timed(totals, "add: canonical fields", audit_trail.appended_fields)}  # fmt: skip
    originals, commit_of_uow = {name: getattr(audit_trail, name) for name in patched}, SqlAlchemyUnitOfWork.commit
    _ON.update(add=_timed(totals, "add", _ADD), seal=seal)
    SqlAlchemyUnitOfWork.commit = commit  # type: ignore[method-assign]
    for name, fn in patched.items():
        setattr(audit_trail, name, fn)
    try:
        yield totals
    finally:
        _ON.update(add=_ADD, seal=_SEAL)
        set_chaining(True)
        SqlAlchemyUnitOfWork.commit = commit_of_uow  # type: ignore[method-assign]
        for name, fn in originals.items():
            setattr(audit_trail, name, fn)


async def time_parts(stack: Stack, ids: list[str]) -> dict[str, list[int]]:
    """Pairs of sessions as in `measure` (on and off alternating), timed by part: nanoseconds per transition, by
    part ("fire (on)", "commit (off)", "seal: link hashes", ...). The commit's parts exclude its `seal`."""
    parts: dict[str, list[int]] = defaultdict(list)
    with breakdown() as current:
        for i in range(len(ids) // 2):
            pair, order = {"on": ids[2 * i], "off": ids[2 * i + 1]}, ("on", "off") if i % 2 == 0 else ("off", "on")
            for trigger in TRIGGERS:
                for mode in order:
                    current.clear()
                    with chaining(mode == "on"):
                        begin = time.perf_counter_ns()
                        await fire(stack, pair[mode], trigger)()
                        current[f"fire ({mode})"] += time.perf_counter_ns() - begin
                    current[f"commit ({mode})"] -= current["seal"]
                    for part, ns in current.items():
                        parts[part].append(ns)
    return parts


# -- report ---------------------------------------------------------------------------------------------------


def ms(samples: list[int]) -> float:
    """Median of nanosecond samples, in milliseconds."""
    return statistics.median(samples) / 1e6


def report(store: str, samples: Samples) -> None:
    """Per transition: wall on/off and ratio (ROW lines), CPU on/off, statements and the ones chaining adds."""
    print(f"\n== one transition, {store}, chaining on vs off (n={len(samples.wall[('start', 'on')])} each) ==")
    print(f"  {'':16} {'on median':>10} {'off median':>10} {'ratio':>6}   {'on p99':>9} {'off p99':>9}   "
          f"{'CPU on':>9} {'CPU off':>9} {'CPU +':>8}")  # fmt: skip
    for trigger in TRIGGERS:
        on, off = samples.wall[(trigger, "on")], samples.wall[(trigger, "off")]
        cpu_on, cpu_off = ms(samples.cpu[(trigger, "on")]), ms(samples.cpu[(trigger, "off")])
        print(
            f"  {trigger:16} {ms(on):8.3f}ms {ms(off):8.3f}ms {ms(on) / ms(off):5.3f}×   {percentile(on, 99):7.3f}ms "
            f"{percentile(off, 99):7.3f}ms   {cpu_on:7.3f}ms {cpu_off:7.3f}ms {(cpu_on - cpu_off) * 1000:6.0f}µs"
        )
        emit_row(f"{store}: {trigger}, audit chaining on vs off", ms(on), ms(off), "ms", f"≤ {GOAL_RATIO}×")
        floor = samples.wall[(trigger, "hashes")]
        cpu_floor = ms(samples.cpu[(trigger, "hashes")])
        print(
            f"  {trigger + ': floor':16} {ms(floor):8.3f}ms {ms(off):8.3f}ms {ms(floor) / ms(off):5.3f}×   "
            f"{percentile(floor, 99):7.3f}ms {percentile(off, 99):7.3f}ms   {cpu_floor:7.3f}ms {cpu_off:7.3f}ms "
            f"{(cpu_floor - cpu_off) * 1000:6.0f}µs   (hashes only, nothing stored)"
        )
        name = f"{store}: {trigger}, audit hashes only vs off"
        print(f"FLOOR|{name}|{ms(floor):.4g}|{ms(off):.4g}|ms|{ms(floor) / ms(off):.3f}|≤ {GOAL_RATIO}×")
    for trigger in TRIGGERS:
        on, off = samples.statements[(trigger, "on")], samples.statements[(trigger, "off")]
        added = Counter(on) - Counter(off)
        print(f"  {trigger}: {len(on)} statements on, {len(off)} off; chaining adds {sum(added.values())}: "
              f"{', '.join(f'{name} ×{count}' for name, count in added.items())}")  # fmt: skip
        print(f"    on: {', '.join(on)}")


def report_breakdown(parts: dict[str, list[int]]) -> None:
    """Median µs per transition of each part: the whole and the COMMIT on and off, the chaining code's parts."""
    per = {part: statistics.median(ns) / 1000 for part, ns in parts.items()}
    print(f"\n  where the time goes ({len(parts['fire (on)'])} transitions on and as many off, alternating as above; "
          "median wall µs per transition):")  # fmt: skip
    for part, label in (("fire", "whole transition (fire)"), ("commit", "COMMIT (the commit without seal)")):
        on, off = per[f"{part} (on)"], per[f"{part} (off)"]
        print(f"    {label:40} on {on:8.1f} µs   off {off:8.1f} µs   on − off {on - off:7.1f} µs")
    for part in ("add", "add: canonical fields", "seal", "seal: link hashes", *_SEAL_PART_NAMES):
        print(f"    {part:66} {per.get(part, 0.0):8.1f} µs")
    added = per["fire (on)"] - per["fire (off)"]
    grown = per["commit (on)"] - per["commit (off)"]
    print(
        f"    add + seal + the COMMIT's growth: {per['add'] + per['seal'] + grown:.0f} µs of the {added:.0f} µs "
        "chaining adds (medians: they need not add up)"
    )


# -- main -----------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="timed iterations (each: start + plan_complete, on+off)")
    parser.add_argument("--warmup", type=int, default=40, help="untimed iterations first (default 40)")
    parser.add_argument("--profile-n", type=int, default=200, help="iterations timed part by part (0: none)")
    parser.add_argument(
        "--postgres", nargs="?", const=PG_BENCH_URL, default=None, metavar="URL",
        help=f"run on PostgreSQL (schema public reset first; default {PG_BENCH_URL})",
    )  # fmt: skip
    return parser.parse_args()


async def run(url: str, store: str, args: argparse.Namespace) -> None:
    """Measure and report, then time the chaining code part by part, on one migrated database."""
    stack = await open_stack(url, synchronous="FULL")
    try:
        measured = 4 + 3 * (args.n + args.warmup)
        ids = await ready_sessions(stack, measured + 2 * args.profile_n)
        samples = await measure(stack, ids[:measured], args.n, args.warmup)
        report(store, samples)
        if args.profile_n:
            report_breakdown(await time_parts(stack, ids[measured:]))
    finally:
        await stack.database.dispose()


def main() -> None:
    """One run on SQLite (FULL) or on PostgreSQL, with the load average before and after."""
    args = parse_args()
    run_on_one_store(args.postgres, "taskgate-audit-cost-", lambda url, store: run(url, store, args))


if __name__ == "__main__":
    main()
