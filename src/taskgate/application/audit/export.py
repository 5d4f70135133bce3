"""Audit exports: the records of a scope with their proofs, as JSON lines, and their verification without the
database (`taskgate audit verify --file EXPORT --public-key KEY`, on any machine).

An export is, one JSON object per line: a `header` (format, scope, time, the exporting key's id), every
`checkpoint` (its body text and signature: the chain of checkpoints is verified whole), every `record` of the
scope in the order they were linked, each chain's in seq order (`chain`, `seq`, `table`, `id`, `hash`, `prev`: the
hash before it, `fields`: canonical), then an `end` line with the counts, so a file cut short shows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from taskgate.application.audit.ledger import (
    PROGRESS_EVERY,
    Progress,
    Scope,
    VerifyReport,
    counted,
    links_in,
    walk_checkpoints,
)
from taskgate.application.audit.linking import link_pending
from taskgate.application.audit.ports import AuditUnitOfWorkFactory, PublicKey
from taskgate.application.ports import Clock
from taskgate.domain.audit.chain import FORMAT, canonical_value
from taskgate.domain.audit.checkpoints import CheckpointReport, StoredCheckpoint, verify_checkpoints
from taskgate.domain.audit.verify import ChainWalk, Finding, LinkRow
from taskgate.domain.errors import InvalidInput


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


async def export(uow: AuditUnitOfWorkFactory, clock: Clock, scope: Scope, key_id: str | None,
                 write: Callable[[str], None], progress: Progress | None = None) -> dict[str, int]:  # fmt: skip
    """Write the scope's export, a line at a time, from one read transaction, once every record committed before
    it is linked; the counts written. `progress` is told the records written, every PROGRESS_EVERY and once at
    the end."""
    await link_pending(uow)
    counts = {"checkpoints": 0, "records": 0}
    async with uow(write=False) as unit:
        write(_line({"type": "header", "format": FORMAT, "exported_at": canonical_value(clock.now()),
                     "scope": scope.as_dict(), "key": key_id}))  # fmt: skip
        for stored in await unit.audit.checkpoints():
            write(_line({"type": "checkpoint", "body": stored.body.decode(), "signature": stored.signature}))
            counts["checkpoints"] += 1
        async for link in counted(links_in(unit, scope), progress):
            record = {"type": "record", "chain": link.chain, "seq": link.seq, "table": link.table,
                      "id": link.record_id, "hash": link.hash, "prev": link.prev, "fields": link.fields}  # fmt: skip
            write(_line(record))
            counts["records"] += 1
    write(_line({"type": "end", **counts}))
    return counts


def verify_export(
    lines: Iterable[str], public: PublicKey, source: str, progress: Callable[[int], None] | None = None
) -> VerifyReport:
    """Verify an export file's lines with `public`, without a database, a line at a time (memory stays flat
    whatever the size but for a few bytes a chain: records are checked as they are read, in the order an export is
    written in, each chain's in seq order).
    `progress` is told the lines read, every PROGRESS_EVERY and once at the end (synchronously: this runs offline,
    outside any event loop).

    Raises: InvalidInput when the file is not a taskgate audit export (no header first, unknown format, a line that
    is not an export line, a checkpoint after the records): a file that is an export but was changed gives findings.
    """
    started = time.perf_counter()
    walk = _ExportWalk(public, source)
    number = 0
    for number, text in enumerate(lines, 1):
        if text.strip():
            walk.take(number, text)
        if progress is not None and number % PROGRESS_EVERY == 0:
            progress(number)
    if progress is not None:
        progress(number)
    return walk.report(time.perf_counter() - started)


class _ExportWalk:
    """An export read line by line: the header, then the checkpoints (verified once the first record comes), then
    the records fed to the chain walk as they come, then the end line."""

    def __init__(self, public: PublicKey, source: str) -> None:
        self._public, self._source = public, source
        self._header: dict[str, Any] | None = None
        self._checkpoints: list[StoredCheckpoint] = []
        self._checks: CheckpointReport | None = None
        self._walk: ChainWalk | None = None
        self._end: dict[str, Any] | None = None

    def take(self, number: int, text: str) -> None:
        """Read one line. Raises: InvalidInput as `verify_export` says."""
        try:
            item = json.loads(text)
            kind = item["type"]
            record = _record(item) if kind == "record" else None
            checkpoint = StoredCheckpoint(item["body"].encode(), item["signature"]) if kind == "checkpoint" else None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidInput(f"{self._source} line {number} is not an audit export line ({exc})") from exc
        if kind == "header":
            self._header = item
        elif self._header is None or self._header.get("format") != FORMAT:
            raise InvalidInput(f"{self._source} is not a {FORMAT} export (no header line naming that format first)")
        elif checkpoint is not None:
            if self._walk is not None:
                raise InvalidInput(
                    f"{self._source} line {number}: a checkpoint after the records (not an export's order)"
                )
            self._checkpoints.append(checkpoint)
        elif record is not None:
            self._walking().feed(record)
        elif kind == "end":
            self._end = item

    def _walking(self) -> ChainWalk:
        if self._walk is None:
            assert self._header is not None
            scope = self._header.get("scope") or {}
            chain = Scope(scope.get("session")).chain
            self._checks = verify_checkpoints(self._checkpoints, self._public.key_id, self._public.verifies)
            heads = self._checks.heads
            signed = heads if chain is None else {c: p for c, p in heads.items() if c == chain}
            self._walk = ChainWalk(signed, self._checks.anchors, complete=scope.get("since") is None)
        return self._walk

    def report(self, seconds: float) -> VerifyReport:
        """The outcome, once every line was read. Raises: InvalidInput when there was no header."""
        if self._header is None or self._header.get("format") != FORMAT:
            raise InvalidInput(f"{self._source} is not a {FORMAT} export (no header line naming that format)")
        walk = self._walking()
        assert self._checks is not None
        walk.finish()
        report = VerifyReport(Scope((self._header.get("scope") or {}).get("session")), self._public.key_id)
        walk_checkpoints(self._checks, walk, report)
        end, source = self._end, self._source
        if end is None:
            report.findings.append(Finding(source, "has no end line: the export was cut short"))
        elif (end.get("records"), end.get("checkpoints")) != (walk.records, self._checks.count):
            report.findings.append(Finding(source, f"its end line counts {end.get('records')} records and "
                                           f"{end.get('checkpoints')} checkpoints, the file holds {walk.records} and "
                                           f"{self._checks.count}: lines were removed or added"))  # fmt: skip
        report.seconds = seconds
        return report


def _record(item: dict[str, Any]) -> LinkRow:
    return LinkRow(item["chain"], int(item["seq"]), item["table"], int(item["id"]), item["hash"], item["prev"],
                   item["fields"])  # fmt: skip
