"""Failover across nodes (docs/nodes.md): three `taskgate serve --http` processes with distinct node ids on one
database, agents running on two of them. One is SIGKILLed mid-run: the others keep serving, a survivor finds its
lease lapsed within the configured time, marks its agent `lost` and its session waiting for it (each with an
event), and touches nothing else; a request for its session on another node is refused naming the node. When it
restarts it reconciles its own leftovers: the agent (which outlived its supervisor) is re-attached and the session
carries on to verifying. On PostgreSQL (the multi-machine set-up) and on SQLite (one machine, the same promise).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import make_git_repo
from tests.e2e.test_crash_points import _pg_database
from tests.e2e.test_crash_recovery import AGENT, agents_running, seed_demo, wait_for_session
from tests.e2e.test_mcp_transports import TASKGATE, _free_port, _wait_until_listening, ok, stop_server

# A lease of five beats: on a loaded two-core machine (parallel test workers, three servers, agents) a live node's
# beat may come late, and a shorter lease would mark it down (its agents lost) though it is alive.
BEAT_S, LEASE_S, SWEEP_S = 0.5, 2.5, 0.5
# Found down at the first sweep after the lease lapsed: within LEASE_S + SWEEP_S of the last beat, plus the time a
# loaded machine takes to run that sweep (the figures on an idle one are in benchmarks/failover.py).
DETECTION_BOUND_S = LEASE_S + SWEEP_S + 4.0


class Cluster:
    """One repository and database served by three nodes (`serve --http` processes), each with its own node id,
    data dir and port."""

    def __init__(self, root: Path, database_url: str) -> None:
        self.root, self.release = root, root / "release"
        make_git_repo(root / "repo")
        self.release.mkdir()
        script = root / "agent.py"
        script.write_text(AGENT)
        q = json.dumps
        config = root / "taskgate.toml"
        config.write_text(
            f"[policies.wip_limit]\nlimit = 10\n\n"
            f'[execution]\ndefault_agents = ["slow"]\non_agent_failure = "fail"\nheartbeat_interval_s = 1\n\n'
            f"[agents.slow]\ncommand = [{q(sys.executable)}, {q(str(script))}, "
            f'"{{task_id}}", "{{task_title}}", {q(str(self.release))}]\ntimeout_s = 120\n\n'
            f"[node]\nheartbeat_s = {BEAT_S}\nlease_s = {LEASE_S}\n\n[sweeper]\ninterval_s = {SWEEP_S}\n"
            f"\n[sandbox]\nwrite = [{q(str(self.release))}]\n"  # the agents' release folder, outside their worktree
        )
        base = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
        self.base = base | {"TASKGATE_CONFIG": str(config), "TASKGATE_DATABASE_URL": database_url,
                            "TASKGATE_OPERATOR__DEFAULT": "alice", "COLUMNS": "200"}  # fmt: skip
        self.ports = [_free_port() for _ in range(3)]
        self.processes: list[subprocess.Popen[bytes] | None] = [None, None, None]
        self.logs: list[list[Path]] = [[], [], []]
        self.token = ""

    def env(self, n: int) -> dict[str, str]:
        return self.base | {"TASKGATE_DATA_DIR": str(self.root / f"data-{n}"), "TASKGATE_NODE__ID": f"node-{n + 1}",
                            "TASKGATE_MCP__PORT": str(self.ports[n])}  # fmt: skip

    def url(self, n: int) -> str:
        return f"http://127.0.0.1:{self.ports[n]}/mcp"

    def cli(self, *args: str, node: int = 0) -> str:
        done = subprocess.run([TASKGATE, *args], cwd=self.root, env=self.env(node), capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode == 0, f"taskgate {' '.join(args)} failed: {done.stderr}"
        return done.stdout

    def seed(self, *titles: str) -> None:
        self.token = seed_demo(self.cli, titles)

    def start(self, n: int) -> None:
        assert self.processes[n] is None
        log = self.root / f"node-{n + 1}-{len(self.logs[n]) + 1}.log"
        self.logs[n].append(log)
        with log.open("w") as out:
            self.processes[n] = subprocess.Popen(
                [TASKGATE, "serve", "--http", "--host", "127.0.0.1", "--port", str(self.ports[n])], cwd=self.root,
                env=self.env(n), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            )  # fmt: skip
        _wait_until_listening(self.processes[n], self.ports[n], log)

    def kill(self, n: int) -> None:
        """SIGKILL the node's server process only: its agents (own process groups) live on."""
        process = self.processes[n]
        assert process is not None and process.poll() is None, f"node {n + 1} died before the kill: {self.log(n)}"
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=10) == -signal.SIGKILL
        self.processes[n] = None

    def stop(self, n: int) -> None:
        process, self.processes[n] = self.processes[n], None
        if process is not None:
            stop_server(process)

    def log(self, n: int) -> str:
        return self.logs[n][-1].read_text()


