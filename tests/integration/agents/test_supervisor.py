"""Agents as real subprocesses in real worktrees: launch, supervise, limits, failures, cancel, relaunch, recovery."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskgate.application.agents.outputs import OutputService
from taskgate.application.agents.supervisor import AgentService, ExecutionOptions
from taskgate.application.operators.decisions import Decide
from taskgate.application.trackers.builtin import AddTask
from taskgate.bootstrap import build_agents
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.entities import AgentStatus
from taskgate.domain.errors import InvalidInput, Unauthenticated
from taskgate.domain.states import SessionState
from taskgate.infrastructure.session_folder import SessionFolderStore
from tests.builders import ACTOR, OPERATOR, fire, seed, start
from tests.conftest import Services

PY = sys.executable
# Writes what it was given (argv, the TASKGATE_* env) to a file in the session folder, commits a file, exits 0.
CODER = """
import json, os, subprocess, sys, time
folder = os.environ["TASKGATE_SESSION_FOLDER"]; os.makedirs(folder, exist_ok=True)
me = os.environ["TASKGATE_AGENT_ID"]
env = {k: v for k, v in os.environ.items() if k.startswith("TASKGATE_")}
json.dump({"argv": sys.argv[1:], "env": env, "cwd": os.getcwd()}, open(os.path.join(folder, me + ".json"), "w"))
open(f"work-{me[:8]}.txt", "w").write("done\\n")
git = ["git", "-c", "user.name=agent", "-c", "user.email=agent@example.invalid"]
for attempt in range(100):  # agents share the worktree: another one may hold git's index lock right now
    if subprocess.run([*git, "add", "--", f"work-{me[:8]}.txt"]).returncode == 0 and subprocess.run(
            [*git, "commit", "-q", "-m", "feat: work", "--", f"work-{me[:8]}.txt"]).returncode == 0:
        break
    time.sleep(0.05)
else:
    sys.exit("could not commit")
print("coded", flush=True)
"""
# Spawns a child that sleeps (in the agent's process group), records both pids, then sleeps itself.
SLEEPER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(os.path.join(os.environ["TASKGATE_SESSION_FOLDER"], "pids-" + os.environ["TASKGATE_AGENT_ID"]), "w").write(
    f"{os.getpid()} {child.pid}")
print("sleeping", flush=True); time.sleep(300)
"""
# Records when it ran (for the concurrency limit), then ends.
SPAN = """
import os, time
start = time.time(); time.sleep(0.4)
open(os.path.join(os.environ["TASKGATE_SESSION_FOLDER"], "span-" + os.environ["TASKGATE_AGENT_ID"]), "w").write(
    f"{start} {time.time()}")
"""
SCRIPTS = {"coder": CODER, "sleeper": SLEEPER, "span": SPAN}


def agent_types(tmp_path: Path, sleeper_timeout_s: float = 1.5, sleeper: str = SLEEPER) -> dict[str, AgentType]:
    """The agent types of these tests; scripts go to files (a template's braces are placeholders)."""
    folder = tmp_path / "scripts"
    folder.mkdir(exist_ok=True)
    for name, source in {**SCRIPTS, "sleeper": sleeper}.items():
        (folder / f"{name}.py").write_text(source)
    return {
        "coder": AgentType("coder", (PY, str(folder / "coder.py"), "{task_title}", "{instructions}", "{prompt}")),
        "failing": AgentType("failing", (PY, "-c", "import sys; print('boom'); sys.exit(3)")),
        "sleeper": AgentType("sleeper", (PY, str(folder / "sleeper.py")), timeout_s=sleeper_timeout_s),
        "span": AgentType("span", (PY, str(folder / "span.py"))),
        "missing": AgentType("missing", ("/nonexistent/agent-binary",)),
    }


def supervisor(services: Services, tmp_path: Path, types=None, **options) -> AgentService:
    from taskgate.infrastructure.system import SystemClock, UuidGenerator

    outputs = OutputService(services.uow, SessionFolderStore(tmp_path / "agent-outputs"), SystemClock())
    return build_agents(
        services.sessions, services.uow, access=services.access, clock=SystemClock(), ids=UuidGenerator(),
        types=types or agent_types(tmp_path), options=ExecutionOptions(heartbeat_interval_s=0.2, **options),
        outputs_root=str(tmp_path / "agent-outputs"), outputs=outputs,
    )  # fmt: skip


async def planning_session(services: Services, git_repo: Path, title: str = "Build the API"):
    seeded = await seed(services, git_repo, tasks=0)
    task = await services.tracker.add_task(AddTask(seeded.project.id, title, plan_id=seeded.plan.id))
    return await start(services, task)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


