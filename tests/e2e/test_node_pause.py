"""A node paused past its lease writes nothing about a session another node adopted meanwhile (docs/nodes.md).

Two real `taskgate serve --http` nodes on one database. Node 2 runs a session's agents; it is paused with SIGSTOP
(as a partition or a frozen machine would), node 1 finds its lease lapsed, and an operator adopts the session on
node 1. Then node 2 is continued, with its writes about that session half-way: the end of an agent that finished
while it was paused, the start of an agent that waited for a slot, the heartbeat of an agent still running (on a
node 2 of another host, as on two machines: adoption on the same host waits for the agent to end). Each of those
writes is fenced: node 2 finds, in the write's own transaction, that it no longer holds the session, writes
nothing (no agent row, no event, no token), says so in its log, and stops an agent of a session it lost.
Issue 36: the agent went from `failed: lost with node …` back to `completed`, with an `agent.status` event.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.test_crash_points import _pg_database
from tests.e2e.test_crash_recovery import agents_running, wait_for_session
from tests.e2e.test_failover import Cluster, connect, events_of, node_row
from tests.e2e.test_mcp_transports import TASKGATE, _wait_until_listening, ok

pytestmark = pytest.mark.slow

OTHER_HOST = "taskgate-other-host"


class PausableCluster(Cluster):
    """Two nodes of the failover cluster, which can be paused and continued, one of them maybe on another host
    (a UTS namespace of its own, so its host name differs, as on a second machine)."""

    def __init__(self, root: Path, database_url: str, *, agents_per_session: int = 1) -> None:
        super().__init__(root, database_url)
        config = Path(self.base["TASKGATE_CONFIG"])
        text = config.read_text().replace(
            "[execution]\n", f"[execution]\nmax_agents_per_session = {agents_per_session}\n"
        )
        config.write_text(text)
        self.other_host: set[int] = set()

    def start(self, n: int) -> None:
        if n not in self.other_host:
            super().start(n)
            return
        log = self.root / f"node-{n + 1}-{len(self.logs[n]) + 1}.log"
        self.logs[n].append(log)
        command = [TASKGATE, "serve", "--http", "--host", "127.0.0.1", "--port", str(self.ports[n])]
        wrapped = ["unshare", "--uts", "sh", "-c", f'hostname {OTHER_HOST} && exec "$@"', "sh", *command]
        with log.open("w") as out:
            self.processes[n] = subprocess.Popen(wrapped, cwd=self.root, env=self.env(n), stdin=subprocess.DEVNULL,
                                                 stdout=out, stderr=out)  # fmt: skip
        _wait_until_listening(self.processes[n], self.ports[n], log)

    def pause(self, n: int) -> None:
        """SIGSTOP node `n`, between two of its transactions. On SQLite a process stopped inside a write
        transaction keeps the database's one write lock, and every other node waits for it (SQLite has no way to
        take a lock back from a live process; several nodes on one SQLite file are one machine's, docs/nodes.md).
        On PostgreSQL one stopped inside a transaction keeps its row locks (a lease's, say), and the other node's
        sweep waits on them: a network partition would end the connection, a SIGSTOP does not.
        What the tests are about is the writes a paused node begins *after* it continues: those are fenced."""
        process = self.processes[n]
        assert process is not None and process.poll() is None
        path = _sqlite_path(self.base["TASKGATE_DATABASE_URL"])
        deadline = time.monotonic() + 30
        while True:
            os.kill(process.pid, signal.SIGSTOP)
            if path is None and _pg_transactions_open(self.base["TASKGATE_DATABASE_URL"]) == 0:
                return
            if path is not None and _write_lock_free(path):
                return
            os.kill(process.pid, signal.SIGCONT)  # stopped inside a write: let it commit, then try again
            assert time.monotonic() < deadline, f"node {n} never left its write transactions"
            time.sleep(0.05)

    def resume(self, n: int) -> None:
        process = self.processes[n]
        assert process is not None
        os.kill(process.pid, signal.SIGCONT)


def _sqlite_path(url: str) -> Path | None:
    return Path(url.split(":///", 1)[1]) if url.startswith("sqlite") else None


def _pg_transactions_open(url: str) -> int:
    """How many other connections to the PostgreSQL database of `url` are inside a transaction (a stopped process's
    would stay so, holding its locks); the other node's come and go."""
    rest = url.split("://", 1)[1]
    server, database = rest.rsplit("/", 1)
    query = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
             "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL")  # fmt: skip
    done = subprocess.run(["psql", f"postgresql://{server}/{database}", "-Atc", query], capture_output=True,
                          text=True, timeout=30, check=True)  # fmt: skip
    return int(done.stdout.strip())


