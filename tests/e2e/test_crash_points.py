"""Every named crash point, on a real `taskgate serve --http`, on SQLite and on PostgreSQL.

For each point of `taskgate.application.sessions.crashpoints.POINTS` the server is started with `TASKGATE_CRASH_AT`
naming it and asked (over MCP, as an operator would) to do the operation that passes through it: start a task,
execute it, request changes, reject with auto_revert, merge. The server kills itself with SIGKILL at that step
boundary. It is then started again, plainly, on the same data, and the session must reach the state the call
would have reached without the crash: its log consistent and replayable, every row acknowledged before the crash
still there, git in the state the finished operation leaves (the work committed once on main after a merge; no
worktree or branch left after a clean-up), and the restart's recovery naming the session.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from taskgate.application.sessions.crashpoints import ENV, POINTS
from tests.conftest import pg_admin, pg_database_url, worker_name
from tests.e2e.test_crash_recovery import (
    Service,
    abandon,
    assert_state_is_the_logs,
    connect,
    in_flight,
    log_of,
    wait_for_session,
)
from tests.e2e.test_mcp_transports import ok

pytestmark = pytest.mark.slow

# An agent that always has something to commit: each run appends a line (with the operator's instructions, if
# any) to work/<task>.md and commits it, "fix: address review" when it was given instructions.
APPENDER = """\
import subprocess, sys
from pathlib import Path
task_id, instructions = sys.argv[1], sys.argv[2]
Path("work").mkdir(exist_ok=True)
with Path("work", f"{task_id}.md").open("a") as out:
    out.write(f"- {instructions or 'first pass'}\\n")
identity = ["-c", "user.name=appender", "-c", "user.email=appender@taskgate.invalid"]
subprocess.run(["git", *identity, "add", "work"], check=True)
subject = "fix: address review" if instructions else f"feat: {task_id}"
subprocess.run(["git", *identity, "commit", "-q", "-m", subject], check=True)
"""


@dataclass(frozen=True)
class Case:
    """A crash point, what must be true before the call that reaches it, and where the session must end."""

    point: str
    before: str  # "" (no session yet), planning, verifying, awaiting_merge, failed
    call: str  # start | execute | request_changes | retry | reject | merge
    expected: str
    base_moved: bool = False  # someone committed to main after the approval: the merge must rebase first

    @property
    def name(self) -> str:
        return f"{self.point}-after-rebase" if self.base_moved else self.point


CASES = [
    *(Case(p, "", "start", "planning") for p in ("start.created", "start.initializing", "start.worktree",
                                                  "start.ready")),
    *(Case(p, "planning", "execute", "verifying") for p in ("execute.plan_complete", "execute.queued",
                                                             "agents.ended")),
    Case("decide.request_changes", "verifying", "request_changes", "verifying"),
    Case("retry.recorded", "failed", "retry", "verifying"),
    *(Case(p, "verifying", "reject", "completed") for p in ("decide.reject", "compensate.reset",
                                                             "compensate.rolled_back")),
    *(Case(p, "awaiting_merge", "merge", "completed") for p in ("merge.requested", "merge.git_done",
                                                                 "merge.merged", "cleanup.discarded")),
    # git rebased the branch and moved main, then the crash: the resumed merge meets a head that is not the
    # approved one, but is on main already (issue 36: it was refused as "changed after it was approved")
    Case("merge.git_done", "awaiting_merge", "merge", "completed", base_moved=True),
]  # fmt: skip


def test_every_named_crash_point_has_a_case():
    assert sorted({c.point for c in CASES}) == sorted(POINTS)


class CrashService(Service):
    """The crash tests' deployment, plus the appender agent, a database URL, and starts with a crash armed."""

    def __init__(self, root: Path, database_url: str | None) -> None:
        super().__init__(root)
        script = root / "appender.py"
        script.write_text(APPENDER)
        config = root / "config" / "taskgate.toml"
        command = json.dumps([sys.executable, str(script), "{task_id}", "{instructions}"])
        config.write_text(config.read_text() + f"\n[agents.appender]\ncommand = {command}\n")
        if database_url:
            self.env["TASKGATE_DATABASE_URL"] = database_url

    def start_armed(self, point: str) -> None:
        """Start the server with the crash point armed; it dies there (SIGKILL) when a call reaches it."""
        plain = self.env
        self.env = {**plain, ENV: point}
        try:
            self.start()
        finally:
            self.env = plain

    async def died(self) -> None:
        """Until the armed server killed itself (bounded)."""
        assert self.process is not None
        deadline = time.monotonic() + 60
        while self.process.poll() is None:
            assert time.monotonic() < deadline, f"the server never reached its crash point: {self.log()}"
            await asyncio.sleep(0.05)
        assert self.process.returncode == -9, f"the server exited with {self.process.returncode}: {self.log()}"
        self.process = None


def _pg_database() -> Iterator[str]:
    """A database of its own on the PostgreSQL server (the suite's other tests truncate theirs)."""
    name = f"taskgate_crash_{worker_name()}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    pg_admin(f'CREATE DATABASE "{name}"')
    try:
        yield pg_database_url(name)
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashService]:
    """One deployment per backend, seeded with a task per case (DEMO-1 …), shared by that backend's cases."""
    databases = _pg_database() if request.param == "postgresql" else iter([None])
    url = next(databases)
    svc = CrashService(tmp_path_factory.mktemp(f"crash-{request.param}"), url)
    svc.seed(*(f"Task {i}" for i in range(1, len(CASES) + 1)))
    try:
        yield svc
    finally:
        svc.unpause()
        svc.stop()
        if url is None:  # agent pids are read from the SQLite file; on PostgreSQL every agent here exits by itself
            svc.kill_agents()
        with pytest.raises(StopIteration):
            next(databases)


