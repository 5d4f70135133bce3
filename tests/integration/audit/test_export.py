"""Audit exports (issue 21): an export of every record, of one session, or of the records since a time verifies
offline, with only the file and the public key; an export edited afterwards fails verification naming what was
changed; a file that is not an export is refused as such.

The exports are made on SQLite and PostgreSQL. The edits work on one export file (made once, on SQLite): what
they test is the file's verification, which no database takes part in."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from taskgate.application.audit.export import export, verify_export
from taskgate.application.audit.ledger import Scope
from taskgate.application.operators.decisions import Decide
from taskgate.application.operators.roster import AddOperator
from taskgate.domain.audit.chain import session_chain
from taskgate.domain.entities import Session
from taskgate.domain.errors import InvalidInput
from taskgate.infrastructure.audit.keys import AuditSigner, load_public, public_path
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.system import SystemClock
from tests.audit_support import AUDITED_TABLES, export_lines, ledger_of, new_signer, problems, raw, stored_time
from tests.builders import OPERATOR, fire, seed, start
from tests.conftest import Services, make_git_repo, run_in_fresh_loop, wire

SOURCE = "audit.jsonl"


@dataclass
class History:
    approved: Session  # started, worked, approved by a decision: awaiting_merge
    toggled: Session  # suspended, resumed and suspended again
    since: datetime  # after the first checkpoint, before the records the second one signs


async def make_history(svc: Services, repo: Path, signer: AuditSigner) -> History:
    """Two sessions, a decision, a token issued and revoked, an operator added; two checkpoints, the second over
    the records written after `since`; one record after it, unsigned."""
    seeded = await seed(svc, repo, tasks=2)
    approved = await fire(svc, await start(svc, seeded.tasks[0]), "plan_complete", "work_complete")
    approved = (await svc.decisions.decide(Decide(approved.id, OPERATOR, "approve", reason="looks good"))).session
    toggled = await fire(svc, await start(svc, seeded.tasks[1]), "plan_complete", "suspend")
    token = await svc.access.create_operator_token(OPERATOR, "ci")
    ledger = ledger_of(svc, signer)
    await ledger.checkpoint()
    since = SystemClock().now()
    toggled = await fire(svc, toggled, "resume")
    await svc.access.revoke(token.token.id)
    await svc.operators.add(AddOperator("bob", ["reviewer"]))
    await ledger.checkpoint()
    toggled = await fire(svc, toggled, "suspend")
    return History(approved, toggled, since)


def records(lines: list[str]) -> list[dict[str, Any]]:
    return [item for item in map(json.loads, lines) if item["type"] == "record"]


def verified(lines: list[str], path: Path, public_key: Path):
    """Verify the export as an auditor does: from its file, with the public key file, no database."""
    path.write_text("".join(line + "\n" for line in lines))
    with path.open() as file:
        return verify_export(file, load_public(public_key), str(path))


async def test_exports_of_every_scope_verify_offline_with_the_public_key(sql_services, git_repo, tmp_path):
    signer = new_signer(tmp_path / "keys")
    history = await make_history(sql_services, git_repo, signer)
    in_db = await ledger_of(sql_services, signer).verify(Scope(), record=False)
    assert in_db.ok and in_db.unsigned > 0, problems(in_db)
    pub = public_path(tmp_path / "keys" / "signing-key.pem")

    whole = await export_lines(sql_services, Scope(), signer.key_id)
    report = verified(whole, tmp_path / "whole.jsonl", pub)
    assert report.ok, problems(report)
    assert (report.records, report.checkpoints, report.unsigned) == (in_db.records, 2, in_db.unsigned)
    header, end = json.loads(whole[0]), json.loads(whole[-1])
    assert (header["type"], header["format"], header["key"]) == ("header", "taskgate-audit-v1", signer.key_id)
    assert end == {"type": "end", "checkpoints": 2, "records": in_db.records}

    chain = session_chain(history.approved.id)
    one = await export_lines(sql_services, Scope(session_id=history.approved.id), signer.key_id)
    report = verified(one, tmp_path / "session.jsonl", pub)
    assert report.ok, problems(report)
    assert {r["chain"] for r in records(one)} == {chain}
    assert [r["seq"] for r in records(one)] == list(range(1, report.records + 1))
    assert report.records == len([r for r in records(whole) if r["chain"] == chain])

    recent = await export_lines(sql_services, Scope(since=history.since), signer.key_id)
    report = verified(recent, tmp_path / "since.jsonl", pub)
    assert report.ok, problems(report)
    stamps = [
        stored_time(at) for table in AUDITED_TABLES for (at,) in await raw(sql_services, f"SELECT at FROM {table}")
    ]
    assert report.records == len([at for at in stamps if at >= history.since]) == len(records(recent)) > 0
    assert all(datetime.fromisoformat(r["fields"]["at"]) >= history.since for r in records(recent))


# -- an export edited afterwards ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exported:
    lines: list[str]
    public_key: Path
    other_key: Path  # another key pair's public key
    key_id: str
    other_id: str


@pytest.fixture(scope="module")
def exported(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """One export of a whole database (on SQLite), made once for the edits below."""
    folder = tmp_path_factory.mktemp("exported")
    shutil.copy(sqlite_template, folder / "taskgate.db")
    signer, other = new_signer(folder / "keys"), new_signer(folder / "other")
    lines: list[str] = []

    async def build() -> None:
        url = f"sqlite:///{folder / 'taskgate.db'}"
        database = Database(url)
        try:
            svc = wire("sqlite", database, url)
            await make_history(svc, make_git_repo(folder / "repo"), signer)
            lines.extend(await export_lines(svc, Scope(), signer.key_id))
        finally:
            await database.dispose()

    run_in_fresh_loop(build)
    return Exported(lines, public_path(folder / "keys" / "signing-key.pem"),
                    public_path(folder / "other" / "signing-key.pem"), signer.key_id, other.key_id)  # fmt: skip


def edited(lines: list[str], change: Callable[[list[dict[str, Any]]], Any]) -> list[str]:
    """The export's lines after `change` edits them (parsed, in place)."""
    items = [json.loads(line) for line in lines]
    change(items)
    return [json.dumps(item, sort_keys=True, separators=(",", ":")) for item in items]


