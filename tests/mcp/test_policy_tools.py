"""policies_list and policies_check over MCP (in-process client), as an operator and as an agent."""

from __future__ import annotations

from taskgate.domain.access import Principal
from tests.builders import seed, start
from tests.mcp.conftest import connect

ALICE = Principal.operator("alice")


async def test_policies_list_shows_every_policy_with_its_configuration(services, git_repo):
    await seed(services, git_repo, tasks=1)
    async with connect(services, ALICE) as tools:
        listed = await tools.ok("policies_list")
    assert listed["project"] == "repo" and listed["test_command"] == []
    wip = next(p for p in listed["policies"] if p["name"] == "wip_limit")
    assert wip == {
        "name": "wip_limit",
        "description": wip["description"],
        "priority": 10,
        "severity": "error",
        "triggers": ["resume", "retry", "start"],
        "enabled": True,
        "settings": {"limit": 3},
    }
    assert "policies enabled in project repo" in listed["summary"]


async def test_policies_check_is_a_dry_run_that_names_the_refusing_policy(services, git_repo):
    seeded = await seed(services, git_repo, tasks=3, blocked_by_first=True)
    session = await start(services, seeded.tasks[0])
    before = await services.snapshot()
    async with connect(services, ALICE) as tools:
        fine = await tools.ok("policies_check", session_id=session.id[:8], trigger="suspend")
        assert fine["allowed"] and fine["policies"] == [] and fine["to_state"] == "suspended"
        refused = await tools.refused("policies_check", session_id=session.id, trigger="merge")
        assert "InvalidTransition" in refused
        assert "InvalidInput" in await tools.refused("policies_check", session_id=session.id, trigger="launch")
    assert await services.snapshot() == before


async def test_an_agent_may_check_its_own_session_only(services, git_repo):
    seeded = await seed(services, git_repo, tasks=2)
    mine, other = await start(services, seeded.tasks[0]), await start(services, seeded.tasks[1])
    async with connect(services, Principal.agent("tok123", mine.id)) as agent:
        out = await agent.ok("policies_check", session_id=mine.id, trigger="plan_complete")
        assert out["session_id"] == mine.id and out["allowed"]
        assert "scoped to session" in await agent.refused("policies_check", session_id=other.id, trigger="suspend")
        assert "agent tokens may not" in await agent.refused("policies_list")
