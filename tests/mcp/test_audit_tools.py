"""audit_status, audit_verify and audit_checkpoint over MCP (in-process client) on SQLite and PostgreSQL: the last
checkpoint and verification shown, a record changed by hand named by verify, agents and operators without write
refused, a bad `since` refused, and nothing written by a refused call (issue 21)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from taskgate.application.audit.ledger import AuditLedger
from taskgate.application.operators.roster import AddOperator
from taskgate.bootstrap import App
from taskgate.domain.access import Principal
from taskgate.domain.audit.chain import session_chain
from taskgate.infrastructure.audit.keyring import FileKeyRing
from taskgate.infrastructure.audit.keys import create_key
from taskgate.infrastructure.system import SystemClock
from tests.builders import fire, seed, start
from tests.conftest import Services
from tests.mcp.conftest import app_of, connect

ALICE = Principal.operator("alice")


@pytest.fixture
def signer(tmp_path: Path):
    return create_key(tmp_path / "keys" / "audit.pem")[0]


class Keys:
    """A key ring holding the signer's private half (unless `private` is false: a server that may only verify, its
    private key kept on another machine) and its public half."""

    def __init__(self, signer, *, private: bool = True) -> None:
        self._signer, self._public = (signer if private else None), signer.public

    def signer(self):
        return self._signer

    def public(self):
        return self._public


async def busy(services: Services, git_repo: Path, sessions: int = 2) -> list:
    """Sessions moved through a few transitions: transition rows and events to chain."""
    seeded = await seed(services, git_repo, tasks=sessions)
    return [await fire(services, await start(services, task), "plan_complete", "suspend", "resume")
            for task in seeded.tasks]  # fmt: skip


async def raw(services: Services, sql: str, **params) -> list:
    """One statement on the database under test, in a transaction of its own, outside taskgate."""
    async with services.database.connect() as conn:
        await conn.begin()
        result = await conn.execute(text(sql), params)
        rows = result.all() if result.returns_rows else []
        await conn.commit()
    return rows


async def second_transition(services: Services, session_id: str) -> int:
    """The seq of the session's second transition row, by its place in the session's chain."""
    rows = await raw(services, "SELECT record_id FROM audit_links WHERE chain_id = :c AND record_table = "
                     "'transition_log' ORDER BY chain_seq", c=session_chain(session_id))  # fmt: skip
    return rows[1][0]


def with_ledger(services: Services, keys) -> App:
    app = app_of(services)
    app.ledger = AuditLedger(services.uow, SystemClock(), keys)
    return app


async def test_status_shows_the_newest_checkpoint_and_then_the_last_verification(sql_services, git_repo, signer):
    sessions = await busy(sql_services, git_repo)
    async with connect(sql_services, ALICE, app=with_ledger(sql_services, Keys(signer))) as tools:
        before = await tools.ok("audit_status")
        assert before["checkpoints"] == 0 and before["last_checkpoint"] is None and before["last_verified"] is None
        assert before["can_sign"] and before["key"] == signer.key_id
        assert before["summary"].startswith("no checkpoint yet")
        # the sessions' records are committed, waiting for the linker (this server runs no linker loop)
        assert before["pending_records"] >= 6 * len(sessions) and before["unsigned_chains"] == 0
        assert f"{before['pending_records']} waiting for their link" in before["summary"]

        signed = await tools.ok("audit_checkpoint")
        assert (signed["number"], signed["reason"], signed["key"]) == (1, "demand", signer.key_id)
        assert signed["by"] == "operator:alice"  # who asked, signed into the checkpoint's body
        assert signed["chains"] >= len(sessions) and signed["summary"].startswith("signed checkpoint #1")
        after = await tools.ok("audit_status")
        assert after["last_checkpoint"] == {k: v for k, v in signed.items() if k != "summary"}
        assert after["unsigned_chains"] == 0 and after["pending_records"] == 0 and after["last_verified"] is None

        verified = await tools.ok("audit_verify")
        assert verified["ok"] and verified["findings"] == [] and verified["unsigned_records"] == 0
        assert verified["last_checkpoint"]["number"] == 1 and verified["summary"].startswith("ok: ")
        status = await tools.ok("audit_status")
    last = status["last_verified"]
    assert (last["ok"], last["checkpoint"], last["records"], last["findings"]) == (True, 1, verified["records"], 0)
    assert last["first"] is None and last["scope"] == {"session": None, "since": None}
    # the audit.verified event itself, waiting for the linker (then for a checkpoint, in global:audit)
    assert (status["pending_records"], status["unsigned_chains"]) == (1, 0)
    assert "last verified" in status["summary"] and ": ok;" in status["summary"]


async def test_verify_names_the_record_changed_by_hand_and_status_shows_it_broken(sql_services, git_repo, signer):
    sessions = await busy(sql_services, git_repo)
    async with connect(sql_services, ALICE, app=with_ledger(sql_services, Keys(signer))) as tools:
        await tools.ok("audit_checkpoint")
        seq = await second_transition(sql_services, sessions[1].id)
        await raw(sql_services, "UPDATE transition_log SET actor = 'operator:mallory' WHERE seq = :s", s=seq)

        report = await tools.ok("audit_verify")
        first = report["findings"][0]
        assert not report["ok"] and first["where"] == f"transition_log {seq}"
        assert first["chain"] == session_chain(sessions[1].id) and "does not hash to its link" in first["problem"]
        assert report["summary"].startswith("BROKEN: 1 finding(s)") and f"transition_log {seq}" in report["summary"]

        untouched = await tools.ok("audit_verify", session_id=sessions[0].id[:8])  # by prefix: the other chain
        assert untouched["ok"] and untouched["scope"]["session"] == sessions[0].id
        await tools.ok("audit_verify")  # the full verify again: the last verification is the broken one
        status = await tools.ok("audit_status")
    last = status["last_verified"]
    assert not last["ok"] and last["findings"] == 1 and last["first"].startswith(f"transition_log {seq} (")
    assert "BROKEN" in status["summary"] and f"transition_log {seq}" in status["summary"]


async def test_agents_are_refused_every_audit_tool_and_only_writers_sign(sql_services, git_repo, signer):
    seeded = await seed(sql_services, git_repo, tasks=1)
    session = await start(sql_services, seeded.tasks[0])
    await sql_services.operators.add(AddOperator("rev", ["reviewer"], actor="operator:alice"))
    app = with_ledger(sql_services, Keys(signer))
    before = await sql_services.snapshot()
    async with connect(sql_services, Principal.agent("tok1", session.id), app=app) as agent:
        for tool in ("audit_status", "audit_verify", "audit_checkpoint"):
            out = await agent.refused(tool)
            assert "Forbidden: agent tokens may not" in out, out
        assert "sign audit checkpoints" in await agent.refused("audit_checkpoint")
    async with connect(sql_services, Principal.operator("rev"), app=app) as rev:
        out = await rev.refused("audit_checkpoint")
        assert "operator rev (reviewer) may not sign audit checkpoints: it needs the 'write' permission" in out
        assert (await rev.ok("audit_status"))["checkpoints"] == 0  # reading is allowed
    assert await sql_services.snapshot() == before
    await sql_services.operators.add(AddOperator("dev", ["developer"], actor="operator:alice"))
    async with connect(sql_services, Principal.operator("dev"), app=app) as dev:
        assert (await dev.ok("audit_checkpoint"))["number"] == 1


async def test_a_bad_since_or_session_is_refused_by_name_and_nothing_is_written(sql_services, git_repo, signer):
    await busy(sql_services, git_repo, sessions=1)
    before = await sql_services.snapshot()
    async with connect(sql_services, ALICE, app=with_ledger(sql_services, Keys(signer))) as tools:
        naive = await tools.refused("audit_verify", since="2026-11-21T10:00:00")
        assert "since '2026-11-21T10:00:00' has no timezone" in naive and "Nothing was changed" in naive
        assert "malformed timestamp 'last tuesday'" in await tools.refused("audit_verify", since="last tuesday")
        assert "SessionNotFound" in await tools.refused("audit_verify", session_id="ffffffff")
        assert "out of range" in await tools.refused("audit_verify", since="0001-01-01T00:00:00+14:00")
        assert "NUL character" in await tools.refused("audit_verify", session_id="ab\x00cd")
        assert await sql_services.snapshot() == before
        recent = await tools.ok("audit_verify", since="2000-01-01T00:00:00+02:00")
        earliest = await tools.ok("audit_verify", since="0001-01-01T00:00:00Z")
    assert recent["ok"] and recent["scope"]["since"] == "1999-12-31T22:00:00.000000Z" and recent["records"] > 0
    assert earliest["ok"] and earliest["records"] == recent["records"] + 1  # and the first verify's own event


async def test_a_server_without_the_private_key_verifies_but_refuses_to_sign(sql_services, git_repo, signer):
    await busy(sql_services, git_repo, sessions=1)
    app = with_ledger(sql_services, Keys(signer, private=False))
    async with connect(sql_services, ALICE, app=app) as tools:
        status = await tools.ok("audit_status")
        assert not status["can_sign"] and status["key"] == signer.key_id
        before = await sql_services.snapshot()
        out = await tools.refused("audit_checkpoint")
        assert "no audit signing key here" in out and "[audit] key_file" in out
        assert await sql_services.snapshot() == before
        assert (await tools.ok("audit_verify"))["ok"]
    async with connect(sql_services, ALICE) as tools:  # a server built without the ledger says so
        assert "has no audit ledger" in await tools.refused("audit_status")


async def test_an_unreadable_key_file_is_named_and_nothing_is_signed(sql_services, git_repo, tmp_path):
    await busy(sql_services, git_repo, sessions=1)
    garbage = tmp_path / "keys" / "signing-key.pem"
    garbage.parent.mkdir()
    garbage.write_text("not a key\n")
    before = await sql_services.snapshot()
    async with connect(sql_services, ALICE, app=with_ledger(sql_services, FileKeyRing(garbage))) as tools:
        assert f"{garbage} is not a readable Ed25519 private key" in await tools.refused("audit_checkpoint")
        status = await tools.ok("audit_status")  # the status still answers, and names what is wrong with the key
        assert not status["can_sign"] and f"{garbage} is not a readable Ed25519 private key" in status["key_error"]
    assert await sql_services.snapshot() == before


async def test_a_verify_tells_a_client_that_asked_for_progress_the_records_it_has_checked(
    sql_services, git_repo, signer, monkeypatch
):
    # Every 3 records here (10,000 in the product), then the total: the notifications arrive before the result.
    monkeypatch.setattr("taskgate.application.audit.ledger.PROGRESS_EVERY", 3)
    await busy(sql_services, git_repo)
    told: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        told.append((progress, message))

    async with connect(sql_services, ALICE, app=with_ledger(sql_services, Keys(signer))) as tools:
        await tools.ok("audit_checkpoint")
        result = await tools.client.call_tool("audit_verify", {}, progress_callback=on_progress)
        quiet = await tools.client.call_tool("audit_verify", {})  # no progressToken: the same call, untold
    report = result.structured_content
    assert not result.is_error and report["ok"] and not quiet.is_error
    records = report["records"]
    assert [p for p, _ in told] == [*range(3, records + 1, 3), records]
    assert told[-1][1] == f"{records:,} records checked"
