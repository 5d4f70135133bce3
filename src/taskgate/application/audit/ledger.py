"""The audit ledger: signed checkpoints over the chains, verification, retention (docs/audit.md).

Every audited record is chained after its commit by the linker (application/audit/linking.py). This service
links what is pending, then signs checkpoints over the chains' heads (on demand, and every `[audit]
checkpoint_interval_s` from the sweeper's turn), re-computes the chains to verify them, and prunes finished
sessions' old records behind a signed anchor.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from taskgate.application.audit.linking import link_pending
from taskgate.application.audit.ports import (
    AuditUnitOfWork,
    AuditUnitOfWorkFactory,
    KeyRing,
    LinkQuery,
    PublicKey,
    Signer,
)
from taskgate.application.ports import Clock
from taskgate.domain.audit.chain import GENESIS, canonical_value, session_chain
from taskgate.domain.audit.checkpoints import Checkpoint, CheckpointReport, verify_checkpoints
from taskgate.domain.audit.verify import ChainWalk, Finding, LinkRow
from taskgate.domain.errors import InvalidInput
from taskgate.domain.states import TERMINAL_STATES

VERIFIED_EVENT = "audit.verified"
PRUNED_EVENT = "audit.pruned"
_MAX_FINDINGS = 100
_BATCH = 5000  # links per read: one batch in memory at a time
PROGRESS_EVERY = 10_000  # records between two calls of a long operation's `progress` (and one at the end)

Progress = Callable[[int], Awaitable[None] | None]
"""Told how many records a long verify or export has been through so far: a CLI's status line, or an MCP
progress notification (awaited: the notifications go out in order, before the result)."""


@dataclass(frozen=True, slots=True)
class Scope:
    """What a verify or export covers: every chain, or one session's; every record, or those since a time."""

    session_id: str | None = None
    since: datetime | None = None

    @property
    def chain(self) -> str | None:
        return session_chain(self.session_id) if self.session_id else None

    def as_dict(self) -> dict[str, Any]:
        return {"session": self.session_id, "since": canonical_value(self.since) if self.since else None}


@dataclass(slots=True)
class VerifyReport:
    """The outcome of a verify: `ok` when nothing is broken; `findings` in the order met, the first one first."""

    scope: Scope
    key_id: str
    records: int = 0
    chains: int = 0
    checkpoints: int = 0
    unsigned: int = 0
    linked_now: int = 0
    last_checkpoint: dict[str, Any] | None = None
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, Any]:
        findings = [f.as_dict() for f in self.findings[:_MAX_FINDINGS]]
        return {"ok": self.ok, "scope": self.scope.as_dict(), "key": self.key_id, "records": self.records,
                "chains": self.chains, "checkpoints": self.checkpoints, "unsigned_records": self.unsigned,
                "linked_now": self.linked_now, "last_checkpoint": self.last_checkpoint, "findings": findings,
                "seconds": round(self.seconds, 3)}  # fmt: skip


@dataclass(frozen=True, slots=True)
class PruneReport:
    before: datetime
    sessions: int
    records: dict[str, int]
    checkpoint: int | None
    dry_run: bool

    def as_dict(self) -> dict[str, Any]:
        return {"before": canonical_value(self.before), "sessions": self.sessions, "records": self.records,
                "checkpoint": self.checkpoint, "dry_run": self.dry_run}  # fmt: skip


def checkpoint_summary(cp: Checkpoint | None) -> dict[str, Any] | None:
    """A checkpoint as the CLI, MCP and console show it."""
    if cp is None:
        return None
    return {"number": cp.number, "at": cp.at, "reason": cp.reason, "key": cp.key, "chains": len(cp.heads),
            "anchors": len(cp.anchors), "by": cp.by}  # fmt: skip


def walk_checkpoints(report: CheckpointReport, walk: ChainWalk, verify: VerifyReport) -> None:
    """Put the checkpoint chain's problems first among the findings, and its totals into the report."""
    verify.findings[:0] = [Finding(where, what) for where, what in report.problems]
    verify.checkpoints = report.count
    verify.last_checkpoint = checkpoint_summary(report.last)
    verify.records, verify.chains, verify.unsigned = walk.records, walk.chains, walk.unsigned
    verify.findings += walk.findings


