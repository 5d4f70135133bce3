"""`taskgate sweep` as a user runs it: one sweep, printed as text or JSON."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli, seed


def test_sweep_times_out_a_session_past_its_deadline_and_then_finds_nothing(tmp_path: Path):
    make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    seed(cli)
    session = cli.json("session", "start", "DEMO-1")
    cli.ok("session", "fire", session["id"], "plan_complete")
    assert "swept 1 sessions: nothing to do" in cli.ok("sweep")
    with sqlite3.connect(cli.workdir / "data" / "taskgate.db") as conn:  # the session's own deadline, long gone
        conn.execute("update sessions set deadline = '2020-01-01 00:00:00.000000' where id = ?", (session["id"],))

    report = cli.json("sweep")
    [action] = report["actions"]
    assert (action["session_id"], action["action"], action["to_state"]) == (session["id"], "timed_out", "failed")
    assert report["errors"] == [] and report["skipped"] == []
    shown = cli.json("session", "show", session["id"])
    assert shown["state"] == "failed" and shown["compensation_plan"] == "manual_review"
    assert "swept 0 sessions: nothing to do" in cli.ok("sweep")
