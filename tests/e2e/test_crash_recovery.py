"""Crash recovery: `taskgate serve --http` killed with SIGKILL at several points of a session's lifecycle, then
started again on the same data dir.

Every test runs the real server (a subprocess, driven over MCP with an operator token) on a real git repository,
with agents that are real processes leading their own process groups. The crash points are deterministic, with
no sleeps to guess timing:

- the agents wait for a release file, so they are certainly running when the server dies and when it is back;
- `git` on the server's PATH is a small wrapper that, while `ctl/pause` names an operation (`worktree add`,
  `merge --quiet --ff-only`, `worktree remove`), stops just before or just after running the real git and says
  so in `ctl/entered`: the server is killed exactly inside the effect of `initialize`, `merge` or `cleanup_done`.
  (A real SIGKILL of the server, not a session written into the database by hand.)

After every restart the tests check what recovery promises: each session is in the state its transition log ends
in (its last applied row, and `session_state_at` now, which replays the log); every transition and decision
acknowledged before the kill is still logged, unchanged; agents still alive are re-attached and how they ended is
read from their exit file (so is how an agent ended while no server watched); agents whose process was killed are
failed, and so is their session (`on_agent_failure =
"fail"`); an interrupted initialisation is carried on to `ready`; a merge git did but the log did not record is
carried on from its recorded request, once; a logged merge whose clean-up was cut off is cleaned up. An agent's
token dies with the agent, also when it ended while no server ran (tests/e2e/test_crash_points.py kills the
server at every named step boundary). No process is left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client import Client  # not `from mcp import`: ruff's isort would take `mcp` for the tests/mcp package
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import make_git_repo
from tests.e2e.test_mcp_transports import TASKGATE, _free_port, _wait_until_listening, ok, refused

pytestmark = pytest.mark.slow

WAIT_S = 60.0  # every wait below is bounded by this and fails saying what it waited for

AGENT = '''\
"""Crash-test agent: ARGV task_id title release_dir. Waits for release_dir/<task_id> (at most 45 s), then exits
with the number written in it, or (empty file) commits work/<task_id>.md and exits 0. release_dir "-": at once."""
import subprocess
import sys
import time
from pathlib import Path

import os

task_id, title, release_dir = sys.argv[1:4]
if release_dir != "-":  # the test checks that this token dies with the agent
    Path(release_dir, f"{task_id}.token").write_text(os.environ.get("TASKGATE_TOKEN", ""))
print(f"agent of {task_id}: waiting for its release", flush=True)
release = Path(release_dir, task_id)
deadline = time.monotonic() + 45
while release_dir != "-" and not release.exists():
    if time.monotonic() > deadline:
        sys.exit(4)
    time.sleep(0.05)
code = int(release.read_text().strip() or 0) if release_dir != "-" else 0
if code:
    print(f"exiting with {code}", flush=True)
    sys.exit(code)
Path("work").mkdir(exist_ok=True)
Path("work", f"{task_id}.md").write_text(f"# {title}\\n")
identity = ["-c", "user.name=crash agent", "-c", "user.email=agent@taskgate.invalid"]
subprocess.run(["git", *identity, "add", "work"], check=True)
subprocess.run(["git", *identity, "commit", "-q", "-m", f"feat: {title}"], check=True)
print("committed", flush=True)
'''

GIT_WRAPPER = """\
#!/bin/sh
# git for the crash tests: while CTL/pause names this operation, stop before or after it (CTL/mode), touch
# CTL/entered and wait until the pause file is removed. A paused "before" never runs git: the server that asked
# for it is dead by then. Every other call is plain git.
ctl='CTL'
if [ -f "$ctl/pause" ]; then
  case " $* " in
    *" $(cat "$ctl/pause") "*)
      if [ "$(cat "$ctl/mode")" = before ]; then
        : > "$ctl/entered"
        while [ -f "$ctl/pause" ]; do sleep 0.05; done
        exit 128
      fi
      'REAL' "$@"
      status=$?
      : > "$ctl/entered"
      while [ -f "$ctl/pause" ]; do sleep 0.05; done
      exit $status
      ;;
  esac
