"""`[tracker] kind = "beads"` as a user meets it: the real `taskgate` CLI on a fresh git repository whose issues
live in Beads (the fake `bd`, built from Beads' source): ready is bd's, start claims atomically, status goes back
through the write-back outbox, a refused write shows everywhere and can be retried or dismissed, and the
`tracker_in_sync` policy holds a merge while Beads is behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli
from tests.support import bead, install_fake_bd, write_beads_state

ISSUES = [
    bead("sh-epic", "Checkout epic", issue_type="epic", priority=1),
    bead("sh-kid", "Card form", deps=[("sh-epic", "parent-child")]),
    bead("sh-blocker", "Payments API", priority=0),
    bead("sh-blocked", "Receipts", deps=[("sh-blocker", "blocks")]),
    bead("sh-hooked", "On someone's hook", status="hooked"),
    bead("sh-mol", "A molecule", issue_type="molecule"),
    bead("sh-bobs", "Bob claimed it", assignee="bob"),
]


@pytest.fixture
def shop(tmp_path: Path) -> tuple[Cli, Path]:
    repo = make_git_repo(tmp_path / "shop")
    write_beads_state(repo, *ISSUES)
    cli = Cli(repo)
    cli.env |= {
        "TASKGATE_TRACKER__KIND": "beads",
        "TASKGATE_TRACKER__BEADS__COMMAND": json.dumps([str(install_fake_bd(tmp_path / "bin"))]),
        "BEADS_ACTOR": "ignored-taskgate-passes-its-own",
    }
    cli.ok("init")
    return cli, repo


def beads(repo: Path) -> dict[str, dict]:
    lines = (repo / ".beads" / "issues.jsonl").read_text().splitlines()
    return {i["id"]: i for i in map(json.loads, lines)}


def test_ready_is_bd_readys_and_start_claims_the_issue_in_beads(shop) -> None:
    cli, repo = shop
    assert [t["id"] for t in cli.json("task", "ready")] == ["sh-blocker", "sh-epic", "sh-bobs", "sh-kid"]
    cli.ok("session", "start", "sh-blocker")
    claimed = beads(repo)["sh-blocker"]
    assert (claimed["status"], claimed["assignee"]) == ("in_progress", "operator:alice")
    assert [t["id"] for t in cli.json("task", "ready")] == ["sh-epic", "sh-bobs", "sh-kid"]
    bob = beads(repo)["sh-kid"] | {"status": "in_progress", "assignee": "bob"}  # taken in Beads by someone else
    write_beads_state(repo, *[i for i in beads(repo).values() if i["id"] != "sh-kid"], bob)
    context = cli.json("context", "--refresh")["tracker"]
    assert (context["ready"], context["ready_ids"]) == (2, ["sh-bobs", "sh-epic"])


def test_a_start_beads_refuses_is_a_blocked_row_and_changes_nothing_in_beads(shop) -> None:
    cli, repo = shop
    refusal = cli.fails("session", "start", "sh-bobs")
    assert "cannot claim sh-bobs in the tracker" in refusal and "already claimed by bob" in refusal
    assert beads(repo)["sh-bobs"]["status"] == "open"
    sessions = cli.json("session", "list")
    assert [(s["task_id"], s["state"]) for s in sessions] == [("sh-bobs", "ready")]
    [blocked] = cli.json("audit", "transitions", "--outcome", "blocked")
    assert blocked["trigger"] == "start" and "tracker_claim" in json.dumps(blocked)
    assert "bd ready does not list it" in cli.fails("session", "start", "sh-hooked")  # held in Beads


def test_a_refused_write_back_is_shown_retried_after_the_fix_and_the_command_says_so(shop) -> None:
    cli, repo = shop
    short = cli.json("session", "start", "sh-epic")["id"][:8]
    for trigger in ("plan_complete", "work_complete", "approve"):
        cli.ok("session", "fire", short, trigger)
    merged = cli.run("session", "merge", short)
    assert merged.returncode == 0, merged.stderr
    assert "tracker write-back of sh-epic → completed failed" in merged.stdout
    assert "cannot close epic sh-epic: 1 open child issue(s)" in merged.stdout
    assert beads(repo)["sh-epic"]["status"] == "in_progress"  # Beads refused; nothing silent about it

    [owed] = cli.json("tracker", "status")["writebacks"]
    assert (owed["task_id"], owed["status"], owed["state"], owed["attempts"]) == ("sh-epic", "completed", "pending", 1)
    assert "open child issue(s)" in owed["last_error"]
    assert "tracker out of sync: write-back #" in cli.ok("session", "status", short)

    kid = beads(repo)["sh-kid"]
    write_beads_state(repo, *[i for i in beads(repo).values() if i["id"] != "sh-kid"], kid | {"status": "closed"})
    assert f"write-back #{owed['id']}: sh-epic → completed written" in cli.ok("tracker", "retry", str(owed["id"]))
    assert beads(repo)["sh-epic"]["status"] == "closed"
    assert "nothing owed to the tracker" in cli.ok("tracker", "status")
    assert next(r["state"] for r in cli.json("tracker", "status", "--all")["writebacks"]) == "done"


def test_tracker_in_sync_holds_the_merge_until_beads_has_the_status_and_dismiss_records_why(shop) -> None:
    cli, repo = shop
    cli.env |= {
        "TASKGATE_POLICIES__TRACKER_IN_SYNC__ENABLED": "true",
        "TASKGATE_TRACKER__BEADS__STATUS_MAP": json.dumps(
            {"in_progress": "in_progress", "approved": "blocked", "completed": "closed"}
        ),
    }
    short = cli.json("session", "start", "sh-blocker")["id"][:8]
    for trigger in ("plan_complete", "work_complete"):
        cli.ok("session", "fire", short, trigger)
    cli.env["FAKE_BD_FAIL_ON"] = "update"  # Beads is down for updates when the work is approved
    done = cli.run("session", "decide", short, "approve", "--reason", "fine")
    assert done.returncode == 0 and "will be retried" in done.stdout, done.stdout + done.stderr
    del cli.env["FAKE_BD_FAIL_ON"]
    refusal = cli.fails("session", "merge", short)
    assert "tracker_in_sync" in refusal and "the tracker is behind" in refusal
    [owed] = cli.json("tracker", "status")["writebacks"]
    assert "simulated failure" in owed["last_error"]
    assert "needs a reason" in cli.fails("tracker", "dismiss", str(owed["id"]))
    cli.ok("tracker", "dismiss", str(owed["id"]), "--reason", "set blocked by hand in bd")
    assert "completed" in cli.ok("session", "merge", short)
    assert beads(repo)["sh-blocker"]["status"] == "closed"
    assert [
        r["resolved_by"] for r in cli.json("tracker", "status", "--all")["writebacks"] if r["state"] == "dismissed"
    ] == ["operator:alice"]
