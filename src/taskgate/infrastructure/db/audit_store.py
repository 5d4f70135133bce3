"""The audit chains' storage: checkpoints, chain heads, and the links read back with their records to verify them
(the linker's half, which writes the links, is audit_link_store.py).

`links()` reads a batch of links in (chain, seq) order, each joined to its record (one LEFT JOIN per audited
table, so a deleted record comes back as a link without fields) and to the link before it (so a window that
starts mid-chain still has each record's predecessor hash). Batches are keyset-paged on (chain, seq), the
primary key, so a verify of millions of rows holds one batch in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, delete, exists, func, insert, literal, or_, select, tuple_, update

from taskgate.application.audit_ports import LinkQuery, PrunePoint
from taskgate.domain.audit_chain import AUDITED_FIELDS, PRIMARY_KEYS, canonical_fields, session_chain
from taskgate.domain.audit_checkpoints import StoredCheckpoint, digest
from taskgate.domain.audit_verify import LinkRow
from taskgate.domain.states import SessionState
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.audit_link_store import AUDITED_TABLES, AuditLinkStore, mark_of

# The checkpoint chain's head row: the last checkpoint's number and body hash; never a record chain. A checkpoint
# locks it first, then raises `signed_seq` on chain heads in sorted order; appenders lock chain heads in sorted
# order too. "!" sorts before every chain id ("global:", "session:"), so all take these locks in one order.
CHECKPOINT_CHAIN = "!checkpoints"
_TABLES = AUDITED_TABLES
_PREFIX = {"transition_log": "tl_", "decisions": "d_", "events": "e_"}
_links, _prev, _chains = t.audit_links, t.audit_links.alias("prev"), t.audit_chains


def _joined() -> Any:
    """Links, each with the link before it and its record's audited columns (prefixed per table)."""
    columns = [_links.c.chain_id, _links.c.chain_seq, _links.c.record_table, _links.c.record_id, _links.c.hash,
               _prev.c.hash.label("prev_hash")]  # fmt: skip
    source = _links.outerjoin(_prev, and_(_prev.c.chain_id == _links.c.chain_id,
                                          _prev.c.chain_seq == _links.c.chain_seq - 1))  # fmt: skip
    for name, table in _TABLES.items():
        columns += [table.c[f].label(_PREFIX[name] + f) for f in AUDITED_FIELDS[name]]
    return select(*columns).select_from(_with_records(source))


def _with_records(source: Any) -> Any:
    """`source` (which holds `audit_links`) outer-joined to each link's record, in whichever table it is."""
    for name, table in _TABLES.items():
        source = source.outerjoin(table, and_(_links.c.record_table == name,
                                              table.c[PRIMARY_KEYS[name]] == _links.c.record_id))  # fmt: skip
    return source


_JOINED = _joined()
# A concurrent appender may have moved a chain on since its head was read: only ever raise the mark.
_RAISE_SIGNED_MARK = (
    update(_chains)
    .where(_chains.c.chain_id == bindparam("match_id"), _chains.c.signed_seq < bindparam("upto"))
    .values(signed_seq=bindparam("upto"))
)
_wd = t.webhook_deliveries.c
# Events the webhook outbox still needs: those with a pending delivery, and each subscriber's cursor (its newest row).
_OUTBOX_NEEDS = (
    select(_wd.event_id)
    .where(_wd.status == "pending")
    .union(select(func.max(_wd.event_id)).group_by(_wd.subscriber))
    .scalar_subquery()
)
_record_at = func.coalesce(*(table.c.at for table in _TABLES.values()))