fi
exec 'REAL' "$@"
"""


def seed_demo(cli: Callable[..., str], titles: Sequence[str]) -> str:
    """Through `cli`: project demo on ./repo, plan 1 with one task per title (DEMO-1, ...); returns an operator
    token for alice."""
    cli("init", "repo", "--name", "demo")
    cli("plan", "add", "Phase 1")
    for title in titles:
        cli("task", "add", title, "--plan", "1")
    return json.loads(cli("token", "create", "--operator", "alice", "--json"))["token"]


class Service:
    """One deployment (repository, config, data dir) whose `taskgate serve --http` is started, crashed and
    restarted; the database is only ever read here (agent pids, to check processes)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.repo = make_git_repo(root / "repo")
        self.ctl, self.release, bin_dir = root / "ctl", root / "release", root / "bin"
        for folder in (self.ctl, self.release, bin_dir, root / "config"):
            folder.mkdir()
        real_git = shutil.which("git")
        assert real_git is not None
        wrapper = bin_dir / "git"
        wrapper.write_text(GIT_WRAPPER.replace("CTL", str(self.ctl)).replace("REAL", real_git))
        wrapper.chmod(0o755)
        script = root / "crash_agent.py"
        script.write_text(AGENT)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        q = json.dumps  # a TOML basic string
        config = root / "config" / "taskgate.toml"
        config.write_text(
            f"[mcp]\nport = {self.port}\n\n[policies.wip_limit]\nlimit = 10\n\n"
            f'[execution]\ndefault_agents = ["slow"]\non_agent_failure = "fail"\nheartbeat_interval_s = 1\n\n'
            f"[agents.slow]\ncommand = [{q(sys.executable)}, {q(str(script))}, "
            f'"{{task_id}}", "{{task_title}}", {q(str(self.release))}]\ntimeout_s = 120\n\n'
            f'[agents.fast]\ncommand = [{q(sys.executable)}, {q(str(script))}, "{{task_id}}", "{{task_title}}", "-"]\n'
            # the agents write their tokens to, and wait for their release in, a folder the sandbox must let them
            f"\n[sandbox]\nwrite = [{q(str(self.release))}]\n"
        )
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")} | {
            "TASKGATE_CONFIG": str(config),
            "TASKGATE_DATA_DIR": str(root / "data"),
            "TASKGATE_OPERATOR__DEFAULT": "alice",
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "COLUMNS": "200",
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []
        self.token = ""

    # -- the CLI and the server ----------------------------------------------------------------------------------

    def cli(self, *args: str) -> str:
        done = subprocess.run([TASKGATE, *args], cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode == 0, f"taskgate {' '.join(args)} failed: {done.stderr}"
        return done.stdout

    def seed(self, *titles: str) -> None:
        self.token = seed_demo(self.cli, titles)

    def start(self) -> None:
        assert self.process is None
        log = self.root / f"server-{len(self.logs) + 1}.log"
        self.logs.append(log)
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [TASKGATE, "serve", "--http"], cwd=self.root, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=out,
            )  # fmt: skip
        _wait_until_listening(self.process, self.port, log)  # after the lifespan: reconcile and recover are done

    def crash(self) -> None:
        """SIGKILL the server process only: agents (own process groups) and git children live on."""
        assert self.process is not None and self.process.poll() is None, "the server died before the crash"
        os.kill(self.process.pid, signal.SIGKILL)
        assert self.process.wait(timeout=10) == -signal.SIGKILL
        self.process = None

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def log(self) -> str:
        return self.logs[-1].read_text()

    # -- the git pause -------------------------------------------------------------------------------------------

    def pause(self, operation: str, mode: str) -> None:
        (self.ctl / "mode").write_text(mode)
        (self.ctl / "pause").write_text(operation)

    async def paused(self) -> None:
        await until(lambda: (self.ctl / "entered").exists(), "git to reach the paused operation")

    def unpause(self) -> None:
        for name in ("pause", "entered"):
            (self.ctl / name).unlink(missing_ok=True)

    # -- the database and the processes --------------------------------------------------------------------------

    def rows(self, sql: str, *params: Any) -> list[sqlite3.Row]:
        with sqlite3.connect(f"file:{self.root / 'data' / 'taskgate.db'}?mode=ro", uri=True, timeout=30) as db:
            db.row_factory = sqlite3.Row
            return db.execute(sql, params).fetchall()

    def agent_pid(self, session_id: str) -> int:
        found = self.rows("select pid from agents where session_id = ? and pid is not null", session_id)
        assert len(found) == 1, f"session {session_id} has {len(found)} started agents"
        return found[0]["pid"]

    def agent_pids(self) -> list[int]:
        if not (self.root / "data" / "taskgate.db").exists():
            return []
        return [r["pid"] for r in self.rows("select pid from agents where pid is not null")]

    def kill_agents(self) -> None:
        for pid in self.agent_pids():
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def git(self, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=self.repo, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = Service(tmp_path)
    try:
        yield svc
    finally:  # whatever happened: no server, no paused git, no agent group left behind
        svc.unpause()
        svc.stop()
        svc.kill_agents()


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphaned agent may wait to be reaped by init)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


