"""Hostile agents in the sandbox (issue 39), through the real `taskgate` CLI, real bubblewrap, real git.

A scripted agent tries every way out the issue lists (tests/support/hostile_agent.py): writes into the project's
checkout, another repository and the operator's home; reads an SSH key and another session's worktree; moves
`main` or another session's branch by `update-ref`, `push` or by writing the ref files; changes git's config and
hooks; rewrites its `.git` file and its alternates; connects to a loopback port not on its allow-list. Each is
refused, its own work still commits and comes home to its branch, and nothing outside changed. A fork bomb and a
10 GiB allocation end that agent and not the node. The operator's home is a planted one (HOME of the service)."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from taskgate.infrastructure.sandbox import limits
from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli, seed
from tests.support.sandbox import require_bwrap

HOSTILE = Path(__file__).parents[1] / "support" / "hostile_agent.py"
ATTEMPTS = 18


@pytest.fixture
def listener():
    """A loopback TCP service on the host that no agent may reach (it answers whoever reaches it)."""
    server = socket.create_server(("127.0.0.1", 0))
    reached: list[str] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            reached.append("reached")
            conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nsecret")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], reached
    server.close()


def fingerprint(*paths: Path) -> dict[str, str]:
    """Every file under `paths` (the project's checkout and .git, the other repository, the home) by content."""
    found = {}
    for root in paths:
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink() and "/.worktrees/" not in str(path):
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def events(cli: Cli, sid: str) -> list[tuple[str, dict]]:
    with sqlite3.connect(cli.workdir / "data" / "taskgate.db") as conn:
        rows = conn.execute("select kind, payload from events where session_id = ? order by id", (sid,)).fetchall()
    return [(kind, json.loads(payload)) for kind, payload in rows]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def hostile(tmp_path: Path, listener) -> tuple[Cli, dict]:
    require_bwrap()
    port, reached = listener
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n")
    (home / ".bashrc").write_text("# the operator's\n")
    other_repo = tmp_path / "elsewhere"
    make_git_repo(other_repo)
    make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    cli.env["HOME"] = str(home)
    seed(cli)
    other = cli.json("session", "start", "DEMO-1")  # a second live session: its worktree and branch
    cli.json("task", "add", "Hostile", "--priority", "1")
    paths = {"project": tmp_path / "repo", "other_repo": other_repo, "home": home, "other": other, "port": port,
             "reached": reached}  # fmt: skip
    command = [sys.executable, str(HOSTILE), str(tmp_path / "repo"), str(other_repo), str(home),
               other["worktree_path"], other["branch_name"], str(port)]  # fmt: skip
    config = tmp_path / "taskgate.toml"
    config.write_text(
        f"[agents.hostile]\ncommand = {json.dumps(command)}\n\n"
        f"[agents.bomb]\ncommand = {json.dumps([*command, '--bomb'])}\n\n"
        f"[agents.hog]\ncommand = {json.dumps([*command, '--hog'])}\n\n"
        '[sandbox]\nmode = "bwrap"\npids = 200\nmemory_mb = 512\n'
    )
    cli.env["TASKGATE_CONFIG"] = str(config)
    # taskgate's own settings cache (settings_cache.py) lives outside the home these tests watch for the agent
    cli.env["XDG_CACHE_HOME"] = str(tmp_path / "xdg-cache")
    return cli, paths


def run_agent(cli: Cli, agent: str) -> tuple[dict, str, list]:
    """Start a session on the next ready task, run `agent` in it to its end; (session, its log, its events)."""
    ready = [t["id"] for t in cli.json("task", "ready") if t["title"] == "Hostile"]
    session = cli.json("session", "start", ready[0])
    done = subprocess.run([*cli_command(), "session", "execute", session["id"], "--agent", agent], cwd=cli.workdir,
                          env=cli.env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    status = cli.json("session", "status", session["id"])
    log = Path(status["agents"][0]["output_path"]).read_text()
    return cli.json("session", "show", session["id"]), log, status["agents"]


def cli_command() -> list[str]:
    from tests.e2e.test_cli import TASKGATE

    return [TASKGATE]


def test_every_way_out_is_refused_and_the_agents_own_work_still_comes_home(hostile):
    cli, paths = hostile
    project, other = paths["project"], paths["other"]
    before = fingerprint(project / "README.md", project / ".git", paths["other_repo"], paths["home"])
    main_before, other_before = git(project, "rev-parse", "main"), git(project, "rev-parse", other["branch_name"])
    status_before = git(project, "status", "--porcelain")
    session, log, agents = run_agent(cli, "hostile")
    attempts = dict(re.findall(r"^ATTEMPT (\S+): (\S+)", log, re.M))
    assert len(attempts) == ATTEMPTS, log
    assert {name for name, verdict in attempts.items() if verdict != "refused"} == set(), log
    assert "OWN WORK COMMITTED" in log and agents[0]["status"] == "completed", log
    assert session["state"] == "verifying"
    # its commit is on its branch in the project; main and the other session's branch did not move
    assert git(project, "log", "-1", "--format=%s", session["branch_name"]) == "feat: the hostile agent's own work"
    assert git(project, "rev-parse", "main") == main_before
    assert git(project, "rev-parse", other["branch_name"]) == other_before
    assert git(project, "status", "--porcelain") == status_before
    assert git(Path(session["worktree_path"]), "status", "--porcelain") == ""
    subprocess.run(["git", "-C", str(project), "fsck", "--strict"], check=True, capture_output=True)
    after = fingerprint(project / "README.md", project / ".git", paths["other_repo"], paths["home"])
    changed = {path for path in set(before) | set(after) if before.get(path) != after.get(path)}
    # taskgate's own: the new session's worktree and branch, and the fetch home (the incoming ref, new objects)
    ours = (session["id"], session["branch_name"], "/.git/objects/", "/.git/refs/taskgate/", "/.git/index")
    assert {p for p in changed if not any(part in p for part in ours)} == set(), changed
    assert paths["reached"] == []
    # every refusal the sandbox saw is on the session's audit log, with the agent that tried
    refused = [payload for kind, payload in events(cli, session["id"]) if kind == "sandbox.refused"]
    assert {(r["target"], r["source"]) for r in refused if r["what"] == "connect"} >= {
        (f"127.0.0.1:{paths['port']}", "catch-all"),
        ("10.1.2.3:443", "catch-all"),
        ("evil.example:443", "proxy"),
    }
    assert len([r for r in refused if r["what"] == "write"]) >= 5
    assert len([r for r in refused if r["what"] == "git"]) >= 2  # update-ref on the hidden project, push into it
    assert {r["agent"] for r in refused} == {agents[0]["id"]}
    assert not [kind for kind, _ in events(cli, session["id"]) if kind == "sandbox.breach"]
    # where the operator looks: session status (text and JSON)
    shown = cli.ok("session", "status", session["id"])
    assert "sandbox refused: connect " in shown and "10.1.2.3:443 (catch-all)" in shown, shown
    assert len(cli.json("session", "status", session["id"])["sandbox"]) == len(refused)
    started = [p for kind, p in events(cli, session["id"]) if kind == "agent.status" and p.get("to") == "running"]
    assert started[0]["sandbox"] == "bwrap" and started[0]["network"].startswith("allow-list: 127.0.0.1:")
    assert agents[0]["sandbox"] == f"bwrap; network {started[0]['network']}"  # the record says it too
    assert Path(session["worktree_path"], ".git").read_text().startswith("gitdir: ")
    assert "/.git/worktrees/" in Path(session["worktree_path"], ".git").read_text()


@pytest.mark.parametrize(("agent", "limit"), [("bomb", "pids limit"), ("hog", "memory limit")])
def test_a_fork_bomb_or_a_runaway_allocation_ends_that_agent_not_the_node(hostile, agent, limit):
    cli, paths = hostile
    session, log, agents = run_agent(cli, agent)
    assert f"hit its {limit}" in log, log
    assert agents[0]["status"] == "failed", agents
    limits_hit = [p for kind, p in events(cli, session["id"]) if kind == "sandbox.refused" and p["what"] == "limit"]
    assert limits_hit and limits_hit[0]["target"].startswith(limit), limits_hit
    # the node still serves: the next agent runs and its work comes home
    assert "OWN WORK COMMITTED" in log
    assert git(paths["project"], "log", "-1", "--format=%s", session["branch_name"]) == (
        "feat: the hostile agent's own work"
    )
    assert cli.json("session", "status", session["id"])["state"] in ("failed", "verifying")
    assert not [line for line in os.popen("ps -eo stat,args").read().splitlines() if "hostile_agent.py" in line]


PLANTER = r"""
import os, subprocess, sys
outside, home = sys.argv[1], sys.argv[2]
os.symlink(outside, "out")            # committed: a link to a folder outside
os.symlink(home, "home")              # a link to the operator's home
os.symlink(outside + "/marker.txt", "notes.md")
subprocess.run(["git", "add", "out", "notes.md", "home"], check=True)
subprocess.run(["git", "-c", "user.name=a", "-c", "user.email=a@x", "commit", "-q", "-m", "feat: links"], check=True)
print("PLANTED")
"""


def test_symlinks_planted_in_the_worktree_lead_taskgates_review_merge_and_cleanup_nowhere(hostile, tmp_path):
    cli, paths = hostile
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "marker.txt").write_text("outside, untouched\n")
    planter = tmp_path / "planter.py"
    planter.write_text(PLANTER)
    config = Path(cli.env["TASKGATE_CONFIG"])
    command = [sys.executable, str(planter), str(outside), str(paths["home"])]
    config.write_text(config.read_text() + f"\n[agents.planter]\ncommand = {json.dumps(command)}\n")
    before = fingerprint(outside, paths["home"])
    session, log, _ = run_agent(cli, "planter")
    assert "PLANTED" in log and session["state"] == "verifying", log
    assert "out" in cli.ok("session", "review", session["id"], "--patch")
    cli.ok("session", "decide", session["id"], "approve", "--reason", "links only")
    cli.ok("session", "merge", session["id"])
    assert cli.json("session", "show", session["id"])["state"] == "completed"
    assert not Path(session["worktree_path"]).exists()
    assert fingerprint(outside, paths["home"]) == before
    assert sorted(p.name for p in outside.iterdir()) == ["marker.txt"]
    assert git(paths["project"], "cat-file", "-p", "main:out") == str(outside)  # merged as a link, not followed


def test_many_sandboxed_agents_at_once_each_get_their_own_group_and_bring_their_own_work_home(hostile):
    """Six `session execute` processes at once, each launching the scripted coder in its own sandbox: each agent
    has a cgroup and a spec of its own (one agent's end must not end another's), and every commit comes home to its
    own branch (the fetches home are serialised by the repository lock)."""
    cli, paths = hostile
    for index in range(6):
        cli.json("task", "add", f"Parallel {index}")
    sessions = [cli.json("session", "start", t["id"]) for t in cli.json("task", "ready") if "Parallel" in t["title"]]
    launched = [subprocess.Popen([*cli_command(), "session", "execute", s["id"], "--agent", "coder"], cwd=cli.workdir,
                                 env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for s in sessions]  # fmt: skip
    for process in launched:
        assert process.wait(timeout=300) == 0, process.stderr.read()
    for session in sessions:
        status = cli.json("session", "status", session["id"])
        assert status["state"] == "verifying" and status["agents"][0]["exit_code"] == 0, status
        started = [p for kind, p in events(cli, session["id"]) if kind == "agent.status" and p.get("to") == "running"]
        assert started[0]["sandbox"] == "bwrap"
        subject = git(paths["project"], "log", "-1", "--format=%s", session["branch_name"])
        assert subject.startswith("feat: Parallel"), subject
    # every agent had a group of its own, removed at its end
    ours = {f"agent-{cli.json('session', 'status', s['id'])['agents'][0]['id']}" for s in sessions}
    support = limits.probe()
    assert support.kind in ("cgroup1", "cgroup2"), support.detail
    left = {Path(d).name for d in glob.glob("/sys/fs/cgroup/**/taskgate/agent-*", recursive=True)}
    assert ours.isdisjoint(left), ours & left


def test_off_only_by_an_explicit_setting_that_doctor_agents_list_the_record_and_the_audit_log_all_show(hostile):
    cli, _ = hostile
    config = Path(cli.env["TASKGATE_CONFIG"])
    config.write_text(config.read_text().replace('mode = "bwrap"', 'mode = "off"'))
    session, log, agents = run_agent(cli, "coder")
    assert session["state"] == "verifying", log
    started = [p for kind, p in events(cli, session["id"]) if kind == "agent.status" and p.get("to") == "running"]
    assert started[0]["sandbox"] == "off" and 'mode = "off"' in started[0]["sandbox_reason"]
    assert agents[0]["sandbox"].startswith("off: [sandbox] mode")
    assert "[UNCONFINED: [sandbox] mode" in cli.ok("session", "status", session["id"])
    doctor = {c["name"]: c for c in json.loads(cli.run("doctor", "--json").stdout)}
    assert doctor["sandbox"]["status"] == "warn" and 'mode = "off"' in doctor["sandbox"]["detail"]
    listed = {r["name"]: r for r in cli.json("agents", "list")}
    assert listed["coder"]["sandbox"].startswith("OFF: [sandbox] mode")