async def test_agents_run_in_the_worktree_and_their_session_moves_to_verifying(sql_services, git_repo, tmp_path):
    agents = supervisor(sql_services, tmp_path)
    session = await planning_session(sql_services, git_repo, title='"; rm -rf ~ $(id)')
    launched = await agents.execute(session.id, ACTOR, ["coder", "coder"])
    assert launched.session.state == SessionState.EXECUTING and len(launched.agents) == 2
    await agents.wait(session.id)

    done = await sql_services.sessions.get(session.id)
    rows = await agents.agents(session.id)
    assert done.state == SessionState.VERIFYING, [(a.status, a.error, a.output_tail) for a in rows]
    assert {a.status for a in rows} == {AgentStatus.COMPLETED} and {a.exit_code for a in rows} == {0}
    for agent in rows:
        seen = json.loads((tmp_path / "agent-outputs" / session.id / f"{agent.id}.json").read_text())
        assert seen["argv"][:2] == ['"; rm -rf ~ $(id)', ""]  # one harmless argument, no shell
        assert seen["cwd"] == session.worktree_path
        assert seen["env"]["TASKGATE_SESSION_ID"] == session.id and seen["env"]["TASKGATE_TOKEN"].startswith("tg")
        assert "TASKGATE_DATABASE_URL" not in seen["env"]
        with pytest.raises(Unauthenticated):  # the agent ended: its session-scoped token was revoked
            await sql_services.access.authenticate(seen["env"]["TASKGATE_TOKEN"])
        assert agent.output_tail.endswith("coded\n") and Path(agent.output_path).read_text().endswith("coded\n")
        assert (agent.started_at and agent.completed_at and agent.heartbeat_at is None) or agent.heartbeat_at
    manifest = json.loads((tmp_path / "agent-outputs" / session.id / "manifest.json").read_text())
    assert manifest["session"] == session.id and {a["id"] for a in manifest["agents"]} == {a.id for a in rows}
    assert {a["status"] for a in manifest["agents"]} == {"completed"}
    log = subprocess.run(["git", "log", "--format=%s", done.branch_name], cwd=git_repo, capture_output=True, text=True)
    assert log.stdout.splitlines().count("feat: work") == 2
    history = await sql_services.sessions.history(session.id, limit=1)
    assert (history[0].trigger, history[0].actor) == ("work_complete", "system")


async def test_a_failed_agent_fails_the_session_for_the_operator(sql_services, git_repo, tmp_path):
    agents = supervisor(sql_services, tmp_path)
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["coder", "failing"])
    await agents.wait(session.id)
    failed = await sql_services.sessions.get(session.id)
    assert failed.state == SessionState.FAILED and failed.compensation_plan == "manual_review"
    last = (await sql_services.sessions.history(session.id, limit=1))[0]
    assert last.trigger == "fail" and "exited with 3" in last.reason and "failing" in last.reason
    statuses = {a.agent_type: (a.status, a.exit_code) for a in await agents.agents(session.id)}
    assert statuses == {"coder": (AgentStatus.COMPLETED, 0), "failing": (AgentStatus.FAILED, 3)}


async def test_with_on_failure_verify_the_session_goes_to_verifying_with_the_failure_noted(
    sql_services, git_repo, tmp_path
):
    agents = supervisor(sql_services, tmp_path, on_failure="verify")
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["failing", "coder"])
    await agents.wait(session.id)
    verifying = await sql_services.sessions.get(session.id)
    assert verifying.state == SessionState.VERIFYING
    assert "exited with 3" in verifying.state_data["agent_failures"] and "coder" not in verifying.state_data[
        "agent_failures"]  # fmt: skip


async def test_an_agent_whose_program_is_not_installed_is_refused_before_anything_is_written(
    sql_services, git_repo, tmp_path
):
    agents = supervisor(sql_services, tmp_path)
    session = await planning_session(sql_services, git_repo)
    refused = "agent type 'missing' runs '/nonexistent/agent-binary', which is not installed here"
    with pytest.raises(InvalidInput, match=refused):
        await agents.execute(session.id, ACTOR, ["coder", "missing"])
    after = await sql_services.sessions.get(session.id)
    assert (after.state, after.version) == (SessionState.PLANNING, session.version)
    assert await agents.agents(session.id) == []