def nth_record(items: list[dict[str, Any]], table: str, n: int = 1) -> dict[str, Any]:
    """The `n`-th record of `table` (0-based) among the record lines, in file order."""
    return [i for i in items if i["type"] == "record" and i["table"] == table][n]


def last_signed_record(items: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """A chain's last record in the file that a checkpoint signed as its head, in a chain of several records, and
    the number of that checkpoint."""
    signed = {}
    for n, cp in enumerate((i for i in items if i["type"] == "checkpoint"), 1):
        signed |= {chain: (n, seq) for chain, (seq, _hash) in json.loads(cp["body"])["heads"].items()}
    last = {i["chain"]: i for i in items if i["type"] == "record"}  # file order is seq order: the last one stays
    return next((n, last[c]) for c, (n, seq) in sorted(signed.items()) if last[c]["seq"] == seq > 1)


def set_actor(items):
    nth_record(items, "transition_log")["fields"]["actor"] = "operator:mallory"


def session_record(items: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """The `n`-th record (0-based) of the first session chain in the file: 0 is its first, 1 one in its middle."""
    chained = [i for i in items if i["type"] == "record" and i["chain"].startswith("session:")]
    return [i for i in chained if i["chain"] == chained[0]["chain"]][n]


def delete_record(items):
    items.remove(session_record(items, 1))


def drop_end(items):
    items.remove(items[-1])


def resign_checkpoint(items):
    cp = next(i for i in items if i["type"] == "checkpoint")
    cp["signature"] = "A" * 86 + "=="


def edit_checkpoint_body(items):
    cp = next(i for i in items if i["type"] == "checkpoint")
    body = json.loads(cp["body"])
    body["reason"] = "interval"
    cp["body"] = json.dumps(body, sort_keys=True, separators=(",", ":"))


def delete_signed_head_and_recount(items):
    items.remove(last_signed_record(items)[1])
    items[-1]["records"] -= 1


def findings_of(exported: Exported, lines: list[str], tmp_path: Path, key: Path | None = None) -> list[tuple[str, str]]:
    report = verified(lines, tmp_path / SOURCE, key or exported.public_key)
    return [(f.where, f.problem) for f in report.findings]


def test_the_unedited_export_verifies(exported, tmp_path):
    assert findings_of(exported, exported.lines, tmp_path) == []


def test_a_records_field_edited_is_named_by_table_and_id(exported, tmp_path):
    items = [json.loads(line) for line in exported.lines]
    record = nth_record(items, "transition_log")
    found = findings_of(exported, edited(exported.lines, set_actor), tmp_path)
    assert found == [(f"transition_log {record['id']}", "does not hash to its link: its fields or its place changed "
                                                         "after it was written")]  # fmt: skip


def test_a_record_line_deleted_is_caught_by_the_end_lines_count(exported, tmp_path):
    found = findings_of(exported, edited(exported.lines, delete_record), tmp_path)
    counted = [what for where, what in found if where.endswith(SOURCE)]
    assert len(counted) == 1 and "its end line counts" in counted[0] and "lines were removed or added" in counted[0]
    # and the chain itself shows the gap, at the record after the one deleted
    assert any("follows no record" in what for where, what in found if not where.endswith(SOURCE))


def test_the_end_line_removed_is_named(exported, tmp_path):
    found = findings_of(exported, edited(exported.lines, drop_end), tmp_path)
    assert found == [(str(tmp_path / SOURCE), "has no end line: the export was cut short")]


def test_a_checkpoint_whose_signature_was_edited_is_named(exported, tmp_path):
    found = findings_of(exported, edited(exported.lines, resign_checkpoint), tmp_path)
    assert found == [("checkpoint #1", f"its signature does not verify with key {exported.key_id}: the checkpoint "
                                       "was changed after it was signed")]  # fmt: skip


def test_a_checkpoint_whose_body_was_edited_fails_its_signature_and_breaks_the_next_ones_link(exported, tmp_path):
    found = findings_of(exported, edited(exported.lines, edit_checkpoint_body), tmp_path)
    assert [where for where, _ in found] == ["checkpoint #1", "checkpoint #2"]
    assert found[0][1].startswith("its signature does not verify")
    assert found[1][1].startswith("does not follow checkpoint #1")


def test_verified_with_another_public_key_every_checkpoint_names_both_keys(exported, tmp_path):
    found = findings_of(exported, exported.lines, tmp_path, exported.other_key)
    why = f"was signed by key {exported.key_id}, not by the verifying key {exported.other_id}"
    assert [where for where, _ in found] == ["checkpoint #1", "checkpoint #2"]
    assert all(why in problem for _, problem in found)


def test_a_signed_head_deleted_with_the_count_mended_is_caught_by_the_checkpoint(exported, tmp_path):
    found = findings_of(exported, edited(exported.lines, delete_signed_head_and_recount), tmp_path)
    number, head = last_signed_record([json.loads(line) for line in exported.lines])
    assert found == [(f"chain {head['chain']}", f"ends at #{head['seq'] - 1}, but checkpoint #{number} signed "
                                                f"#{head['seq']}: its last 1 record(s) were removed")]  # fmt: skip


def mend_the_count(change):
    def both(items):
        change(items)
        items[-1]["records"] -= 1

    return both


@pytest.mark.parametrize("where", [1, 0], ids=["middle", "first"])
def test_a_record_line_deleted_with_the_count_mended_is_named_at_the_record_after_it(exported, tmp_path, where):
    """The chain itself shows the gap: a whole export's chains run from #1 (or their anchor) without one."""
    items = [json.loads(line) for line in exported.lines]
    after = session_record(items, where + 1)

    def delete(items):
        items.remove(session_record(items, where))

    found = findings_of(exported, edited(exported.lines, mend_the_count(delete)), tmp_path)
    assert found == [(f"{after['table']} {after['id']}", f"follows no record: #{where + 1} of its chain is missing "
                                                         "(deleted with its link)")]  # fmt: skip


# -- not an export ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("hello, auditor\n", "line 1 is not an audit export line"),
        ('{"type": "header", "format": "taskgate-audit-v1"}\n[1, 2]\n', "line 2 is not an audit export line"),
        ('{"type": "record", "chain": "x"}\n', "line 1 is not an audit export line"),
        ('{"type": "end", "records": 0, "checkpoints": 0}\n', "is not a taskgate-audit-v1 export"),
        ('{"type": "header", "format": "taskgate-audit-v2"}\n', "is not a taskgate-audit-v1 export"),
        ("", "is not a taskgate-audit-v1 export"),
    ],
    ids=["text", "json-not-an-object", "record-without-fields", "no-header", "other-format", "empty"],
)
def test_a_file_that_is_not_an_export_is_refused_by_name(exported, tmp_path, content, says):
    path = tmp_path / "not-an-export.jsonl"
    path.write_text(content)
    with pytest.raises(InvalidInput, match=says) as refused, path.open() as file:
        verify_export(file, load_public(exported.public_key), str(path))
    assert str(path) in str(refused.value)