class SqlAlchemyAuditRepository(AuditLinkStore):
    async def lock_checkpoints(self) -> tuple[int, str]:
        row = (await self._conn.execute(sql.lock_chain(self._dialect), {"chain_id": CHECKPOINT_CHAIN})).mappings()
        head = row.first()
        return int(head["seq"]), str(head["hash"])

    async def unsigned_heads(self) -> dict[str, tuple[int, str]]:
        c = _chains.c
        stmt = select(c.chain_id, c.seq, c.hash).where(c.seq > c.signed_seq, c.chain_id != CHECKPOINT_CHAIN)
        return {r.chain_id: (int(r.seq), r.hash) for r in (await self._conn.execute(stmt.order_by(c.chain_id))).all()}

    async def unsigned_records(self) -> int:
        c = _chains.c
        stmt = select(func.coalesce(func.sum(c.seq - c.signed_seq), 0)).where(
            c.seq > c.signed_seq, c.chain_id != CHECKPOINT_CHAIN
        )
        return int((await self._conn.execute(stmt)).scalar_one())

    async def add_checkpoint(self, number: int, at: datetime, reason: str, body: bytes, signature: str, key_id: str,
                             signed: dict[str, tuple[int, str]]) -> None:  # fmt: skip
        row = {"number": number, "at": at, "reason": reason, "body": body.decode(), "signature": signature,
               "key_id": key_id}  # fmt: skip
        await self._conn.execute(insert(t.audit_checkpoints), row)
        if signed:  # one statement for all (executemany), in sorted order: the lock order appenders keep
            marks = [{"match_id": chain, "upto": seq} for chain, (seq, _hash) in sorted(signed.items())]
            await self._conn.execute(_RAISE_SIGNED_MARK, marks)
        await self._conn.execute(sql.ADVANCE_CHAIN, {"match_id": CHECKPOINT_CHAIN, "seq": number, "hash": digest(body)})

    async def checkpoints(self) -> list[StoredCheckpoint]:
        c = t.audit_checkpoints.c
        rows = (await self._conn.execute(select(c.body, c.signature).order_by(c.number))).all()
        return [StoredCheckpoint(r.body.encode(), r.signature) for r in rows]

    async def last_checkpoint_at(self) -> datetime | None:
        return (await self._conn.execute(select(func.max(t.audit_checkpoints.c.at)))).scalar()

    async def stored_heads(self, chain: str | None = None) -> dict[str, tuple[int, str]]:
        c = _chains.c
        stmt = select(c.chain_id, c.seq, c.hash).where(c.chain_id != CHECKPOINT_CHAIN)
        if chain is not None:
            stmt = stmt.where(c.chain_id == chain)
        return {r.chain_id: (int(r.seq), r.hash) for r in (await self._conn.execute(stmt)).all()}

    async def links(self, query: LinkQuery) -> list[LinkRow]:
        key = tuple_(_links.c.chain_id, _links.c.chain_seq)
        stmt = _JOINED.where(key > tuple_(literal(query.after[0]), literal(query.after[1])))
        if query.chain is not None:
            stmt = stmt.where(_links.c.chain_id == query.chain)
        if query.since is not None:
            stmt = stmt.where(query.since <= _record_at)
        stmt = stmt.order_by(_links.c.chain_id, _links.c.chain_seq).limit(query.limit)
        return [_link_row(row) for row in (await self._conn.execute(stmt)).mappings().all()]

    async def unlinked(self, chain: str | None, since: datetime | None, limit: int) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        for name, table in _TABLES.items():
            key = table.c[PRIMARY_KEYS[name]]
            stmt = select(key).where(key <= mark_of(name), self._unlinked(name, key))  # above it: not linked yet
            if chain is not None:
                stmt = stmt.where(table.c.session_id == chain.removeprefix("session:"))
            if since is not None:
                stmt = stmt.where(table.c.at >= since)
            rows = (await self._conn.execute(stmt.order_by(key).limit(limit - len(found)))).all()
            found += [(name, int(r[0])) for r in rows]
            if len(found) >= limit:
                break
        return found

    def _unlinked(self, name: str, key: Any) -> Any:
        """`key` has no link: an anti-join, as no index leads from a record to its link (0015).

        SQLite builds the table's linked ids once for NOT IN (a correlated NOT EXISTS would scan the links per
        record); PostgreSQL plans NOT EXISTS as a hash anti-join, where a NOT IN over more ids than `work_mem`
        holds would re-scan them per record.
        """
        linked = _links.c.record_table == name
        if self._dialect == "postgresql":
            return ~exists().where(linked, _links.c.record_id == key)
        return key.not_in(select(_links.c.record_id).where(linked))

    async def sessions_in(self, states: Iterable[SessionState]) -> list[str]:
        c = t.sessions.c
        stmt = select(c.id).where(c.state.in_([s.value for s in states])).order_by(c.id)
        return [r[0] for r in (await self._conn.execute(stmt)).all()]

    async def prunable(self, before: datetime, sessions: Sequence[str]) -> list[PrunePoint]:
        # A few queries for many sessions at once (_PRUNE_CHUNK chains each), not three per session: a prune of
        # 2,000 sessions took 8.5 s that way, all of it holding the write lock.
        points: list[PrunePoint] = []
        for first in range(0, len(sessions), _PRUNE_CHUNK):
            chains = [session_chain(s) for s in sessions[first : first + _PRUNE_CHUNK]]
            rows = (await self._conn.execute(_prune_points(chains, before))).all()
            points += [PrunePoint(r.chain_id, int(r.upto), r.hash, int(r.records)) for r in rows]
        return points

    async def prune(self, points: Sequence[PrunePoint]) -> dict[str, int]:
        removed = dict.fromkeys(_TABLES, 0)
        for first in range(0, len(points), _DELETE_CHUNK):  # five statements per chunk of chains, not per chain
            chunk = points[first : first + _DELETE_CHUNK]
            upto = or_(*(and_(_links.c.chain_id == p.chain, _links.c.chain_seq <= p.seq) for p in chunk))
            for name, table in _TABLES.items():
                ids = select(_links.c.record_id).where(upto, _links.c.record_table == name)
                if name == "events":
                    deliveries = t.webhook_deliveries.c.event_id.in_(ids)
                    await self._conn.execute(delete(t.webhook_deliveries).where(deliveries))
                result = await self._conn.execute(delete(table).where(table.c[PRIMARY_KEYS[name]].in_(ids)))
                removed[name] += int(result.rowcount or 0)
            await self._conn.execute(delete(_links).where(upto))
        await self.lower_marks_to_tops()
        return removed


