"""Stops through the agent service with real processes: from a service that does not supervise the agent (a
second AgentService on the same database stands for another terminal of the node), a pid the system gave to
another process, another node's agent, and a lost agent that still runs under its supervisor."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from dataclasses import replace

from taskgate.domain.entities import AgentStatus
from taskgate.infrastructure import process_groups
from tests.builders import ACTOR
from tests.integration.agents.test_supervisor import agent_types, planning_session, supervisor


async def running(agents, session_id: str):
    for _ in range(400):
        rows = await agents.agents(session_id)
        if rows[0].pid and len(process_groups.members(rows[0].pid)) >= 3:  # wrapper, sleeper, its child
            return rows[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"the agent never ran: {rows}")


async def test_a_service_that_does_not_supervise_the_agent_ends_its_group_and_records_the_signal(
    sql_services, git_repo, tmp_path
):
    launcher = supervisor(sql_services, tmp_path, agent_types(tmp_path, sleeper_timeout_s=600))
    session = await planning_session(sql_services, git_repo)
    await launcher.execute(session.id, ACTOR, ["sleeper"])
    agent = await running(launcher, session.id)
    assert agent.pgid == agent.pid and agent.process_start == process_groups.start_time(agent.pid)

    other = supervisor(sql_services, tmp_path, agent_types(tmp_path, sleeper_timeout_s=600), stop_grace_s=1.0)
    stopped = await other.stop_session(session.id, "operator:bob", "from another terminal")
    assert process_groups.members(agent.pid) == []
    [row] = stopped.agents
    assert (row.status, row.ended_by, stopped.session.state.value) == (AgentStatus.CANCELLED, "SIGTERM", "failed")
    await asyncio.wait_for(launcher.wait(session.id), 30)  # its own supervisor saw it end, and wrote nothing more
    [row] = await launcher.agents(session.id)
    assert (row.status, row.ended_by) == (AgentStatus.CANCELLED, "SIGTERM")


async def test_a_pid_now_of_another_process_is_not_signalled_and_the_stop_says_so(sql_services, git_repo, tmp_path):
    launcher = supervisor(sql_services, tmp_path, agent_types(tmp_path, sleeper_timeout_s=600))
    session = await planning_session(sql_services, git_repo)
    await launcher.execute(session.id, ACTOR, ["sleeper"])
    agent = await running(launcher, session.id)
    for task in list(launcher._tasks[session.id]):  # its supervisor "dies"; the agent stays recorded running
        task.cancel()
    await asyncio.gather(*launcher._tasks.get(session.id, ()), return_exceptions=True)
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:  # the record now names the stranger's pid: a pid reused after the agent ended, as far as the stop knows
        async with sql_services.uow(write=True) as uow:
            reused = replace(agent, pid=stranger.pid, pgid=stranger.pid, process_start=agent.process_start)
            await uow.agents.update(reused)
            await uow.commit()
        other = supervisor(sql_services, tmp_path, agent_types(tmp_path, sleeper_timeout_s=600))
        await other.stop(session.id)
        assert stranger.poll() is None  # never signalled
        [row] = await other.agents(session.id)
        assert (row.status, row.ended_by) == (AgentStatus.CANCELLED, None)
        async with sql_services.uow(write=False) as uow:
            events = [e["payload"] for e in await uow.events.list(session.id) if e["kind"] == "agent.stopped"]
        assert [(e["pid"], e["not_ours"], e["signal"]) for e in events] == [(stranger.pid, True, None)]
    finally:
        stranger.kill()
        stranger.wait()
        process_groups.kill_group(agent.pid, signal.SIGKILL)  # the real agent, left behind by the test


async def test_a_lost_agent_whose_supervisor_lives_keeps_running_and_an_ended_one_is_stopped(
    sql_services, git_repo, tmp_path
):
    agents = supervisor(sql_services, tmp_path, agent_types(tmp_path, sleeper_timeout_s=600))
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["sleeper"])
    agent = await running(agents, session.id)
    async with sql_services.uow(write=True) as uow:  # a survivor marked its node down: lost is not ended
        await uow.agents.set_status(agent.id, AgentStatus.LOST, agent.started_at)
        await uow.commit()
    await asyncio.sleep(0.6)  # three heartbeats
    assert len(process_groups.members(agent.pid)) >= 3
    async with sql_services.uow(write=True) as uow:  # another node recorded it cancelled
        await uow.agents.set_status(agent.id, AgentStatus.CANCELLED, agent.started_at)
        await uow.commit()
    await asyncio.wait_for(agents.wait(session.id), 30)  # its next heartbeat found it ended: it stopped it
    assert process_groups.members(agent.pid) == []


async def test_an_agent_killed_at_its_timeout_records_the_signal_that_ended_its_group(sql_services, git_repo, tmp_path):
    agents = supervisor(sql_services, tmp_path, agent_types(tmp_path, sleeper_timeout_s=1.0))
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["sleeper"])
    await asyncio.wait_for(agents.wait(session.id), 30)
    [row] = await agents.agents(session.id)
    assert (row.status, row.error, row.ended_by) == (AgentStatus.FAILED, "killed at its timeout", "SIGTERM")
    assert process_groups.members(row.pid) == []
