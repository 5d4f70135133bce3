"""Every MCP tool through the SDK's in-process Client: the happy path and each refusal, on every backend."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from taskgate.domain.access import Principal
from taskgate.entrypoints.mcp.names import COLON
from taskgate.entrypoints.mcp.server import UNSTRUCTURED
from taskgate.entrypoints.mcp.tools import TOOLS
from tests.conftest import make_git_repo
from tests.mcp.conftest import ToolCaller, connect

ALICE = Principal.operator("alice")


async def seed(tools: ToolCaller, tmp_path, tasks: int = 2) -> dict:
    repo = make_git_repo(tmp_path / "repo")
    project = await tools.ok("project_init", path=str(repo), name="shop")
    plan = await tools.ok("plan_add", name="Phase 1")
    made = [await tools.ok("task_add", title=f"task {i}", plan_id=plan["id"], priority=i % 5) for i in range(tasks)]
    return {"project": project, "plan": plan, "tasks": made}


async def test_project_init_registers_the_repository_and_creates_the_calling_operator(services, tmp_path):
    async with connect(services, ALICE) as operator_tools:
        seeded = await seed(operator_tools, tmp_path)
        assert seeded["project"]["key"] == "SHOP" and "SHOP-1" in seeded["project"]["summary"]
        assert [o.id for o in await services.tracker.list_operators()] == ["alice"]
        refusal = await operator_tools.refused("project_init", path=str(tmp_path / "repo"))
        assert "already registered" in refusal and "Nothing was changed" in refusal
        assert "not inside a git repository" in await operator_tools.refused("project_init", path=str(tmp_path))


async def test_plans_and_tasks_are_created_and_listed(services, tmp_path):
    async with connect(services, ALICE) as operator_tools:
        seeded = await seed(operator_tools, tmp_path, tasks=2)
        blocked = await operator_tools.ok(
            "task_add",
            title="docs",
            plan_id=seeded["plan"]["id"],
            blocked_by=[seeded["tasks"][0]["id"]],
            description="write them",
        )
        assert blocked["blockers"] == ["SHOP-1"] and "blocked by SHOP-1" in blocked["summary"]
        plans = await operator_tools.ok("plan_list", project="shop")
        assert [p["name"] for p in plans["plans"]] == ["Phase 1"]
        listed = await operator_tools.ok("task_list", plan_id=seeded["plan"]["id"])
        assert [t["id"] for t in listed["tasks"]] == ["SHOP-1", "SHOP-2", "SHOP-3"]
        assert (await operator_tools.ok("task_list", status="completed"))["tasks"] == []
        ready = await operator_tools.ok("project_ready_tasks")
        assert [t["id"] for t in ready["tasks"]] == ["SHOP-1", "SHOP-2"]


async def test_a_task_added_to_a_closed_plan_reopens_it_and_says_so(services, tmp_path):
    async with connect(services, ALICE) as operator_tools:
        seeded = await seed(operator_tools, tmp_path, tasks=1)
        plan_id = seeded["plan"]["id"]
        first = (await operator_tools.ok("project_session_start", task_id="SHOP-1", operator_id="alice"))["id"]
        for trigger in ("plan_complete", "work_complete", "approve", "merge"):
            await operator_tools.ok("session_fire", session_id=first, trigger=trigger)
        assert [p["status"] for p in (await operator_tools.ok("plan_list"))["plans"]] == ["closed"]
        assert seeded["tasks"][0]["plan_reopened"] is False

        added = await operator_tools.ok("task_add", title="one more", plan_id=plan_id)
        assert added["plan_reopened"] is True
        assert added["summary"].endswith(f"plan {plan_id} 'Phase 1' was closed and is open again")
        assert [p["status"] for p in (await operator_tools.ok("plan_list"))["plans"]] == ["open"]
        assert [t["id"] for t in (await operator_tools.ok("project_ready_tasks"))["tasks"]] == [added["id"]]
        started = await operator_tools.ok("project_session_start", task_id=added["id"], operator_id="alice")
        assert started["state"] == "planning"


async def test_tracker_refusals_name_the_problem(services, tmp_path):
    async with connect(services, ALICE) as operator_tools:
        await seed(operator_tools, tmp_path)
        assert "plan 99 not found" in await operator_tools.refused("task_add", title="x", plan_id=99)
        assert "task NOPE-1 not found" in await operator_tools.refused("task_add", title="x", blocked_by=["NOPE-1"])
        assert "less than or equal to 4" in await operator_tools.refused("task_add", title="x", priority=9)
        assert "project nowhere not found" in await operator_tools.refused("plan_list", project="nowhere")
        assert "plan name" in await operator_tools.refused("plan_add", name="../../etc")
        assert "status" in await operator_tools.refused("task_list", status="sleeping")


async def test_a_session_runs_from_start_to_completed_through_the_tools(services, tmp_path):
    async with connect(services, ALICE) as operator_tools:
        seeded = await seed(operator_tools, tmp_path)
        session = await operator_tools.ok("project_session_start", task_id="SHOP-1", operator_id="alice")
        assert session["state"] == "planning" and "plan_complete" in session["allowed_triggers"]
        short = session["id"][:8]
        for trigger in ("plan_complete", "work_complete"):
            await operator_tools.ok("session_fire", session_id=short, trigger=trigger, reason="done")
        waiting = await operator_tools.ok("project_sessions_ready")
        assert [s["id"] for s in waiting["sessions"]] == [session["id"]]
        await operator_tools.ok("session_suspend", session_id=short, reason="lunch")
        resumed = await operator_tools.ok("session_resume", session_id=short)
        assert resumed["state"] == "verifying"
        for trigger in ("approve", "merge"):
            fired = await operator_tools.ok("session_fire", session_id=short, trigger=trigger)
        assert fired["state"] == "completed" and fired["actor"] == "operator:alice"
        assert fired["to_state"] == "merged" and fired["then"] == ["cleanup_done: merged → completed"]
        status = await operator_tools.ok("session_status", session_id=session["id"])
        assert status["version"] == 11 and status["allowed_triggers"] == []
        history = await operator_tools.ok("session_history", session_id=short, limit=3)
        assert [t["trigger"] for t in history["transitions"]] == ["approve", "merge", "cleanup_done"]
        assert seeded["tasks"][0]["id"] == "SHOP-1"


async def test_state_at_and_audit_query_answer_from_the_log(services, tmp_path):
    async with connect(services, ALICE) as operator_tools:
        await seed(operator_tools, tmp_path)
        session = await operator_tools.ok("project_session_start", task_id="SHOP-1")
        now = datetime.now(UTC).isoformat()
        assert (await operator_tools.ok("session_state_at", session_id=session["id"], timestamp=now))[
            "state"
        ] == "planning"
        by_system = await operator_tools.ok("audit_query", actor="system")
        assert [t["trigger"] for t in by_system["transitions"]] == ["initialize", "context_discovered"]
        entered = await operator_tools.ok(
            "audit_query", session_id=session["id"][:8], state="planning", outcome="applied"
        )
        assert len(entered["transitions"]) == 1 and entered["transitions"][0]["guard_results"]
        assert "malformed timestamp" in await operator_tools.refused(
            "session_state_at", session_id=session["id"], timestamp="yesterday"
        )
        assert "did not exist" in await operator_tools.refused(
            "session_state_at", session_id=session["id"], timestamp="2000-01-01"
        )
        assert "unknown state" in await operator_tools.refused("audit_query", state="nirvana")
        assert "--since is after --until" in await operator_tools.refused(
            "audit_query", since="2026-02-01", until="2026-01-01"
        )


async def test_session_refusals_say_why_and_change_nothing(services, tmp_path):
    async with connect(services, ALICE) as operator_tools:
        await seed(operator_tools, tmp_path, tasks=5)
        session = await operator_tools.ok("project_session_start", task_id="SHOP-1")
        for task in ("SHOP-2", "SHOP-3"):
            await operator_tools.ok("project_session_start", task_id=task)
        before = await services.snapshot()
        refusals = {
            "trigger 'merge' is not allowed": ("session_fire", {"session_id": session["id"], "trigger": "merge"}),
            "unknown trigger 'explode'": ("session_fire", {"session_id": session["id"], "trigger": "explode"}),
            "is at version 4": (
                "session_fire",
                {"session_id": session["id"], "trigger": "plan_complete", "expected_version": 1},
            ),
            "session ffffffff not found": ("session_status", {"session_id": "ffffffff"}),
            "too short": ("session_history", {"session_id": "ab"}),
            "already has session": ("project_session_start", {"task_id": "SHOP-1"}),
            "task NOPE-1 not found": ("project_session_start", {"task_id": "NOPE-1"}),
            "does not match the caller": ("project_session_start", {"task_id": "SHOP-5", "operator_id": "mallory"}),
            "trigger 'resume' is not allowed": ("session_resume", {"session_id": session["id"]}),
        }
        for expected, (tool, arguments) in refusals.items():
            assert expected in await operator_tools.refused(tool, **arguments), tool
        assert await services.snapshot() == before
        wip = await operator_tools.refused("project_session_start", task_id="SHOP-4")
        assert "wip_limit" in wip and "suggestion" in wip and "stays ready" in wip
        cancelled = await operator_tools.ok("session_cancel", session_id=session["id"], reason="wrong task")
        assert cancelled["state"] == "cancelled"


async def test_an_agent_reaches_only_its_own_session_and_only_its_own_triggers(services, tmp_path):
    async with connect(services, ALICE) as operator_tools:
        await seed(operator_tools, tmp_path, tasks=2)
        mine = await operator_tools.ok("project_session_start", task_id="SHOP-1")
        other = await operator_tools.ok("project_session_start", task_id="SHOP-2")
        async with connect(services, Principal.agent("tok123", mine["id"])) as agent:
            assert (await agent.ok("session_status", session_id=mine["id"][:8]))["state"] == "planning"
            before = await services.snapshot()
            for tool, arguments in (
                ("project_init", {"path": str(tmp_path)}),
                ("task_add", {"title": "sneaky"}),
                ("project_session_start", {"task_id": "SHOP-2"}),
                ("audit_query", {}),
                ("project_ready_tasks", {}),
            ):
                assert "agent tokens may not" in await agent.refused(tool, **arguments), tool
            assert "scoped to session" in await agent.refused("session_status", session_id=other["id"])
            assert "scoped to session" in await agent.refused(
                "session_fire", session_id=other["id"], trigger="plan_complete"
            )
            for trigger in ("cancel", "approve", "merge", "reject"):
                assert "agents may not fire" in await agent.refused(
                    "session_fire", session_id=mine["id"], trigger=trigger
                )
            assert "agents may not fire 'suspend'" in await agent.refused("session_suspend", session_id=mine["id"])
            assert await services.snapshot() == before
            fired = await agent.ok(
                "session_fire", session_id=mine["id"], trigger="plan_complete", reason="plan written"
            )
            assert fired["actor"] == "agent:tok123"
            await agent.ok("session_fire", session_id=mine["id"], trigger="work_complete")
        assert (await operator_tools.ok("session_status", session_id=mine["id"]))["state"] == "verifying"


async def test_a_call_without_any_principal_is_refused(services, tmp_path):
    async with connect(services, None) as anonymous:
        assert "bearer token" in await anonymous.refused("project_ready_tasks")


async def test_tools_have_descriptions_typed_parameters_and_output_schemas(services):
    async with connect(services, ALICE) as operator_tools:
        tools = (await operator_tools.client.list_tools()).tools
        assert sorted(t.name for t in tools) == sorted(fn.__name__ for fn in TOOLS)  # every tool registered
        for tool in tools:
            assert tool.description and len(tool.description) > 20, tool.name
            if tool.name in UNSTRUCTURED:  # its answer is one text block (Claude Code's permission prompt)
                assert tool.output_schema is None, tool.name
            else:
                assert tool.output_schema and "summary" in tool.output_schema["properties"], tool.name
            for name, schema in tool.input_schema.get("properties", {}).items():
                assert "description" in schema, f"{tool.name}.{name}"


async def test_the_colon_setting_registers_the_seeds_names_and_speaks_them_everywhere(services, tmp_path):
    seeded = await seed_services(services, tmp_path)
    async with connect(services, Principal.operator("alice"), tool_names="colon") as tools:
        listed = (await tools.client.list_tools()).tools
        names = {t.name for t in listed}
        seeds = {"project:init", "project:ready_tasks", "project:session_start", "project:sessions_ready",
                 "project:decide", "project:session_merge"}  # fmt: skip
        assert seeds | {"session:status", "audit:query", "ping", "save_output", "query_workflows"} <= names
        assert not {"save:output", "add:workflow_to_session", "query:workflows"} & names
        underscored = re.compile(r"\b(" + "|".join(COLON) + r")\b")
        instructions = tools.client.instructions
        assert "project:session_start" in instructions and not underscored.search(instructions)
        for tool in listed:
            assert not underscored.search(tool.description), tool.name
        refusal = await tools.refused("session:fire", session_id=seeded.id, trigger="approve")
        assert "session:fire" in refusal and "session_fire" not in refusal
        # an agent written for the underscore style still works against a colon-style server
        assert (await tools.ok("session_status", session_id=seeded.id))["id"] == seeded.id


async def test_tracker_changes_record_the_calling_principal_in_the_events_log(services, tmp_path):
    async with connect(services, ALICE) as operator_tools:
        await seed(operator_tools, tmp_path, tasks=1)
    async with services.uow(write=False) as uow:
        events = await uow.events.list()
    recorded = [(e["kind"], e["payload"]["actor"]) for e in events]
    assert recorded == [
        ("project.registered", "operator:alice"),
        ("plan.added", "operator:alice"),
        ("task.added", "operator:alice"),
    ]


async def test_an_agent_cannot_learn_other_session_ids_by_probing_prefixes(services, tmp_path):
    async with connect(services, ALICE) as operator_tools:
        await seed(operator_tools, tmp_path, tasks=2)
        mine = await operator_tools.ok("project_session_start", task_id="SHOP-1")
        other = await operator_tools.ok("project_session_start", task_id="SHOP-2")
    async with connect(services, Principal.agent("tok123", mine["id"])) as agent:
        for probe in (other["id"][:4], other["id"], "0000", "zzzz"):
            refusal = await agent.refused("session_status", session_id=probe)
            assert other["id"] not in refusal and "not found" not in refusal
        fired = await agent.ok("session_fire", session_id=mine["id"][:6], trigger="plan_complete")
        assert fired["seq"] is not None


async def test_nul_characters_huge_ids_and_out_of_range_timestamps_are_refused_by_name(services, tmp_path):
    async with connect(services, ALICE) as tools:
        await seed(tools, tmp_path, tasks=1)
        session = await tools.ok("project_session_start", task_id="SHOP-1")
        before = await services.snapshot()
        assert "parameter 'reason' contains a NUL" in await tools.refused(
            "session_suspend", session_id=session["id"], reason="a\x00b"
        )
        assert "parameter 'blocked_by' contains a NUL" in await tools.refused(
            "task_add", title="x", blocked_by=["SHOP-1\x00"]
        )
        huge = await tools.refused("task_add", title="x", plan_id=2**63)  # out of range: see test_int_ranges.py
        assert "plan_id" in huge and "less than or equal to 2147483647" in huge
        assert "project ² not found" in await tools.refused("plan_list", project="²")
        assert "out of range" in await tools.refused(
            "session_state_at", session_id=session["id"], timestamp="0001-01-01T00:00:00+14:00"
        )
        assert await services.snapshot() == before


async def seed_services(services, tmp_path):
    """A started session of a seeded project (via the services, not the tools)."""
    from tests.builders import seed as seed_project
    from tests.builders import start

    seeded = await seed_project(services, make_git_repo(tmp_path / "colon-repo"), tasks=1)
    return await start(services, seeded.tasks[0])
