"""Audit exports: the records of a scope with their proofs, as JSON lines, and their verification without the
database (`taskgate audit verify --file EXPORT --public-key KEY`, on any machine).

An export is, one JSON object per line: a `header` (format, scope, time, the exporting key's id), every
`checkpoint` (its body text and signature: the chain of checkpoints is verified whole), every `record` of the
scope in (chain, seq) order (`chain`, `seq`, `table`, `id`, `hash`, `prev`: the hash before it, `fields`:
canonical), then an `end` line with the counts, so a file cut short shows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from taskgate.application.audit_ledger import Scope, VerifyReport, links_in, walk_checkpoints
from taskgate.application.audit_ports import AuditUnitOfWorkFactory, PublicKey
from taskgate.application.ports import Clock
from taskgate.domain.audit_chain import FORMAT, canonical_value
from taskgate.domain.audit_checkpoints import StoredCheckpoint, verify_checkpoints
from taskgate.domain.audit_verify import ChainWalk, Finding, LinkRow
from taskgate.domain.errors import InvalidInput


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


async def export(uow: AuditUnitOfWorkFactory, clock: Clock, scope: Scope, key_id: str | None,
                 write: Callable[[str], None]) -> dict[str, int]:  # fmt: skip
    """Write the scope's export, a line at a time, from one read transaction; the counts written."""
    counts = {"checkpoints": 0, "records": 0}
    async with uow(write=False) as unit:
        write(_line({"type": "header", "format": FORMAT, "exported_at": canonical_value(clock.now()),
                     "scope": scope.as_dict(), "key": key_id}))  # fmt: skip
        for stored in await unit.audit.checkpoints():
            write(_line({"type": "checkpoint", "body": stored.body.decode(), "signature": stored.signature}))
            counts["checkpoints"] += 1
        async for link in links_in(unit, scope):
            record = {"type": "record", "chain": link.chain, "seq": link.seq, "table": link.table,
                      "id": link.record_id, "hash": link.hash, "prev": link.prev, "fields": link.fields}  # fmt: skip
            write(_line(record))
            counts["records"] += 1
    write(_line({"type": "end", **counts}))
    return counts


def verify_export(lines: Iterable[str], public: PublicKey, source: str) -> VerifyReport:
    """Verify an export file's lines with `public`, without a database.

    Raises: InvalidInput when the file is not a taskgate audit export (no header, unknown format, a line that is
    not JSON): a file that is an export but was changed gives findings instead.
    """
    started = time.perf_counter()
    header, checkpoints, records, end = _read(lines, source)
    scope_data = header.get("scope") or {}
    scope = Scope(scope_data.get("session"), None)
    report = VerifyReport(scope, public.key_id)
    checks = verify_checkpoints(checkpoints, public.key_id, public.verifies)
    signed = checks.heads if scope.chain is None else {c: p for c, p in checks.heads.items() if c == scope.chain}
    walk = ChainWalk(signed, checks.anchors, complete=scope_data.get("since") is None)
    for link in records:
        walk.feed(link)
    walk.finish()
    walk_checkpoints(checks, walk, report)
    if end is None:
        report.findings.append(Finding(source, "has no end line: the export was cut short"))
    elif (end.get("records"), end.get("checkpoints")) != (walk.records, checks.count):
        report.findings.append(Finding(source, f"its end line counts {end.get('records')} records and "
                                       f"{end.get('checkpoints')} checkpoints, the file holds {walk.records} and "
                                       f"{checks.count}: lines were removed or added"))  # fmt: skip
    report.seconds = time.perf_counter() - started
    return report


def _read(lines: Iterable[str], source: str) -> tuple[dict[str, Any], list[StoredCheckpoint], list[LinkRow], Any]:
    header: dict[str, Any] | None = None
    checkpoints: list[StoredCheckpoint] = []
    records: list[LinkRow] = []
    end = None
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            item = json.loads(text)
            kind = item["type"]
            if kind == "header":
                header = item
            elif kind == "checkpoint":
                checkpoints.append(StoredCheckpoint(item["body"].encode(), item["signature"]))
            elif kind == "record":
                records.append(LinkRow(item["chain"], int(item["seq"]), item["table"], int(item["id"]), item["hash"],
                                       item["prev"], item["fields"]))  # fmt: skip
            elif kind == "end":
                end = item
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidInput(f"{source} line {number} is not an audit export line ({exc})") from exc
    if header is None or header.get("format") != FORMAT:
        raise InvalidInput(f"{source} is not a {FORMAT} export (no header line naming that format)")
    records.sort(key=lambda r: (r.chain, r.seq))
    return header, checkpoints, records, end