async def test_a_timeout_kills_the_whole_process_group_children_included(sql_services, git_repo, tmp_path):
    agents = supervisor(sql_services, tmp_path)
    session = await planning_session(sql_services, git_repo)
    [agent] = (await agents.execute(session.id, ACTOR, ["sleeper"])).agents
    started = time.monotonic()
    await asyncio.wait_for(agents.wait(session.id), 30)
    assert time.monotonic() - started < 15
    leader, child = map(int, (tmp_path / "agent-outputs" / session.id / f"pids-{agent.id}").read_text().split())
    assert not alive(leader) and not alive(child)
    [row] = await agents.agents(session.id)
    assert row.status == AgentStatus.FAILED and row.error == "killed at its timeout"
    assert (await sql_services.sessions.get(session.id)).state == SessionState.FAILED


async def test_cancelling_the_session_stops_its_agents_and_their_children(sql_services, git_repo, tmp_path):
    agents = supervisor(sql_services, tmp_path, agent_types(tmp_path, sleeper_timeout_s=600))
    session = await planning_session(sql_services, git_repo)
    [agent] = (await agents.execute(session.id, ACTOR, ["sleeper"])).agents
    pids = tmp_path / "agent-outputs" / session.id / f"pids-{agent.id}"
    for _ in range(200):
        if pids.exists() and pids.read_text():
            break
        await asyncio.sleep(0.05)
    await fire(sql_services, await sql_services.sessions.get(session.id), "cancel")
    await asyncio.wait_for(agents.wait(session.id), 30)
    leader, child = map(int, pids.read_text().split())
    assert not alive(leader) and not alive(child)
    assert [a.status for a in await agents.agents(session.id)] == [AgentStatus.CANCELLED]


async def test_no_more_than_the_per_session_limit_run_at_once_the_rest_wait_queued(sql_services, git_repo, tmp_path):
    agents = supervisor(sql_services, tmp_path, max_per_session=2)
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["span"] * 5)
    await agents.wait(session.id)
    spans = [tuple(map(float, f.read_text().split())) for f in (tmp_path / "agent-outputs" / session.id).glob("span-*")]
    assert len(spans) == 5
    for start_at, _ in spans:  # at any start, at most 2 ran
        assert sum(1 for s, e in spans if s <= start_at < e) <= 2
    assert (await sql_services.sessions.get(session.id)).state == SessionState.VERIFYING


async def test_request_changes_relaunches_the_agents_with_the_instructions(sql_services, git_repo, tmp_path):
    agents = supervisor(sql_services, tmp_path)
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["coder"])
    await agents.wait(session.id)
    await sql_services.decisions.decide(
        Decide(session.id, OPERATOR, "request_changes", reason="tests", instructions="add tests for the edge cases")
    )
    await agents.wait(session.id)
    rows = await agents.agents(session.id)
    assert [a.run for a in rows if a.status == AgentStatus.COMPLETED] and max(a.run for a in rows) == 2
    second = next(a for a in rows if a.run == 2)
    seen = json.loads((tmp_path / "agent-outputs" / session.id / f"{second.id}.json").read_text())
    assert seen["argv"][1] == "add tests for the edge cases"
    # the default prompt says the second run is a revision of work already on the branch, then what was asked
    assert "This is a revision, not a fresh start" in seen["argv"][2]
    assert seen["argv"][2].endswith("The operator's instructions:\nadd tests for the edge cases")
    first = json.loads(
        (tmp_path / "agent-outputs" / session.id / f"{next(a for a in rows if a.run == 1).id}.json").read_text()
    )
    assert "revision" not in first["argv"][2]  # the first run is not told it is one
    assert (await sql_services.sessions.get(session.id)).state == SessionState.VERIFYING


async def test_unknown_agent_types_are_refused_by_name_and_nothing_moves(sql_services, git_repo, tmp_path):
    agents = supervisor(sql_services, tmp_path)
    session = await planning_session(sql_services, git_repo)
    before = await sql_services.snapshot()
    with pytest.raises(InvalidInput, match="unknown agent type 'claude'; configured: coder"):
        await agents.execute(session.id, ACTOR, ["claude"])
    assert await sql_services.snapshot() == before


