"""What the in-row audit layout would cost a real transition (issue 21): a prototype measured inside the product.

`audit_layouts.py` measures where a link could live on a bare sqlite3 transaction; this script measures the layout
docs/decisions.md names as the only one that could reach ≤ 1.05× **inside `SessionService.fire`**, before anyone
rewrites the product for it. On SQLite FULL, with the real migrations plus, in this benchmark's database only,
two columns on `transition_log`, `events` and `sessions` (`chain_seq`, `link_hash` / `chain_hash`):

- **in-row**: the session's locking read also reads the next ids of `transition_log` and `events` (the unit holds
  SQLite's write lock from BEGIN IMMEDIATE, so `max(id) + 1` is the id the INSERT would take) and the session
  chain's head from the session row; each audited record is hashed *before* its INSERT (the v1 link hash, over
  its fields with that id) and inserted with its id, its chain seq and its hash; the head is written back to the
  session row at commit, by one UPDATE (**in-row, head by its own UPDATE**), or not at all (**in-row, head folded**:
  what it would cost if the session's own UPDATE carried it, as the redesign would do after moving that UPDATE
  to the end of the unit; the two columns more in an UPDATE already sent are taken as free). No `audit_links`,
  no `audit_chains` write.
- **in-row, folded, lean hash**: the same, with each record hashed the leanest way (one orjson call over its
  values in column order; not the v1 format): what a format built for speed would leave.
- **on**: the product as it is (links in `audit_links`, the head in `audit_chains`).
- **off**: no chaining at all (`audit_cost.py`'s "off").

The modes alternate call by call, a session each per iteration (the order rotates), in one database, the
in-row statements run on the driver as the product's hot statements do. The prototype patches the product's
classes in this process only; nothing of it is taskgate's code. It does not verify, export or prune, and it
covers only records written by a unit that locked their session (a fire's transition row and event), which is
all a fire writes.

Printed: per trigger and mode the median wall time, the ratio to off, and the process CPU added per transition;
`ROW|` lines for the in-row modes against off (goal ≤ 1.05×).

On PostgreSQL (`--postgres`) the locking read takes the two ids from the sequences (`nextval`, one each: a fire
appends one row to each table; the product would have to take them under the outbox's lock, docs/decisions.md).

Run:  .venv/bin/python benchmarks/audit_inrow.py [--n 400] [--warmup 40] [--postgres [URL]]   (~5 s; ~30 s on PG)
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from collections import defaultdict
from operator import itemgetter
from typing import Any

import audit_cost
import orjson
from bench_support import PG_BENCH_URL, emit_row, run_on_one_store
from sqlalchemy import Column, Integer, MetaData, String, bindparam, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine
from transition_cost import Stack, fire, open_stack, ready_sessions

from taskgate.domain.audit_chain import (
    AUDITED_FIELDS,
    GENESIS,
    PRIMARY_KEYS,
    appended_fields,
    canonical_fields,
    link_hash,
    session_chain,
)
from taskgate.infrastructure.db import session_store
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.audit_trail import AuditTrail
from taskgate.infrastructure.db.session_store import (
    SqlAlchemyEventLog,
    SqlAlchemySessionRepository,
    SqlAlchemyTransitionLog,
)

TRIGGERS = ("start", "plan_complete")
MODES = ("on", "in-row, head by its own UPDATE", "in-row, head folded", "in-row, folded, lean hash", "off")
GOAL_RATIO = 1.05

# -- the prototype's tables and statements (this benchmark's database only) -----------------------------------

_META = MetaData()
_TL = t.transition_log.to_metadata(_META)
_EV = t.events.to_metadata(_META)
_SESSIONS = t.sessions.to_metadata(_META)
for _table, _columns in ((_TL, ("chain_seq", "link_hash")), (_EV, ("chain_seq", "link_hash")),
                         (_SESSIONS, ("chain_seq", "chain_hash"))):  # fmt: skip
    _table.append_column(Column(_columns[0], Integer, nullable=True))
    _table.append_column(Column(_columns[1], String(64), nullable=True))

SESSION_INROW = select(
    _SESSIONS,
    select(func.max(_TL.c.seq)).scalar_subquery().label("tl_top"),
    select(func.max(_EV.c.id)).scalar_subquery().label("ev_top"),
).where(_SESSIONS.c.id == bindparam("id"))
# PostgreSQL: the ids come from the sequences, taken by the locking read (a fire appends one row to each table).
SESSION_INROW_PG = (
    select(
        _SESSIONS,
        (func.nextval("transition_log_seq_seq") - 1).label("tl_top"),
        (func.nextval("events_id_seq") - 1).label("ev_top"),
    )
    .where(_SESSIONS.c.id == bindparam("id"))
    .with_for_update(of=_SESSIONS)
)
INSERT_TL = insert(_TL)
INSERT_EV = insert(_EV)
SET_HEAD = (
    update(_SESSIONS)
    .where(_SESSIONS.c.id == bindparam("match_id"))
    .values(chain_seq=bindparam("new_seq"), chain_hash=bindparam("new_hash"))
)
_DDL = (
    "ALTER TABLE transition_log ADD COLUMN chain_seq INTEGER",
    "ALTER TABLE transition_log ADD COLUMN link_hash VARCHAR(64)",
    "ALTER TABLE events ADD COLUMN chain_seq INTEGER",
    "ALTER TABLE events ADD COLUMN link_hash VARCHAR(64)",
    "ALTER TABLE sessions ADD COLUMN chain_seq INTEGER",
    "ALTER TABLE sessions ADD COLUMN chain_hash VARCHAR(64)",
)


# -- the prototype's write path (patched in for the in-row modes) ----------------------------------------------


class InRowChain:
    """A unit's session chain in the in-row layout: its head and the next ids, read with the session lock."""

    __slots__ = ("chain", "hash", "last_event", "last_seq", "moved", "next_event", "next_seq", "seq", "session_id")

    def __init__(self, row: Any, reserved: bool) -> None:
        self.session_id, self.chain = row["id"], session_chain(row["id"])
        self.seq, self.hash = int(row["chain_seq"] or 0), row["chain_hash"] or GENESIS
        self.next_seq, self.next_event = int(row["tl_top"] or 0) + 1, int(row["ev_top"] or 0) + 1
        # On PostgreSQL only the one id of each table the read took from its sequence is this unit's to use.
        self.last_seq = self.next_seq if reserved else None
        self.last_event = self.next_event if reserved else None
        self.moved = False

    def link(self, table: str, record_id: int, values: dict[str, Any]) -> dict[str, Any]:
        """`values` with the record's id, chain seq and link hash: the head moves on by one record."""
        self.seq += 1
        if _LEAN[0]:
            self.hash = lean_hash(self.chain, self.seq, self.hash, table, record_id, values)
        else:
            self.hash = link_hash(self.chain, self.seq, self.hash, table, appended_fields(table, values, record_id))
        self.moved = True
        return {**values, "chain_seq": self.seq, "link_hash": self.hash}