class AuditLedger:
    """Checkpoints, verification and retention over the audit chains."""

    def __init__(self, uow: AuditUnitOfWorkFactory, clock: Clock, keys: KeyRing) -> None:
        self._uow, self._clock, self._keys = uow, clock, keys

    @property
    def can_sign(self) -> bool:
        return self._keys.signer() is not None

    @property
    def public_key(self) -> PublicKey | None:
        return self._keys.public()

    async def checkpoint(
        self, reason: str = "demand", *, only_if_grown: bool = False, actor: str = "system"
    ) -> Checkpoint | None:
        """Sign the heads of every chain that grew since it was last signed. `only_if_grown`: none if none grew.
        `actor` (who asked) is signed into the checkpoint's body. Every record committed before it is linked
        first, so the heads signed cover it.

        Raises: InvalidInput when this process has no signing key.
        """
        self._require_signer()
        await self.link()
        async with self._uow(write=True) as uow:
            cp = await self._checkpoint_in(uow, reason, {}, only_if_grown=only_if_grown, actor=actor)
            if cp is not None:
                await uow.commit()
        return cp

    async def seal_if_unsealed(self) -> Checkpoint | None:
        """The first checkpoint, over records that no checkpoint covers yet because they were chained by the
        migration to 0014 (or written before any key existed): made at start when this process has the key."""
        if self._keys.signer() is None:
            return None
        await self.link()
        async with self._uow(write=False) as uow:
            if await uow.audit.last_checkpoint_at() is not None or not await uow.audit.unsigned_heads():
                return None
        return await self.checkpoint("seal", only_if_grown=True)

    async def checkpoint_if_due(self, interval_s: float) -> Checkpoint | None:
        """The periodic checkpoint: when the last one is `interval_s` old and a chain grew. None without a key."""
        if self._keys.signer() is None or interval_s <= 0:
            return None
        async with self._uow(write=False) as uow:
            last = await uow.audit.last_checkpoint_at()
        if last is not None and self._clock.now() - last < timedelta(seconds=interval_s):
            return None
        return await self.checkpoint("interval", only_if_grown=True)

    async def _checkpoint_in(self, uow: AuditUnitOfWork, reason: str, anchors: dict[str, tuple[int, str]], *,
                             only_if_grown: bool, actor: str = "system") -> Checkpoint | None:  # fmt: skip
        signer = self._require_signer()
        number, prev = await uow.audit.lock_checkpoints()  # checkpoints take turns: each follows the one before
        heads = await uow.audit.unsigned_heads()
        if only_if_grown and not heads and not anchors:
            return None
        now = self._clock.now()
        cp = Checkpoint(number + 1, canonical_value(now), prev if number else GENESIS, reason, signer.key_id, heads,
                        anchors, actor)  # fmt: skip
        body = cp.body()
        await uow.audit.add_checkpoint(cp.number, now, reason, body, signer.sign(body), signer.key_id, heads)
        return cp

    async def link(self) -> int:
        """Link every audited record committed so far (application/audit/linking.py); how many were."""
        return await link_pending(self._uow)

    def _require_signer(self) -> Signer:
        signer = self._keys.signer()
        if signer is None:
            raise InvalidInput("no audit signing key here: `taskgate init` creates one ([audit] key_file names it)")
        return signer

    async def verify(
        self,
        scope: Scope,
        public: PublicKey | None = None,
        *,
        record: bool = True,
        actor: str = "system",
        progress: Progress | None = None,
    ) -> VerifyReport:
        """Re-compute the chains in `scope` and check the checkpoints' signatures with `public` (default: the
        configured public key). `record`: append an `audit.verified` event with the outcome, the scope and `actor`
        (every scope checks the whole checkpoint chain, so each names the last checkpoint it verified).
        `progress` is told the records walked, every PROGRESS_EVERY and once at the end.

        Raises: InvalidInput when there is no public key to verify with.
        """
        key = public or self._keys.public()
        if key is None:
            raise InvalidInput("no public key to verify with: pass --public-key, or run `taskgate init` for one")
        started, report = time.perf_counter(), VerifyReport(scope, key.key_id)
        report.linked_now = await self.link()  # what is committed is verified, not left pending
        async with self._uow(write=False) as uow:
            # Checkpoints and head rows first: a record appended while the links are read only extends a chain.
            checks = verify_checkpoints(await uow.audit.checkpoints(), key.key_id, key.verifies)
            heads = await uow.audit.stored_heads(scope.chain)
            walk = ChainWalk(_within(checks.heads, scope), checks.anchors, heads, complete=scope.since is None)
            async for link in counted(links_in(uow, scope), progress):
                walk.feed(link)
            walk.finish()
            unlinked = await uow.audit.unlinked(scope.chain, scope.since, _MAX_FINDINGS)
        walk_checkpoints(checks, walk, report)
        report.findings += [Finding(f"{table} {rid}", "has no link: it was added by hand, outside taskgate")
                            for table, rid in unlinked]  # fmt: skip
        report.seconds = time.perf_counter() - started
        if record:
            await self._record(VERIFIED_EVENT, _verified_payload(report, actor))
        return report

    async def _record(self, kind: str, payload: dict[str, Any]) -> None:
        async with self._uow(write=True) as uow:
            await uow.events.append(kind, self._clock.now(), payload)
            await uow.commit()

    async def prune(self, before: datetime, *, dry_run: bool = False, actor: str = "system") -> PruneReport:
        """Remove finished sessions' records written before `before`, behind a signed anchor per chain, in one
        transaction with the checkpoint that signs the anchors.

        Raises: InvalidInput for a naive time or a missing signing key.
        """
        if before.tzinfo is None:
            raise InvalidInput("--before must carry a timezone")
        if not dry_run:  # a dry run signs nothing: a machine that can only verify may ask what a prune would remove
            self._require_signer()
        await self.link()  # a record waiting for its link is neither prunable nor left behind unlinked
        async with self._uow(write=True) as uow:
            finished = await uow.audit.sessions_in(TERMINAL_STATES)
            points = await uow.audit.prunable(before, finished)
            if dry_run or not points:  # nothing is written: the report says what a prune would remove
                return PruneReport(before, len(points), {"total": sum(p.records for p in points)}, None, dry_run)
            removed = await uow.audit.prune(points)
            anchors = {p.chain: (p.seq, p.hash) for p in points}
            cp = await self._checkpoint_in(uow, "prune", anchors, only_if_grown=False, actor=actor)
            assert cp is not None
            await uow.events.append(PRUNED_EVENT, self._clock.now(), {"before": canonical_value(before),
                                    "sessions": len(points), "records": removed, "checkpoint": cp.number,
                                    "actor": actor})  # fmt: skip
            await uow.commit()
        return PruneReport(before, len(points), removed, cp.number, False)

    async def status(self) -> dict[str, Any]:
        """The newest checkpoint, the last verification, and how many records no checkpoint covers yet.

        `records` counts every record ever chained (pruned ones included: it is the sum of the chains' lengths).
        A key file that cannot be read does not fail the status: `key_error` says what is wrong with it.
        """
        async with self._uow(write=False) as uow:
            stored = await uow.audit.checkpoints()
            heads = await uow.audit.stored_heads()
            unsigned = await uow.audit.unsigned_heads()
            unsigned_records = await uow.audit.unsigned_records()
            pending = await uow.audit.pending_records()
            verified = await uow.events.list(None, 1, kind=VERIFIED_EVENT)
        last = Checkpoint.parse(stored[-1].body) if stored else None
        key_id, can_sign, key_error = None, False, None
        try:
            key_id = key.key_id if (key := self._keys.public()) else None
            can_sign = self._keys.signer() is not None
        except InvalidInput as exc:
            key_error = str(exc)
        return {
            "key": key_id,
            "can_sign": can_sign,
            "key_error": key_error,
            "checkpoints": len(stored),
            "last_checkpoint": checkpoint_summary(last),
            "chains": len(heads),
            "records": sum(seq for seq, _hash in heads.values()),
            "unsigned_chains": len(unsigned),
            "unsigned_records": unsigned_records,
            "pending_records": pending,
            "last_verified": _verified(verified[-1]) if verified else None,
        }