async def test_after_a_restart_dead_agents_are_failed_and_live_ones_reattached(sql_services, git_repo, tmp_path):
    slow = agent_types(tmp_path, sleeper_timeout_s=600, sleeper="import time; time.sleep(1.5)")
    first = supervisor(sql_services, tmp_path, slow)
    session = await planning_session(sql_services, git_repo)
    [agent] = (await first.execute(session.id, ACTOR, ["sleeper"])).agents
    for _ in range(200):
        rows = await first.agents(session.id)
        if rows[0].pid:
            break
        await asyncio.sleep(0.05)
    for task in list(first._tasks[session.id]):  # the service "dies": its supervising tasks are gone
        task.cancel()
    await asyncio.gather(*first._tasks.get(session.id, ()), return_exceptions=True)

    second = supervisor(sql_services, tmp_path, slow)
    report = await second.recover()
    assert report == [f"agent {agent.id} of session {session.id}: re-attached (pid {rows[0].pid})"]
    await asyncio.wait_for(second.wait(session.id), 30)
    [row] = await second.agents(session.id)
    assert (row.status, row.exit_code) == (AgentStatus.COMPLETED, 0)  # learned from agent_exec's exit file
    assert (await sql_services.sessions.get(session.id)).state == SessionState.VERIFYING

    third = supervisor(sql_services, tmp_path)  # nothing left to recover
    assert await third.recover() == []


async def test_an_agent_that_ended_while_no_service_watched_is_recorded_from_its_exit_file(
    sql_services, git_repo, tmp_path
):
    quick = agent_types(tmp_path, sleeper_timeout_s=600, sleeper="import time; time.sleep(0.3)")
    first = supervisor(sql_services, tmp_path, quick)
    session = await planning_session(sql_services, git_repo)
    [agent] = (await first.execute(session.id, ACTOR, ["sleeper"])).agents
    await first.started(session.id)
    for task in list(first._tasks[session.id]):  # the service dies right after starting it
        task.cancel()
    await asyncio.gather(*first._tasks.get(session.id, ()), return_exceptions=True)
    second = supervisor(sql_services, tmp_path, quick)
    [row] = await first.agents(session.id)
    for _ in range(200):  # the agent finishes on its own meanwhile (its wrapper writes the file, then exits)
        if Path(f"{row.output_path}.exit").exists() and not second._runner.alive(row.pid):
            break
        await asyncio.sleep(0.05)

    report = await second.recover()

    assert report == [f"agent {agent.id} of session {session.id}: ended meanwhile (exited with 0)"]
    [row] = await first.agents(session.id)
    assert (row.status, row.exit_code) == (AgentStatus.COMPLETED, 0)
    assert (await sql_services.sessions.get(session.id)).state == SessionState.VERIFYING


async def test_recovery_touches_only_its_own_nodes_agents(sql_services, git_repo, tmp_path):
    """Two machines on one database: node b restarting must not mark node a's healthy agent failed because the
    pid is not alive on b; when node a restarts, it re-attaches its own agent, also once a survivor marked it
    lost."""
    slow = agent_types(tmp_path, sleeper_timeout_s=600, sleeper="import time; time.sleep(1.5)")
    node_a = supervisor(sql_services, tmp_path, slow, node_id="host-a-1111")
    session = await planning_session(sql_services, git_repo)
    [agent] = (await node_a.execute(session.id, ACTOR, ["sleeper"])).agents
    for _ in range(200):
        rows = await node_a.agents(session.id)
        if rows[0].pid:
            break
        await asyncio.sleep(0.05)
    assert rows[0].node_id == "host-a-1111"
    for task in list(node_a._tasks[session.id]):  # node a's supervisor "dies"; its agent runs on
        task.cancel()
    await asyncio.gather(*node_a._tasks.get(session.id, ()), return_exceptions=True)

    node_b = supervisor(sql_services, tmp_path, slow, node_id="host-b-2222")
    node_b._runner.alive = lambda pid: False  # on machine b no such process exists
    assert await node_b.recover() == [f"agent {agent.id} of session {session.id}: left to node host-a-1111"]
    [row] = await node_b.agents(session.id)
    assert row.status == AgentStatus.RUNNING and row.error is None  # untouched
    async with sql_services.uow(write=True) as uow:  # a survivor found node a's lease lapsed (NodeService.reap)
        await uow.agents.set_status(agent.id, AgentStatus.LOST, row.started_at)
        await uow.commit()
    assert await node_b.recover() == []  # lost, and node a's: nothing of b's to settle

    restarted_a = supervisor(sql_services, tmp_path, slow, node_id="host-a-1111")
    report = await restarted_a.recover()
    assert report == [f"agent {agent.id} of session {session.id}: re-attached (pid {rows[0].pid}) (it was lost)"]
    [row] = await restarted_a.agents(session.id)
    assert row.status == AgentStatus.RUNNING and row.completed_at is None  # found again, supervised here
    await asyncio.wait_for(restarted_a.wait(session.id), 30)
    [row] = await restarted_a.agents(session.id)
    assert row.status == AgentStatus.COMPLETED