async def until(condition: Any, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


def assert_no_agent_left(svc: Service) -> None:
    deadline = time.monotonic() + 10
    while left := [pid for pid in svc.agent_pids() if alive(pid)]:
        assert time.monotonic() < deadline, f"agent processes left behind: {left}"
        time.sleep(0.05)


# -- MCP -----------------------------------------------------------------------------------------------------------


@asynccontextmanager
async def connect(svc: Service) -> AsyncIterator[Client]:
    """An SDK client of the running server, as alice (bearer token)."""
    headers = {"Authorization": f"Bearer {svc.token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0)) as http,
        Client(streamable_http_client(svc.url, http_client=http), read_timeout_seconds=60) as client,
    ):
        yield client


async def token_works(svc: Service, token: str) -> bool:
    """Whether the server takes `token` (an MCP initialize answered 200) or refuses it (403, see docs/mcp.md)."""
    assert token.startswith("tg_"), f"not a token: {token!r}"
    request = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
               "capabilities": {}, "clientInfo": {"name": "crash-test", "version": "1"}}}  # fmt: skip
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(timeout=30) as http:
        answer = await http.post(svc.url, json=request, headers=headers)
    assert answer.status_code in (200, 403), answer.text
    return answer.status_code == 200


async def in_flight(svc: Service, tool: str, **arguments: Any) -> None:
    """A call the server never answers because it is killed meanwhile (run as a task, cancelled after the kill)."""
    with suppress(Exception):
        async with connect(svc) as client:
            await client.call_tool(tool, arguments)


async def abandon(call: asyncio.Task[None]) -> None:
    call.cancel()
    with suppress(BaseException):
        await asyncio.wait_for(call, 10)


async def wait_for_session(client: Client, sid: str, what: str, predicate: Any) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        status = await ok(client, "session_status", session_id=sid)
        if predicate(status):
            return status
        if time.monotonic() > deadline:
            agents = [(a["type"], a["status"], a["exit_code"], a["error"]) for a in status["agents"]]
            pytest.fail(f"session {sid} did not {what} within {WAIT_S:.0f}s: it is {status['state']}, agents {agents}")
        await asyncio.sleep(0.1)


def agents_running(status: dict[str, Any]) -> bool:
    return bool(status["agents"]) and all(a["status"] == "running" for a in status["agents"])


async def log_of(client: Client, sid: str) -> list[dict[str, Any]]:
    """The session's applied transitions, oldest first."""
    rows = (await ok(client, "session_history", session_id=sid, limit=10000))["transitions"]
    return [r for r in rows if r["outcome"] == "applied"]


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["seq"], row["trigger"], row["from_state"], row["to_state"], row["actor"], row["session_version"]


async def assert_state_is_the_logs(client: Client, sid: str, acknowledged: list[dict[str, Any]]) -> dict[str, Any]:
    """The session is where its log says (last applied row; a replay of the log now), and every row read back
    before the crash is still there, unchanged. Returns the session's status."""
    status = await ok(client, "session_status", session_id=sid)
    rows = await log_of(client, sid)
    assert rows, f"session {sid} has no transitions"
    assert (rows[-1]["to_state"], rows[-1]["session_version"]) == (status["state"], status["version"]), (
        f"session {sid} is {status['state']} v{status['version']} but its log ends in {rows[-1]}"
    )
    replayed = await ok(client, "session_state_at", session_id=sid, timestamp=datetime.now(UTC).isoformat())
    assert replayed["state"] == status["state"], f"replaying the log of {sid} gives {replayed['state']}"
    assert [r["session_version"] for r in rows] == list(range(1, len(rows) + 1)), "a gap in the applied log"
    now = {_key(r) for r in rows}
    lost = [_key(r) for r in acknowledged if _key(r) not in now]
    assert not lost, f"transitions acknowledged before the crash are gone: {lost}"
    return status


