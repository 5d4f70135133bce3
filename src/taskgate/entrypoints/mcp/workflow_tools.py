"""The MCP tools of the workflow catalogue and a session's workflow stack: query the catalogue, push workflows and
checklists, tick items, and the hand edits (advance, back, break, continue, restart).

No annotation here may be a string: the SDK reads them at runtime.
"""

from collections.abc import Awaitable, Callable
from typing import Annotated

from mcp.server.mcpserver import Context
from pydantic import Field

from taskgate.application.workflows.engine import WorkflowEngine
from taskgate.application.workflows.views import StackView
from taskgate.domain.access import (
    Capability,
)
from taskgate.domain.workflows.visibility import allows
from taskgate.entrypoints.mcp.calls import (
    ChecklistName,
    Pattern,
    SessionRef,
    WorkflowName,
    call_of,
    session_id_of,
    tool_errors,
    viewer_of,
    workflows_of,
)
from taskgate.entrypoints.mcp.models import (
    ChecklistList,
    WorkflowList,
    WorkflowStackOut,
)


@tool_errors
async def query_workflows(
    ctx: Context,
    pattern: Pattern = None,
    category: Annotated[
        str | None, Field(description="Only this category (the folder under workflows/).", max_length=100)
    ] = None,
) -> WorkflowList:
    """The valid workflows of the catalogue (built-in and the project's own) the caller may run (a workflow's
    `visible_to`), by category then id: id, description, category, steps and the loop guard. Files are read again
    on every call."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.READ)
    viewer = await viewer_of(call)
    found = [w for w in workflows_of(call).query_workflows(pattern, category) if allows(w.visible_to, viewer)]
    return WorkflowList.of(found, pattern, category)


@tool_errors
async def query_checklists(ctx: Context, pattern: Pattern = None) -> ChecklistList:
    """The valid checklists of the catalogue (built-in and the project's own), by id, with their items."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.READ)
    return ChecklistList.of(workflows_of(call).query_checklists(pattern), pattern)


async def _edit_stack(
    ctx: Context, session_id: str, edit: Callable[[WorkflowEngine, str, str], Awaitable[StackView]], done: str
) -> WorkflowStackOut:
    """Stack edits (and checklist ticks) need STEER, which operators hold with `write` and agents on their own
    session only."""
    call = call_of(ctx)
    sid = await session_id_of(call, session_id, Capability.STEER)
    engine = workflows_of(call)
    return WorkflowStackOut.of(await edit(engine, sid, call.principal.actor), done)


@tool_errors
async def add_workflow_to_session(
    session_id: SessionRef, workflow_name: WorkflowName, ctx: Context
) -> WorkflowStackOut:
    """Push a workflow onto the session's stack (its root frame when the stack is empty). The top frame runs
    while the session is executing; when it finishes, the frame below goes on. Refused past executing, when
    the workflow is already on the stack, at the depth limit, or when the workflow's `visible_to` does not name
    the caller (an operator, or an agent by its type). Agents: their own session only."""
    viewer = await viewer_of(call_of(ctx))
    return await _edit_stack(
        ctx,
        session_id,
        lambda e, sid, actor: e.add_workflow(sid, workflow_name, actor, viewer),
        f"pushed workflow {workflow_name}",
    )


@tool_errors
async def add_checklist_to_session(
    session_id: SessionRef, checklist_name: ChecklistName, ctx: Context
) -> WorkflowStackOut:
    """Push a checklist onto the session's stack: the workflow below waits until its required items are
    ticked with checklist_check. Agents: their own session only."""
    return await _edit_stack(
        ctx,
        session_id,
        lambda e, sid, actor: e.add_checklist(sid, checklist_name, actor),
        f"pushed checklist {checklist_name}",
    )


@tool_errors
async def checklist_check(
    session_id: SessionRef,
    item: Annotated[str, Field(description="The item's id (see waiting.items).", min_length=1, max_length=100)],
    ctx: Context,
) -> WorkflowStackOut:
    """Tick an item of the checklist the session's top frame waits on; ticking it again changes nothing.
    When every required item is ticked the workflow goes on. Agents: their own session only."""
    return await _edit_stack(ctx, session_id, lambda e, sid, actor: e.check_item(sid, item, actor), f"ticked {item}")


@tool_errors
async def workflow_advance(session_id: SessionRef, ctx: Context) -> WorkflowStackOut:
    """Move the top frame past its current step by hand (recorded as skipped, routed as a success). Refused on
    an approval step (answer it with project_decide) and while required checklist items are missing. Agents:
    their own session only."""
    return await _edit_stack(ctx, session_id, lambda e, sid, actor: e.advance(sid, actor), "advanced")


@tool_errors
async def workflow_back(session_id: SessionRef, ctx: Context) -> WorkflowStackOut:
    """Return the top frame to the step it ran before the current one (that step runs again). Agents: their
    own session only."""
    return await _edit_stack(ctx, session_id, lambda e, sid, actor: e.back(sid, actor), "went back")


@tool_errors
async def workflow_break(session_id: SessionRef, ctx: Context) -> WorkflowStackOut:
    """Leave the nested top frame and return to the one below (the step that pushed it counts as skipped).
    Refused at depth 1: the root workflow is left by finishing it, or by cancelling the session. Agents: their
    own session only."""
    return await _edit_stack(ctx, session_id, lambda e, sid, actor: e.break_frame(sid, actor), "left the top frame")


@tool_errors
async def workflow_continue(session_id: SessionRef, ctx: Context) -> WorkflowStackOut:
    """End the nested top frame early as a success and return to the one below: the step that pushed it succeeds
    with what the frame did so far (its structured result: children, summary, files changed, usage), and the
    frame below goes on along its success route. Refused at depth 1. Agents: their own session only."""
    return await _edit_stack(
        ctx, session_id, lambda e, sid, actor: e.continue_frame(sid, actor), "ended the top frame early"
    )


@tool_errors
async def workflow_restart(session_id: SessionRef, ctx: Context) -> WorkflowStackOut:
    """Run the top frame again from its first step, with its results and ticked items cleared. Agents: their
    own session only."""
    return await _edit_stack(ctx, session_id, lambda e, sid, actor: e.restart(sid, actor), "restarted the top frame")


WORKFLOW_TOOLS = [
    query_workflows,
    query_checklists,
    add_workflow_to_session,
    add_checklist_to_session,
    checklist_check,
    workflow_advance,
    workflow_back,
    workflow_break,
    workflow_continue,
    workflow_restart,
]
