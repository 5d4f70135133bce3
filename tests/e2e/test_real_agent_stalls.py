"""The REAL Claude Code, Codex and aider, run through their presets as shipped, with the model endpoint set the way
a user sets it but nothing listening there: each CLI only reports that it retries its connection, and taskgate
finds it stalled after the type's `stall_s` (set small here; 300 s by default), escalates and stops it, instead of
waiting out its hour-long `timeout_s` (issue 38)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_cli import TASKGATE
from tests.e2e.test_init import User, fresh_repo
from tests.support.agent_clis import require_cli

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens
ENDPOINTS = {  # the variables a user sets to point each CLI at a model endpoint
    "claude": {"ANTHROPIC_BASE_URL": CLOSED, "ANTHROPIC_API_KEY": "test-key"},
    "codex": {"OPENAI_BASE_URL": f"{CLOSED}/v1", "OPENAI_API_KEY": "test-key"},
    "aider": {"OPENAI_API_BASE": f"{CLOSED}/v1", "OPENAI_API_KEY": "test-key"},
}
# aider prints nothing for several seconds while it starts (litellm): a stall_s shorter than that finds it stalled
# before it ever retried, which is right but not what this test is about
STALL_S = {"claude": 4, "codex": 4, "aider": 20}


@pytest.mark.parametrize("cli", ["claude", "codex", "aider"])
def test_a_real_cli_that_cannot_reach_its_endpoint_is_found_stalled_escalated_and_stopped(tmp_path: Path, cli: str):
    user = User(fresh_repo(tmp_path / "shop", branch="main"))
    home = tmp_path / "home"
    home.mkdir()
    binary = require_cli(cli)
    user.env |= {"PATH": f"{binary.parent}:{user.env['PATH']}", "HOME": str(home), "TMPDIR": str(tmp_path),
                 **ENDPOINTS[cli]}  # fmt: skip
    user.ok("init")
    config = user.repo / ".taskgate" / "taskgate.toml"
    config.write_text(config.read_text() + f"\n[agents.{cli}]\nstall_s = {STALL_S[cli]}\n")
    task = user.json("task", "add", "Say hello")["id"]
    sid = user.json("session", "start", task)["id"]

    began = time.monotonic()
    done = subprocess.run([TASKGATE, "session", "execute", sid, "--agent", cli], cwd=user.repo, env=user.env,
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    [agent] = user.json("session", "status", sid)["agents"]
    assert agent["status"] == "failed", agent
    assert agent["error"].startswith(f"stalled: no progress for {STALL_S[cli]} s (only retry notices, the last: ")
    assert agent["ended_by"] in ("SIGTERM", "SIGKILL")
    assert took < 120  # stall_s and the CLI's start-up, not its timeout_s of an hour
    with sqlite3.connect(user.repo / ".taskgate" / "data" / "taskgate.db") as db:
        kinds = [(k, json.loads(p)) for k, p in db.execute(
            "select kind, payload from events where session_id = ? and kind in ('agent.stalled', 'session.escalated') "
            "order by id", (sid,))]  # fmt: skip
    assert [k for k, _ in kinds] == ["agent.stalled", "session.escalated"]
    assert kinds[1][1]["cause"] == "agent_stalled"
    assert user.json("session", "show", sid)["state"] == "failed"
