"""Where an audit link could live, and what each place costs a transaction: plain sqlite3, no taskgate code.

Issue 21 asks chaining to cost ≤ 1.05× a transition. This asks what the storage layout alone allows, with the
hashing left out (a fixed 64-character hash): on one SQLite file (WAL, synchronous=FULL, taskgate's pragmas), a
transaction that writes what a `plan_complete` writes (UPDATE of a session row, INSERT of a transition row and of
an event row, each table with an index on the session) and COMMIT, then the same transaction plus the link
writes of each layout:

- `links+index`: a link row per record in `audit_links` (WITHOUT ROWID, keyed by chain and seq) with an index on
  (record_table, record_id), the head read and upserted in `audit_chains` (taskgate up to revision 0014);
- `links`: the same without that index (taskgate since 0015);
- `links, no head row`: the head is the chain's last link (read by its key), no `audit_chains` write;
- `in-row`: the hash in columns of the record rows, written by an UPDATE after each insert (the id is known only
  then), the head in columns of the session row (pages the transaction writes anyway, no new b-tree);
- `in-row + head row`: the hash in the records' columns, the head in `audit_chains`.
- `in-row, ids known`: the hash in the records' columns written by their own INSERT (their ids read before, with
  the session, as the next rowids: a transaction holds SQLite's write lock), the head carried by the session's
  own UPDATE: no statement and no page the bare transaction does not write;
- `in-row, ids known + head row`: the same, the head upserted in `audit_chains` (one statement, one page).

The layouts alternate transaction by transaction on random sessions of one file, so all see the same disk, cache
and drift. Printed: the median per layout, its ratio to the bare transaction, and the load average.

Run:  .venv/bin/python benchmarks/audit_layouts.py [--n 6000] [--sessions 5000]     (~10 s)
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HASH = "ab" * 32
PAYLOAD = '{"from":"planning","to":"executing","trigger":"plan_complete"}'
SCHEMA = """
CREATE TABLE sessions (id TEXT PRIMARY KEY, state TEXT, version INT, payload TEXT, audit_seq INT DEFAULT 0,
                       audit_head TEXT);
CREATE TABLE transition_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, trigger TEXT, from_state TEXT,
                             to_state TEXT, actor TEXT, reason TEXT, guard_results TEXT, at TEXT, chain_seq INT,
                             link_hash TEXT);
CREATE INDEX ix_tl_session ON transition_log (session_id, seq);
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, kind TEXT, payload TEXT, at TEXT,
                     chain_seq INT, link_hash TEXT);
CREATE INDEX ix_events_session ON events (session_id, id);
CREATE TABLE audit_links (chain_id TEXT, chain_seq INT, record_table TEXT, record_id INT, hash TEXT,
                          PRIMARY KEY (chain_id, chain_seq)) WITHOUT ROWID;
CREATE UNIQUE INDEX uq_links_record ON audit_links (record_table, record_id);
CREATE TABLE audit_links_unindexed (chain_id TEXT, chain_seq INT, record_table TEXT, record_id INT, hash TEXT,
                                    PRIMARY KEY (chain_id, chain_seq)) WITHOUT ROWID;
CREATE TABLE audit_links_headless (chain_id TEXT, chain_seq INT, record_table TEXT, record_id INT, hash TEXT,
                                   PRIMARY KEY (chain_id, chain_seq)) WITHOUT ROWID;
