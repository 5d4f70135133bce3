"""A workflow's `visible_to` through the MCP tools, on every backend: query_workflows leaves out what the caller may
not run; project_session_start and add_workflow_to_session refuse it (naming the list) and write nothing, for an
operator the list leaves out and for an agent whose own token belongs to an agent type the list does not name.
The workflow is an OpenAgents-style JSON file (docs/workflows.md)."""

from __future__ import annotations

from taskgate.domain.access import Principal
from taskgate.domain.entities import Agent, AgentStatus
from tests.builders import seed
from tests.mcp.conftest import app_of, connect
from tests.workflow_support import rig

ALICE, BOB = Principal.operator("alice"), Principal.operator("bob")

RESTRICTED = """{
  "id": "for-ok-agents",
  "description": "Only ok agents and operator alice may run it",
  "visible_to": ["ok", "operator:alice"],
  "max_duration_ms": 600000,
  "steps": [{"id": "build", "type": "agent", "agent": "ok"}]
}"""
OPEN = """{
  "id": "for-everyone",
  "description": "No visible_to: everyone's",
  "max_duration_ms": 600000,
  "steps": [{"id": "build", "type": "agent", "agent": "ok"}]
}"""
FILES = {"openagents/restricted.json": RESTRICTED, "openagents/open.json": OPEN}


async def agent_of_type(services, session_id: str, agent_type: str) -> Principal:
    """The principal of an agent's own token (as `TASKGATE_TOKEN` carries it) for an agent of `agent_type`."""
    agent_id = f"agent-{agent_type}"
    async with services.uow(write=True) as uow:
        await uow.agents.add(Agent(agent_id, session_id, agent_type, [agent_type], AgentStatus.COMPLETED))
        await uow.commit()
    issued = await services.access.create_agent_token(session_id, f"agent {agent_id}", agent_id=agent_id)
    return Principal.agent(issued.token.id, session_id)


async def test_query_workflows_shows_a_restricted_workflow_only_to_whom_it_names(services, git_repo, tmp_path):
    r = rig(services, tmp_path, FILES)
    await seed(services, git_repo, tasks=0)
    await services.tracker.ensure_operator("bob")
    app = app_of(services, workflows=r.engine, agents=r.agents)
    async with connect(services, ALICE, app=app) as tools:
        listed = (await tools.ok("query_workflows", category="openagents"))["workflows"]
        assert [(w["id"], w["visible_to"], w["format"]) for w in listed] == [
            ("for-everyone", [], "openagents"), ("for-ok-agents", ["ok", "operator:alice"], "openagents"),
        ]  # fmt: skip
    async with connect(services, BOB, app=app) as tools:
        listed = await tools.ok("query_workflows", pattern="for-*")
        assert [w["id"] for w in listed["workflows"]] == ["for-everyone"] and listed["summary"].startswith("1 ")


async def test_an_operator_the_list_leaves_out_cannot_start_a_session_with_it(services, git_repo, tmp_path):
    r = rig(services, tmp_path, FILES)
    seeded = await seed(services, git_repo, tasks=2)
    await services.tracker.ensure_operator("bob")
    app = app_of(services, workflows=r.engine, agents=r.agents)
    async with connect(services, BOB, app=app) as tools:
        before = await services.snapshot()
        refusal = await tools.refused("project_session_start", task_id=seeded.tasks[0].id, workflow="for-ok-agents")
        assert "Forbidden: workflow 'for-ok-agents' is visible_to [ok, operator:alice] only, not to operator:bob" in (
            refusal
        )
        assert "Nothing was changed" in refusal and await services.snapshot() == before
        started = await tools.ok("project_session_start", task_id=seeded.tasks[0].id, workflow="for-everyone")
        assert started["workflow"]["breadcrumb"] == "for-everyone"
    async with connect(services, ALICE, app=app) as tools:
        started = await tools.ok("project_session_start", task_id=seeded.tasks[1].id, workflow="for-ok-agents")
        assert started["workflow"]["breadcrumb"] == "for-ok-agents"


async def test_an_agent_pushes_it_only_when_the_list_names_its_type(services, git_repo, tmp_path):
    r = rig(services, tmp_path, FILES)
    seeded = await seed(services, git_repo, tasks=1)
    app = app_of(services, workflows=r.engine, agents=r.agents)
    async with connect(services, ALICE, app=app) as tools:
        sid = (await tools.ok("project_session_start", task_id=seeded.tasks[0].id))["id"]
    holder = await agent_of_type(services, sid, "hold")
    ok_agent = await agent_of_type(services, sid, "ok")

    before = await services.snapshot()
    for principal, who in (
        (holder, "an agent of type hold"),
        (Principal.agent("tok-by-hand", sid), "an agent token that names no agent type"),  # a session's token
    ):
        async with connect(services, principal, app=app) as agent:
            refusal = await agent.refused("add_workflow_to_session", session_id=sid, workflow_name="for-ok-agents")
            assert f"visible_to [ok, operator:alice] only, not to {who}" in refusal, refusal
    assert await services.snapshot() == before

    async with connect(services, ok_agent, app=app) as agent:
        pushed = await agent.ok("add_workflow_to_session", session_id=sid, workflow_name="for-ok-agents")
        assert pushed["breadcrumb"] == "for-ok-agents"
    async with services.uow(write=False) as uow:
        events = [e["payload"] for e in await uow.events.list() if e["kind"] == "workflow.pushed"]
    assert [(e["workflow"], e["actor"]) for e in events] == [("for-ok-agents", ok_agent.actor)]
