"""What a linker pass's writes cost on SQLite, by link layout and by the size of the history: plain sqlite3.

The linker (application/audit/linking.py) writes, per pass, a link row per record and the new head of every chain
that grew. `audit_cost.py` measures it on a small database (a few thousand sessions of a few records each); this
asks how the writes alone (no reading, no hashing: fixed 64-character hashes) scale with the history already
stored, and what another layout of `audit_links` would cost. Each layout gets a file of its own, with the same
history grown organically (`--active` sessions at a time, each getting its `--per-session` links in turns, so the
b-trees' pages fill as they would in service), then passes of `--chains` recent chains × 4 links each, alternating
file by file, pass by pass:

- `by chain` (taskgate 0015 to 0016): `audit_links` WITHOUT ROWID keyed by (chain_id, chain_seq), the heads
  upserted in `audit_chains`;
- `in link order` (taskgate since 0017): `audit_links` a rowid table keyed by the link's number, in the order links
  are written, each naming its chain's link before (`prev_no`), with a unique index on (record_table, record_id)
  (both grow at their right edge), the heads upserted with their links' numbers in a rowid table (rows in the
  order chains were created, the chain id in an index of its own: the heads of the sessions at work sit together);
- `in link order, heads by chain`: the same links, the heads WITHOUT ROWID keyed by chain id (as before 0017);
- `in link order, chain index`: the same rowid table with a unique index on (chain_id, chain_seq) instead (the
  queries by chain kept as they are), the same head upserts;
- `in link order, no head rows`: the same without the `audit_chains` writes (what is left if the head were read
  from elsewhere).

Printed per history size: each layout's median pass (BEGIN IMMEDIATE, the inserts, the head writes, COMMIT), per
record, the WAL frames it wrote, and its ratio to `by chain` (the baseline, measured in the same run).

Run:  .venv/bin/python benchmarks/audit_link_batches.py [--sessions 2800,20000] [--passes 12]   (~1 min)
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HASH = "ab" * 32
LINKS_PER_CHAIN_PER_PASS = 4
_IN_LINK_ORDER = """
    CREATE TABLE audit_links (link_no INTEGER PRIMARY KEY, chain_id TEXT, chain_seq INT, record_table TEXT,
                              record_id INT, hash TEXT{prev_no});
    CREATE UNIQUE INDEX {index} ON audit_links ({columns});"""
_BY_RECORD = {"prev_no": ", prev_no INT", "index": "uq_links_record", "columns": "record_table, record_id"}
LAYOUTS: dict[str, str] = {
    "by chain": """
        CREATE TABLE audit_links (chain_id TEXT, chain_seq INT, record_table TEXT, record_id INT, hash TEXT,
                                  PRIMARY KEY (chain_id, chain_seq)) WITHOUT ROWID;""",
    "in link order": _IN_LINK_ORDER.format(**_BY_RECORD),
    "in link order, heads by chain": _IN_LINK_ORDER.format(**_BY_RECORD),
    "in link order, chain index": _IN_LINK_ORDER.format(
        prev_no="", index="uq_links_chain", columns="chain_id, chain_seq"
    ),
    "in link order, no head rows": _IN_LINK_ORDER.format(**{**_BY_RECORD, "prev_no": ""}),
}
HEADS = (
    "CREATE TABLE audit_chains (chain_id TEXT PRIMARY KEY, seq INT, hash TEXT, signed_seq INT, link_no INT) "
    "WITHOUT ROWID;"
)
INSERT_LINK = "INSERT INTO audit_links (chain_id, chain_seq, record_table, record_id, hash) VALUES (?, ?, ?, ?, ?)"
SET_HEAD = (
    "INSERT INTO audit_chains (chain_id, seq, hash, signed_seq) VALUES (?, ?, ?, 0) "
    "ON CONFLICT (chain_id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash"
)
# taskgate's own statements since 0017 (infrastructure/db/audit_link_store.py)
INSERT_NUMBERED_LINK = (
    "INSERT INTO audit_links (link_no, chain_id, chain_seq, record_table, record_id, hash, prev_no) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
SET_NUMBERED_HEAD = (
    "INSERT INTO audit_chains (chain_id, seq, hash, signed_seq, link_no) VALUES (?, ?, ?, 0, ?) "
    "ON CONFLICT (chain_id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, link_no = excluded.link_no"
)


class Store:
    """One layout's file, its chains' lengths and the next record id."""

    def __init__(self, folder: Path, layout: str) -> None:
        self.layout, self.path = layout, folder / f"{layout.replace(' ', '_').replace(',', '')}.db"
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        for pragma in ("journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON"):
            self.conn.execute(f"PRAGMA {pragma}")
        # taskgate's heads since 0017 are a rowid table (rows in the order chains were created); WITHOUT ROWID before
        heads = HEADS.replace(" WITHOUT ROWID", "") if layout == "in link order" else HEADS
        self.conn.executescript(LAYOUTS[layout] + heads)
        self.seqs: dict[str, int] = {}
        self.numbers: dict[str, int] = {}  # each chain's last link number (the numbered layout)
        self.next_id = 1

    def write(self, counts: dict[str, int]) -> None:
        """One transaction: `counts[chain]` links for each chain (in chain order, as the linker writes them), and
        the heads of the chains that grew (but in the layout without head rows)."""
        links = link_rows(counts, self.seqs, self.next_id)
        self.next_id += len(links)
        self.conn.execute("BEGIN IMMEDIATE")
        if self.layout in ("in link order", "in link order, heads by chain"):  # numbered, as taskgate writes them
            write_numbered(self.conn, links, counts, self.seqs, self.numbers)
        else:
            self.conn.executemany(INSERT_LINK, links)
            if self.layout != "in link order, no head rows":
                self.conn.executemany(SET_HEAD, [(chain, self.seqs[chain], HASH) for chain in sorted(counts)])
        self.conn.execute("COMMIT")

    def wal_frames(self) -> int:
        """Frames in the WAL since the last truncating checkpoint."""
        return max(0, os.path.getsize(f"{self.path}-wal") - 32) // (4096 + 24)

    def truncate_wal(self) -> None:
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def chain_names(count: int, seed: int) -> list[str]:
    """`count` session chains with random (repeatable) ids."""
    rng = random.Random(seed)
    return [f"session:{uuid.UUID(int=rng.getrandbits(128), version=4)}" for _ in range(count)]


def organic_batches(sessions: list[str], per_session: int, active: int, seed: int) -> Iterator[dict[str, int]]:
    """A history grown organically, as batches of 500 links (the linker's): `active` sessions at a time, each next
    link going to a random one of them; a session leaves after `per_session`. Each batch: links per chain."""
    rng = random.Random(seed)
    waiting, live = list(reversed(sessions)), []
    planned: dict[str, int] = {}
    batch: dict[str, int] = {}
    filled = 0
    while waiting or live:
        while len(live) < active and waiting:
            live.append(waiting.pop())
        chain = rng.choice(live)
        batch[chain] = batch.get(chain, 0) + 1
        planned[chain] = planned.get(chain, 0) + 1
        filled += 1
        if planned[chain] == per_session:
            live.remove(chain)
        if filled == 500 or not (waiting or live):
            yield batch
            batch, filled = {}, 0


def link_rows(counts: dict[str, int], seqs: dict[str, int], first_id: int) -> list[tuple[str, int, str, int, str]]:
    """`audit_links` rows for `counts[chain]` links per chain, chains in order, record ids from `first_id`;
    `seqs` (each chain's length) moves on."""
    links = []
    for chain in sorted(counts):
        for _ in range(counts[chain]):
            seqs[chain] = seqs.get(chain, 0) + 1
            links.append((chain, seqs[chain], "events", first_id + len(links), HASH))
    return links


def numbered(links: list[tuple[str, int, str, int, str]], numbers: dict[str, int]) -> list[tuple[Any, ...]]:
    """`links` as taskgate 0017 stores them: numbered by their record ids (given out in order here), each with its
    chain's link before; `numbers` (each chain's last link number) moves on."""
    rows = []
    for chain, seq, table, record_id, link in links:
        rows.append((record_id, chain, seq, table, record_id, link, numbers.get(chain)))
        numbers[chain] = record_id
    return rows


def write_numbered(
    conn: sqlite3.Connection,
    links: list[tuple[str, int, str, int, str]],
    grown: dict[str, int],
    seqs: dict[str, int],
    numbers: dict[str, int],
) -> None:
    """`links` and the heads of the `grown` chains, as taskgate writes them since 0017 (in the caller's
    transaction); `numbers` moves on."""
    conn.executemany(INSERT_NUMBERED_LINK, numbered(links, numbers))
    conn.executemany(SET_NUMBERED_HEAD, [(chain, seqs[chain], HASH, numbers[chain]) for chain in sorted(grown)])


def grow(stores: list[Store], sessions: list[str], per_session: int, active: int, seed: int) -> None:
    """The same organic history in every store (`organic_batches`)."""
    for batch in organic_batches(sessions, per_session, active, seed):
        for store in stores:
            store.write(batch)
    for store in stores:
        store.truncate_wal()


def measure(folder: Path, sessions: int, args: argparse.Namespace) -> None:
    """Grow the history, then time alternating passes; print a line per layout."""
    stores = [Store(folder, layout) for layout in LAYOUTS]
    names = chain_names(sessions, seed=0)
    begin = time.perf_counter()
    grow(stores, names, args.per_session, args.active, seed=sessions)
    built = time.perf_counter() - begin
    recent = names[-max(args.active, args.chains * 4) :]  # the sessions grown last: those still at work
    timings: dict[str, list[float]] = {s.layout: [] for s in stores}
    frames: dict[str, list[int]] = {s.layout: [] for s in stores}
    rng = random.Random(1)
    for index in range(args.passes):
        chains = rng.sample(recent, args.chains)
        for store in stores if index % 2 == 0 else reversed(stores):
            store.truncate_wal()
            start = time.perf_counter()
            store.write(dict.fromkeys(chains, LINKS_PER_CHAIN_PER_PASS))
            timings[store.layout].append(time.perf_counter() - start)
            frames[store.layout].append(store.wal_frames())
    records = args.chains * LINKS_PER_CHAIN_PER_PASS
    links = stores[0].next_id - 1
    print(f"\n== history: {sessions:,} sessions, {links:,} links (grown in {built:.0f} s); passes of {args.chains} "
          f"chains × {LINKS_PER_CHAIN_PER_PASS} links ==")  # fmt: skip
    baseline = statistics.median(timings["by chain"])
    for layout in LAYOUTS:
        median = statistics.median(timings[layout])
        print(f"  {layout:28} {median * 1e3:7.2f} ms a pass, {median / records * 1e6:6.2f} µs a record, "
              f"{statistics.median(frames[layout]):6.0f} WAL frames; {median / baseline:5.2f}× by chain")  # fmt: skip
        print(f"ROW|linker pass writes, {links:,} links: {layout} vs by chain|{median * 1e3:.4g}|"
              f"{baseline * 1e3:.4g}|ms|{median / baseline:.3f}|")  # fmt: skip
    for store in stores:
        store.conn.close()


def main() -> None:
    """Each history size in its own temporary folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="2800,20000", help="history sizes, in sessions (comma-separated)")
    parser.add_argument("--per-session", type=int, default=50, help="links per session in the history")
    parser.add_argument("--active", type=int, default=200, help="sessions growing at a time in the history")
    parser.add_argument("--chains", type=int, default=250, help="chains a pass touches")
    parser.add_argument("--passes", type=int, default=12, help="timed passes per layout")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for sessions in (int(s) for s in args.sessions.split(",")):
        with tempfile.TemporaryDirectory(prefix="taskgate-link-batches-") as folder:
            measure(Path(folder), sessions, args)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
