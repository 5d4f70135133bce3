"""The workflow tools through the SDK's in-process Client, on every backend: sessions started with a workflow,
its approval step in session_status, project_sessions_ready and project_decide, checklists, hand edits of the
stack, the catalogue queries, and who may edit which stack.

The server's App carries a real WorkflowEngine and AgentService (tests/workflow_support.py `rig`); only the
agent processes are scripted."""

from __future__ import annotations

from taskgate.domain.access import Principal
from tests.builders import seed
from tests.mcp.conftest import app_of, connect
from tests.workflow_support import APPROVALS, Rig, rig, run_until_idle

ALICE = Principal.operator("alice")

FEATURE = """
id: feature-small
description: one agent builds a small feature
steps:
  - id: build
    type: agent
    agent: ok
    prompt: build {{task.title}}
"""
SMOKE = """
id: smoke
description: run the smoke tests
steps:
  - id: run
    type: agent
    agent: ok
    prompt: smoke
"""
RELEASE = """
id: release
description: Release checks
items:
  - {id: tests, text: Tests pass}
  - {id: notes, text: Release notes written, required: false}
"""
FILES = {
    "development/approvals.yaml": APPROVALS,
    "development/feature-small.yaml": FEATURE,
    "testing/smoke.yaml": SMOKE,
    "checklists/release.yaml": RELEASE,
}


def workflow_rig(services, tmp_path) -> Rig:
    return rig(services, tmp_path, FILES)


def app_with(services, r: Rig):
    return app_of(services, workflows=r.engine, agents=r.agents)


async def test_a_session_started_with_a_workflow_waits_at_its_approval_and_a_decision_moves_it_on(
    services, git_repo, tmp_path
):
    r = workflow_rig(services, tmp_path)
    seeded = await seed(services, git_repo, tasks=1)
    async with connect(services, ALICE, app=app_with(services, r)) as tools:
        started = await tools.ok("project_session_start", task_id=seeded.tasks[0].id, workflow="approvals")
        assert started["state"] == "planning" and started["workflow"]["depth"] == 1
        assert started["workflow"]["breadcrumb"] == "approvals" and "workflow approvals" in started["summary"]
        sid = started["id"]

        executing = await tools.ok("session_execute", session_id=sid)
        assert executing["state"] == "executing" and executing["agents"] == []  # the workflow launches them
        await run_until_idle(r, sid)
        status = await tools.ok("session_status", session_id=sid[:8])
        stack = status["workflow"]
        assert stack["breadcrumb"] == "approvals › approve-plan" and stack["depth"] == 1
        assert stack["waiting"]["kind"] == "approval" and stack["waiting"]["step_id"] == "approve-plan"
        assert stack["waiting"]["message"] == "Read the plan and approve it."
        assert stack["frames"][0]["name"] == "approvals" and stack["frames"][0]["step"] == "approve-plan"
        assert "waits for approval of step 'approve-plan'" in status["summary"]

        ready = await tools.ok("project_sessions_ready")
        [item] = ready["sessions"]
        assert item["id"] == sid and item["approval_step"] == "approve-plan"
        assert item["message"] == "Read the plan and approve it." and item["would_approve"] is None
        assert "approval step 'approve-plan': Read the plan and approve it." in item["summary"]

        shown = item["version"]
        decide = {"session_id": sid, "decision": "approve", "reason": "good plan", "expected_version": shown}
        decided = await tools.ok("project_decide", **decide)
        assert decided["decision"] == "approve" and decided["state"] == "executing"
        await run_until_idle(r, sid)
        done = await tools.ok("session_status", session_id=sid)
        assert done["state"] == "verifying" and done["workflow"] is None
        resent = await tools.ok("project_decide", **decide)  # after the workflow moved on to verifying
        assert resent["replayed"] is True and resent["state"] == "verifying"
    runs = [(x.step_id, x.status.value) for x in await r.engine.step_runs(sid)]
    assert runs == [("plan", "succeeded"), ("approve-plan", "approved"), ("build", "succeeded")]


async def test_an_unknown_workflow_is_refused_before_anything_is_written(services, git_repo, tmp_path):
    r = workflow_rig(services, tmp_path)
    seeded = await seed(services, git_repo, tasks=1)
    before = await services.snapshot()
    async with connect(services, ALICE, app=app_with(services, r)) as tools:
        out = await tools.refused("project_session_start", task_id=seeded.tasks[0].id, workflow="nope")
    assert "WorkflowNotFound" in out and "known: approvals, feature-small, smoke" in out
    assert "Nothing was changed" in out
    async with connect(services, ALICE) as no_runtime:  # a server without the workflow runtime
        out = await no_runtime.refused("project_session_start", task_id=seeded.tasks[0].id, workflow="approvals")
        assert "runs no workflow runtime" in out
        assert "runs no workflow runtime" in await no_runtime.refused("query_workflows")
    assert await services.snapshot() == before