_CHAINS: dict[int, InRowChain] = {}  # by id(trail): AuditTrail has __slots__ and no weak references
_FOLD = [False]  # whether the head's write is taken as folded into the session's UPDATE
_LEAN = [False]  # whether records are hashed the leanest way (not the v1 format)
_VALUES_OF = {
    table: itemgetter(*(name for name in AUDITED_FIELDS[table] if name not in (PRIMARY_KEYS[table], "at")))
    for table in AUDITED_FIELDS
}


def lean_hash(chain: str, seq: int, prev: str, table: str, record_id: int, values: dict[str, Any]) -> str:
    """What a format built for speed could cost (not v1, not kept): one orjson call over the record's values in
    column order (no canonical dict, no sorted keys, no float walk: floats would be refused where written)."""
    row = (chain, seq, prev, table, record_id, values["at"].isoformat(), _VALUES_OF[table](values))
    return hashlib.sha256(orjson.dumps(row)).hexdigest()


async def _inrow_lock(repo: SqlAlchemySessionRepository, session_id: str, trail: AuditTrail) -> Any:
    postgres = repo._dialect == "postgresql"
    row = await repo._one(SESSION_INROW_PG if postgres else SESSION_INROW, {"id": session_id})
    if row is not None:
        _CHAINS[id(trail)] = InRowChain(row, reserved=postgres)
    return row