async def _prepare(svc: CrashService, task: str, before: str) -> str | None:
    """Bring the task's session to `before` on a plain server; its id."""
    if not before:
        return None
    async with connect(svc) as client:
        sid = (await ok(client, "project_session_start", task_id=task))["id"]
        if before == "planning":
            return sid
        await ok(client, "session_execute", session_id=sid, agents=["appender"])
        await wait_for_session(client, sid, "reach verifying", lambda s: s["state"] == "verifying")
        if before == "awaiting_merge":
            approved = await ok(client, "project_decide", session_id=sid, decision="approve", reason="fine")
            assert approved["state"] == "awaiting_merge", approved
        if before == "failed":  # manual_review: waits for the operator's retry
            rejected = await ok(client, "project_decide", session_id=sid, decision="reject", reason="wrong approach")
            assert rejected["state"] == "failed", rejected
        return sid


def _arguments(case: Case, task: str, sid: str | None) -> tuple[str, dict[str, Any]]:
    if case.call == "start":
        return "project_session_start", {"task_id": task}
    if case.call == "execute":
        return "session_execute", {"session_id": sid, "agents": ["appender"]}
    if case.call == "merge":
        return "project_session_merge", {"session_id": sid}
    if case.call == "retry":
        return "session_fire", {"session_id": sid, "trigger": "retry"}
    decision = {
        "request_changes": {"decision": "request_changes", "instructions": "rename the helper"},
        "reject": {"decision": "reject", "reason": "wrong approach", "compensation": "auto_revert"},
    }
    return "project_decide", {"session_id": sid, **decision[case.call]}  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_a_crash_at_every_step_boundary_is_carried_forward_at_restart(deployment: CrashService, case: Case):
    svc = deployment
    task = f"DEMO-{CASES.index(case) + 1}"
    svc.stop()
    svc.start()
    sid = await _prepare(svc, task, case.before)
    async with connect(svc) as client:
        acknowledged = await log_of(client, sid) if sid else []
    svc.stop()
    if case.base_moved:
        _commit_on_main(svc, f"elsewhere-{task}.md")

    svc.start_armed(case.point)
    tool, arguments = _arguments(case, task, sid)
    call = asyncio.create_task(in_flight(svc, tool, **arguments))
    await svc.died()
    await abandon(call)
    crashed_log = svc.log()

    svc.start()  # recovery runs before the server listens
    recovery = svc.log()
    async with connect(svc) as client:
        if sid is None:  # the start's session: the one session of this task
            sid = await _session_of(client, task)
        status = await wait_for_session(client, sid, f"reach {case.expected}", lambda s: s["state"] == case.expected)
        await assert_state_is_the_logs(client, sid, acknowledged)
        await _assert_git_follows(svc, client, sid, case, status)
    named = [line for line in recovery.splitlines() if "start-up recovery: " in line and sid in line]
    assert named, f"recovery did not name {sid}: {recovery}"
    assert "Traceback" not in recovery and "Traceback" not in crashed_log, recovery


def _commit_on_main(svc: CrashService, name: str) -> None:
    """Someone else's commit on main, in the project checkout (main is checked out there)."""
    (svc.repo / name).write_text("another change\n")
    identity = ("-c", "user.name=colleague", "-c", "user.email=colleague@taskgate.invalid")
    svc.git("add", name)
    svc.git(*identity, "commit", "-q", "-m", f"chore: {name}")


async def _session_of(client: Any, task: str) -> str:
    """The session created for `task` (there is no session listing tool yet: the log's create rows)."""
    found = await ok(client, "audit_query", state="created", limit=10000)
    for session_id in {r["session_id"] for r in found["transitions"]}:
        status = await ok(client, "session_status", session_id=session_id)
        if status["task_id"] == task:
            return session_id
    pytest.fail(f"no session of {task} was created before the crash")


async def _assert_git_follows(svc: CrashService, client: Any, sid: str, case: Case, status: dict[str, Any]) -> None:
    """Git is where the finished operation leaves it."""
    worktree, branch = status["worktree"], status["branch"]
    if case.expected in ("planning", "verifying"):
        assert worktree and Path(worktree).is_dir(), status
        head = svc.git("rev-parse", "--abbrev-ref", "HEAD").strip()
        assert head == "main" and branch in svc.git("branch", "--list", branch), status
    if case.expected == "verifying":
        runs = {a["run"] for a in status["agents"]}
        assert all(a["status"] == "completed" for a in status["agents"]), status["agents"]
        subjects = svc.git("log", "--format=%s", f"main..{branch}").splitlines()
        if case.call in ("request_changes", "retry"):
            assert runs == {1, 2} and subjects.count("fix: address review") == 1, (runs, subjects)
        else:
            assert runs == {1} and subjects == [f"feat: DEMO-{CASES.index(case) + 1}"], (runs, subjects)
    if case.expected == "completed":
        assert not Path(worktree).exists() and not svc.git("branch", "--list", branch).strip(), status
        on_main = svc.git("log", "--format=%s", "main").splitlines().count(f"feat: DEMO-{CASES.index(case) + 1}")
        assert on_main == (1 if case.call == "merge" else 0), f"the work is on main {on_main} time(s)"
        ending = [r["trigger"] for r in (await log_of(client, sid))[-2:]]
        assert ending == ["merge" if case.call == "merge" else "compensate", "cleanup_done"], ending
        if case.base_moved:  # the colleague's commit stays, under the rebased work
            subjects = svc.git("log", "--format=%s", "main").splitlines()
            assert subjects[0] == f"feat: DEMO-{CASES.index(case) + 1}" and subjects[1].startswith("chore:"), subjects
