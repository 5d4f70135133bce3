"""Fencing (docs/nodes.md): once another node holds a session, this node writes nothing about it, whatever the write.

A session created on node-1 runs an agent there; then its holder becomes node-2, as adoption by another node
makes it while node-1 is paused (tests/e2e/test_node_pause.py does that with real processes). Every kind of write
node-1 may still try about that session is then refused in its own transaction: nothing is written (the whole
database is compared), the refusal is logged on node-1, and the agent it was running is stopped at its next
heartbeat. On SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from pathlib import Path

import pytest

from taskgate.application.agents.outputs import SaveOutput
from taskgate.application.sessions.commands import FireTrigger
from taskgate.domain.errors import WrongNode
from taskgate.domain.policies.violations import Violation
from tests.builders import ACTOR
from tests.integration.agents.test_supervisor import agent_types, alive, planning_session, supervisor

pytestmark = pytest.mark.timeout(120)


async def adopted_by_node_2(services, session_id: str) -> None:
    """What adoption on node-2 writes about the holder (the session's node), under the session's row lock."""
    async with services.uow(write=True) as uow:
        session = await uow.sessions.get(session_id, lock=True)
        await uow.sessions.update(replace(session, node_id="node-2"), expected_version=session.version)
        await uow.commit()


async def running_agent_pid(services, agents, session_id: str) -> int:
    deadline = time.monotonic() + 30
    while True:
        [agent] = await agents.agents(session_id)
        if agent.pid and agent.status.value == "running":
            return agent.pid
        assert time.monotonic() < deadline, f"the agent never ran: {agent}"
        await asyncio.sleep(0.05)


def fenced(caplog: pytest.LogCaptureFixture, session_id: str, what: str) -> bool:
    return any(
        r.name == "taskgate.nodes"
        and f"no longer holds session {session_id}" in r.getMessage()
        and what in r.getMessage()
        for r in caplog.records
    )


async def test_a_node_that_no_longer_holds_a_session_writes_nothing_about_it(
    sql_services, git_repo, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING, logger="taskgate.nodes")
    services = sql_services
    services.sessions.on_node("node-1")
    assert services.outputs is not None
    services.outputs.on_node("node-1")
    agents = supervisor(services, tmp_path, agent_types(tmp_path, sleeper_timeout_s=60))
    session = await planning_session(services, git_repo)
    await agents.execute(session.id, ACTOR, ["sleeper"])
    pid = await running_agent_pid(services, agents, session.id)

    await adopted_by_node_2(services, session.id)
    deadline = time.monotonic() + 30
    while alive(pid):  # its next heartbeat is fenced, and stops the agent: the worktree is node-2's now
        assert time.monotonic() < deadline, "the agent of a session node-1 lost was not stopped"
        await asyncio.sleep(0.05)
    await agents.wait(session.id)
    assert fenced(caplog, session.id, "the heartbeat of agent")
    assert fenced(caplog, session.id, "cancelled was not written")  # its end, too
    before = await services.snapshot()

    writes = {
        "a note on the session": lambda: services.sessions.annotate(session.id, {"flag": "x"}),
        "the refusal of 'work_complete'": lambda: services.sessions.log_refusal(
            FireTrigger(session.id, "work_complete", ACTOR), [Violation("merge", "conflict")]
        ),
        "the output report.md": lambda: services.outputs.save_output(SaveOutput(session.id, "report.md", "# r")),
        "the launch of": lambda: agents.launch_step(session.id, [("sleeper", "go")], instructions="", timeout_s=5),
        "the session.resumed event": lambda: services.sessions.resume(session.id),
    }
    for what, write in writes.items():
        with pytest.raises(WrongNode, match=f"session {session.id} is held by node node-2, not this node"):
            await write()
        assert await services.snapshot() == before, f"{what}: something was written"
    assert fenced(caplog, session.id, "the output report.md")
    assert not (tmp_path / "agent-outputs" / session.id / "report.md").exists()
    [agent] = await agents.agents(session.id)
    assert agent.status.value == "running", "node-1 recorded its agent's end for a session it no longer holds"