@pytest.fixture(params=["postgresql", "sqlite"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    databases = _pg_database() if request.param == "postgresql" else iter([f"sqlite+aiosqlite:///{tmp_path}/shared.db"])
    made = Cluster(tmp_path, next(databases))
    try:
        yield made
    finally:
        for n in range(3):
            made.stop(n)
        for task in ("DEMO-1", "DEMO-2", "DEMO-3"):  # whatever happened, no agent waits on for its release
            (made.release / task).write_text("")
        if request.param == "postgresql":
            with pytest.raises(StopIteration):
                next(databases)


@asynccontextmanager
async def connect(cluster: Cluster, n: int) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {cluster.token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0)) as http,
        Client(streamable_http_client(cluster.url(n), http_client=http), read_timeout_seconds=60) as client,
    ):
        yield client


async def events_of(client: Client, session_id: str | None = None) -> list[dict[str, Any]]:
    return (await ok(client, "events_list", session_id=session_id, limit=10_000))["events"]


async def kinds_of(client: Client, session_id: str | None = None) -> list[str]:
    return [e["kind"] for e in await events_of(client, session_id)]


async def node_row(client: Client, node_id: str) -> dict[str, Any]:
    return next(n for n in (await ok(client, "nodes_list"))["nodes"] if n["id"] == node_id)


async def test_a_killed_node_is_found_down_its_work_marked_and_it_reconciles_its_own_at_restart(cluster: Cluster):
    cluster.seed("Work on node 1", "Work on node 2", "Untouched")
    for n in range(3):
        cluster.start(n)
    async with connect(cluster, 0) as one, connect(cluster, 1) as two:
        sids = []
        for client, task in ((one, "DEMO-1"), (two, "DEMO-2")):
            started = await ok(client, "project_session_start", task_id=task)
            executing = await ok(client, "session_execute", session_id=started["id"])
            assert executing["node"] == started["node"] and [a["type"] for a in executing["agents"]] == ["slow"]
            sids.append(started["id"])
        first = await wait_for_session(one, sids[0], "get a running agent", agents_running)
        second = await wait_for_session(two, sids[1], "get a running agent", agents_running)
    assert (first["node"], second["node"]) == ("node-1", "node-2")
    assert [a["node"] for a in (*first["agents"], *second["agents"])] == ["node-1", "node-2"]
    untouched, theirs = sids
    nodes = json.loads(cluster.cli("nodes", "--json"))["nodes"]
    assert {n["id"]: (n["alive"], n["live_agents"], n["live_sessions"]) for n in nodes} == {
        "node-1": (True, 1, 1), "node-2": (True, 1, 1), "node-3": (True, 0, 0)}  # fmt: skip

    killed_at = time.monotonic()
    cluster.kill(1)
    async with connect(cluster, 2) as three, connect(cluster, 0) as one:
        deadline = killed_at + 30
        while (await node_row(three, "node-2"))["down_at"] is None:
            assert time.monotonic() < deadline, f"node-2 was never found down: {cluster.log(0)} {cluster.log(2)}"
            await asyncio.sleep(0.05)
        detected = time.monotonic() - killed_at
        assert detected <= DETECTION_BOUND_S, f"found down after {detected:.1f} s"

        # its agent lost (its process lives on, unsupervised), its session waiting for it, each with an event
        status = await ok(three, "session_status", session_id=theirs)
        assert status["state"] == "executing" and [a["status"] for a in status["agents"]] == ["lost"]
        assert "session.waiting_for_node" in await kinds_of(three, theirs)
        assert "node.down" in await kinds_of(three)
        # the other nodes' work is not touched: node 1's agent runs on, its session's log is what it was
        mine = await ok(one, "session_status", session_id=untouched)
        assert (mine["state"], mine["version"], agents_running(mine)) == (first["state"], first["version"], True)
        events = await events_of(one, untouched)
        assert "session.waiting_for_node" not in {e["kind"] for e in events}
        assert [e["payload"]["to"] for e in events if e["kind"] == "agent.status"] == ["queued", "running"]
        # a change to node 2's session on node 1 is refused, naming the node and what to do
        refused = await one.call_tool("session_fire", {"session_id": theirs, "trigger": "suspend"})
        text = " ".join(getattr(c, "text", "") for c in refused.content)
        assert refused.is_error and "held by node node-2" in text and "taskgate session adopt" in text, text
        assert (await ok(one, "session_status", session_id=theirs))["version"] == status["version"]

    cluster.start(1)  # it comes back: recovery settles its lost agent, its first beat says it is back
    log = cluster.log(1)
    assert f"of session {theirs}: re-attached (pid" in log and "(it was lost)" in log, log
    assert "left to node node-1" in log, log  # node 1's agent is not node 2's to settle
    async with connect(cluster, 1) as two, connect(cluster, 0) as one:
        back = await node_row(two, "node-2")
        assert back["alive"] and back["down_at"] is None
        assert "session.node_back" in await kinds_of(two, theirs) and "node.back" in await kinds_of(two)
        for task in ("DEMO-1", "DEMO-2"):
            (cluster.release / task).write_text("")  # both agents commit and exit 0
        for client, sid in ((one, untouched), (two, theirs)):
            done = await wait_for_session(client, sid, "reach verifying", lambda s: s["state"] != "executing")
            assert done["state"] == "verifying", done
            assert [(a["status"], a["exit_code"]) for a in done["agents"]] == [("completed", 0)]
    for n in range(3):
        assert "Traceback" not in cluster.log(n), cluster.log(n)
    assert {n["id"]: n["alive"] for n in json.loads(cluster.cli("nodes", "--json"))["nodes"]} == {
        "node-1": True, "node-2": True, "node-3": True}  # fmt: skip