_PRUNE_CHUNK = 500  # chains per query: an IN list well inside SQLite's and asyncpg's parameter limits
# Chains per DELETE: one `chain = ? AND seq <= ?` term each, ORed; SQLite refuses an expression deeper than 1,000.
_DELETE_CHUNK = 200


def _prune_points(chains: list[str], before: datetime) -> Any:
    """For each of `chains`: the last seq a prune before `before` may remove, its hash and how many records go.

    The webhook outbox still needs an event a delivery is pending for, and the event a subscriber's cursor rests
    on (its newest row: application/outbox.py): a chain is pruned up to the record before the first such event,
    never past it. A chain with nothing to remove has no row.
    """
    in_scope = _links.c.chain_id.in_(chains)
    needed = (
        select(_links.c.chain_id, func.min(_links.c.chain_seq).label("stop"))
        .where(in_scope, _links.c.record_table == "events", _links.c.record_id.in_(_OUTBOX_NEEDS))
        .group_by(_links.c.chain_id)
        .subquery("needed")
    )
    source = _with_records(_links.outerjoin(needed, needed.c.chain_id == _links.c.chain_id))  # records: their time
    old = (
        select(_links.c.chain_id, func.max(_links.c.chain_seq).label("upto"), func.count().label("records"))
        .select_from(source)
        .where(in_scope, _record_at < before, or_(needed.c.stop.is_(None), _links.c.chain_seq < needed.c.stop))
        .group_by(_links.c.chain_id)
        .subquery("old")
    )
    last = _links.alias("last")
    at_upto = and_(last.c.chain_id == old.c.chain_id, last.c.chain_seq == old.c.upto)
    return (
        select(old.c.chain_id, old.c.upto, old.c.records, last.c.hash)
        .select_from(old.join(last, at_upto))
        .order_by(old.c.chain_id)
    )


def _link_row(row: Any) -> LinkRow:
    table = row["record_table"]
    prefix = _PREFIX.get(table)
    fields = None
    if prefix is not None and row[prefix + PRIMARY_KEYS[table]] is not None:
        fields = canonical_fields(table, {f: row[prefix + f] for f in AUDITED_FIELDS[table]})
    return LinkRow(row["chain_id"], int(row["chain_seq"]), table, int(row["record_id"]), row["hash"],
                   row["prev_hash"], fields)  # fmt: skip