async def test_a_checklist_pushed_onto_the_stack_is_ticked_and_broken_out_of(services, git_repo, tmp_path):
    r = workflow_rig(services, tmp_path)
    seeded = await seed(services, git_repo, tasks=1)
    async with connect(services, ALICE, app=app_with(services, r)) as tools:
        sid = (await tools.ok("project_session_start", task_id=seeded.tasks[0].id, workflow="approvals"))["id"]
        refusal = await tools.refused("workflow_break", session_id=sid)
        assert "workflow_break leaves a nested frame" in refusal and "depth 1" in refusal

        pushed = await tools.ok("add_checklist_to_session", session_id=sid, checklist_name="release")
        assert pushed["depth"] == 2 and pushed["breadcrumb"].startswith("approvals")
        waiting = pushed["waiting"]
        assert waiting["kind"] == "checklist" and waiting["missing"] == ["tests"]
        assert [i["id"] for i in waiting["items"]] == ["tests", "notes"]
        assert "tick tests (checklist_check)" in pushed["summary"]
        assert "ChecklistNotFound" in await tools.refused(
            "add_checklist_to_session", session_id=sid, checklist_name="nope"
        )

        before = await services.snapshot()
        refusal = await tools.refused("checklist_check", session_id=sid, item="nope")
        assert "'nope' is not on the list; items: tests, notes" in refusal
        assert "required items first: tests" in await tools.refused("workflow_advance", session_id=sid)
        assert await services.snapshot() == before

        ticked = await tools.ok("checklist_check", session_id=sid, item="tests")
        assert ticked["waiting"]["missing"] == [] and ticked["summary"].startswith("ticked tests; ")
        assert (await tools.ok("checklist_check", session_id=sid, item="tests"))["waiting"]["missing"] == []

        left = await tools.ok("workflow_break", session_id=sid)
        assert left["depth"] == 1 and left["breadcrumb"] == "approvals" and left["waiting"] is None
        status = await tools.ok("session_status", session_id=sid)
        assert status["workflow"]["depth"] == 1


async def test_back_and_restart_run_steps_again_and_advance_refuses_an_approval(services, git_repo, tmp_path):
    r = workflow_rig(services, tmp_path)
    seeded = await seed(services, git_repo, tasks=1)
    async with connect(services, ALICE, app=app_with(services, r)) as tools:
        sid = (await tools.ok("project_session_start", task_id=seeded.tasks[0].id, workflow="approvals"))["id"]
        assert "no previous step" in await tools.refused("workflow_back", session_id=sid)
        await tools.ok("session_execute", session_id=sid)
        await run_until_idle(r, sid)
        refusal = await tools.refused("workflow_advance", session_id=sid)
        assert "'approve-plan' is an approval: answer it with a decision (MCP project_decide" in refusal

        back = await tools.ok("workflow_back", session_id=sid)
        assert back["summary"].startswith("went back; ") and back["frames"][0]["step"] == "plan"
        await run_until_idle(r, sid)
        restarted = await tools.ok("workflow_restart", session_id=sid)
        assert restarted["frames"][0]["step"] is None and restarted["frames"][0]["status"] == "pending"
        await run_until_idle(r, sid)
        status = await tools.ok("session_status", session_id=sid)
        assert status["workflow"]["waiting"]["step_id"] == "approve-plan"
    steps = [(x.step_id, x.status.value) for x in await r.engine.step_runs(sid)]
    assert steps == [
        ("plan", "succeeded"), ("approve-plan", "cancelled"), ("plan", "succeeded"), ("approve-plan", "cancelled"),
        ("plan", "succeeded"), ("approve-plan", "waiting"),
    ]  # fmt: skip


async def test_an_agent_may_push_a_workflow_on_its_own_session_only(services, git_repo, tmp_path):
    r = workflow_rig(services, tmp_path)
    seeded = await seed(services, git_repo, tasks=2)
    app = app_with(services, r)
    async with connect(services, ALICE, app=app) as tools:
        mine = await tools.ok("project_session_start", task_id=seeded.tasks[0].id)
        other = await tools.ok("project_session_start", task_id=seeded.tasks[1].id)
        assert mine["workflow"] is None  # no workflow named and no default configured
    async with connect(services, Principal.agent("tok123", mine["id"]), app=app) as agent:
        before = await services.snapshot()
        for tool, arguments in (
            ("add_workflow_to_session", {"workflow_name": "smoke"}),
            ("add_checklist_to_session", {"checklist_name": "release"}),
            ("workflow_restart", {}),
        ):
            refusal = await agent.refused(tool, session_id=other["id"], **arguments)
            assert "scoped to session" in refusal and other["id"] not in refusal, tool
        assert "agent tokens may not" in await agent.refused("query_workflows")
        assert await services.snapshot() == before

        pushed = await agent.ok("add_workflow_to_session", session_id=mine["id"][:8], workflow_name="smoke")
        assert pushed["session_id"] == mine["id"] and pushed["breadcrumb"] == "smoke"
        assert "pushed workflow smoke" in pushed["summary"] and pushed["version"] == mine["version"] + 1
        refusal = await agent.refused("add_workflow_to_session", session_id=mine["id"], workflow_name="smoke")
        assert "already on session" in refusal
    async with services.uow(write=False) as uow:
        events = [e for e in await uow.events.list() if e["kind"] == "workflow.pushed"]
    assert [(e["payload"]["workflow"], e["payload"]["actor"]) for e in events] == [("smoke", "agent:tok123")]


