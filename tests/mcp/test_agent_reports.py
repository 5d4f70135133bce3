"""session_status gives each agent's `report` (what its CLI said of its run) and the session's `usage` summed, on
every backend. The agents run
through the real AgentService; only their processes are scripted (tests/workflow_support.py)."""

from __future__ import annotations

import json

from taskgate.application.agents.supervisor import ExecutionOptions
from taskgate.bootstrap import build_agents
from taskgate.domain.access import Principal
from taskgate.domain.agents.kinds import AgentType
from taskgate.infrastructure.system import SystemClock, UuidGenerator
from tests.builders import seed, start
from tests.mcp.conftest import app_of, connect
from tests.workflow_support import ScriptedAgentRunner

ALICE = Principal.operator("alice")
USAGE = {"input_tokens": 900, "output_tokens": 120, "cache_read_input_tokens": 50}
RESULT = {"type": "result", "subtype": "success", "is_error": False, "num_turns": 3, "result": "Added the endpoint.",
          "total_cost_usd": 0.0125, "usage": USAGE}  # fmt: skip


def literal(text: str) -> str:
    """`text` as a command template element (braces are placeholders there)."""
    return text.replace("{", "{{").replace("}", "}}")


async def test_session_status_gives_each_agent_the_report_of_its_cli(services, git_repo, tmp_path):
    types = {
        # the scripted runner's log is the command's arguments: a Claude Code result line, or plain text
        "claude": AgentType("claude", ("ok", literal(json.dumps(RESULT))), output_format="claude-stream-json"),
        "plain": AgentType("plain", ("ok", "hello"), output_format="text"),
    }
    agents = build_agents(
        services.sessions, services.uow, access=services.access, clock=SystemClock(), ids=UuidGenerator(),
        types=types, options=ExecutionOptions(heartbeat_interval_s=30), outputs_root=str(tmp_path / "out"),
        runner=ScriptedAgentRunner(),
    )  # fmt: skip
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    async with connect(services, ALICE, app=app_of(services, agents=agents)) as tools:
        await tools.ok("session_execute", session_id=session.id, agents=["claude", "plain"])
        await agents.wait(session.id)
        status = await tools.ok("session_status", session_id=session.id[:8])

    assert status["state"] == "verifying"
    reports = {a["type"]: a["report"] for a in status["agents"]}
    assert reports == {
        "claude": {"final_message": "Added the endpoint.", "turns": 3, "input_tokens": 900, "output_tokens": 120,
                   "cache_read_tokens": 50, "cost_usd": 0.0125, "is_error": False, "error": None},
        # a plain-text agent reports no usage: its report holds only its result (what it printed)
        "plain": {"final_message": "hello", "turns": 0, "input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
                  "cost_usd": None, "is_error": False, "error": None},
    }  # fmt: skip
    usage = status["usage"]  # the session's usage adds up: in all, per run, per agent
    claude = {"agents": 1, "measured": 1, "turns": 3, "input_tokens": 900, "output_tokens": 120,
              "cache_read_tokens": 50, "cost_usd": 0.0125, "uncosted": 0}  # fmt: skip
    assert usage["total"] == {**claude, "agents": 2} and usage["runs"] == {"1": {**claude, "agents": 2}}
    assert usage["summary"] == "2 agents, 3 turns, 900 in / 120 out tokens (50 cached), $0.0125; 1 reported none"
    by_type = {a["type"]: usage["agents"][a["id"]] for a in status["agents"]}
    assert by_type["claude"] == claude and by_type["plain"]["measured"] == 0