CREATE TABLE audit_chains (chain_id TEXT PRIMARY KEY, seq INT, hash TEXT, signed_seq INT) WITHOUT ROWID;
"""
UPSERT_HEAD = (
    "INSERT INTO audit_chains VALUES (?, ?, ?, 0) "
    "ON CONFLICT (chain_id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash"
)

Layout = Callable[[sqlite3.Connection, str, int, int], None]


def _head(db: sqlite3.Connection, chain: str) -> int:
    row = db.execute("SELECT seq, hash FROM audit_chains WHERE chain_id = ?", (chain,)).fetchone()
    return row[0] if row else 0


def _links(table: str) -> Layout:
    def write(db: sqlite3.Connection, sid: str, tl: int, ev: int) -> None:
        chain = f"{table}:{sid}"  # each layout its own chains: they share the file, not their heads
        seq = _head(db, chain)
        db.execute(f"INSERT INTO {table} VALUES (?, ?, ?, ?, ?), (?, ?, ?, ?, ?)",
                   (chain, seq + 1, "transition_log", tl, HASH, chain, seq + 2, "events", ev, HASH))  # fmt: skip
        db.execute(UPSERT_HEAD, (chain, seq + 2, HASH))

    return write


def links_no_head_row(db: sqlite3.Connection, sid: str, tl: int, ev: int) -> None:
    chain = f"session:{sid}"
    last = db.execute("SELECT chain_seq, hash FROM audit_links_headless WHERE chain_id = ? "
                      "ORDER BY chain_seq DESC LIMIT 1", (chain,)).fetchone()  # fmt: skip
    seq = last[0] if last else 0
    db.execute("INSERT INTO audit_links_headless VALUES (?, ?, ?, ?, ?), (?, ?, ?, ?, ?)",
               (chain, seq + 1, "transition_log", tl, HASH, chain, seq + 2, "events", ev, HASH))  # fmt: skip


def _hash_columns(db: sqlite3.Connection, seq: int, tl: int, ev: int) -> None:
    db.execute("UPDATE transition_log SET chain_seq = ?, link_hash = ? WHERE seq = ?", (seq + 1, HASH, tl))
    db.execute("UPDATE events SET chain_seq = ?, link_hash = ? WHERE id = ?", (seq + 2, HASH, ev))


def in_row(db: sqlite3.Connection, sid: str, tl: int, ev: int) -> None:
    seq = db.execute("SELECT audit_seq FROM sessions WHERE id = ?", (sid,)).fetchone()[0]
    _hash_columns(db, seq, tl, ev)
    db.execute("UPDATE sessions SET audit_seq = ?, audit_head = ? WHERE id = ?", (seq + 2, HASH, sid))


def in_row_head_row(db: sqlite3.Connection, sid: str, tl: int, ev: int) -> None:
    chain = f"in-row:{sid}"
    seq = _head(db, chain)
    _hash_columns(db, seq, tl, ev)
    db.execute(UPSERT_HEAD, (chain, seq + 2, HASH))


_NEXT_IDS = (
    "SELECT s.audit_seq, c.seq, (SELECT max(seq) FROM transition_log), (SELECT max(id) FROM events) FROM sessions s "
    "LEFT JOIN audit_chains c ON c.chain_id = 'known:' || s.id WHERE s.id = ?"
)


def _known_ids(head_row: bool) -> Callable[[sqlite3.Connection, str], None]:
    """A whole `plan_complete`-like transaction body whose records carry their hashes from their INSERT."""

    def write(db: sqlite3.Connection, sid: str) -> None:
        own, row_seq, tl, ev = db.execute(_NEXT_IDS, (sid,)).fetchone()
        seq = (row_seq or 0) if head_row else own
        head = "" if head_row else ", audit_seq = ?, audit_head = ?"
        db.execute(f"UPDATE sessions SET state = 'executing', version = version + 1{head} WHERE id = ?",
                   (sid,) if head_row else (seq + 2, HASH, sid))  # fmt: skip
        db.execute("INSERT INTO transition_log (seq, session_id, trigger, from_state, to_state, actor, reason, "
                   "guard_results, at, chain_seq, link_hash) VALUES (?, ?, 'plan_complete', 'planning', 'executing', "
                   "'operator:alice', NULL, '[]', '2026-11-25 12:00:00.000000', ?, ?)",
                   ((tl or 0) + 1, sid, seq + 1, HASH))  # fmt: skip
        db.execute("INSERT INTO events (id, session_id, kind, payload, at, chain_seq, link_hash) VALUES "
                   "(?, ?, 'session.transitioned', ?, '2026-11-25 12:00:00.000000', ?, ?)",
                   ((ev or 0) + 1, sid, PAYLOAD, seq + 2, HASH))  # fmt: skip
        if head_row:
            db.execute(UPSERT_HEAD + " WHERE audit_chains.seq = ?", (f"known:{sid}", seq + 2, HASH, seq))

    return write


# The layouts whose records carry their links from their INSERT write the transaction's body themselves.
WHOLE: dict[str, Callable[[sqlite3.Connection, str], None]] = {
    "in-row, ids known": _known_ids(head_row=False),
    "in-row, ids known + head row": _known_ids(head_row=True),
}

LAYOUTS: dict[str, Layout | None] = {
    "bare transaction": None,
    "links+index": _links("audit_links"),
    "links": _links("audit_links_unindexed"),
    "links, no head row": links_no_head_row,
    "in-row": in_row,
    "in-row + head row": in_row_head_row,
    **dict.fromkeys(WHOLE),
}


def transaction(db: sqlite3.Connection, sid: str, name: str) -> int:
    """One plan_complete-like transaction with the link writes of layout `name`; its wall time in ns."""
    layout = LAYOUTS[name]
    begin = time.perf_counter_ns()
    db.execute("BEGIN IMMEDIATE")
    if name in WHOLE:
        WHOLE[name](db, sid)
        db.execute("COMMIT")
        return time.perf_counter_ns() - begin
    db.execute("UPDATE sessions SET state = 'executing', version = version + 1 WHERE id = ?", (sid,))
    tl = db.execute("INSERT INTO transition_log (session_id, trigger, from_state, to_state, actor, reason, "
                    "guard_results, at) VALUES (?, 'plan_complete', 'planning', 'executing', 'operator:alice', "
                    "NULL, '[]', '2026-11-25 12:00:00.000000')", (sid,)).lastrowid  # fmt: skip
    ev = db.execute("INSERT INTO events (session_id, kind, payload, at) VALUES (?, 'session.transitioned', ?, "
                    "'2026-11-25 12:00:00.000000')", (sid, PAYLOAD)).lastrowid  # fmt: skip
    if layout is not None:
        layout(db, sid, tl or 0, ev or 0)
    db.execute("COMMIT")
    return time.perf_counter_ns() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=6000, help="transactions in all, spread over the layouts")
    parser.add_argument("--sessions", type=int, default=5000)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp) / "layouts.db", isolation_level=None)
        for pragma in ("journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON", "cache_size=-20000"):
            db.execute(f"PRAGMA {pragma}")
        db.executescript(SCHEMA)
        ids = [f"{i:08x}-0000-4000-8000-000000000000" for i in range(args.sessions)]
        db.execute("BEGIN")
        db.executemany("INSERT INTO sessions (id, state, version, payload) VALUES (?, 'planning', 1, ?)",
                       [(sid, "x" * 300) for sid in ids])  # fmt: skip
        db.execute("COMMIT")
        names, rng = list(LAYOUTS), random.Random(7)
        samples: dict[str, list[int]] = {name: [] for name in names}
        for i in range(args.n):
            name = names[i % len(names)]
            samples[name].append(transaction(db, rng.choice(ids), name))
        db.close()
    bare = statistics.median(samples["bare transaction"])
    print(f"\n== one plan_complete-like transaction (SQLite WAL, synchronous=FULL), {args.n // len(names)} each ==")
    for name in names:
        median = statistics.median(samples[name])
        print(f"  {name:30} {median / 1000:8.1f} µs   {median / bare:.3f}× the bare transaction")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
