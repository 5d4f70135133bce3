"""Every state-changing tool × every role: allowed or refused exactly as docs/operators.md documents.

"Allowed" means the call was not refused for permissions (it may still fail for another reason, which is
then asserted not to be `Forbidden`); "refused" means a `Forbidden` tool error naming the missing permission,
with nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from taskgate.application.operators.roster import AddOperator
from taskgate.application.trackers.builtin import AddTask
from taskgate.domain.access import Principal
from tests.builders import ACTOR, OPERATOR, fire, seed, start
from tests.conftest import Services, make_git_repo, wire
from tests.mcp.conftest import app_of, connect
from tests.workflow_support import Rig, rig, run_until_idle

ROLES = ["admin", "architect", "developer", "reviewer", "qa"]
# tool (with the arguments' shape) → the roles allowed; written from docs/operators.md, not from the code
ALLOWED = {
    "project_init": {"admin", "architect", "developer"},
    "plan_add": {"admin", "architect", "developer"},
    "task_add": {"admin", "architect", "developer"},
    "project_session_start": {"admin", "architect", "developer"},
    "session_fire:plan_complete": {"admin", "architect", "developer"},
    "session_fire:approve": {"admin", "architect", "reviewer", "qa"},
    "session_suspend": {"admin", "architect", "developer"},
    "session_resume": {"admin", "architect", "developer"},
    "session_cancel": {"admin", "architect", "developer"},
    "session_stop": {"admin", "architect", "developer"},
    "project_session_merge": {"admin", "architect", "reviewer", "qa"},
    "session_review_checkpoint": {"admin", "architect", "reviewer", "qa"},
    "session_execute": {"admin", "architect", "developer"},
    "project_decide": {"admin", "architect", "reviewer", "qa"},
    "project_decide:override": {"admin"},
    "save_output": {"admin", "architect", "developer"},
    "add_workflow_to_session": {"admin", "architect", "developer"},
    "add_checklist_to_session": {"admin", "architect", "developer"},
    "checklist_check": {"admin", "architect", "developer"},
    "workflow_advance": {"admin", "architect", "developer"},
    "workflow_back": {"admin", "architect", "developer"},
    "workflow_break": {"admin", "architect", "developer"},
    "workflow_restart": {"admin", "architect", "developer"},
}
# The stack tools run on a real workflow engine; `gated` reaches its approval through a condition, no agents.
WORKFLOWS = {
    "dev/gated.yaml": "id: gated\ndescription: a condition, then an approval\nsteps:\n"
    "  - {id: route, type: condition, when: 'true', then: gate, else: end}\n"
    "  - {id: gate, type: approval, message: Approve it.}\n",
    "dev/solo.yaml": "id: solo\ndescription: one approval\nsteps:\n  - {id: gate, type: approval, message: Go.}\n",
    "checklists/rel.yaml": "id: rel\ndescription: release\nitems:\n  - {id: a, text: A}\n",
}


async def new_task(services: Services, title: str):
    project = await services.tracker.resolve_project("repo")
    plan = (await services.tracker.list_plans(project.id))[0]
    return await services.tracker.add_task(AddTask(project.id, title, plan_id=plan.id))


async def session_in(services: Services, state_triggers: list[str]):
    """A session of project 'repo' started by alice (admin) and moved by her into the state the tool needs."""
    return await fire(services, await start(services, await new_task(services, "matrix work")), *state_triggers)


async def with_stack(services: Services, r: Rig, *frames: str, executing: bool = False):
    """A planning session with `frames` pushed ("checklist:NAME" for a checklist); moved to executing and driven
    until it waits, if asked."""
    session = await session_in(services, [])
    for frame in frames:
        kind, _, name = frame.rpartition(":")
        push = r.engine.add_checklist if kind == "checklist" else r.engine.add_workflow
        await push(session.id, name, ACTOR)
    if executing:
        await fire(services, session, "plan_complete")
        await run_until_idle(r, session.id)
    return session


async def call_stack_tool(tool: str, tools, services: Services, r: Rig):
    if tool == "add_workflow_to_session":
        session = await session_in(services, [])
        return await tools.call(tool, session_id=session.id, workflow_name="solo")
    if tool == "add_checklist_to_session":
        session = await with_stack(services, r, "solo")
        return await tools.call(tool, session_id=session.id, checklist_name="rel")
    if tool == "checklist_check":
        session = await with_stack(services, r, "solo", "checklist:rel")
        return await tools.call(tool, session_id=session.id, item="a")
    if tool == "workflow_break":
        session = await with_stack(services, r, "solo", "checklist:rel")
        return await tools.call(tool, session_id=session.id)
    if tool == "workflow_back":  # executing, waiting at `gate` after `route`: back has a step to return to
        session = await with_stack(services, r, "gated", executing=True)
        out = await tools.call(tool, session_id=session.id)
        await run_until_idle(r, session.id)
        return out
    session = await with_stack(services, r, "solo")
    return await tools.call(tool, session_id=session.id)


async def call_for(tool: str, tools, services: Services, tmp_path: Path, r: Rig):
    """Prepare what `tool` needs, then call it; returns (ok, text)."""
    if tool in STACK_TOOLS:
        return await call_stack_tool(tool, tools, services, r)
    if tool == "project_init":
        return await tools.call("project_init", path=str(make_git_repo(tmp_path / "another")), name="another")
    if tool == "plan_add":
        return await tools.call("plan_add", name="Phase 2", project="repo")
    if tool == "task_add":
        return await tools.call("task_add", title="matrix task", project="repo")
    if tool == "project_session_start":
        return await tools.call("project_session_start", task_id=(await new_task(services, "to start")).id)
    if tool == "session_fire:plan_complete":
        session = await session_in(services, [])
        return await tools.call("session_fire", session_id=session.id, trigger="plan_complete")
    if tool == "session_fire:approve":
        session = await session_in(services, ["plan_complete", "work_complete"])
        return await tools.call("session_fire", session_id=session.id, trigger="approve")
    if tool in {"session_suspend", "session_cancel", "session_stop"}:
        session = await session_in(services, [])
        return await tools.call(tool, session_id=session.id)
    if tool == "session_resume":
        session = await session_in(services, ["suspend"])
        return await tools.call(tool, session_id=session.id)
    if tool == "project_session_merge":
        session = await session_in(services, ["plan_complete", "work_complete", "approve"])
        return await tools.call(tool, session_id=session.id)
    if tool == "session_execute":  # the in-process server runs no supervisor: allowed means "not Forbidden"
        session = await session_in(services, [])
        return await tools.call(tool, session_id=session.id)
    if tool == "session_review_checkpoint":
        session = await session_in(services, [])
        return await tools.call(tool, session_id=session.id, note="checked")
    if tool == "save_output":
        session = await session_in(services, [])
        return await tools.call(tool, session_id=session.id, path="notes/matrix.md", content="# checked\n")
    session = await session_in(services, ["plan_complete", "work_complete"])
    if tool == "project_decide":
        return await tools.call(tool, session_id=session.id, decision="approve")
    return await tools.call("project_decide", session_id=session.id, decision="approve", reason="hotfix",
                            override_policies=["wip_limit"])  # fmt: skip


STACK_TOOLS = {t for t in ALLOWED if t.startswith(("add_", "checklist_", "workflow_"))}


@pytest.mark.parametrize("role", ROLES)
async def test_every_state_changing_tool_is_allowed_or_refused_for_each_role_as_documented(services, tmp_path, role):
    services = wire(services.backend, services.database, services.url, wip_limit=1000)  # many sessions at once
    repo = make_git_repo(tmp_path / "repo")
    await seed(services, repo, tasks=1)  # alice (admin) owns project 'repo'
    await services.operators.grant(OPERATOR, max_active_sessions=1000)
    await services.operators.add(AddOperator(f"op-{role}", [role], max_active_sessions=100))
    r = rig(services, tmp_path, WORKFLOWS)
    verdicts = {}
    async with connect(services, Principal.operator(f"op-{role}"), app=app_of(services, workflows=r.engine)) as tools:
        for tool in ALLOWED:
            ok, out = await call_for(tool, tools, services, tmp_path, r)
            refused = not ok and "Forbidden" in out
            verdicts[tool] = not refused
            if refused:
                assert "permission" in out and f"op-{role}" in out, out
            elif tool in {"session_execute", "session_stop"}:
                assert ok or "no agent supervisor" in out, out
            else:
                assert ok, f"{role} was allowed {tool} but it failed otherwise: {out}"
    assert {t for t, allowed in verdicts.items() if allowed} == {t for t, roles in ALLOWED.items() if role in roles}


async def test_a_refused_call_writes_nothing(services, tmp_path):
    repo = make_git_repo(tmp_path / "repo")
    await seed(services, repo, tasks=1)
    await services.operators.add(AddOperator("dev", ["developer"]))
    session = await session_in(services, ["plan_complete", "work_complete"])
    before = await services.snapshot()
    async with connect(services, Principal.operator("dev")) as tools:
        out = await tools.refused("project_decide", session_id=session.id, decision="approve")
    assert "needs the 'approve' permission" in out and "taskgate operator grant dev" in out
    assert await services.snapshot() == before


async def test_an_unregistered_operator_is_refused_once_operators_exist(services, tmp_path):
    repo = make_git_repo(tmp_path / "repo")
    await seed(services, repo, tasks=1)
    async with connect(services, Principal.operator("mallory")) as tools:
        out = await tools.refused("task_add", title="sneaky", project="repo")
    assert "not registered" in out and "taskgate operator add mallory" in out
    assert OPERATOR != "mallory"
