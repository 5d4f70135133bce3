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

from taskgate.domain.audit_chain import GENESIS, appended_fields, chain_of, link_hash
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db.engine import AnyConnection


class AuditTrail:
    """The records one unit of work appended, in append order, waiting for `seal()`."""

    __slots__ = ("_known", "_pending", "_sealer")

    def __init__(self, conn: AnyConnection, dialect: str) -> None:
        self._sealer: _Sealer = _PostgresSealer(conn) if dialect == "postgresql" else _SqliteSealer(conn)
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
        fields = appended_fields(table, values, record_id)
        self._pending.append((chain_of(table, fields), table, record_id, fields))

    async def seal(self) -> int:
        """Link the pending records into their chains; returns how many. Runs inside the unit's transaction."""
        if not self._pending:
            return 0
        by_chain = _by_chain(self._pending)
        count, self._pending, heads = len(self._pending), [], self._known
        self._known = {}
        for chain in sorted(by_chain):
            records = by_chain[chain]
            known = heads.get(chain)
            if known is not None and len(records) <= sql.MULTI_LINK_INSERTS:
                links, seq, head = _linked(chain, *known, records)
                if await self._sealer.seal_known(chain, known[0], links, seq, head):
                    continue  # else another writer moved the head since it was read: lock it and link again
            links, seq, head = _linked(chain, *(await self._sealer.head(chain)), records)
            await self._sealer.seal(chain, links, seq, head)
        return count


class _Sealer:
    """How one dialect reads a chain's head and writes its links and new head."""

    def __init__(self, conn: AnyConnection) -> None:
        self._conn = conn

    async def seal_known(self, chain: str, old_seq: int, links: list[dict[str, Any]], seq: int, head: str) -> bool:
        """Move the head from `old_seq` (as read with the session) to `seq`/`head` and insert the links; False,
        with nothing written, if the head is no longer at `old_seq`."""
        raise NotImplementedError

    async def head(self, chain: str) -> tuple[int, str]:
        """The chain's head (seq, hash), held for this transaction: (0, GENESIS) for a new chain."""
        raise NotImplementedError

    async def seal(self, chain: str, links: list[dict[str, Any]], seq: int, head: str) -> None:
        """Insert the links and move the head, read by `head()`, to `seq`/`head`."""
        raise NotImplementedError


class _SqliteSealer(_Sealer):
    """SQLite: the unit holds the database's write lock, so a head is read with a plain SELECT and written once,
    by an upsert; a few links go in one multi-row INSERT (driver_statements.py runs each as one driver call)."""

    async def seal_known(self, chain: str, old_seq: int, links: list[dict[str, Any]], seq: int, head: str) -> bool:
        move = {"chain_id": chain, "old_seq": old_seq, "seq": seq, "hash": head}
        if (await self._conn.execute(sql.move_known_head("sqlite"), move)).rowcount != 1:
            return False
        await self._insert(links)
        return True

    async def head(self, chain: str) -> tuple[int, str]:
        row = (await self._conn.execute(sql.CHAIN_HEAD, {"chain_id": chain})).mappings().first()
        return (int(row["seq"]), row["hash"]) if row else (0, GENESIS)

    async def seal(self, chain: str, links: list[dict[str, Any]], seq: int, head: str) -> None:
        await self._insert(links)
        await self._conn.execute(sql.set_chain_head_sqlite(), {"chain_id": chain, "seq": seq, "hash": head})

    async def _insert(self, links: list[dict[str, Any]]) -> None:
        if 2 <= len(links) <= sql.MULTI_LINK_INSERTS:
            await self._conn.execute(sql.insert_links_sqlite(len(links)), _numbered(links, keep_chain=True))
        else:
            for link in links:
                await self._conn.execute(sql.INSERT_LINK, link)


class _PostgresSealer(_Sealer):
    """PostgreSQL: a head is locked by the statement that reads it (`lock_chain`) or moves it, so appenders of one
    chain take turns; a few links and the head's move go in one statement (one round trip)."""

    async def seal_known(self, chain: str, old_seq: int, links: list[dict[str, Any]], seq: int, head: str) -> bool:
        # The move waits for any other writer holding the head row, as `lock_chain` does; the rowcount is the
        # links inserted, none if the head had moved.
        params = {"match_id": chain, "old_seq": old_seq, "seq": seq, "hash": head, **_numbered(links)}
        return bool((await self._conn.execute(sql.seal_known_chain_postgresql(len(links)), params)).rowcount)

    async def head(self, chain: str) -> tuple[int, str]:
        row = (await self._conn.execute(sql.lock_chain("postgresql"), {"chain_id": chain})).mappings().first()
        return int(row["seq"]), row["hash"]

    async def seal(self, chain: str, links: list[dict[str, Any]], seq: int, head: str) -> None:
        if len(links) <= sql.MULTI_LINK_INSERTS:
            params = {"match_id": chain, "seq": seq, "hash": head, **_numbered(links)}
            await self._conn.execute(sql.seal_chain_postgresql(len(links)), params)
            return
        await self._conn.execute(sql.INSERT_LINK, links)  # executemany: one round trip for all of them
        await self._conn.execute(sql.ADVANCE_CHAIN, {"match_id": chain, "seq": seq, "hash": head})


def _numbered(links: list[dict[str, Any]], *, keep_chain: bool = False) -> dict[str, Any]:
    """The links' values as the parameters of a multi-link statement: `<column>_<i>` for link i (the chain id
    once, as the statement's own parameter, unless `keep_chain`)."""
    return {
        f"{key}_{i}": value
        for i, link in enumerate(links)
        for key, value in link.items()
        if keep_chain or key != "chain_id"
    }


def _by_chain(pending: list[tuple[str, str, int, dict[str, Any]]]) -> dict[str, list[tuple[str, int, dict[str, Any]]]]:
    """The pending records (chain, table, id, fields) by chain, each chain's in the order they were appended."""
    by_chain: dict[str, list[tuple[str, int, dict[str, Any]]]] = {}
    for chain, table, record_id, fields in pending:
        by_chain.setdefault(chain, []).append((table, record_id, fields))
    return by_chain


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
