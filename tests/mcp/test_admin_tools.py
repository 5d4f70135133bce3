"""operator_list, operator_add, operator_grant and plan_close over MCP (in-process client): the CLI's admin commands
for MCP clients, with the same permission checks (admins only for operators), nothing written when refused."""

from __future__ import annotations

from taskgate.application.operators.roster import AddOperator
from taskgate.domain.access import Principal
from tests.builders import seed, start
from tests.mcp.conftest import connect

ALICE = Principal.operator("alice")


async def test_an_admin_adds_and_grants_operators_and_a_developer_may_not(services, git_repo) -> None:
    await seed(services, git_repo, tasks=1)
    async with connect(services, ALICE) as tools:
        added = await tools.ok("operator_add", operator_id="dev", roles=["developer"], name="Dev")
        assert added["summary"] == "added operator dev (developer): read, write"
        granted = await tools.ok("operator_grant", operator_id="dev", permissions=["approve"])
        assert granted["effective_permissions"] == ["approve", "read", "write"] and granted["permissions"] == [
            "approve"
        ]
        listed = await tools.ok("operator_list")
        assert [o["id"] for o in listed["operators"]] == ["alice", "dev"]
        assert "AlreadyExists" in await tools.refused("operator_add", operator_id="dev")
        assert "nothing to grant" in await tools.refused("operator_grant", operator_id="dev")
        assert "OperatorNotFound" in await tools.refused("operator_grant", operator_id="ghost", roles=["qa"])
    before = await services.snapshot()
    async with connect(services, Principal.operator("dev")) as dev:
        assert "Forbidden" in await dev.refused("operator_add", operator_id="mallory", roles=["admin"])
        assert "Forbidden" in await dev.refused("operator_grant", operator_id="dev", roles=["admin"])
        assert [o["id"] for o in (await dev.ok("operator_list"))["operators"]] == ["alice", "dev"]
    assert await services.snapshot() == before


async def test_a_closed_plan_lists_nothing_ready_refuses_starts_and_a_new_task_reopens_it(services, git_repo) -> None:
    seeded = await seed(services, git_repo, tasks=2)
    running = await start(services, seeded.tasks[0])
    await services.operators.add(AddOperator("rev", ["reviewer"], actor="operator:alice"))
    async with connect(services, Principal.operator("rev")) as rev:
        assert "Forbidden" in await rev.refused("plan_close", plan_id=seeded.plan.id)
    async with connect(services, ALICE) as tools:
        closed = await tools.ok("plan_close", plan_id=seeded.plan.id, reason="out of scope")
        assert closed["status"] == "closed"
        assert (await tools.ok("plan_close", plan_id=seeded.plan.id))["status"] == "closed"  # again: no change
        assert (await tools.ok("project_ready_tasks"))["tasks"] == []
        assert "plan_open" in await tools.refused("project_session_start", task_id=seeded.tasks[1].id)
        assert (await tools.ok("session_status", session_id=running.id))["state"] == "planning"  # goes on
        await tools.ok("task_add", title="one more", plan_id=seeded.plan.id)
        assert (await tools.ok("plan_list"))["plans"][0]["status"] != "closed"
        assert "PlanNotFound" in await tools.refused("plan_close", plan_id=999)
    async with services.uow(write=False) as uow:
        kinds = [e["kind"] for e in await uow.events.list(None, 200)]
    assert "plan.closed" in kinds and "plan.reopened" in kinds