def _verified_payload(report: VerifyReport, actor: str) -> dict[str, Any]:
    """The `audit.verified` event of a verify: its outcome, the last checkpoint it verified, its scope and who."""
    return {
        "ok": report.ok,
        "checkpoint": (report.last_checkpoint or {}).get("number"),
        "records": report.records,
        "findings": len(report.findings),
        "first": report.findings[0].describe() if report.findings else None,
        "scope": report.scope.as_dict(),
        "actor": actor,
    }


def _verified(event: dict[str, Any]) -> dict[str, Any]:
    return {"at": canonical_value(event["at"]), **event["payload"]}


def _within(heads: dict[str, Any], scope: Scope) -> dict[str, Any]:
    return heads if scope.chain is None else {c: p for c, p in heads.items() if c == scope.chain}


async def counted(links: AsyncIterator[LinkRow], progress: Progress | None) -> AsyncIterator[LinkRow]:
    """`links`, telling `progress` how many went by: every PROGRESS_EVERY, and the total at the end."""
    count = 0
    async for link in links:
        yield link
        count += 1
        if progress is not None and count % PROGRESS_EVERY == 0 and (told := progress(count)) is not None:
            await told
    if progress is not None and (told := progress(count)) is not None:
        await told


async def links_in(uow: AuditUnitOfWork, scope: Scope) -> AsyncIterator[LinkRow]:
    """Every link in scope, in the order they were written (each chain's in seq order), a batch at a time."""
    after = 0
    while True:
        batch = await uow.audit.links(LinkQuery(after, scope.chain, scope.since, _BATCH))
        for link in batch:
            yield link
        if len(batch) < _BATCH:
            return
        after = batch[-1].no