async def test_query_workflows_filters_by_pattern_and_category_and_lists_checklists(services, git_repo, tmp_path):
    r = workflow_rig(services, tmp_path)
    await seed(services, git_repo, tasks=0)  # alice, registered
    async with connect(services, ALICE, app=app_with(services, r)) as tools:
        every = await tools.ok("query_workflows")
        assert [(w["category"], w["id"]) for w in every["workflows"]] == [
            ("development", "approvals"), ("development", "feature-small"), ("testing", "smoke"),
        ]  # fmt: skip
        approvals = every["workflows"][0]
        assert approvals["steps"] == 3 and approvals["step_ids"] == ["plan", "approve-plan", "build"]
        assert approvals["description"] == "plan, approve, build"

        testing = await tools.ok("query_workflows", category="testing")
        assert [w["id"] for w in testing["workflows"]] == ["smoke"] and "in category testing" in testing["summary"]
        globbed = await tools.ok("query_workflows", pattern="feature-*")
        assert [w["id"] for w in globbed["workflows"]] == ["feature-small"]
        described = await tools.ok("query_workflows", pattern="APPROVE", category="development")
        assert [w["id"] for w in described["workflows"]] == ["approvals"]  # a substring of its description
        assert (await tools.ok("query_workflows", category="ops"))["workflows"] == []

        checklists = await tools.ok("query_checklists", pattern="rel")
        [release] = checklists["checklists"]
        assert release["id"] == "release" and release["description"] == "Release checks"
        assert [(i["id"], i["required"]) for i in release["items"]] == [("tests", True), ("notes", False)]
        assert (await tools.ok("query_checklists", pattern="nothing-*"))["checklists"] == []


async def test_the_stack_tools_refuse_a_session_past_executing(services, git_repo, tmp_path):
    r = workflow_rig(services, tmp_path)
    seeded = await seed(services, git_repo, tasks=1)
    async with connect(services, ALICE, app=app_with(services, r)) as tools:
        sid = (await tools.ok("project_session_start", task_id=seeded.tasks[0].id, workflow="feature-small"))["id"]
        await tools.ok("session_execute", session_id=sid)
        await run_until_idle(r, sid)
        assert (await tools.ok("session_status", session_id=sid))["state"] == "verifying"
        refusal = await tools.refused("add_workflow_to_session", session_id=sid, workflow_name="smoke")
        assert "InvalidTransition" in refusal and "verifying" in refusal


OUTER = """
id: outer
description: runs inner, then reports what it returned
steps:
  - id: sub
    type: workflow
    workflow: inner
  - id: report
    type: agent
    agent: ok
    prompt: "inner said {{steps.sub.summary}} (success {{steps.sub.success}})"
"""
INNER = """
id: inner
description: builds, then waits at a gate
steps:
  - id: build
    type: agent
    agent: ok
    prompt: build it
  - id: gate
    type: approval
    message: inner gate
"""


async def test_workflow_continue_ends_a_nested_workflow_early_and_the_parent_reads_its_result(
    services, git_repo, tmp_path
):
    r = rig(services, tmp_path, {**FILES, "development/outer.yaml": OUTER, "development/inner.yaml": INNER})
    seeded = await seed(services, git_repo, tasks=1)
    async with connect(services, ALICE, app=app_with(services, r)) as tools:
        sid = (await tools.ok("project_session_start", task_id=seeded.tasks[0].id, workflow="outer"))["id"]
        refusal = await tools.refused("workflow_continue", session_id=sid)
        assert "workflow_continue ends a nested frame" in refusal and "depth 1" in refusal
        await tools.ok("session_execute", session_id=sid)
        await run_until_idle(r, sid)
        status = await tools.ok("session_status", session_id=sid)
        assert status["workflow"]["breadcrumb"] == "outer › sub › inner › gate"
        ended = await tools.ok("workflow_continue", session_id=sid)
        assert ended["depth"] == 1 and ended["summary"].startswith("ended the top frame early")
        await run_until_idle(r, sid)
        assert (await tools.ok("session_status", session_id=sid))["state"] == "verifying"
    assert r.runner.prompts("ok")[-1] == "inner said - build: succeeded: build it (success true)"