def commits_on(svc: Service, ref: str, subject: str) -> int:
    return svc.git("log", "--format=%s", ref).splitlines().count(subject)


# -- while agents run ----------------------------------------------------------------------------------------------


async def test_agents_outlive_a_killed_server_and_are_reattached_or_failed_at_restart(service: Service):
    """Four sessions executing, each with a running agent, when the server is SIGKILLed. While it is down one
    agent's process group is killed, and another agent finishes (exit 0, its wrapper writes the exit file). At
    restart the killed one is failed (and its session, for the operator); the finished one is completed from its
    exit file and its session goes on to verifying; the live ones are re-attached by pid: one exits 0 (its commit
    is on the branch, the session goes on to verifying by itself), one exits 3 (a status only the exit file
    knows: the agent is no child of the new server), which fails its session."""
    service.seed("Slow work", "Doomed work", "Failing work", "Finished meanwhile")
    service.start()
    async with connect(service) as client:
        sids = []
        for task in ("DEMO-1", "DEMO-2", "DEMO-3", "DEMO-4"):
            started = await ok(client, "project_session_start", task_id=task)
            executing = await ok(client, "session_execute", session_id=started["id"])
            assert executing["state"] == "executing" and [a["type"] for a in executing["agents"]] == ["slow"]
            sids.append(started["id"])
        for sid in sids:
            await wait_for_session(client, sid, "get a running agent", agents_running)
        acknowledged = {sid: await log_of(client, sid) for sid in sids}
    reattached, killed, failing, finished = sids
    pids = {sid: service.agent_pid(sid) for sid in sids}

    service.crash()
    assert all(alive(pid) for pid in pids.values()), "an agent died with the server"
    os.killpg(pids[killed], signal.SIGKILL)  # its process dies while nobody supervises it
    (service.release / "DEMO-4").write_text("")  # it commits and exits while nobody supervises it
    await until(lambda: not alive(pids[killed]), "the killed agent to die")
    await until(lambda: not alive(pids[finished]), "the released agent to exit")
    service.start()

    log = service.log()
    assert f"re-attached (pid {pids[reattached]})" in log and f"re-attached (pid {pids[failing]})" in log, log
    assert f"of session {killed}: marked failed (process gone)" in log, log
    assert f"of session {finished}: ended meanwhile (exited with 0)" in log, log
    async with connect(service) as client:
        # the dead agent: failed at start-up, and its session with it, for the operator to look at
        lost = await assert_state_is_the_logs(client, killed, acknowledged[killed])
        assert lost["state"] == "failed", lost
        assert [(a["status"], a["error"]) for a in lost["agents"]] == [("failed", "lost at restart")]
        fail = (await log_of(client, killed))[-1]
        assert (fail["trigger"], fail["actor"]) == ("fail", "system") and "lost at restart" in fail["reason"]

        # the one that finished while the server was down: completed from its exit file, the session goes on
        meanwhile = await assert_state_is_the_logs(client, finished, acknowledged[finished])
        assert meanwhile["state"] == "verifying", meanwhile
        assert [(a["status"], a["exit_code"], a["error"]) for a in meanwhile["agents"]] == [("completed", 0, None)]
        assert commits_on(service, meanwhile["branch"], "feat: Finished meanwhile") == 1

        # the live ones: re-attached, still running, their sessions still executing
        for sid in (reattached, failing):
            status = await assert_state_is_the_logs(client, sid, acknowledged[sid])
            assert status["state"] == "executing" and agents_running(status), status
        tokens = {sid: (service.release / f"DEMO-{sids.index(sid) + 1}.token").read_text() for sid in sids}
        # the agents that ended while no server ran lost their tokens at restart; the live ones keep theirs
        assert [await token_works(service, tokens[sid]) for sid in sids] == [True, False, True, False]
        (service.release / "DEMO-1").write_text("")
        (service.release / "DEMO-3").write_text("3")

        done = await wait_for_session(client, reattached, "reach verifying", lambda s: s["state"] != "executing")
        assert done["state"] == "verifying", done
        assert [(a["status"], a["exit_code"], a["error"]) for a in done["agents"]] == [("completed", 0, None)]
        finish = (await log_of(client, reattached))[-1]
        assert (finish["trigger"], finish["actor"], finish["reason"]) == ("work_complete", "system",
                                                                          "all agents completed")  # fmt: skip
        await assert_state_is_the_logs(client, reattached, acknowledged[reattached])
        assert commits_on(service, done["branch"], "feat: Slow work") == 1

        failed = await wait_for_session(client, failing, "end its agent", lambda s: s["state"] != "executing")
        assert failed["state"] == "failed", failed
        assert [(a["status"], a["exit_code"]) for a in failed["agents"]] == [("failed", 3)]
        assert "exited with 3" in (await log_of(client, failing))[-1]["reason"]
        await assert_state_is_the_logs(client, failing, acknowledged[failing])
        assert [await token_works(service, tokens[sid]) for sid in sids] == [False] * 4  # died with their agents
    assert_no_agent_left(service)
    assert "Traceback" not in log