def _write_lock_free(path: Path) -> bool:
    """Whether no process holds the SQLite database's write lock (a write transaction could begin now)."""
    db = sqlite3.connect(path, timeout=0.2, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()


@pytest.fixture(params=["postgresql", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path}/shared.db"
        return
    databases = _pg_database()
    yield next(databases)
    with pytest.raises(StopIteration):
        next(databases)


def _tear_down(cluster: PausableCluster) -> None:
    for n in (0, 1):
        if cluster.processes[n] is not None:
            cluster.resume(n)  # a stopped process cannot be terminated
            cluster.stop(n)
    (cluster.release / "DEMO-1").write_text("")


async def _adopt_once_down(cluster: PausableCluster, sid: str) -> dict[str, Any]:
    """On node 1: wait until node 2 is marked down, then adopt its session (retried while its agents' processes
    still run on this host)."""
    async with connect(cluster, 0) as one:
        deadline = time.monotonic() + 60
        while (await node_row(one, "node-2"))["down_at"] is None:
            assert time.monotonic() < deadline, f"node-2 was never found down: {cluster.log(0)}"
            await asyncio.sleep(0.05)
        while True:
            adopted = await one.call_tool("session_adopt", {"session_id": sid})
            if not adopted.is_error:
                assert adopted.structured_content is not None
                return adopted.structured_content
            text = " ".join(getattr(c, "text", "") for c in adopted.content)
            assert "still run on this host" in text and time.monotonic() < deadline, text
            await asyncio.sleep(0.1)


async def _fenced_in_log(cluster: PausableCluster, n: int, sid: str, what: str) -> str:
    """Until node 2 logs that it fenced `what`, or writes about the session anyway (then the caller's checks of
    what was written say what); bounded."""
    deadline = time.monotonic() + 30
    while True:
        log = cluster.log(n)
        lines = [line for line in log.splitlines() if f"no longer holds session {sid}" in line and what in line]
        if lines:
            return lines[0]
        await _assert_nothing_written_after_adoption(cluster, sid)
        assert time.monotonic() < deadline, f"node 2 never logged a fenced {what!r}: {log}"
        await asyncio.sleep(0.1)


async def _assert_nothing_written_after_adoption(
    cluster: PausableCluster, sid: str, adopted: dict[str, Any] | None = None
) -> None:
    """Every agent is as adoption left it (failed, lost with node 2), and the last event of each agent is the
    adoption's: nothing node 2 wrote about the session after it."""
    async with connect(cluster, 0) as one:
        status = await ok(one, "session_status", session_id=sid)
        events = await events_of(one, sid)
    assert status["node"] == "node-1", status
    for agent in status["agents"]:
        assert agent["status"] == "failed" and "lost with node node-2" in (agent["error"] or ""), agent
        # no heartbeat after the adoption either (written with the row only, so it is compared with the adoption)
        beat = agent["heartbeat_at"]
        assert beat is None or beat <= agent["completed_at"], f"node 2 recorded a heartbeat after the adoption: {agent}"
        theirs = [e["payload"] for e in events if e["kind"] == "agent.status" and e["payload"]["agent"] == agent["id"]]
        assert theirs[-1]["to"] == "failed" and "adopted by node node-1" in theirs[-1]["reason"], theirs
    assert not [e for e in events if e["kind"] == "token.revoked" and e["payload"].get("why") == "agent ended"]
    if adopted is not None:
        assert set(adopted["agents_failed"]) == {a["id"] for a in status["agents"]}


async def test_a_paused_node_records_neither_the_end_of_an_agent_nor_the_start_of_the_next_once_adopted(
    database: str, tmp_path: Path
):
    cluster = PausableCluster(tmp_path, database, agents_per_session=1)
    try:
        cluster.seed("Work on node 2")
        for n in (0, 1):
            cluster.start(n)
        async with connect(cluster, 1) as two:
            started = await ok(two, "project_session_start", task_id="DEMO-1")
            sid = started["id"]
            await ok(two, "session_execute", session_id=sid, agents=["slow", "slow"])  # one runs, one waits its turn
            running = await wait_for_session(
                two, sid, "run one agent", lambda s: sorted(a["status"] for a in s["agents"]) == ["queued", "running"]
            )
        first, waiting = sorted(running["agents"], key=lambda a: a["status"] != "running")

        cluster.pause(1)
        (cluster.release / "DEMO-1").write_text("")  # the running agent commits and exits while node 2 is paused
        adopted = await _adopt_once_down(cluster, sid)
        assert adopted["session"]["state"] == "abandoned", adopted
        cluster.resume(1)

        await _fenced_in_log(cluster, 1, sid, f"agent {first['id']} completed")
        await _fenced_in_log(cluster, 1, sid, f"the start of agent {waiting['id']}")
        await _assert_nothing_written_after_adoption(cluster, sid, adopted)
        assert not Path(waiting["output_path"]).exists(), "the waiting agent was started after the adoption"
        async with connect(cluster, 1) as two:  # node 2 is back and serves, and refuses changes to the session
            assert (await node_row(two, "node-2"))["down_at"] is None
            refused = await two.call_tool("session_fire", {"session_id": sid, "trigger": "cancel"})
            assert refused.is_error and "held by node node-1" in " ".join(c.text for c in refused.content)
    finally:
        _tear_down(cluster)


async def test_a_paused_node_of_another_host_stops_its_agent_at_the_first_fenced_heartbeat(
    database: str, tmp_path: Path
):
    cluster = PausableCluster(tmp_path, database)
    cluster.other_host.add(1)  # node 2's pids are not node 1's: adoption does not wait for its agent to end
    try:
        cluster.seed("Work on node 2")
        for n in (0, 1):
            cluster.start(n)
        async with connect(cluster, 1) as two:
            sid = (await ok(two, "project_session_start", task_id="DEMO-1"))["id"]
            await ok(two, "session_execute", session_id=sid, agents=["slow"])
            running = await wait_for_session(two, sid, "run its agent", agents_running)
        [agent] = running["agents"]
        process = psutil.Process(agent_pid(cluster, agent["id"]))

        cluster.pause(1)
        adopted = await _adopt_once_down(cluster, sid)
        assert adopted["agents_failed"] == [agent["id"]], adopted
        cluster.resume(1)

        await _fenced_in_log(cluster, 1, sid, f"the heartbeat of agent {agent['id']}")
        process.wait(timeout=30)  # stopped: it worked in a worktree node 2 no longer holds
        await _fenced_in_log(cluster, 1, sid, f"agent {agent['id']} cancelled")
        await _assert_nothing_written_after_adoption(cluster, sid, adopted)
    finally:
        _tear_down(cluster)


def agent_pid(cluster: PausableCluster, agent_id: str) -> int:
    """The pid of the agent's process (the crash agent of DEMO-1, waiting for its release file)."""
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if str(cluster.release) in cmdline and "DEMO-1" in cmdline:
            return int(proc.info["pid"])
    pytest.fail(f"no process of agent {agent_id} found")
