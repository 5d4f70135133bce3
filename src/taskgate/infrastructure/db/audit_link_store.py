"""The linker's storage: which audited records wait for a link, and one batch of them linked (issue 21).

`audit_marks` holds, per audited table, the id up to which every record has its link. A batch reads the records
above each mark (at most its table's top, `committed_tops`), links them in their chains after the heads stored in
`audit_chains` (domain/audit/chain.py `link_records`), and writes the links, the new heads and the marks in the
linker's transaction (application/audit/linking.py says why that cannot skip or repeat a record).

Links are numbered here, in the order `link_records` returns them (each chain's in seq order), from the largest
number stored: one linker at a time holds the marks, so numbers follow the order links are written, and a chain's
links are in seq order by number too (the verify pages by number: audit_store.py). Each link names its chain's
link before (`prev_no`, from the head row's `link_no`).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson
from sqlalchemy import JSON, bindparam, func, literal, select, update

from taskgate.domain.audit.chain import (
    AUDITED_FIELDS,
    PRIMARY_KEYS,
    Record,
    canonical_fields,
    canonical_time,
    chain_of,
    link_records,
    needs_reference,
)
from taskgate.domain.errors import StorageError
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.repository_base import SqlRepository

AUDITED_TABLES = {"transition_log": t.transition_log, "decisions": t.decisions, "events": t.events}
_KEYS = {name: table.c[PRIMARY_KEYS[name]] for name, table in AUDITED_TABLES.items()}
_m = t.audit_marks.c
_MARKS = select(_m.record_table, _m.linked_upto)


def mark_of(name: str) -> Any:
    """The mark of audited table `name`, as a scalar subquery."""
    return select(_m.linked_upto).where(_m.record_table == name).scalar_subquery()


_TOPS = select(*(select(func.coalesce(func.max(key), 0)).scalar_subquery().label(name) for name, key in _KEYS.items()))
# Whether any table has a record above its mark: a read of three index ends, without a lock.
_ANY_PENDING = select(
    *(
        (select(func.coalesce(func.max(key), 0)).scalar_subquery() > mark_of(name)).label(name)
        for name, key in _KEYS.items()
    )
)
_PENDING_COUNT = select(
    sum(
        (select(func.count()).where(key > mark_of(name)).scalar_subquery() for name, key in _KEYS.items()),
        start=literal(0),
    )
)
_PENDING = {
    name: select(*(table.c[f] for f in AUDITED_FIELDS[name]))
    .where(_KEYS[name] > bindparam("after"), _KEYS[name] <= bindparam("upto"))
    .order_by(_KEYS[name])
    .limit(bindparam("limit"))
    for name, table in AUDITED_TABLES.items()
}
_SET_MARK = update(t.audit_marks).where(_m.record_table == bindparam("match_table"))
# SQLite: the pending records read on the driver, as stored (`_stored_record`), and the links and heads written
# there too (SQLAlchemy's processing of each row and parameter was a third of a batch's time).
_PENDING_SQLITE = {
    name: f"SELECT {', '.join(AUDITED_FIELDS[name])} FROM {name} WHERE {PRIMARY_KEYS[name]} > ? "
    f"AND {PRIMARY_KEYS[name]} <= ? ORDER BY {PRIMARY_KEYS[name]} LIMIT ?"
    for name in AUDITED_TABLES
}
_INSERT_LINKS_SQLITE = (
    "INSERT INTO audit_links (link_no, chain_id, chain_seq, record_table, record_id, hash, prev_no) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_SET_HEADS_SQLITE = (
    "INSERT INTO audit_chains (chain_id, seq, hash, signed_seq, link_no) VALUES (?, ?, ?, 0, ?) "
    "ON CONFLICT (chain_id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, link_no = excluded.link_no"
)
_LAST_LINK_NO = select(func.coalesce(func.max(t.audit_links.c.link_no), 0))
_LINK_COLUMNS = ("link_no", "chain_id", "chain_seq", "record_table", "record_id", "hash", "prev_no")
NumberedLink = tuple[int, str, int, str, int, str, int | None]
Head = tuple[str, int, str, int]
_JSON_COLUMNS = {
    name: frozenset(c.name for c in table.columns if isinstance(c.type, JSON)) for name, table in AUDITED_TABLES.items()
}

_HEADS_CHUNK = 500  # chains per IN list: well inside SQLite's and asyncpg's parameter limits
_c = t.audit_chains.c
_HEADS = select(_c.chain_id, _c.seq, _c.hash, _c.link_no).where(_c.chain_id.in_(bindparam("chains", expanding=True)))
# How long the SHARE lock may wait. Short, and below PostgreSQL's deadlock_timeout (1 s by default): a writer that
# inserted into a later table of the three before an earlier one (an approval writes its decision and its event,
# then its log row: application/sessions/records.py) holds what this lock waits for while it waits for what this
# lock holds. Timing out first, the linker gives way (its transaction ends, the writer goes on) and tries again
# (linking.link_pending), where the deadlock detector would have failed one of the two after a second. Short also
# because every writer queued behind a waiting SHARE lock waits with it.
_LOCK_TIMEOUT = "200ms"


class AuditLinkStore(SqlRepository):
    """The linker's half of the audit repository (audit_store.py adds the rest)."""

    async def pending_records(self) -> int:
        return int((await self._conn.execute(_PENDING_COUNT)).scalar_one())

    async def committed_tops(self) -> dict[str, int] | None:
        if not any((await self._conn.execute(_ANY_PENDING)).one()):
            return None  # nothing to link: no lock taken
        if self._dialect == "postgresql":
            # SHARE waits for every transaction holding ROW EXCLUSIVE on these tables (any that inserted), and
            # keeps new ones out until this transaction ends: no id at or below the tops read here commits later.
            await self._conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
            await self._conn.exec_driver_sql("LOCK TABLE transition_log, decisions, events IN SHARE MODE")
        row = (await self._conn.execute(_TOPS)).mappings().one()
        return {name: int(row[name]) for name in AUDITED_TABLES}

    async def link_pending(self, tops: dict[str, int], limit: int) -> tuple[int, bool]:
        marks = await self._locked_marks()
        if self._dialect != "postgresql":
            # SQLite: this transaction holds the write lock, so the tops read now are committed, and they are the
            # ones to use: tops read before a prune freed the largest ids could lift a mark over ids given out again.
            tops = {name: int(top) for name, top in (await self._conn.execute(_TOPS)).mappings().one().items()}
        records: list[Record] = []
        more = False
        for name in AUDITED_TABLES:
            found = await self._pending(name, marks[name], tops[name], limit)
            records += found
            if len(found) == limit and found[-1][1] < tops[name]:  # more below the top: the next batch starts
                more, marks[name] = True, found[-1][1]  # after the last one read
            else:  # never down: another linker may have read later tops, and linked past these, since they were read
                marks[name] = max(marks[name], tops[name])
        if records:
            heads, numbers = await self._heads(records)
            links, moved = link_records(heads, records)
            await self._write(*await self._numbered(links, moved, numbers))
        await self._conn.execute(_SET_MARK, [{"match_table": n, "linked_upto": v} for n, v in marks.items()])
        return len(records), more

    async def _pending(self, name: str, after: int, upto: int, limit: int) -> list[Record]:
        """Up to `limit` records of table `name` with `after` < id <= `upto`, in id order, with canonical fields."""
        key = PRIMARY_KEYS[name]
        if self._dialect == "postgresql":
            rows = await self._all(_PENDING[name], {"after": after, "upto": upto, "limit": limit})
            return [(name, int(row[key]), canonical_fields(name, row), False) for row in rows]
        rows = (await self._conn.exec_driver_sql(_PENDING_SQLITE[name], (after, upto, limit))).all()
        return [_stored_record(name, row) for row in rows]

    async def _numbered(
        self, links: list[tuple[str, int, str, int, str]], moved: dict[str, tuple[int, str]], numbers: dict[str, int]
    ) -> tuple[list[NumberedLink], list[Head]]:
        """`links` numbered on from the largest stored number (this linker holds the marks: no other numbers
        links meanwhile), each with its chain's link before; and the heads `moved` to, with their links' numbers.

        A number freed by a prune of the newest links may be given again: a `prev_no` is only ever followed to a
        link of the same chain and seq before (audit_store.py), so a stale one leads nowhere."""
        number = int((await self._conn.execute(_LAST_LINK_NO)).scalar_one())
        numbered: list[NumberedLink] = []
        for chain, seq, table, record_id, link in links:
            number += 1
            numbered.append((number, chain, seq, table, record_id, link, numbers.get(chain)))
            numbers[chain] = number
        return numbered, [(chain, seq, head, numbers[chain]) for chain, (seq, head) in sorted(moved.items())]

    async def _write(self, links: list[NumberedLink], heads: list[Head]) -> None:
        """Insert the links and move the heads (executemany, one statement each)."""
        if self._dialect == "postgresql":
            await self._conn.execute(sql.INSERT_LINK, [dict(zip(_LINK_COLUMNS, link, strict=True)) for link in links])
            moved = [{"chain_id": chain, "seq": seq, "hash": head, "link_no": no} for chain, seq, head, no in heads]
            await self._conn.execute(sql.set_chain_head(self._dialect), moved)
            return
        await self._conn.exec_driver_sql(_INSERT_LINKS_SQLITE, links)
        await self._conn.exec_driver_sql(_SET_HEADS_SQLITE, heads)

    async def _locked_marks(self) -> dict[str, int]:
        """The marks, held for this transaction: a second linker waits here for the first one's commit."""
        stmt = _MARKS.with_for_update() if self._dialect == "postgresql" else _MARKS
        marks = {r.record_table: int(r.linked_upto) for r in (await self._conn.execute(stmt)).all()}
        if set(marks) != set(AUDITED_TABLES):
            raise StorageError("the audit marks are missing: the database is not migrated to 0016 (taskgate migrate)")
        return marks

    async def _heads(self, records: list[Record]) -> tuple[dict[str, tuple[int, str]], dict[str, int]]:
        """The stored heads (seq, hash) of the chains `records` go to (a new chain has none), and their links'
        numbers."""
        chains = sorted({chain_of(record[0], record[2]) for record in records})
        heads, numbers = {}, {}
        for first in range(0, len(chains), _HEADS_CHUNK):
            chunk = chains[first : first + _HEADS_CHUNK]
            if self._dialect == "postgresql":
                rows = (await self._conn.execute(_HEADS, {"chains": chunk})).all()
            else:  # on the driver: SQLAlchemy's expanding IN cost ~1 µs a record
                rows = (await self._conn.exec_driver_sql(_heads_sqlite(len(chunk)), tuple(chunk))).all()
            for chain, seq, head, number in rows:
                heads[chain] = (int(seq), head)
                if number is not None:
                    numbers[chain] = int(number)
        return heads, numbers

    async def lower_marks_to_tops(self) -> None:
        """SQLite reuses the largest rowid once its row is deleted: after a prune, a mark above its table's largest
        id comes down to it, or a new record taking a removed id would stay below the mark, never linked.
        (PostgreSQL's sequences never hand an id out twice.)"""
        if self._dialect == "postgresql":
            return
        for name, key in _KEYS.items():
            top = select(func.coalesce(func.max(key), 0)).scalar_subquery()
            stmt = update(t.audit_marks).where(_m.record_table == name, _m.linked_upto > top).values(linked_upto=top)
            await self._conn.execute(stmt)


