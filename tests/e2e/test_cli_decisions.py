"""Operators and decisions through the `taskgate` executable."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli, seed
from tests.e2e.test_crash_points import APPENDER, _pg_database
from tests.e2e.test_operator_loop import decisions


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


@pytest.fixture(params=["sqlite", "postgresql"])
def loop_cli(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cli]:
    """A workspace with project demo, DEMO-1 and DEMO-2, and the appender agent (tests/e2e/test_crash_points.py),
    on SQLite or on a PostgreSQL database of its own."""
    databases = _pg_database() if request.param == "postgresql" else iter([None])
    make_git_repo(tmp_path / "repo")
    script = tmp_path / "appender.py"
    script.write_text(APPENDER)
    config = tmp_path / "taskgate.toml"
    command = json.dumps([sys.executable, str(script), "{task_id}", "{instructions}"])
    config.write_text(f'[execution]\ndefault_agents = ["appender"]\n\n[agents.appender]\ncommand = {command}\n')
    cli = Cli(tmp_path, database_url=next(databases))
    cli.env["TASKGATE_CONFIG"] = str(config)
    seed(cli)
    yield cli
    with pytest.raises(StopIteration):
        next(databases)


def test_the_operators_loop_through_the_cli(loop_cli: Cli):
    """Issue 14 through the CLI: `session fire approve` is a decision that `session decide` replays; reject
    (manual_review) then `session fire retry` runs the agent again, told why, supervised by the command; the next
    reject is a new round's decision; a branch changed after approval is merged only after reverify and a new
    approval."""
    cli = loop_cli
    sid = cli.json("session", "start", "DEMO-1")["id"][:8]
    cli.ok("session", "execute", sid)
    assert cli.json("session", "show", sid)["state"] == "verifying"

    cli.ok("session", "fire", sid, "reject", "--reason", "wrong approach")
    assert cli.json("session", "show", sid)["state"] == "failed"
    cli.ok("session", "fire", sid, "retry")  # relaunches the agent and waits for it
    shown = cli.json("session", "show", sid)
    assert shown["state"] == "verifying", shown
    worktree = Path(shown["worktree_path"])
    log = subprocess.run(["git", "log", "--format=%s", "main.."], cwd=worktree, capture_output=True, text=True)
    assert log.stdout.split()[:3] == ["fix:", "address", "review"], log.stdout  # the second run's commit
    assert (worktree / "work" / "DEMO-1.md").read_text().splitlines()[-1].endswith(
        "(reject by operator:alice): wrong approach"
    )  # fmt: skip
    second = cli.json("session", "decide", sid, "reject", "--reason", "still wrong")
    assert (second["to_state"], second["reason"]) == ("failed", "still wrong")  # a new round: decided, not replayed
    cli.ok("session", "fire", sid, "retry")

    fired = cli.json("session", "fire", sid, "approve", "--reason", "fine")
    assert (fired["trigger"], fired["to_state"], fired["actor"]) == ("approve", "awaiting_merge", "operator:alice")
    replay = cli.json("session", "decide", sid, "approve", "--reason", "fine")
    assert replay["to_state"] == "awaiting_merge" and replay["decision"] == "approve"
    rows = asyncio.run(decisions(cli, shown["id"]))
    assert [(d, o) for d, o, _ in rows] == [("reject", "alice"), ("reject", "alice"), ("approve", "alice")]

    (worktree / "work" / "DEMO-1.md").write_text("- resolved by hand\n")
    subprocess.run(["git", "-c", "user.name=op", "-c", "user.email=op@x.invalid", "commit", "-q", "-am",
                    "fix: resolved by hand"], cwd=worktree, check=True)  # fmt: skip
    error = cli.fails("session", "merge", sid)
    assert "changed after it was approved" in error and "reverify" in error, error
    cli.ok("session", "fire", sid, "reverify", "--reason", "look at the fix")
    cli.ok("session", "decide", sid, "approve", "--reason", "the fix is fine")
    assert "merged → completed" in cli.ok("session", "merge", sid)


def test_each_decision_says_what_the_operator_can_do_next(tmp_path):
    """Issue 38: a reject printed no next step."""
    make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    seed(cli)
    for title in ("One", "Two", "Three"):
        cli.ok("task", "add", title, "--plan", "1")
    for task, decision, extra, says in (
        ("DEMO-3", "reject", [], ["session fire", "retry", "cancel` frees task DEMO-3"]),
        ("DEMO-4", "reject", ["--compensation", "auto_revert"], ["task DEMO-4 is open again", "session start DEMO-4"]),
        ("DEMO-5", "approve", [], ["session merge"]),
    ):
        sid = cli.json("session", "start", task)["id"][:8]
        for trigger in ("plan_complete", "work_complete"):
            cli.ok("session", "fire", sid, trigger)
        out = cli.ok("session", "decide", sid, decision, "--reason", "because", *extra)
        assert "next:" in out and all(part in out for part in says), out
