"""A principal is shown what it may use (issue 18): an agent token lists its own session's tools and sees only the
triggers it may fire; an operator lists the tools its permissions allow. Listing is a courtesy: every hidden tool
is still refused by its own check when called anyway (checked here against the real calls)."""

from __future__ import annotations

from taskgate.application.operators.roster import AddOperator
from taskgate.domain.access import Principal
from taskgate.entrypoints.mcp.annotations import AGENT_TOOLS
from taskgate.entrypoints.mcp.tools import TOOLS
from tests.builders import seed, start
from tests.mcp.conftest import connect


async def listed(tools) -> set[str]:
    return {t.name for t in (await tools.client.list_tools()).tools}


async def test_an_agent_lists_only_its_sessions_tools_and_the_triggers_it_may_fire(services, git_repo) -> None:
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    async with connect(services, Principal.agent("tok1", session.id)) as agent:
        assert await listed(agent) == AGENT_TOOLS
        status = await agent.ok("session_status", session_id=session.id)
        assert status["allowed_triggers"] == ["fail", "plan_complete"]  # not cancel, suspend, timeout, ...
        for hidden in ("policies_list", "session_list", "audit_query", "tracker_status"):  # hidden and refused
            assert "agent tokens may not" in await agent.refused(hidden)
    async with connect(services, Principal.operator("alice")) as alice:
        assert await listed(alice) == {fn.__name__ for fn in TOOLS}  # admin: everything
        status = await alice.ok("session_status", session_id=session.id)
        assert {"cancel", "suspend"} <= set(status["allowed_triggers"])


async def test_an_operator_lists_what_its_permissions_allow(services, git_repo) -> None:
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    await services.operators.add(AddOperator("dev", ["developer"], actor="operator:alice"))
    await services.operators.add(AddOperator("rev", ["reviewer"], actor="operator:alice"))
    async with connect(services, Principal.operator("dev")) as dev:
        shown = await listed(dev)
        assert {"task_add", "session_execute", "session_fire", "save_output"} <= shown
        assert {"project_decide", "project_session_merge", "tracker_dismiss"}.isdisjoint(shown)
        assert "Forbidden" in await dev.refused("project_decide", session_id=session.id, decision="approve")
    async with connect(services, Principal.operator("rev")) as rev:
        shown = await listed(rev)
        assert {"project_decide", "project_session_merge", "session_status"} <= shown
        assert {"task_add", "session_execute", "save_output"}.isdisjoint(shown)
        assert "Forbidden" in await rev.refused("task_add", title="nope")
