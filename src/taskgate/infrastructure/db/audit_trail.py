"""`AuditTrail`: a unit of work's audited records, linked into their chains when it commits.

The repositories that append audited records (transition rows, decisions, events) hand each one here with the
values they inserted and the id the database gave it. `seal()` runs just before the commit: per chain, in sorted
chain order, it locks the chain's head row (creating it at the genesis hash), links the records in the order they
were appended and advances the head. So a link hash covers the record's primary key, known only after the insert.

A unit that locked a session read its chain's head with it (`known_head`, from `SessionRepository.get(lock=True)`):
its seal computes the links from that head and moves it in the statement that would have locked it, only if it
is still at the seq read (one statement fewer on SQLite, one round trip fewer on PostgreSQL). If another writer
of the chain moved it since, that statement changes nothing and the seal links as below. On PostgreSQL that
writer is one that appends to the session's chain without locking the session (an agent's event); on SQLite
none can, as a unit holds the writers' turn from its read to its seal, and the condition only guards that.

Why no deadlock: a chain head is locked only here, at the very end of a transaction, after every other lock it
takes, and several chains are locked in sorted order; a transaction holding a chain head waits for no other kind
of lock. Two transactions meet only on a chain both append to, which means the same session (or the same kind of
global record), and take turns there. On SQLite the writers already take turns on the database.
"""

from __future__ import annotations

from typing import Any

from taskgate.domain.audit_chain import GENESIS, PRIMARY_KEYS, canonical_fields, chain_of, link_hash
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db.engine import AnyConnection


class AuditTrail:
    """The records one unit of work appended, in append order, waiting for `seal()`."""

    __slots__ = ("_conn", "_dialect", "_known", "_pending")

    def __init__(self, conn: AnyConnection, dialect: str) -> None:
        self._conn, self._dialect = conn, dialect
        self._pending: list[tuple[str, str, int, dict[str, Any]]] = []
        self._known: dict[str, tuple[int, str]] = {}

    def known_head(self, chain: str, seq: int | None, head: str | None) -> None:
        """Note the head `chain` had when this unit read it (None, None: the chain has no head row yet), so that
        `seal()` can move it without reading it again, if no other writer moved it since."""
        self._known[chain] = (int(seq), head) if seq is not None and head is not None else (0, GENESIS)

    def add(self, table: str, record_id: int, values: dict[str, Any]) -> None:
        """Note a record just inserted into `table` with `values` (every audited field but its id).

        Raises: KeyError naming a field the chain covers that `values` lacks (a programming error).
        """
        fields = canonical_fields(table, {**values, PRIMARY_KEYS[table]: record_id})
        self._pending.append((chain_of(table, fields), table, record_id, fields))

    async def seal(self) -> int:
        """Link the pending records into their chains; returns how many. Runs inside the unit's transaction."""
        if not self._pending:
            return 0
        by_chain: dict[str, list[tuple[str, int, dict[str, Any]]]] = {}
        for chain, table, record_id, fields in self._pending:
            by_chain.setdefault(chain, []).append((table, record_id, fields))
        count, self._pending, heads = len(self._pending), [], self._known
        self._known = {}
        for chain in sorted(by_chain):
            records = by_chain[chain]
            known = heads.get(chain)
            if known is not None and len(records) <= sql.MULTI_LINK_INSERTS:
                links, seq, prev = _linked(chain, *known, records)
                if await self._seal_known(chain, known[0], seq, prev, links):
                    continue  # else another writer moved the head since it was read: lock it and link again
            links, seq, prev = _linked(chain, *(await self._head(chain)), records)
            if self._dialect == "postgresql" and len(links) <= sql.MULTI_LINK_INSERTS:
                await self._seal_postgresql(chain, seq, prev, links)
            else:
                await self._insert(links)
                await self._advance(chain, seq, prev)
        return count

    async def _seal_known(self, chain: str, old_seq: int, seq: int, head: str, links: list[dict[str, Any]]) -> bool:
        """Move the head from `old_seq`, as read with the session, and insert the links; False (nothing written)
        if the head is no longer at `old_seq`. On PostgreSQL the move waits for, and so serialises with, any other
        writer holding the head row, as `lock_chain` does."""
        if self._dialect == "postgresql":
            params: dict[str, Any] = {"match_id": chain, "old_seq": old_seq, "seq": seq, "hash": head}
            for i, link in enumerate(links):
                params.update({f"{key}_{i}": value for key, value in link.items() if key != "chain_id"})
            result = await self._conn.execute(sql.seal_known_chain_postgresql(len(links)), params)
            return bool(result.rowcount)
        move = {"chain_id": chain, "old_seq": old_seq, "seq": seq, "hash": head}
        if (await self._conn.execute(sql.move_known_head(self._dialect), move)).rowcount != 1:
            return False
        await self._insert(links)
        return True

    async def _seal_postgresql(self, chain: str, seq: int, head: str, links: list[dict[str, Any]]) -> None:
        """A few links and the head's move in one round trip (`statements.seal_chain_postgresql`)."""
        params: dict[str, Any] = {"match_id": chain, "seq": seq, "hash": head}
        for i, link in enumerate(links):
            params.update({f"{key}_{i}": value for key, value in link.items() if key != "chain_id"})
        await self._conn.execute(sql.seal_chain_postgresql(len(links)), params)

    async def _head(self, chain: str) -> tuple[int, str]:
        """The chain's head, locked for this transaction on PostgreSQL (created at the genesis hash if new)."""
        if self._dialect == "postgresql":
            head = (await self._conn.execute(sql.lock_chain(self._dialect), {"chain_id": chain})).mappings().first()
        else:  # the write lock is the database's: a read is enough, and the head is written once, by `_advance`
            head = (await self._conn.execute(sql.CHAIN_HEAD, {"chain_id": chain})).mappings().first()
        return (int(head["seq"]), head["hash"]) if head else (0, GENESIS)

    async def _advance(self, chain: str, seq: int, head: str) -> None:
        if self._dialect == "postgresql":
            await self._conn.execute(sql.ADVANCE_CHAIN, {"match_id": chain, "seq": seq, "hash": head})
        else:
            await self._conn.execute(sql.set_chain_head_sqlite(), {"chain_id": chain, "seq": seq, "hash": head})

    async def _insert(self, links: list[dict[str, Any]]) -> None:
        if self._dialect == "postgresql":  # one round trip for all of them
            await self._conn.execute(sql.INSERT_LINK, links)
        elif 2 <= len(links) <= sql.MULTI_LINK_INSERTS:  # one driver call (driver_statements.py) for a few
            params = {f"{key}_{i}": value for i, link in enumerate(links) for key, value in link.items()}
            await self._conn.execute(sql.insert_links_sqlite(len(links)), params)
        else:
            for link in links:
                await self._conn.execute(sql.INSERT_LINK, link)


def _linked(
    chain: str, seq: int, prev: str, records: list[tuple[str, int, dict[str, Any]]]
) -> tuple[list[dict[str, Any]], int, str]:
    """The links of `records`, appended to `chain` after its head (`seq`, `prev`), and the chain's new head."""
    links = []
    for table, record_id, fields in records:
        seq += 1
        prev = link_hash(chain, seq, prev, table, fields)
        links.append({"chain_id": chain, "chain_seq": seq, "record_table": table, "record_id": record_id, "hash": prev})
    return links, seq, prev
