"""`taskgate demo` (what `make demo` runs) tells the whole story and leaves a database that agrees with it."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

TASKGATE = str(Path(sys.executable).with_name("taskgate"))


def test_the_demo_runs_the_story_and_its_database_matches_what_it_printed(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    done = subprocess.run(
        [TASKGATE, "demo", "--workdir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "refused DEMO-5" in out and "task_unblocked" in out
    assert "refused DEMO-4" in out and "wip_limit" in out and "stays ready" in out
    assert "merged → completed" in out and "failed → rolled_back" in out and "rolled_back → completed" in out
    assert "started DEMO-4" in out and "Transition log" in out
    # the happy session's work is done by a real agent process (the built-in scripted coder), supervised
    assert "launched: " in out and "scripted_coder.py Implement the API" in out and "Agents of session" in out
    assert "coder completed, exit 0" in out and "[scripted_coder] committed" in out
    assert "work_complete    executing → verifying (automatic, by system: all agents completed)" in out

    with sqlite3.connect(tmp_path / "data" / "taskgate.db") as conn:
        states = dict(conn.execute("select task_id, state from sessions").fetchall())
        tasks = dict(conn.execute("select id, status from tasks").fetchall())
        blocked = conn.execute("select count(*) from transition_log where outcome = 'blocked'").fetchone()[0]
        agents = conn.execute(
            "select s.task_id, a.agent_type, a.status, a.exit_code, a.run from agents a join sessions s"
            " on s.id = a.session_id"
        ).fetchall()
        automatic = conn.execute(
            "select l.actor from transition_log l join sessions s on s.id = l.session_id"
            " where s.task_id = 'DEMO-1' and l.trigger = 'work_complete'"
        ).fetchall()
    assert states == {"DEMO-1": "completed", "DEMO-2": "completed", "DEMO-3": "planning", "DEMO-4": "planning"}
    assert tasks["DEMO-1"] == "completed" and tasks["DEMO-2"] == "open" and tasks["DEMO-5"] == "open"
    assert blocked == 1  # the refused 4th start; the blocked task was refused before any session existed
    assert agents == [("DEMO-1", "coder", "completed", 0, 1)] and automatic == [("system",)]

    # the agent's commit is what was reviewed and merged: on main, after the commit that landed meanwhile
    repo = tmp_path / "scratch-repo"
    log = subprocess.run(["git", "log", "--format=%s", "main"], cwd=repo, capture_output=True, text=True).stdout
    assert log.splitlines()[:2] == ["feat: Implement the API", "docs: start a changelog"]
    assert (repo / "work" / "implement-the-api.md").read_text().startswith("# Implement the API")