async def _inrow_transition(repo: SqlAlchemyTransitionLog, record: Any) -> int:
    chain = _CHAINS.get(id(repo._trail))
    values = session_store._record_values(record)
    if chain is None or values["session_id"] != chain.session_id:
        raise AssertionError("the prototype covers only a unit that locked the record's session")
    seq, chain.next_seq = chain.next_seq, chain.next_seq + 1
    if chain.last_seq is not None and seq > chain.last_seq:
        raise AssertionError("the prototype reserves one transition_log id per unit on PostgreSQL")
    await repo._conn.execute(INSERT_TL, {**chain.link("transition_log", seq, values), "seq": seq})
    return seq


async def _inrow_event(repo: SqlAlchemyEventLog, kind: str, at: Any, payload: Any, session_id: Any = None) -> None:
    chain = _CHAINS.get(id(repo._trail))
    if chain is None or session_id != chain.session_id:
        raise AssertionError("the prototype covers only a unit that locked the record's session")
    values = {"kind": kind, "at": at, "payload": payload, "session_id": session_id}
    event_id, chain.next_event = chain.next_event, chain.next_event + 1
    if chain.last_event is not None and event_id > chain.last_event:
        raise AssertionError("the prototype reserves one events id per unit on PostgreSQL")
    await repo._conn.execute(INSERT_EV, {**chain.link("events", event_id, values), "id": event_id})


async def _inrow_seal(trail: AuditTrail) -> int:
    chain = _CHAINS.pop(id(trail), None)
    trail._pending, trail._known = [], {}
    if chain is not None and chain.moved and not _FOLD[0]:
        params = {"match_id": chain.session_id, "new_seq": chain.seq, "new_hash": chain.hash}
        await trail._sealer._conn.execute(SET_HEAD, params)
    return 0


_PRODUCT = {
    "lock": SqlAlchemySessionRepository._with_head,
    "transition": SqlAlchemyTransitionLog.append,
    "event": SqlAlchemyEventLog.append,
}


def set_mode(mode: str) -> None:
    """Install `mode`: the product's own code ("on"), no chaining ("off") or the in-row prototype."""
    inrow = mode.startswith("in-row")
    audit_cost.set_chaining(mode != "off")  # "on" also for the in-row modes: their seal and add replaced below
    _FOLD[0] = mode in ("in-row, head folded", "in-row, folded, lean hash")
    _LEAN[0] = mode == "in-row, folded, lean hash"
    SqlAlchemySessionRepository._with_head = _inrow_lock if inrow else _PRODUCT["lock"]  # type: ignore[method-assign]
    SqlAlchemyTransitionLog.append = _inrow_transition if inrow else _PRODUCT["transition"]  # type: ignore[method-assign]
    SqlAlchemyEventLog.append = _inrow_event if inrow else _PRODUCT["event"]  # type: ignore[method-assign]
    if inrow:
        AuditTrail.add = audit_cost._no_add  # type: ignore[method-assign]
        AuditTrail.seal = _inrow_seal  # type: ignore[method-assign]


# -- measuring ------------------------------------------------------------------------------------------------


async def prepare(stack: Stack) -> None:
    """Add the prototype's columns to the migrated database, before the timed part."""
    engine = stack.database.engine
    if isinstance(engine, AsyncEngine):
        async with engine.begin() as conn:
            for statement in _DDL:
                await conn.exec_driver_sql(statement)
        return
    with engine.begin() as conn:
        for statement in _DDL:
            conn.exec_driver_sql(statement)


async def measure(stack: Stack, ids: list[str], n: int, warmup: int) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """(wall, CPU) ns per (trigger, mode), the modes alternating call by call on a session each."""
    samples: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for i in range(n + warmup):
        own = dict(zip(MODES, ids[len(MODES) * i : len(MODES) * (i + 1)], strict=True))
        order = MODES[i % len(MODES) :] + MODES[: i % len(MODES)]
        for trigger in TRIGGERS:
            for mode in order:
                set_mode(mode)
                try:
                    cpu, wall = time.process_time_ns(), time.perf_counter_ns()
                    await fire(stack, own[mode], trigger)()
                    wall, cpu = time.perf_counter_ns() - wall, time.process_time_ns() - cpu
                finally:
                    set_mode("on")
                if i >= warmup:
                    samples[(trigger, mode)].append((wall, cpu))
    return samples