@cache
def _heads_sqlite(count: int) -> str:
    """The heads of `count` chains, on SQLite's driver."""
    return f"SELECT chain_id, seq, hash, link_no FROM audit_chains WHERE chain_id IN ({', '.join('?' * count)})"


def _stored_record(name: str, row: Any) -> Record:
    """A record of table `name` as SQLite's driver returns it (the columns of AUDITED_FIELDS, as stored), with the
    canonical fields a verify computes from the same row read through SQLAlchemy (tests/integration/
    test_audit_linker.py compares the two). A JSON text is read by orjson unless that gives a float (a number with a
    fraction or an exponent, or an integer beyond 64 bits, which orjson reads as a float and `json` as an integer)
    or fails: then by SQLAlchemy's reader (`json`), and its record is not plain; so is a bare number, which SQLite
    stores as a number (the JSON columns have NUMERIC affinity). `at` is rewritten from its stored
    text (`YYYY-MM-DD HH:MM:SS.ffffff`, naive UTC, as SQLAlchemy writes it); any other text is read as SQLAlchemy
    reads it."""
    plain = _PLAIN_SCALARS.issuperset(map(type, row))  # as stored: JSON columns are texts
    fields: dict[str, Any] = dict(zip(AUDITED_FIELDS[name], row, strict=True))
    for column in _JSON_COLUMNS[name]:
        stored = fields[column]
        if stored is None:
            continue
        if type(stored) is str:
            try:
                value = orjson.loads(stored)
            except (
                orjson.JSONDecodeError
            ):  # NaN, a lone surrogate, ...: SQLAlchemy reads it, or fails as a verify would
                value = None
            else:
                if not needs_reference(value):
                    fields[column] = value
                    continue
        # A float, a long integer, or what SQLite's NUMERIC affinity made of a bare number: as SQLAlchemy reads it.
        fields[column], plain = _sqlalchemy_reader(name, column)(stored), False
    fields["at"] = _canonical_stored_time(fields["at"])
    return name, int(fields[PRIMARY_KEYS[name]]), fields, plain


_PLAIN_SCALARS = frozenset({str, int, type(None)})


def _canonical_stored_time(stored: Any) -> str:
    """The canonical text of a stored `at`: SQLAlchemy's own format rewritten, anything else read as SQLAlchemy
    reads it (a row written by hand)."""
    if type(stored) is str and len(stored) == 26 and stored[10] == " " and stored[19] == "." and stored[4] == "-":
        return f"{stored[:10]}T{stored[11:]}Z"
    return canonical_time(_sqlalchemy_reader("events", "at")(stored))


@cache
def _sqlalchemy_reader(name: str, column: str) -> Any:
    """How SQLAlchemy reads column `column` of table `name` on SQLite (what a verify's row holds)."""
    from sqlalchemy.dialects import sqlite

    return AUDITED_TABLES[name].c[column].type._cached_result_processor(sqlite.dialect(), None)