async def test_a_long_verify_export_and_offline_verify_tell_their_progress_as_they_go(
    sql_services, git_repo, tmp_path, monkeypatch
):
    # The CLI shows these counts on its status line; every 4 here (10,000 in the product), and the total last.
    monkeypatch.setattr("taskgate.application.audit.ledger.PROGRESS_EVERY", 4)
    monkeypatch.setattr("taskgate.application.audit.export.PROGRESS_EVERY", 4)
    signer = new_signer(tmp_path / "keys")
    await make_history(sql_services, git_repo, signer)
    told: dict[str, list[int]] = {"verify": [], "export": [], "offline": []}

    report = await ledger_of(sql_services, signer).verify(Scope(), record=False, progress=told["verify"].append)
    assert report.ok and report.records > 8, problems(report)
    lines: list[str] = []
    counts = await export(sql_services.uow, SystemClock(), Scope(), signer.key_id, lines.append, told["export"].append)
    path = tmp_path / "all.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    with path.open() as file:
        offline = verify_export(file, load_public(public_path(tmp_path / "keys" / "signing-key.pem")), str(path),
                                told["offline"].append)  # fmt: skip
    assert offline.ok, problems(offline)

    totals = {"verify": report.records, "export": counts["records"], "offline": len(lines)}
    for what, seen in told.items():
        assert seen[:-1] == list(range(4, totals[what] + 1, 4))[: len(seen) - 1], what
        assert seen[-1] == totals[what] and len(seen) == totals[what] // 4 + 1, what