# -- during initialize ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("moment", ["before", "after"])
async def test_a_crash_inside_initialize_is_carried_on_to_the_start_at_restart(service: Service, moment: str):
    """`project_session_start` logs `initialize` (created → initializing), then creates the worktree; the server is
    killed in `git worktree add`, before it ran or after it made the worktree, with `context_discovered` not yet
    fired (the call never returned). At restart reconciliation creates (or reuses) the worktree and fires
    `context_discovered`, then the start the operator asked for (recorded when the session was created): the
    session is planning, as the call would have left it. The operator's resent start is told so."""
    service.seed("Set up")
    service.start()
    service.pause("worktree add", moment)
    async with connect(service) as client:
        call = asyncio.create_task(in_flight(service, "project_session_start", task_id="DEMO-1"))
        await service.paused()
        [session] = service.rows("select id, state, worktree_path from sessions")
        assert session["state"] == "initializing"
        sid, worktree = session["id"], Path(session["worktree_path"])
        acknowledged = await log_of(client, sid)
        assert [r["to_state"] for r in acknowledged] == ["created", "initializing"]
    service.crash()
    await abandon(call)
    service.unpause()
    assert worktree.is_dir() == (moment == "after")

    service.start()  # reconciliation resumes the initialisation before the server listens
    async with connect(service) as client:
        ready = await assert_state_is_the_logs(client, sid, acknowledged)
        assert ready["state"] == "planning" and ready["worktree"] == str(worktree), ready
        resumed = (await log_of(client, sid))[-2:]
        assert [(r["trigger"], r["actor"]) for r in resumed] == [("context_discovered", "system"), ("start", "system")]
        assert resumed[1]["reason"] == "resumed: start requested by operator:alice"
        assert ready["workspace"].get("base_commit") == service.git("rev-parse", "main").strip()
        head = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=worktree, capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        assert head == ready["branch"]

        again = await refused(client, "project_session_start", task_id="DEMO-1")  # the operator sends it again
        assert f"already has session {sid} in state 'planning'" in again, again
        await assert_state_is_the_logs(client, sid, acknowledged)
    assert "Traceback" not in service.log()


# -- during merge --------------------------------------------------------------------------------------------------


