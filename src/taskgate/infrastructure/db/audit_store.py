"""The audit chains' storage: checkpoints, chain heads, and the links read back with their records to verify them
(the linker's half, which writes the links, is audit_link_store.py).

`links()` reads a batch of links in the order they were written (`link_no`, the primary key since 0017; each
chain's links in seq order within it), each joined to its record (one LEFT JOIN per audited table, so a deleted
record comes back as a link without fields) and to its chain's link before (`prev_no`, so a window that starts
mid-chain still has each record's predecessor hash). Batches are keyset-paged on `link_no`, so a verify of
millions of rows holds one batch in memory. Nothing is indexed by chain (a chain's links would scatter over the
pages a linker batch writes): one session's links are found through its records' `session_id` indexes and the
index on (record_table, record_id), and walked back by `prev_no` from the head and from each of them, which also
finds a link whose record was deleted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, delete, exists, func, insert, or_, select, union, union_all, update

from taskgate.application.audit.ports import LinkQuery, PrunePoint
from taskgate.domain.audit.chain import AUDITED_FIELDS, PRIMARY_KEYS, canonical_fields, session_chain
from taskgate.domain.audit.checkpoints import StoredCheckpoint, digest
from taskgate.domain.audit.verify import LinkRow
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
_by_record = t.audit_links.alias("by_record")  # a record's link, looked up from the record (`_session_links`)


def _joined() -> Any:
    """Links, each with the link before it and its record's audited columns (prefixed per table)."""
    columns = [_links.c.link_no, _links.c.chain_id, _links.c.chain_seq, _links.c.record_table, _links.c.record_id,
               _links.c.hash, _prev.c.hash.label("prev_hash")]  # fmt: skip
    # `prev_no` is followed only to the same chain's seq - 1: a stale or altered number leads nowhere.
    source = _links.outerjoin(_prev, and_(_prev.c.link_no == _links.c.prev_no, _prev.c.chain_id == _links.c.chain_id,
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
        stmt = _JOINED.where(_links.c.link_no > query.after)
        if query.chain is not None:
            walked = _chain_link_nos(query.chain, self._dialect)
            stmt = stmt.where(_links.c.chain_id == query.chain, _links.c.link_no.in_(walked))
        if query.since is not None:
            stmt = stmt.where(query.since <= _record_at)
        stmt = stmt.order_by(_links.c.link_no).limit(query.limit)
        return [_link_row(row) for row in (await self._conn.execute(stmt)).mappings().all()]

    async def unlinked(self, chain: str | None, since: datetime | None, limit: int) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        for name, table in _TABLES.items():
            key = table.c[PRIMARY_KEYS[name]]
            linked = exists().where(_links.c.record_table == name, _links.c.record_id == key)  # the record index
            stmt = select(key).where(key <= mark_of(name), ~linked)  # above the mark: not linked yet
            if chain is not None:
                stmt = stmt.where(table.c.session_id == chain.removeprefix("session:"))
            if since is not None:
                stmt = stmt.where(table.c.at >= since)
            rows = (await self._conn.execute(stmt.order_by(key).limit(limit - len(found)))).all()
            found += [(name, int(r[0])) for r in rows]
            if len(found) >= limit:
                break
        return found

    async def sessions_in(self, states: Iterable[SessionState]) -> list[str]:
        c = t.sessions.c
        stmt = select(c.id).where(c.state.in_([s.value for s in states])).order_by(c.id)
        return [r[0] for r in (await self._conn.execute(stmt)).all()]

    async def prunable(self, before: datetime, sessions: Sequence[str]) -> list[PrunePoint]:
        # A few queries for many sessions at once (_PRUNE_CHUNK each), not three per session: a prune of 2,000
        # sessions took 8.5 s that way, all of it holding the write lock.
        points: list[PrunePoint] = []
        for first in range(0, len(sessions), _PRUNE_CHUNK):
            chunk = list(sessions[first : first + _PRUNE_CHUNK])
            rows = (await self._conn.execute(_prune_points(chunk, before, self._dialect))).all()
            points += [PrunePoint(r.chain_id, int(r.upto), r.hash, int(r.records)) for r in rows]
        return points

    async def prune(self, points: Sequence[PrunePoint]) -> dict[str, int]:
        removed = dict.fromkeys(_TABLES, 0)
        for first in range(0, len(points), _PRUNE_CHUNK):  # one read and a few deletes per chunk of sessions
            upto = {p.chain: p.seq for p in points[first : first + _PRUNE_CHUNK]}
            # The ids first, filtered here (an OR of a term per chain cost SQLite ~20 µs a record): once a record
            # is gone, its link cannot be found from its session any more.
            found = _session_links([chain.removeprefix("session:") for chain in upto], self._dialect)
            ids: dict[str, list[int]] = {name: [] for name in _TABLES}
            stmt = select(found.c.chain_id, found.c.chain_seq, found.c.record_table, found.c.record_id)
            for chain, seq, table, record_id in (await self._conn.execute(stmt)).all():
                if seq <= upto.get(chain, 0):
                    ids[table].append(int(record_id))
            for name, chosen in ids.items():
                for start in range(0, len(chosen), _IDS_CHUNK):
                    removed[name] += await self._remove(name, chosen[start : start + _IDS_CHUNK])
        await self.lower_marks_to_tops()
        return removed

    async def _remove(self, name: str, ids: list[int]) -> int:
        """Delete records `ids` of table `name` and their links (and an event's webhook deliveries): how many."""
        table = _TABLES[name]
        if name == "events":
            await self._conn.execute(delete(t.webhook_deliveries).where(t.webhook_deliveries.c.event_id.in_(ids)))
        result = await self._conn.execute(delete(table).where(table.c[PRIMARY_KEYS[name]].in_(ids)))
        await self._conn.execute(delete(_links).where(_links.c.record_table == name, _links.c.record_id.in_(ids)))
        return int(result.rowcount or 0)


_PRUNE_CHUNK = 500  # sessions per query: an IN list well inside SQLite's and asyncpg's parameter limits
_IDS_CHUNK = 5000  # record ids per DELETE: inside SQLite's (32,766 since 3.32) and asyncpg's parameter limits


def _session_links(sessions: list[str], dialect: str) -> Any:
    """The links of these sessions' records, each with its record's time: through the records' `session_id`
    indexes, then the index on (record_table, record_id) (a deleted record's link is not among them).

    On SQLite each record's link number is a correlated lookup, which makes its planner start from the records:
    joined on the record index instead, SQLite without statistics started from the index's equality on
    `record_table` and read a third of the links for one session (0.5 s on 1,000,000 links; test_audit_plans.py).
    PostgreSQL plans the join from its statistics, and ran the correlated form as a subplan per record (a prune
    of 98,000 records: 4.0 s against 2.5)."""
    parts = []
    for name, table in _TABLES.items():
        key = table.c[PRIMARY_KEYS[name]]
        if dialect == "postgresql":
            on_link = and_(_links.c.record_table == name, _links.c.record_id == key)
        else:
            link_of = select(_by_record.c.link_no).where(_by_record.c.record_table == name,
                                                         _by_record.c.record_id == key)  # fmt: skip
            on_link = _links.c.link_no == link_of.scalar_subquery()
        columns = (_links.c.link_no, _links.c.chain_id, _links.c.chain_seq, _links.c.record_table,
                   _links.c.record_id, _links.c.hash, table.c.at)  # fmt: skip
        parts.append(select(*columns).select_from(table.join(_links, on_link)).where(table.c.session_id.in_(sessions)))
    return union_all(*parts).subquery("session_links")


def _chain_link_nos(chain: str, dialect: str) -> Any:
    """The numbers of `chain`'s links: its head's, its records' (a session chain's), and every link reached back
    from these by `prev_no` within the chain. UNION keeps each number once, so the walk ends, even on a cycle."""
    seeds = [select(_chains.c.link_no.label("no")).where(_chains.c.chain_id == chain, _chains.c.link_no.is_not(None))]
    if chain.startswith("session:"):
        found = _session_links([chain.removeprefix("session:")], dialect)
        seeds.append(select(found.c.link_no).where(found.c.chain_id == chain))
    start = union(*seeds).subquery("seeds") if len(seeds) > 1 else seeds[0].subquery("seeds")
    walked = select(start.c.no).cte("walked", recursive=True)
    step = _links.alias("step")
    back = select(step.c.prev_no).where(step.c.link_no == walked.c.no, step.c.chain_id == chain,
                                         step.c.prev_no.is_not(None))  # fmt: skip
    return select(walked.union(back).c.no)


def _prune_points(sessions: list[str], before: datetime, dialect: str) -> Any:
    """For each of these sessions' chains: the last seq a prune before `before` may remove, its hash and how many
    records go.

    The webhook outbox still needs an event a delivery is pending for, and the event a subscriber's cursor rests
    on (its newest row: application/webhooks/outbox.py): a chain is pruned up to the record before the first such event,
    never past it. A chain with nothing to remove has no row.
    """
    found = _session_links(sessions, dialect).element.cte("found")  # the sessions' records read once, used thrice
    chains = [session_chain(s) for s in sessions]
    needed = (
        select(found.c.chain_id, func.min(found.c.chain_seq).label("stop"))
        .where(found.c.record_table == "events", found.c.record_id.in_(_OUTBOX_NEEDS))
        .group_by(found.c.chain_id)
        .subquery("needed")
    )
    old = (
        select(found.c.chain_id, func.max(found.c.chain_seq).label("upto"), func.count().label("records"))
        .select_from(found.outerjoin(needed, needed.c.chain_id == found.c.chain_id))
        .where(
            found.c.chain_id.in_(chains),
            found.c.at < before,
            or_(needed.c.stop.is_(None), found.c.chain_seq < needed.c.stop),
        )
        .group_by(found.c.chain_id)
        .subquery("old")
    )
    last = found.alias("last")
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
                   row["prev_hash"], fields, int(row["link_no"]))  # fmt: skip
