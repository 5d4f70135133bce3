"""What the audit ledger needs from storage and from the signing key (adapters: infrastructure/db/audit_store.py,
infrastructure/audit/keys.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from taskgate.application.ports import UnitOfWork
from taskgate.domain.audit.checkpoints import StoredCheckpoint
from taskgate.domain.audit.verify import LinkRow
from taskgate.domain.states import SessionState


@dataclass(frozen=True, slots=True)
class LinkQuery:
    """Which links to read: after link number `after`, in the order they were written (each chain's in seq
    order), of one chain, of records since."""

    after: int = 0
    chain: str | None = None
    since: datetime | None = None
    limit: int = 5000


@dataclass(frozen=True, slots=True)
class PrunePoint:
    """A finished session's chain, prunable up to `seq` (whose link hash is `hash`): `records` records."""

    chain: str
    seq: int
    hash: str
    records: int


class AuditRepository(Protocol):
    """The chains, their heads and the checkpoints, in the unit of work's transaction."""

    async def lock_checkpoints(self) -> tuple[int, str]:
        """Lock the checkpoint chain for this transaction: the last checkpoint's number and body hash."""
        ...

    async def unsigned_heads(self) -> dict[str, tuple[int, str]]:
        """The head of every chain that grew since the checkpoint that last signed it."""
        ...

    async def unsigned_records(self) -> int:
        """How many records no checkpoint covers yet (over every chain)."""
        ...

    async def add_checkpoint(self, number: int, at: datetime, reason: str, body: bytes, signature: str, key_id: str,
                             signed: dict[str, tuple[int, str]]) -> None:  # fmt: skip
        """Store a checkpoint, mark `signed` heads as covered and advance the checkpoint chain."""
        ...

    async def checkpoints(self) -> list[StoredCheckpoint]:
        """Every checkpoint in number order."""
        ...

    async def last_checkpoint_at(self) -> datetime | None: ...

    async def stored_heads(self, chain: str | None = None) -> dict[str, tuple[int, str]]:
        """The chains' head rows (one chain's with `chain`)."""
        ...

    async def links(self, query: LinkQuery) -> list[LinkRow]:
        """A batch of links with their records' canonical fields, in the order they were written (by number)."""
        ...

    async def unlinked(self, chain: str | None, since: datetime | None, limit: int) -> list[tuple[str, int]]:
        """Audited records at or below their table's mark that have no link: (table, id), at most `limit`."""
        ...

    async def pending_records(self) -> int:
        """How many audited records wait for the linker (above their table's mark)."""
        ...

    async def committed_tops(self) -> dict[str, int] | None:
        """Per audited table, the largest id no uncommitted transaction can still hold (PostgreSQL: read under a
        SHARE lock that waits for the tables' writers; it holds until this transaction ends); None, with no lock
        taken, when no table has a record above its mark."""
        ...

    async def link_pending(self, tops: dict[str, int], limit: int) -> tuple[int, bool]:
        """Link up to `limit` records of each table above its mark and at most its top, into their chains, and
        move the marks; holds the marks for this transaction. Returns how many were linked and whether any table
        has more below its top."""
        ...

    async def sessions_in(self, states: Iterable[SessionState]) -> list[str]:
        """The ids of the sessions in these states."""
        ...

    async def prunable(self, before: datetime, sessions: Sequence[str]) -> list[PrunePoint]:
        """For each of these sessions' chains: how far its records written before `before` reach."""
        ...

    async def prune(self, points: Sequence[PrunePoint]) -> dict[str, int]:
        """Delete each point's chain's records and links up to its seq (and the webhook deliveries of their events);
        the records removed per table."""
        ...


class AuditUnitOfWork(UnitOfWork, Protocol):
    audit: AuditRepository


class AuditUnitOfWorkFactory(Protocol):
    def __call__(self, *, write: bool) -> AuditUnitOfWork: ...


class Signer(Protocol):
    """The private half of the audit key."""

    key_id: str

    def sign(self, body: bytes) -> str:
        """A base64 Ed25519 signature over `body`."""
        ...


class PublicKey(Protocol):
    """The public half: what verifies checkpoints, here or on another machine."""

    key_id: str

    def verifies(self, body: bytes, signature: str) -> bool: ...


class KeyRing(Protocol):
    """Where the ledger finds the audit key's halves, loaded when first needed (None: not on this machine)."""

    def signer(self) -> Signer | None: ...

    def public(self) -> PublicKey | None: ...