async def test_a_crash_during_merge_loses_no_decision_and_merges_exactly_once(service: Service):
    """Three approved sessions. The server is killed (1) inside merge's effect, after git fast-forwarded main but
    before the transition was written; (2) right after a merge call returned; (3) between a logged merge and its
    automatic cleanup_done (in `git worktree remove`). After (1) the restart carries the recorded merge request
    on (git finds the work merged already): completed, the commit on main once, and merging again is refused;
    after (2) it is completed; after (3) the restart fires the clean-up: completed. The approvals taken before
    each crash are still there: deciding again replays them."""
    service.seed("Merge me", "Merge me too", "Merge me last")
    service.start()
    async with connect(service) as client:
        sids, approvals = [], {}
        for task in ("DEMO-1", "DEMO-2", "DEMO-3"):
            started = await ok(client, "project_session_start", task_id=task)
            await ok(client, "session_execute", session_id=started["id"], agents=["fast"])
            sids.append(started["id"])
        for sid in sids:
            await wait_for_session(client, sid, "reach verifying", lambda s: s["state"] != "executing")
            approved = await ok(client, "project_decide", session_id=sid, decision="approve", reason="looks good")
            assert (approved["outcome"], approved["state"], approved["replayed"]) == ("applied", "awaiting_merge",
                                                                                      False)  # fmt: skip
            approvals[sid] = approved
        first, second, third = sids
        branch = (await ok(client, "session_status", session_id=first))["branch"]

        service.pause("merge --ff-only --quiet", "after")
        call = asyncio.create_task(in_flight(service, "project_session_merge", session_id=first))
        await service.paused()
        assert service.git("rev-parse", "main") == service.git("rev-parse", branch)  # git merged: not yet logged
        acknowledged = {sid: await log_of(client, sid) for sid in sids}
    service.crash()
    await abandon(call)
    service.unpause()

    service.start()
    async with connect(service) as client:
        merged = await assert_state_is_the_logs(client, first, acknowledged[first])
        assert merged["state"] == "completed", merged  # the recorded merge request, carried on at restart
        resumed = (await log_of(client, first))[-2:]
        assert [(r["trigger"], r["actor"]) for r in resumed] == [("merge", "system"), ("cleanup_done", "system")]
        assert resumed[0]["reason"].startswith("merge requested by operator:alice"), resumed[0]
        for sid in sids:
            await assert_approval_kept(client, sid, approvals[sid])
        again = await refused(client, "project_session_merge", session_id=first)
        assert "completed" in again, again
        assert commits_on(service, "main", "feat: Merge me") == 1
        await assert_state_is_the_logs(client, first, acknowledged[first])

        done = await ok(client, "project_session_merge", session_id=second)  # acknowledged, then the crash
        assert done["state"] == "completed", done
        acknowledged = {sid: await log_of(client, sid) for sid in sids}
    service.crash()

    service.start()
    async with connect(service) as client:
        for sid in (first, second):
            status = await assert_state_is_the_logs(client, sid, acknowledged[sid])
            assert status["state"] == "completed", status
            assert [r["trigger"] for r in (await log_of(client, sid))[-2:]] == ["merge", "cleanup_done"]
            await assert_approval_kept(client, sid, approvals[sid])
        await assert_state_is_the_logs(client, third, acknowledged[third])

        service.pause("worktree remove", "before")
        call = asyncio.create_task(in_flight(service, "project_session_merge", session_id=third))
        await service.paused()
        acknowledged = {sid: await log_of(client, sid) for sid in sids}
        assert acknowledged[third][-1]["to_state"] == "merged"  # logged; its cleanup_done is not
        worktree = Path((await ok(client, "session_status", session_id=third))["worktree"])
    service.crash()
    await abandon(call)
    service.unpause()

    service.start()
    async with connect(service) as client:
        cleaned = await assert_state_is_the_logs(client, third, acknowledged[third])
        assert cleaned["state"] == "completed" and not worktree.exists(), cleaned  # clean-up carried on
        assert commits_on(service, "main", "feat: Merge me last") == 1
        await assert_approval_kept(client, third, approvals[third])
        for sid in sids:
            await assert_state_is_the_logs(client, sid, acknowledged[sid])
    subjects = ("feat: Merge me", "feat: Merge me too", "feat: Merge me last")
    assert [commits_on(service, "main", s) for s in subjects] == [1, 1, 1]
    assert service.git("branch", "--list", "feature/*").strip() == ""  # every branch cleaned up
    assert_no_agent_left(service)
    assert "Traceback" not in service.log()


async def assert_approval_kept(client: Client, sid: str, approval: dict[str, Any]) -> None:
    """The decision is still recorded: deciding the same again replays it (same time), and the approve it caused
    is in the audit log as alice's."""
    again = await ok(client, "project_decide", session_id=sid, decision="approve", reason="looks good")
    assert (again["replayed"], again["at"], again["version"] >= approval["version"]) == (True, approval["at"], True)
    audit = await ok(client, "audit_query", session_id=sid, actor="operator:alice")
    assert [r["to_state"] for r in audit["transitions"] if r["trigger"] == "approve"] == ["awaiting_merge"]
