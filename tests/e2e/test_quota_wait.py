"""A quota error is a wait and a retry, not a failure (issue 42): a scripted agent speaking Claude Code's stream-json
is refused by the model API (429, rate limit) on its first run and exits 1; taskgate recognises it with the claude
preset's `quota_patterns`, waits, launches the same command again, and the second run's work completes the session's
run. Without retries left, the same error fails the session as any failure does."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from taskgate.domain.agents.presets import PRESETS
from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli, seed

pytestmark = pytest.mark.timeout(120)

LIMITED = r"""
import json, subprocess, sys
from pathlib import Path

marker = Path(sys.argv[1])  # in the worktree: the sandbox lets the agent write only there
if not marker.exists():
    marker.write_text("refused once\n")
    print(json.dumps({"type": "system", "subtype": "api_retry", "attempt": 1, "max_retries": 1,
                      "retry_delay_ms": 10, "error_status": 429, "error": "rate_limit"}), flush=True)
    print(json.dumps({"type": "result", "subtype": "success", "is_error": True, "num_turns": 0,
                      "result": "API Error: 429 rate_limit_error: This request would exceed your rate limit"}))
    sys.exit(1)
with open("work.txt", "w") as f:
    f.write("done after the wait\n")
subprocess.run(["git", "add", "work.txt"], check=True)
subprocess.run(["git", "-c", "user.name=agent", "-c", "user.email=a@x", "commit", "-qm", "agent work"], check=True)
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "num_turns": 1, "result": "done",
                  "usage": {"input_tokens": 10, "output_tokens": 5}, "total_cost_usd": 0.001}))
"""


def workspace(tmp_path: Path, retries: int) -> Cli:
    make_git_repo(tmp_path / "repo")
    script = tmp_path / "limited.py"
    script.write_text(LIMITED)
    patterns = json.dumps(list(PRESETS["claude"].quota_patterns))  # the preset's own patterns, as TOML strings
    (tmp_path / "taskgate.toml").write_text(
        f"[agents.limited]\ncommand = {json.dumps([sys.executable, str(script), '.refused-once'])}\n"
        f'output_format = "claude-stream-json"\nquota_patterns = {patterns}\n'
        f"quota_retries = {retries}\nquota_wait_s = 0.5\n\n[execution]\nheartbeat_interval_s = 0.3\n"
    )
    cli = Cli(tmp_path)
    cli.env["TASKGATE_CONFIG"] = str(tmp_path / "taskgate.toml")
    seed(cli)
    return cli


def events(cli: Cli, sid: str, kind: str) -> list[dict]:
    with sqlite3.connect(cli.workdir / "data" / "taskgate.db") as conn:
        rows = conn.execute("select payload from events where session_id = ? and kind = ? order by id", (sid, kind))
        return [json.loads(payload) for (payload,) in rows.fetchall()]


def test_a_rate_limited_run_waits_and_runs_again_and_its_second_run_completes_the_work(tmp_path):
    cli = workspace(tmp_path, retries=2)
    sid = cli.json("session", "start", "DEMO-1")["id"]

    cli.ok("session", "execute", sid, "--agent", "limited")

    status = cli.json("session", "status", sid)
    assert status["state"] == "verifying", status
    first, second = sorted(status["agents"], key=lambda a: a["started_at"])  # agents are listed by id
    assert first["status"] == "cancelled" and first["error"].startswith("quota: retried after a wait:")
    assert "429" in first["error"] and second["status"] == "completed" and second["run"] == first["run"]
    (wait,) = events(cli, sid, "agent.quota_wait")
    assert (wait["agent"], wait["attempt"], wait["of"], wait["wait_s"]) == (first["id"], 1, 2, 0.5)
    assert wait["next_agent"] == second["id"] and "rate_limit" in wait["line"]
    assert Path(status["worktree_path"], "work.txt").read_text() == "done after the wait\n"
    assert Path(status["worktree_path"], ".refused-once").exists()


def test_without_retries_left_a_rate_limited_run_fails_the_session(tmp_path):
    cli = workspace(tmp_path, retries=0)
    sid = cli.json("session", "start", "DEMO-1")["id"]

    cli.ok("session", "execute", sid, "--agent", "limited")

    status = cli.json("session", "status", sid)
    assert status["state"] == "failed" and [a["status"] for a in status["agents"]] == ["failed"]
    assert events(cli, sid, "agent.quota_wait") == []
