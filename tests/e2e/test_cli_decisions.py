"""Operators and decisions through the `taskgate` executable."""

from __future__ import annotations

from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli, seed


def test_operators_are_managed_by_the_admin_and_decisions_are_idempotent(tmp_path):
    make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    seed(cli)  # alice, the first operator, is the admin
    bob = cli.json("operator", "add", "bob", "--role", "reviewer", "--max-active", "2")
    assert (bob["roles"], bob["max_active_sessions"]) == (["reviewer"], 2)
    assert "already exists" in cli.fails("operator", "add", "bob", "--role", "qa")
    assert "unknown or missing role" in cli.fails("operator", "add", "carol", "--role", "boss")
    granted = cli.json("operator", "grant", "bob", "--permission", "override")
    assert granted["permissions"] == ["override"]
    assert [o["id"] for o in cli.json("operator", "list")] == ["alice", "bob"]

    session = cli.json("session", "start", "DEMO-1")
    for trigger in ("plan_complete", "work_complete"):
        cli.ok("session", "fire", session["id"][:8], trigger)
    first = cli.json("session", "decide", session["id"][:8], "approve", "--reason", "fine")
    again = cli.json("session", "decide", session["id"][:8], "approve", "--reason", "fine")
    assert first["id"] == again["id"] and first["to_state"] == "awaiting_merge"
    assert "already decided: approve by alice" in cli.fails("session", "decide", session["id"][:8], "reject")

    # as bob (a reviewer), administering operators is refused
    cli.env["TASKGATE_OPERATOR__DEFAULT"] = "bob"
    assert "needs the 'admin' permission" in cli.fails("operator", "add", "eve", "--role", "admin")
