"""tracker_status, tracker_retry and tracker_dismiss over MCP (in-process client): what is owed to Beads, with bd's
words, retried by anyone who may write and dismissed only by those who may approve, with nothing else changed."""

from __future__ import annotations

from pathlib import Path

from taskgate.application.operators.roster import AddOperator
from taskgate.application.trackers.beads_import import BeadsImporter, ImportBeads
from taskgate.application.trackers.writebacks import WritebackService
from taskgate.domain.access import Principal
from taskgate.infrastructure.system import SystemClock
from taskgate.infrastructure.trackers import BeadsTracker
from tests.conftest import make_git_repo
from tests.mcp.conftest import app_of, connect
from tests.support import bead, install_fake_bd, write_beads_state

ALICE, DEV = Principal.operator("alice"), Principal.operator("dev")


async def owed_close(services, tmp_path: Path) -> WritebackService:
    """An epic imported from Beads whose close Beads refuses (an open child), owed once and tried once."""
    repo = make_git_repo(tmp_path / "repo")
    state = write_beads_state(
        repo, bead("sh-e", "Epic", issue_type="epic"), bead("sh-k", deps=[("sh-e", "parent-child")])
    )
    project = await services.tracker.init_project(str(repo))
    await services.tracker.ensure_operator("alice")
    await services.operators.add(AddOperator("dev", ["developer"], actor="operator:alice"))
    await BeadsImporter(services.uow, SystemClock()).import_jsonl(ImportBeads(project.id, state.read_bytes()))
    async with services.uow(write=True) as uow:
        await uow.writebacks.enqueue_for_task("sh-e", ("beads",), "completed", None, "merged", SystemClock().now())
        await uow.commit()
    writebacks = WritebackService(services.uow, SystemClock(), BeadsTracker([str(install_fake_bd(tmp_path / "bin"))]))
    await writebacks.run_due()
    return writebacks


async def test_status_shows_what_is_owed_with_bds_words_and_retry_says_what_happened(services, tmp_path) -> None:
    writebacks = await owed_close(services, tmp_path)
    app = app_of(services, writebacks=writebacks)
    async with connect(services, ALICE, app=app) as tools:
        listed = await tools.ok("tracker_status")
        [row] = listed["writebacks"]
        assert listed["summary"] == "1 write-back(s), 0 failed; 0 tracker poll(s), 0 failed"
        assert listed["projects"] == []
        assert (row["task_id"], row["status"], row["state"], row["attempts"]) == ("sh-e", "completed", "pending", 1)
        assert "cannot close epic sh-e: 1 open child issue(s)" in row["last_error"]
        again = await tools.ok("tracker_retry", writeback_id=row["id"])
        assert not again["ok"] and "failed again" in again["summary"] and again["writeback"]["attempts"] == 1
        assert (await tools.ok("tracker_status", state="done"))["writebacks"] == []


async def test_dismiss_needs_the_approve_permission_and_a_reason_and_is_recorded(services, tmp_path) -> None:
    writebacks = await owed_close(services, tmp_path)
    app = app_of(services, writebacks=writebacks)
    [row] = await writebacks.open_rows()
    before = await services.snapshot()
    async with connect(services, DEV, app=app) as tools:
        assert "Forbidden" in await tools.refused("tracker_dismiss", writeback_id=row.id, reason="fixed by hand")
        assert (await tools.ok("tracker_status"))["writebacks"][0]["state"] == "pending"  # reading is allowed
    assert await services.snapshot() == before
    async with connect(services, ALICE, app=app) as tools:
        dismissed = await tools.ok("tracker_dismiss", writeback_id=row.id, reason="closed the child by hand")
        assert dismissed["summary"] == f"write-back #{row.id} dismissed"
        assert (dismissed["writeback"]["state"], dismissed["writeback"]["resolved_by"]) == (
            "dismissed",
            "operator:alice",
        )
        assert "InvalidInput" in await tools.refused("tracker_retry", writeback_id=row.id)  # nothing owed any more
        assert "WritebackNotFound" in await tools.refused("tracker_retry", writeback_id=999)
    async with services.uow(write=False) as uow:
        kinds = [e["kind"] for e in await uow.events.list(None, limit=200)]
    assert "tracker.writeback_dismissed" in kinds