async def check_chains(stack: Stack) -> int:
    """Re-hash every in-row chain the run wrote from the rows as stored (read back through the tables' own types);
    returns how many records matched. Raises AssertionError on the first that does not: the prototype must write
    what a verify would accept."""
    queries = {
        "transition_log": select(_TL).where(_TL.c.chain_seq.is_not(None)),
        "events": select(_EV).where(_EV.c.chain_seq.is_not(None)),
        "sessions": select(_SESSIONS.c.id, _SESSIONS.c.chain_seq, _SESSIONS.c.chain_hash),
    }
    async with stack.uow(write=False) as uow:
        conn = uow._conn  # the unit's own connection: a plain read of the three tables
        found = {name: [dict(r) for r in (await conn.execute(q)).mappings().all()] for name, q in queries.items()}
    heads = {r["id"]: (r["chain_seq"], r["chain_hash"]) for r in found.pop("sessions")}
    by_session: dict[str, list[tuple[int, str, Any]]] = defaultdict(list)
    for table, rows in found.items():
        for row in rows:
            by_session[row["session_id"]].append((row["chain_seq"], table, row))
    checked = 0
    for session_id, records in by_session.items():
        if heads[session_id][1] is None:
            continue  # "head folded": its head is not written (the mode only times the rest), so it restarts
        prev = GENESIS
        for seq, table, row in sorted(records, key=lambda r: r[0]):
            expected = link_hash(session_chain(session_id), seq, prev, table, canonical_fields(table, row))
            assert expected == row["link_hash"], f"{table} {row[PRIMARY_KEYS[table]]}: does not hash"
            prev, checked = expected, checked + 1
        assert heads[session_id] == (seq, prev), f"session {session_id}: its head is not its last link"
    return checked


def report(store: str, samples: dict[tuple[str, str], list[tuple[int, int]]]) -> None:
    """Median wall and ratio to off, CPU added; ROW lines for the in-row modes."""
    print(f"\n== one transition, {store}, the modes alternating (n={len(samples[(TRIGGERS[0], 'off')])}) ==")
    for trigger in TRIGGERS:
        off_wall = statistics.median(w for w, _ in samples[(trigger, "off")])
        off_cpu = statistics.median(c for _, c in samples[(trigger, "off")])
        for mode in MODES:
            wall = statistics.median(w for w, _ in samples[(trigger, mode)])
            cpu = statistics.median(c for _, c in samples[(trigger, mode)])
            added = (cpu - off_cpu) / 1e3
            print(f"  {trigger:14} {mode:32} {wall / 1e6:7.3f} ms  {wall / off_wall:6.3f}×   CPU +{added:5.0f} µs")
            if mode.startswith("in-row"):
                emit_row(f"{store}: {trigger}, audit {mode} vs off", wall / 1e6, off_wall / 1e6, "ms",
                         f"≤ {GOAL_RATIO}×")  # fmt: skip


async def run(url: str, store: str, args: argparse.Namespace) -> None:
    """Migrate, add the prototype's columns, measure, check what the prototype wrote."""
    stack = await open_stack(url, synchronous="FULL")
    try:
        await prepare(stack)
        if stack.database._driver is not None:  # SQLite: run on the driver, as the product's hot statements are
            for statement in (SESSION_INROW, INSERT_TL, INSERT_EV, SET_HEAD):
                stack.database._driver._hot[id(statement)] = statement
        ids = await ready_sessions(stack, len(MODES) * (args.n + args.warmup))
        samples = await measure(stack, ids, args.n, args.warmup)
        report(store, samples)
        print(f"\n  the prototype's chains re-hash from the stored rows: {await check_chains(stack)} records")
    finally:
        await stack.database.dispose()


def main() -> None:
    """One run on a scratch SQLite database or on PostgreSQL, with the load average before and after."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="timed iterations (each: start + plan_complete per mode)")
    parser.add_argument("--warmup", type=int, default=40, help="untimed iterations first")
    parser.add_argument(
        "--postgres", nargs="?", const=PG_BENCH_URL, default=None, metavar="URL",
        help=f"run on PostgreSQL (schema public reset first; default {PG_BENCH_URL})",
    )  # fmt: skip
    args = parser.parse_args()
    run_on_one_store(args.postgres, "taskgate-audit-inrow-", lambda url, store: run(url, store, args))


if __name__ == "__main__":
    main()