@pytest.mark.parametrize("cluster", ["postgresql"], indirect=True)
async def test_an_operator_adopts_a_dead_nodes_session_over_mcp_once_its_agent_is_gone(cluster: Cluster):
    """Node 2 dies for good with a session executing. Over MCP on node 1, adoption is refused while node 2 is not
    yet marked down, and while its agent (on this same host) still runs; once the agent has ended, node 1 adopts
    the session (the lost agent fails, the run is abandoned), resumes it and starts it again, now held here."""
    cluster.seed("Work on node 2")
    for n in (0, 1):
        cluster.start(n)
    async with connect(cluster, 1) as two:
        started = await ok(two, "project_session_start", task_id="DEMO-1")
        await ok(two, "session_execute", session_id=started["id"])
        status = await wait_for_session(two, started["id"], "get a running agent", agents_running)
    sid = started["id"]
    cluster.kill(1)
    async with connect(cluster, 0) as one:
        first = await one.call_tool("session_adopt", {"session_id": sid})
        text = " ".join(getattr(c, "text", "") for c in first.content)
        assert first.is_error and "node node-2 holding session" in text and "is not down" in text, text
        deadline = time.monotonic() + 30
        while (await node_row(one, "node-2"))["down_at"] is None:
            assert time.monotonic() < deadline, "node-2 was never found down"
            await asyncio.sleep(0.05)
        second = await one.call_tool("session_adopt", {"session_id": sid})
        text = " ".join(getattr(c, "text", "") for c in second.content)
        assert second.is_error and "still run on this host" in text and "Nothing was changed" in text, text

        (cluster.release / "DEMO-1").write_text("")  # the agent commits and exits, with nobody supervising it
        [agent] = status["agents"]
        while True:  # adoption refuses until the process is gone
            adopted = await one.call_tool("session_adopt", {"session_id": sid})
            if not adopted.is_error:
                break
            assert time.monotonic() < deadline + 30, adopted.content
            await asyncio.sleep(0.1)
        out = adopted.structured_content
        assert out is not None and out["from_node"] == "node-2" and out["agents_failed"] == [agent["id"]]
        assert (out["session"]["state"], out["session"]["node"], out["worktree"]) == (
            "abandoned",
            "node-1",
            "reachable",
        )
        resumed = await ok(one, "session_resume", session_id=sid)
        assert resumed["to_state"] == "ready"
        kinds = await kinds_of(one, sid)
        assert "session.adopted" in kinds and "session.waiting_for_node" in kinds
    nodes = {n["id"]: n for n in json.loads(cluster.cli("nodes", "--json"))["nodes"]}
    assert (nodes["node-1"]["live_sessions"], nodes["node-2"]["live_sessions"]) == (1, 0)
    assert nodes["node-2"]["down_at"] is not None and not nodes["node-2"]["alive"]
