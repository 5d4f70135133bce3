"""session_stop: an operator stops a session's agents over MCP; the agents say how they ended. The agents run
through the real AgentService; only their processes are scripted (tests/workflow_support.py). The stop of real
process groups from other processes is in tests/e2e/test_agent_stop.py."""

from __future__ import annotations

from taskgate.application.agents.supervisor import ExecutionOptions
from taskgate.bootstrap import build_agents
from taskgate.domain.access import Principal
from taskgate.domain.agents.kinds import AgentType
from taskgate.infrastructure.system import SystemClock, UuidGenerator
from tests.builders import seed, start
from tests.mcp.conftest import app_of, connect
from tests.workflow_support import ScriptedAgentRunner

ALICE = Principal.operator("alice")


async def test_session_stop_fails_an_executing_session_and_its_agents_end_cancelled_by_sigterm(
    services, git_repo, tmp_path
):
    agents = build_agents(
        services.sessions, services.uow, access=services.access, clock=SystemClock(), ids=UuidGenerator(),
        types={"hold": AgentType("hold", ("hold", "{prompt}"))}, options=ExecutionOptions(heartbeat_interval_s=30),
        outputs_root=str(tmp_path / "out"), runner=ScriptedAgentRunner(),
    )  # fmt: skip
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    async with connect(services, ALICE, app=app_of(services, agents=agents)) as tools:
        await tools.ok("session_execute", session_id=session.id, agents=["hold", "hold"])
        await agents.started(session.id)
        stopped = await tools.ok("session_stop", session_id=session.id[:8], reason="wrong approach")
        again = await tools.ok("session_stop", session_id=session.id[:8])  # nothing left to stop: no error
        history = await tools.ok("session_history", session_id=session.id, limit=1)

    assert stopped["state"] == "failed"
    assert [(a["status"], a["ended_by"]) for a in stopped["agents"]] == [("cancelled", "SIGTERM")] * 2
    assert again["state"] == "failed" and again["agents"] == stopped["agents"]
    [last] = history["transitions"]
    assert (last["trigger"], last["reason"]) == ("fail", "agents stopped by operator:alice: wrong approach")
