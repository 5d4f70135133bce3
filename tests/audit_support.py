"""Helpers shared by the audit log's tests (issue 21): a key ring in memory, raw SQL on the database under test,
the chains' shape as stored, and exports written to a list of lines."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from taskgate.application.audit.export import export
from taskgate.application.audit.ledger import AuditLedger, Scope, VerifyReport
from taskgate.application.audit.linking import link_pending
from taskgate.infrastructure.audit.keys import AuditPublicKey, AuditSigner, create_key
from taskgate.infrastructure.db.audit_store import CHECKPOINT_CHAIN
from taskgate.infrastructure.system import SystemClock

AUDITED_TABLES = ("transition_log", "decisions", "events")


class Keys:
    """A key ring holding one signer (and, unless given another, its own public half)."""

    def __init__(self, signer: AuditSigner | None, public: AuditPublicKey | None = None) -> None:
        self._signer = signer
        self._public = public or (signer.public if signer is not None else None)

    def signer(self) -> AuditSigner | None:
        return self._signer

    def public(self) -> AuditPublicKey | None:
        return self._public


def new_signer(folder: Path) -> AuditSigner:
    """A fresh Ed25519 key pair written under `folder` (as `taskgate init` writes one)."""
    signer, created = create_key(folder / "signing-key.pem")
    assert created
    return signer


def ledger_of(services: Any, signer: AuditSigner | None, clock: Any = None) -> AuditLedger:
    """The ledger over `services`' database, signing with `signer` (None: a process without the key)."""
    return AuditLedger(services.uow, clock or SystemClock(), Keys(signer))


async def raw(target: Any, sql: str, **params: Any) -> list:
    """Run one SQL statement in a transaction of its own on `target` (a Services or a Database); its rows."""
    database = getattr(target, "database", target)
    async with database.connect() as conn:
        await conn.begin()
        result = await conn.execute(text(sql), params)
        rows = result.all() if result.returns_rows else []
        await conn.commit()
    return rows


def stored_time(value: Any) -> datetime:
    """A timestamp as raw SQL reads it back (SQLite: naive UTC text; PostgreSQL: an aware datetime), aware."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


async def record_count(target: Any) -> int:
    """How many audited records (transition rows, decisions, events) the database holds."""
    total = 0
    for table in AUDITED_TABLES:
        total += (await raw(target, f"SELECT count(*) FROM {table}"))[0][0]
    return total


async def whole_chains(services: Any) -> dict[str, int]:
    """Every chain's length, once the linker has linked every committed record, after checking that its links are
    seqs 1..N without a gap or a repeat, numbered in seq order with each `prev_no` the chain's link before, that
    every audited record has exactly one link, and that its head row holds seq N, the hash of link N and its
    number."""
    await link_pending(services.uow)
    target = services
    links = await raw(target, "SELECT chain_id, count(*), min(chain_seq), max(chain_seq) FROM audit_links "
                              "GROUP BY chain_id")  # fmt: skip
    lengths = {}
    for chain, count, first, last in links:
        assert (first, last) == (1, count), f"chain {chain} holds {count} links from #{first} to #{last}"
        lengths[chain] = count
    last = numbered_in_seq_order(await raw(target, "SELECT chain_id, chain_seq, link_no, prev_no FROM audit_links"))
    heads = await raw(
        target,
        "SELECT h.chain_id, h.seq, h.hash, l.hash, h.link_no, l.link_no FROM audit_chains h LEFT JOIN audit_links l "
        "ON l.chain_id = h.chain_id AND l.chain_seq = h.seq WHERE h.chain_id <> :checkpoints",
        checkpoints=CHECKPOINT_CHAIN,
    )
    assert {chain: seq for chain, seq, *_rest in heads} == lengths, "the head rows disagree with the links"
    assert all(head == link for _c, _s, head, link, _n, _ln in heads), "a head row's hash is not its last link's"
    assert all(number == linked == last[chain] for chain, _s, _h, _l, number, linked in heads), "a head's link_no"
    assert sum(lengths.values()) == await record_count(target), "a record has no link, or a link no record"
    return lengths


def numbered_in_seq_order(links: list) -> dict[str, int]:
    """Check (chain, seq, link_no, prev_no) rows: by number, each chain's seqs run 1, 2, ... and each link's
    `prev_no` is its chain's link before (None for the first). Each chain's last number."""
    last: dict[str, tuple[int, int]] = {}
    for chain, seq, number, prev in sorted(links, key=lambda link: link[2]):
        seq_before, number_before = last.get(chain, (0, None))
        assert (seq, prev) == (seq_before + 1, number_before), f"{chain} #{seq} is link {number} after {prev}"
        last[chain] = (seq, number)
    return {chain: number for chain, (_seq, number) in last.items()}


def problems(report: VerifyReport) -> list[str]:
    """A report's findings as the CLI prints them (for assertion messages)."""
    return [finding.describe() for finding in report.findings]


async def export_lines(services: Any, scope: Scope = Scope(), key_id: str | None = None, clock: Any = None) -> list:
    """An export of `scope` (`application.audit_export.export`), as its lines."""
    lines: list[str] = []
    await export(services.uow, clock or SystemClock(), scope, key_id, lines.append)
    return lines
