"""A spend cap reached mid-run (issue 42): a scripted agent printing Claude Code's stream-json, message by message with
its usage, commits its work and goes on spending; taskgate stops it at the session's token cap, keeps its commit on the
session's branch, suspends the session with the budget as the reason, and says so in `budget.*` events."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli, seed

pytestmark = pytest.mark.timeout(120)

SPENDER = r"""
import json, subprocess, sys, time

def say(n):
    message = {"id": f"msg-{n}", "role": "assistant", "content": [{"type": "text", "text": f"step {n}"}],
               "usage": {"input_tokens": 300, "output_tokens": 100}}
    print(json.dumps({"type": "assistant", "message": message}), flush=True)

import os
if os.path.exists("work.txt"):  # resumed after the budget was raised: finish
    print(json.dumps({"type": "result", "is_error": False, "num_turns": 1, "result": "finished",
                      "usage": {"input_tokens": 10, "output_tokens": 5}}), flush=True)
    sys.exit(0)
say(0)
with open("work.txt", "w") as f:
    f.write("the agent's work\n")
subprocess.run(["git", "add", "work.txt"], check=True)
subprocess.run(["git", "-c", "user.name=agent", "-c", "user.email=a@x", "commit", "-qm", "agent work"], check=True)
for n in range(1, 1000):
    say(n)
    time.sleep(0.2)
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Cli:
    make_git_repo(tmp_path / "repo")
    spender = tmp_path / "spender.py"
    spender.write_text(SPENDER)
    config = tmp_path / "taskgate.toml"
    config.write_text(
        f"[agents.spender]\ncommand = {json.dumps([sys.executable, str(spender)])}\n"
        'output_format = "claude-stream-json"\n\n[execution]\nstop_grace_s = 1.5\nheartbeat_interval_s = 0.3\n\n'
        "[budgets]\nsession = {tokens = 2000}\nwarn_at = 0.5\n"
    )
    cli = Cli(tmp_path)
    cli.env["TASKGATE_CONFIG"] = str(config)
    seed(cli)
    return cli


def events(cli: Cli, sid: str) -> list[tuple[str, dict]]:
    with sqlite3.connect(cli.workdir / "data" / "taskgate.db") as conn:
        rows = conn.execute("select kind, payload from events where session_id = ? order by id", (sid,)).fetchall()
    return [(kind, json.loads(payload)) for kind, payload in rows]


def test_a_session_cap_reached_mid_run_stops_the_agent_keeps_its_commit_and_suspends_the_session_until_raised(
    workspace,
):
    cli = workspace
    sid = cli.json("session", "start", "DEMO-1")["id"]

    cli.ok("session", "execute", sid, "--agent", "spender")

    status = cli.json("session", "status", sid)
    assert status["state"] == "suspended", status
    (agent,) = status["agents"]
    assert agent["status"] == "cancelled" and agent["error"].startswith(f"stopped: budget: session {sid} spend")
    branch = status["branch_name"]
    log = subprocess.run(["git", "log", "--format=%s", branch], cwd=cli.workdir / "repo", capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert "agent work" in log.splitlines()
    assert Path(status["worktree_path"], "work.txt").exists()
    kinds = [(kind, payload) for kind, payload in events(cli, sid) if kind.startswith("budget.")]
    assert [k for k, _ in kinds] == ["budget.nearly_spent", "budget.reached"]
    reached = kinds[-1][1]
    assert (reached["scope"], reached["key"], reached["unit"], reached["limit"]) == ("session", sid, "tokens", 2000)
    assert reached["spent"] >= 2000 and reached["session_id"] == sid
    with sqlite3.connect(cli.workdir / "data" / "taskgate.db") as conn:
        (reason,) = conn.execute("select reason from transition_log where session_id = ? and trigger = 'suspend'",
                                 (sid,)).fetchone()  # fmt: skip
    assert reason.startswith(f"budget: session {sid} spend") and "reached 2000 tokens" in reason

    usage = cli.json("usage")
    (line,) = [b for b in usage["budgets"] if b["scope"] == "session"]
    assert (line["key"], line["unit"], line["limit"], line["reserved"]) == (sid, "tokens", 2000, 0)
    assert line["spent"] >= 2000 and line["used"] >= 1.0
    table = cli.ok("usage")
    assert "budgets" in table and sid in table and "2000 tokens" in table

    refused = cli.fails("session", "fire", sid, "resume")
    assert "budget: session" in refused and "exceeds 2000 tokens" in refused
    config = Path(cli.env["TASKGATE_CONFIG"])
    config.write_text(config.read_text().replace("session = {tokens = 2000}", "session = {tokens = 1000000}"))
    cli.ok("session", "fire", sid, "resume")
    resumed = cli.json("session", "status", sid)
    assert resumed["state"] == "verifying", resumed
    by_start = sorted(resumed["agents"], key=lambda a: a["started_at"])  # agents are listed by id
    assert [a["status"] for a in by_start] == ["cancelled", "completed"] and by_start[0]["id"] == agent["id"]
    assert by_start[1]["run"] == agent["run"] + 1
