"""Stop stops, whichever process launched the agent, and a stalled agent is found (issue 38).

Real processes all the way: `taskgate session execute` launches a long-running scripted agent (the catalogue's
sleeper, with a child of its own) and is then killed, interrupted with SIGINT, or left to finish; `session fire ID
cancel` and `session stop ID` come from other processes; the test looks at /proc for the agent's process group."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskgate.infrastructure import process_groups
from tests.conftest import make_git_repo
from tests.e2e.test_cli import TASKGATE, Cli, seed

SLEEPER = ["python3", "{catalogue_dir}/agents/sleeper.py", "600", "--child"]
# Says only that it is retrying its connection, as Codex does against an endpoint it cannot reach.
RETRIER = r"""
import sys, time
while True:
    print('{"type":"error","message":"Reconnecting... waiting for network (Connection failed)"}', flush=True)
    time.sleep(0.2)
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Cli:
    make_git_repo(tmp_path / "repo")
    retrier = tmp_path / "retrier.py"
    retrier.write_text(RETRIER)
    config = tmp_path / "taskgate.toml"
    config.write_text(
        f"[agents.sleepy]\ncommand = {json.dumps(SLEEPER)}\n\n"
        f"[agents.stubborn]\ncommand = {json.dumps([*SLEEPER, '--ignore-term'])}\n\n"
        f"[agents.retrier]\ncommand = {json.dumps([sys.executable, str(retrier)])}\nstall_s = 2\n"
        'stall_patterns = ["Reconnecting\\\\.\\\\.\\\\.", "waiting for network"]\n\n'
        "[execution]\nstop_grace_s = 1.5\nheartbeat_interval_s = 0.5\n"
    )
    cli = Cli(tmp_path)
    cli.env["TASKGATE_CONFIG"] = str(config)
    seed(cli)
    return cli


