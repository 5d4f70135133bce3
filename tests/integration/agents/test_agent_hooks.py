"""The `before_agent` and `after_agent` worktree hooks around real agent processes, on SQLite and PostgreSQL: each runs
at its point in the worktree, a failing before_agent keeps the agent from starting (named in its error), a failing
after_agent is recorded and blocks nothing, and an agent taskgate stopped gets no after_agent."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from taskgate.application.workspaces.hooks import HOOK_EVENT, HOOKS_LOG, HookBook, Hooks, WorktreeHooks
from taskgate.domain.entities import AgentStatus
from taskgate.domain.states import SessionState
from taskgate.infrastructure.session_folder import SessionFolderStore
from taskgate.infrastructure.system import SystemClock
from taskgate.infrastructure.worktree_setup import LocalWorktreeSetup
from tests.builders import ACTOR, fire
from tests.conftest import Services
from tests.integration.agents.test_supervisor import agent_types, alive, planning_session, supervisor


def hooked(services: Services, tmp_path: Path, types=None, **hooks: object):
    agents = supervisor(services, tmp_path, types)
    store = SessionFolderStore(tmp_path / "agent-outputs")
    book = HookBook(Hooks(**hooks))  # type: ignore[arg-type]
    agents.use_hooks(WorktreeHooks(services.uow, SystemClock(), LocalWorktreeSetup(), book, store, services.sessions))
    return agents, store


async def hook_events(services: Services, session_id: str) -> list[dict]:
    async with services.uow(write=False) as uow:
        return [e["payload"] for e in await uow.events.list(session_id) if e["kind"] == HOOK_EVENT]


async def test_before_and_after_agent_run_around_each_agent_in_its_worktree(sql_services, git_repo, tmp_path):
    marks = tmp_path / "marks.txt"
    agents, store = hooked(sql_services, tmp_path,
                           before_agent=f'echo "before $TASKGATE_AGENT_ID $(ls work-* 2>/dev/null | wc -l)" >> {marks}',
                           after_agent=f'echo "after $TASKGATE_AGENT_ID $(ls work-* | wc -l)" >> {marks}')  # fmt: skip
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["coder"])
    await agents.wait(session.id)
    [agent] = await agents.agents(session.id)
    assert (await sql_services.sessions.get(session.id)).state == SessionState.VERIFYING
    assert agent.status == AgentStatus.COMPLETED
    assert marks.read_text().splitlines() == [f"before {agent.id} 0", f"after {agent.id} 1"]
    events = await hook_events(sql_services, session.id)
    assert [(e["hook"], e["agent"], e["exit_code"]) for e in events] == [
        ("before_agent", agent.id, 0),
        ("after_agent", agent.id, 0),
    ]
    log = Path(store.path(session.id), HOOKS_LOG).read_text()
    assert log.index("=== before_agent ") < log.index("=== after_agent ")


async def test_a_failing_before_agent_keeps_the_agent_from_starting_and_names_the_hook(
    sql_services, git_repo, tmp_path
):
    agents, store = hooked(sql_services, tmp_path, before_agent="echo the database is not up; exit 4")
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["coder"])
    await agents.wait(session.id)
    [agent] = await agents.agents(session.id)
    assert agent.status == AgentStatus.FAILED and agent.pid is None
    log = Path(store.path(session.id), HOOKS_LOG)
    assert agent.error.startswith(
        "not started: hook before_agent (`echo the database is not up; exit 4`) exited 4 after"
    )
    assert agent.error.endswith(f": the database is not up; see {log}")
    assert not list(Path(session.worktree_path).glob("work-*"))  # the agent never ran
    assert (await sql_services.sessions.get(session.id)).state == SessionState.FAILED
    assert [e["hook"] for e in await hook_events(sql_services, session.id)] == ["before_agent"]


async def test_a_failing_after_agent_is_recorded_and_blocks_nothing(sql_services, git_repo, tmp_path):
    agents, _ = hooked(sql_services, tmp_path, after_agent="echo lint found 3 problems; exit 5")
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["coder"])
    await agents.wait(session.id)
    [agent] = await agents.agents(session.id)
    assert agent.status == AgentStatus.COMPLETED
    assert (await sql_services.sessions.get(session.id)).state == SessionState.VERIFYING
    [event] = await hook_events(sql_services, session.id)
    assert event["exit_code"] == 5 and event["error"].startswith(
        "hook after_agent (`echo lint found 3 problems; exit 5`)"
    )


async def test_an_agent_taskgate_stopped_gets_no_after_agent(sql_services, git_repo, tmp_path):
    marks = tmp_path / "marks.txt"
    types = agent_types(tmp_path, sleeper_timeout_s=120)
    agents, _ = hooked(sql_services, tmp_path, types, after_agent=f"echo after >> {marks}")
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["sleeper"])
    await agents.started(session.id)
    await asyncio.sleep(0.3)
    await fire(sql_services, session, "cancel")
    await asyncio.wait_for(agents.wait(session.id), 30)
    [agent] = await agents.agents(session.id)
    assert agent.status == AgentStatus.CANCELLED
    assert not marks.exists() and not await hook_events(sql_services, session.id)


async def test_a_cancel_during_after_agent_kills_the_hooks_process_group(sql_services, git_repo, tmp_path):
    pid_file = tmp_path / "hook-child.pid"
    agents, _ = hooked(sql_services, tmp_path, after_agent=f"sleep 300 & echo $! > {pid_file}; wait")
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["coder"])
    for _ in range(400):  # the agent ended by itself and its after_agent hook is running
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.05)
    child = int(pid_file.read_text())
    assert alive(child)
    began = time.monotonic()
    await fire(sql_services, session, "cancel")
    await asyncio.wait_for(agents.wait(session.id), 30)
    assert time.monotonic() - began < 15 and not alive(child)
    assert not Path(session.worktree_path).exists()


async def test_a_cancel_during_before_agent_kills_the_hook_and_the_agent_never_starts(sql_services, git_repo, tmp_path):
    pid_file = tmp_path / "hook-child.pid"
    agents, _ = hooked(sql_services, tmp_path, before_agent=f"sleep 300 & echo $! > {pid_file}; wait")
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["coder"])
    for _ in range(400):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.05)
    child = int(pid_file.read_text())
    began = time.monotonic()
    await fire(sql_services, session, "cancel")
    await asyncio.wait_for(agents.wait(session.id), 30)
    [agent] = await agents.agents(session.id)
    assert time.monotonic() - began < 15 and not alive(child)
    assert agent.status == AgentStatus.CANCELLED and agent.pid is None
    assert agent.error == "not started: stopped while its before_agent hook ran"