def launch(cli: Cli, sid: str, agent: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([TASKGATE, "session", "execute", sid, "--agent", agent, *extra], cwd=cli.workdir,
                            env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def running_agent(cli: Cli, sid: str, execute: subprocess.Popen[str] | None = None) -> dict:
    """The session's one agent once it runs and its sleeper has started its child (the group has two members)."""
    deadline = time.monotonic() + 60
    while True:
        agents = cli.json("session", "status", sid)["agents"]
        if agents and agents[0]["status"] == "running" and len(process_groups.members(agents[0]["pgid"])) >= 3:
            return agents[0]  # the agent_exec wrapper, the sleeper and its child
        assert time.monotonic() < deadline, execute and execute.poll() is not None and execute.stderr.read()
        time.sleep(0.1)


def events(cli: Cli, sid: str) -> list[tuple[str, dict]]:
    with sqlite3.connect(cli.workdir / "data" / "taskgate.db") as conn:
        rows = conn.execute("select kind, payload from events where session_id = ? order by id", (sid,)).fetchall()
    return [(kind, json.loads(payload)) for kind, payload in rows]


def test_cancel_from_another_process_ends_the_group_of_an_agent_whose_launcher_was_killed(workspace):
    cli = workspace
    sid = cli.json("session", "start", "DEMO-1")["id"]
    execute = launch(cli, sid, "sleepy")
    agent = running_agent(cli, sid, execute)
    assert agent["pgid"] == agent["pid"] and agent["process_start"] == process_groups.start_time(agent["pid"])
    worktree = Path(cli.json("session", "show", sid)["worktree_path"])
    assert worktree.is_dir()
    execute.kill()  # the launcher is gone; its agent runs on in its own process group
    execute.communicate(timeout=30)
    assert process_groups.members(agent["pgid"]), "the agent died with its launcher"

    out = cli.ok("session", "fire", sid[:8], "cancel", "--reason", "wrong task")
    assert "→ cancelled" in out
    assert process_groups.members(agent["pgid"]) == []  # gone when the command returned
    [after] = cli.json("session", "status", sid)["agents"]
    assert (after["status"], after["ended_by"]) == ("cancelled", "SIGTERM")
    stopped = [p for kind, p in events(cli, sid) if kind == "agent.stopped"]
    assert [(p["agent"], p["signal"], p["not_ours"]) for p in stopped] == [(agent["id"], "SIGTERM", False)]
    assert not worktree.exists()  # removed after the group was gone (the cancel's effects run in that order)


def test_session_stop_kills_an_agent_that_ignores_sigterm_with_sigkill_after_the_grace(workspace):
    cli = workspace
    sid = cli.json("session", "start", "DEMO-1")["id"]
    execute = launch(cli, sid, "stubborn", "--no-wait")  # returns once it started; the agent runs on
    assert execute.wait(timeout=60) == 0, execute.stderr.read()
    agent = running_agent(cli, sid)

    started = time.monotonic()
    out = cli.ok("session", "stop", sid[:8], "--reason", "runs too long")
    took = time.monotonic() - started
    assert process_groups.members(agent["pgid"]) == []
    assert f"agent {agent['id'][:8]} stubborn (run 1): cancelled, its process group ended by SIGKILL" in out
    assert f"session {sid[:8]} is now failed; `taskgate session fire {sid[:8]} retry` runs its agents again" in out
    assert took >= 1.5  # SIGTERM was ignored: SIGKILL came after the grace
    [after] = cli.json("session", "status", sid)["agents"]
    assert (after["status"], after["ended_by"]) == ("cancelled", "SIGKILL")
    last = cli.json("session", "history", sid)[-1]
    assert (last["trigger"], last["reason"]) == ("fail", "agents stopped by operator:alice: runs too long")


def test_ctrl_c_on_session_execute_stops_its_agents_within_the_grace_and_says_so(workspace):
    cli = workspace
    sid = cli.json("session", "start", "DEMO-1")["id"]
    execute = launch(cli, sid, "sleepy")
    agent = running_agent(cli, sid, execute)
    interrupted = time.monotonic()
    execute.send_signal(signal.SIGINT)
    out, err = execute.communicate(timeout=30)
    took = time.monotonic() - interrupted
    assert execute.returncode == 130, err
    assert took < 1.5 + 5  # the grace, and the time to record it
    assert process_groups.members(agent["pgid"]) == []
    assert "interrupted: stopping the session's agents (SIGTERM, then SIGKILL after 1.5 s)" in err
    assert f"agent {agent['id'][:8]} sleepy (run 1): cancelled, its process group ended by SIGTERM" in out
    assert f"session {sid[:8]} is now failed" in out
    assert "ASGI" not in err and "Traceback" not in err + out
    assert cli.json("session", "show", sid)["state"] == "failed"


def test_an_agent_that_only_retries_its_connection_is_found_stalled_escalated_and_stopped(workspace):
    cli = workspace
    sid = cli.json("session", "start", "DEMO-1")["id"]
    started = time.monotonic()
    execute = launch(cli, sid, "retrier")
    _out, err = execute.communicate(timeout=60)
    took = time.monotonic() - started
    assert execute.returncode == 0, err
    assert took < 30  # stall_s is 2 s: nowhere near its hour-long timeout_s
    [agent] = cli.json("session", "status", sid)["agents"]
    assert agent["status"] == "failed" and agent["ended_by"] == "SIGTERM"
    assert agent["error"].startswith("stalled: no progress for 2 s (only retry notices, the last: ")
    assert "Reconnecting... waiting for network" in agent["error"]
    kinds = [(kind, p) for kind, p in events(cli, sid) if kind in ("agent.stalled", "session.escalated")]
    assert [k for k, _ in kinds] == ["agent.stalled", "session.escalated"]
    assert kinds[1][1]["cause"] == "agent_stalled" and kinds[1][1]["agent"] == agent["id"]
    assert cli.json("session", "show", sid)["state"] == "failed"  # concluded as any failed agent: for the operator


def test_a_pid_reused_by_another_process_is_never_signalled(tmp_path):
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        real = process_groups.start_time(stranger.pid)
        assert real is not None and process_groups.ours(stranger.pid, real)
        ended = asyncio.run(process_groups.end_group(stranger.pid, real - 1, 0.5))  # recorded for an older process
        assert ended == process_groups.Ended(None, not_ours=True)
        assert stranger.poll() is None and os.getpgid(stranger.pid) == stranger.pid
    finally:
        stranger.kill()
        stranger.wait()


def test_two_stops_at_once_while_the_launcher_supervises_record_one_end_and_one_signal(workspace):
    cli = workspace
    sid = cli.json("session", "start", "DEMO-1")["id"]
    execute = launch(cli, sid, "sleepy")
    agent = running_agent(cli, sid, execute)
    stops = [subprocess.Popen([TASKGATE, "session", "stop", sid[:8]], cwd=cli.workdir, env=cli.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    for stop in stops:
        out, err = stop.communicate(timeout=60)
        assert stop.returncode == 0, err
        # the stopper that signalled the group says by what; one that came second, or after the launcher's own
        # supervisor ended it (it stops an agent whose row ended, at its next heartbeat), finds the group gone
        said = f"agent {agent['id'][:8]} sleepy (run 1): cancelled, "
        assert f"{said}its process group ended by SIG" in out or f"{said}its process had ended" in out, out
    _out, err = execute.communicate(timeout=60)  # its supervisor found its agent ended, and so did it
    assert execute.returncode == 0, err
    assert process_groups.members(agent["pgid"]) == []
    [after] = cli.json("session", "status", sid)["agents"]
    assert after["status"] == "cancelled" and after["ended_by"] in ("SIGTERM", "SIGKILL")
    ends = [p for kind, p in events(cli, sid) if kind == "agent.status" and p["to"] not in ("queued", "running")]
    assert len(ends) == 1, ends  # the first writer won; the others wrote nothing
    assert cli.json("session", "show", sid)["state"] == "failed"
