"""The MCP tools. Each checks what the caller may do, calls one use case, and returns a pydantic model.

The caller is the token's principal over HTTP and the configured local operator over stdio; it is never a
tool parameter. A refused or invalid call raises `ToolError` with what was wrong and what to do next, and
writes nothing (the use cases guarantee it). No annotation here may be a string: the SDK reads them at runtime.
This module holds the project, task, session and review tools and assembles `TOOLS`, every tool the server
offers; the workflow, browsing, tracker, admin and audit-proof tools live in modules of their own, and what they
all share (the caller, `tool_errors`, the parameter types) in `calls.py`.
"""

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

from taskgate.application.agents.outputs import SaveOutput
from taskgate.application.operators.decisions import Decide
from taskgate.application.operators.roster import authorize_in
from taskgate.application.ports import UnitOfWork
from taskgate.application.sessions.commands import FireTrigger, StartTask, parse_trigger
from taskgate.application.sessions.ports import TransitionQuery
from taskgate.application.trackers.builtin import AddTask
from taskgate.domain.access import (
    DECISION_TRIGGERS,
    Capability,
    check_operator_param,
)
from taskgate.domain.bounds import PRIORITIES, VERSIONS
from taskgate.domain.errors import InvalidInput, StorageError
from taskgate.domain.states import Trigger
from taskgate.entrypoints.mcp.admin_tools import ADMIN_TOOLS
from taskgate.entrypoints.mcp.audit_tools import AUDIT_TOOLS
from taskgate.entrypoints.mcp.browse_tools import BROWSE_TOOLS
from taskgate.entrypoints.mcp.calls import (
    Call,
    PlanId,
    ProjectRef,
    Reason,
    SessionRef,
    Timestamp,
    call_of,
    parse_when,
    resolved_session_id,
    session_id_of,
    session_out,
    tool_errors,
    viewer_of,
    within,
    workflows_of,
)
from taskgate.entrypoints.mcp.models import (
    CheckpointOut,
    ContextOut,
    DecisionOut,
    FireOut,
    OutputOut,
    PlanList,
    PlanOut,
    PolicyCheckOut,
    PolicyList,
    Pong,
    ProjectOut,
    ReadyList,
    ReviewOut,
    SessionOut,
    StateAtOut,
    TaskList,
    TaskOut,
    TransitionList,
)
from taskgate.entrypoints.mcp.node_tools import NODE_TOOLS
from taskgate.entrypoints.mcp.question_tools import QUESTION_TOOLS
from taskgate.entrypoints.mcp.tracker_tools import TRACKER_TOOLS
from taskgate.entrypoints.mcp.workflow_tools import WORKFLOW_TOOLS


@tool_errors
async def ping() -> Pong:
    """Check that taskgate answers. Does nothing else."""
    return Pong()


@tool_errors
async def project_init(
    path: Annotated[str, Field(description="A directory inside the git repository to register.", max_length=4096)],
    ctx: Context,
    name: Annotated[
        str | None, Field(description="Project name; default: the repository folder's name.", max_length=100)
    ] = None,
) -> ProjectOut:
    """Register a git repository as a taskgate project (and make sure the calling operator exists).

    Task ids of the project will be KEY-1, KEY-2, ... where KEY comes from the name."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.MANAGE)
    project = await call.app.tracker.init_project(path, name, call.principal.actor)
    if call.principal.operator_id:
        await call.app.tracker.ensure_operator(call.principal.operator_id)
    return ProjectOut.of(project, f"registered project {project.name}; task ids look like {project.key}-1")


@tool_errors
async def plan_add(
    name: Annotated[str, Field(description="Plan (phase) name, e.g. 'Phase 1'.", max_length=100)],
    ctx: Context,
    project: ProjectRef = None,
) -> PlanOut:
    """Add a plan (a phase of work) to a project. Tasks are grouped in plans; the WIP limit is per plan."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.MANAGE)
    found = await call.app.tracker.resolve_project(project)
    return PlanOut.of(await call.app.tracker.add_plan(found.id, name, call.principal.actor))


@tool_errors
async def plan_list(ctx: Context, project: ProjectRef = None) -> PlanList:
    """List the plans of a project with their status (open, in_progress, closed)."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.READ)
    found = await call.app.tracker.resolve_project(project)
    plans = [PlanOut.of(p) for p in await call.app.tracker.list_plans(found.id)]
    return PlanList(summary=f"{len(plans)} plan(s) in {found.name}", plans=plans)


@tool_errors
async def task_add(
    title: Annotated[str, Field(description="What the task is.", max_length=500)],
    ctx: Context,
    description: Annotated[str, Field(description="Details for the agents.", max_length=20000)] = "",
    plan_id: PlanId = None,
    priority: Annotated[int, Field(description="0 (most urgent) to 4.", **within(PRIORITIES))] = 2,
    blocked_by: Annotated[
        list[Annotated[str, Field(max_length=64)]],
        Field(description="Ids of tasks that must complete first.", max_length=100),
    ] = [],  # noqa: B006 (pydantic copies)
    project: ProjectRef = None,
    labels: Annotated[
        list[Annotated[str, Field(max_length=50)]],
        Field(description="Task labels, e.g. bug: a workflow's label:<name> trigger takes the task.", max_length=20),
    ] = [],  # noqa: B006 (pydantic copies)
) -> TaskOut:
    """Add a task to the built-in tracker. A task with unfinished blockers cannot be started. A closed plan (its
    tasks all completed) is reopened by the task; `plan_reopened` says so."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.MANAGE)
    found = await call.app.tracker.resolve_project(project)
    command = AddTask(found.id, title, description, plan_id, priority, list(blocked_by), call.principal.actor,
                      labels=list(labels))  # fmt: skip
    return TaskOut.added(await call.app.tracker.add(command))


@tool_errors
async def task_list(
    ctx: Context,
    project: ProjectRef = None,
    plan_id: PlanId = None,
    status: Annotated[
        Literal["open", "in_progress", "pending_review", "approved", "merged", "completed"] | None,
        Field(description="Only tasks with this status."),
    ] = None,
) -> TaskList:
    """List tasks of a project, oldest first."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.READ)
    found = await call.app.tracker.resolve_project(project)
    return TaskList.of(await call.app.tracker.list_tasks(found.id, plan_id, status))


@tool_errors
async def project_ready_tasks(
    ctx: Context,
    project: ProjectRef = None,
    limit: Annotated[int | None, Field(description="At most this many (default: all).", ge=1, le=100_000)] = None,
) -> TaskList:
    """Tasks that can start now: open, no active session, every blocker completed, plan not closed; most urgent
    first. With a Beads tracker, bd ready's own list."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.READ)
    found = await call.app.tracker.resolve_project(project)
    return TaskList.of(await call.app.tracker.ready_tasks(found.id, limit), "ready task(s)")


@tool_errors
async def project_session_start(
    task_id: Annotated[str, Field(description="The task to start work on (see project_ready_tasks).", max_length=64)],
    ctx: Context,
    operator_id: Annotated[
        str | None,
        Field(
            description="Optional; must equal the caller. The operator always comes from the caller's identity.",
            max_length=100,
        ),
    ] = None,
    workflow: Annotated[
        str | None,
        Field(
            description="The workflow the session runs (see query_workflows); default: [workflows] default.",
            max_length=100,
        ),
    ] = None,
) -> SessionOut:
    """Start work on a task: create its session (or reuse its ready one) and fire `start` (ready → planning).

    Guarded by the WIP limit of the plan, plan_open and task_unblocked; a refusal says which guard and why,
    and leaves the session `ready` to start later. With `workflow` (or a configured default) the workflow is
    pushed as the session's root frame and runs once session_execute moves it to executing; an unknown
    workflow is refused before anything is written."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.START)
    operator = check_operator_param(call.principal, operator_id)
    engine = workflows_of(call) if workflow is not None else call.app.workflows
    chosen = engine.chosen(workflow, await viewer_of(call)) if engine is not None else None
    await call.app.tracker.prepare_start(task_id)
    session = (await call.app.sessions.start_task(StartTask(task_id, call.principal.actor, operator))).session
    if engine is not None and await engine.attach(session.id, chosen, call.principal.actor) is not None:
        session = await call.app.sessions.get(session.id)  # the push moved its version on
    return await session_out(call, session, [])


@tool_errors
async def project_sessions_ready(ctx: Context, project: ProjectRef = None) -> ReadyList:
    """Sessions waiting for the caller's decision (state `verifying`), escalated ones first (`escalated`: waiting
    longer than the sweeper's escalation time), then oldest first, each with its diff stat,
    commits, the stored test result of its head, the approve policies as the caller would meet them (a dry run;
    tests are not run here) and the approvals counted so far. Sessions whose workflow waits on an approval step
    (state `executing`) are listed too, with `approval_step` and its `message`; project_decide answers them."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.READ)
    found = await call.app.tracker.resolve_project(project)
    return ReadyList.of(await call.app.review_queue.waiting(found.id, call.principal.actor))


@tool_errors
async def project_decide(
    session_id: SessionRef,
    decision: Annotated[
        Literal["approve", "request_changes", "reject"],
        Field(
            description="approve → awaiting_merge; request_changes → executing; reject → failed + compensation. "
            "On a workflow approval step: approve → its on_approve, reject → its on_reject (or the session is "
            "rejected), request_changes → back to the step that made the work."
        ),
    ],
    ctx: Context,
    reason: Reason = None,
    instructions: Annotated[
        str | None, Field(description="For request_changes: what the agents must change.", max_length=5000)
    ] = None,
    override_policies: Annotated[
        list[Annotated[str, Field(max_length=64)]],
        Field(description="Policies to override (needs the override permission and a reason).", max_length=20),
    ] = [],  # noqa: B006 (pydantic copies)
    compensation: Annotated[
        Literal["auto_revert", "manual_review", "approve_and_merge"] | None,
        Field(description="For reject: auto_revert (discard the work), manual_review (default), approve_and_merge."),
    ] = None,
    expected_version: Annotated[
        int | None,
        Field(
            description="The session version you decided on (from session_status or project_sessions_ready). "
            "Recommended: a resent decision is then recognised even after the session moved on to its next gate.",
            **within(VERSIONS),
        ),
    ] = None,
) -> DecisionOut:
    """Decide on a session waiting in verifying, or answer the workflow approval step a session waits on in
    executing: approve → the step's on_approve, reject → its on_reject (or the session is rejected when the step
    has none), request_changes → back to the step that made the work, with the instructions. Idempotent: the
    same decision sent again returns the first result and writes nothing; a different decision on an
    already-decided verification or step is refused, naming it. Needs the approve permission
    (override_policies and approve_and_merge also need override)."""
    call = call_of(ctx)
    sid = await resolved_session_id(call, session_id, Capability.DECIDE)
    assert call.principal.operator_id is not None  # agents were refused DECIDE above
    cmd = Decide(
        sid, call.principal.operator_id, decision, reason, instructions, tuple(override_policies), compensation,
        expected_version,
    )  # fmt: skip
    # the operator is authorised inside the decision's own first read transaction, not in one of its own
    return DecisionOut.of(await call.app.decisions.decide(cmd, principal=call.principal))


@tool_errors
async def session_status(session_id: SessionRef, ctx: Context) -> SessionOut:
    """One session: state, version, prior state (while suspended), the triggers allowed next, `escalated_at` (when
    the sweeper escalated the verification it waits in), its agents
    (status, exit code, start/end, heartbeat, output file and tail, and `report`: what its CLI said of its run,
    its final message, turns, tokens and cost) and its workflow stack (depth, breadcrumb,
    frames, and what a person must do: an approval or checklist items), when it runs one."""
    call = call_of(ctx)
    sid = await resolved_session_id(call, session_id)
    # the caller's authorisation, the session and its agents: one read transaction
    with_agents = call.app.agents is not None
    session, agents = await call.app.operators.read_session(call.principal, sid, with_agents=with_agents)
    return await session_out(call, session, agents)


@tool_errors
async def session_execute(
    session_id: SessionRef,
    ctx: Context,
    agents: Annotated[
        list[Annotated[str, Field(max_length=100)]],
        Field(
            description="Agent types to launch ([agents.NAME] in config); default: execution.default_agents.",
            max_length=64,
        ),
    ] = [],  # noqa: B006 (pydantic copies)
) -> SessionOut:
    """Move a session from planning to executing and launch its agents into its worktree (each with a token
    scoped to the session). They run supervised: when all have ended the session moves to verifying by itself
    (a failed agent fails it for the operator). A session running a workflow, with no agents named, lets its
    workflow launch the agents step by step. Follow them with session_status."""
    call = call_of(ctx)
    sid = await session_id_of(call, session_id, Capability.START)
    if call.app.agents is None:
        raise InvalidInput("this server runs no agent supervisor")
    launched = await call.app.agents.execute(sid, call.principal.actor, list(agents))
    return await session_out(call, launched.session, launched.agents)


@tool_errors
async def session_history(
    session_id: SessionRef,
    ctx: Context,
    limit: Annotated[int, Field(description="Newest N rows.", ge=1, le=10000)] = 100,
) -> TransitionList:
    """The session's transition log, applied and blocked rows, oldest first, with guard results and actors."""
    call = call_of(ctx)
    sid = await session_id_of(call, session_id)
    return TransitionList.of(await call.app.sessions.history(sid, limit))


@tool_errors
async def session_state_at(session_id: SessionRef, timestamp: Timestamp, ctx: Context) -> StateAtOut:
    """The state the session was in at a moment, rebuilt by replaying its log."""
    call = call_of(ctx)
    sid = await session_id_of(call, session_id)
    at = parse_when(timestamp)
    assert at is not None
    state = await call.app.sessions.state_at(sid, at)
    return StateAtOut(
        summary=f"session {sid} was {state.value} at {at.isoformat()}", session_id=sid, at=at, state=state.value
    )


async def _fire(
    ctx: Context, session_id: str, trigger: str, reason: str | None, expected_version: int | None = None
) -> FireOut:
    call = call_of(ctx)
    operator = call.principal.operator_id
    if trigger in DECISION_TRIGGERS and operator is not None:  # one way to decide: the decision path records it
        sid = await session_id_of(call, session_id, Capability.FIRE, parse_trigger(trigger))
        result = await call.app.decisions.fire(sid, trigger, operator, reason=reason, expected_version=expected_version)
        return FireOut.of(result.session, result.record, result.follow_ups, result.warnings)
    parsed = parse_trigger(trigger)
    sid = await resolved_session_id(call, session_id, Capability.FIRE, parsed)  # an agent: held to its scope here

    async def authorized(uow: UnitOfWork) -> None:  # an operator: by its roles, in the fire's first transaction
        await authorize_in(uow, call.principal, Capability.FIRE, session_id=sid, trigger=parsed)

    cmd = FireTrigger(sid, trigger, call.principal.actor, reason, expected_version, authorize=authorized)
    result = await call.app.sessions.fire(cmd)
    return FireOut.of(result.session, result.record, result.follow_ups, result.warnings)


@tool_errors
async def session_fire(
    session_id: SessionRef,
    trigger: Annotated[
        str,
        Field(
            description="e.g. plan_complete, work_complete, approve, merge, cleanup_done; "
            "session_status lists the allowed ones.",
            max_length=64,
        ),
    ],
    ctx: Context,
    reason: Reason = None,
    expected_version: Annotated[
        int | None,
        Field(
            description="Refuse if the session is no longer at this version (optimistic concurrency).",
            **within(VERSIONS),
        ),
    ] = None,
) -> FireOut:
    """Fire a trigger on a session: one guarded, logged transition. approve, request_changes and reject are
    decisions: fired here they are taken exactly as project_decide takes them (recorded, a resend replays the
    first result, reject's compensation is manual_review; use project_decide for instructions, overrides or
    another compensation). Agents may fire only plan_complete, work_complete and fail on their own session."""
    return await _fire(ctx, session_id, trigger, reason, expected_version)


@tool_errors
async def session_suspend(session_id: SessionRef, ctx: Context, reason: Reason = None) -> FireOut:
    """Pause a session in planning, executing, verifying or awaiting_merge; it frees a WIP slot."""
    return await _fire(ctx, session_id, "suspend", reason)


@tool_errors
async def session_resume(session_id: SessionRef, ctx: Context, reason: Reason = None) -> FireOut:
    """Resume a suspended session into the state it was suspended from (WIP-limited), or an abandoned one to ready."""
    return await _fire(ctx, session_id, "resume", reason)


@tool_errors
async def session_cancel(session_id: SessionRef, ctx: Context, reason: Reason = None) -> FireOut:
    """Cancel a session for good (terminal); its task becomes open again."""
    return await _fire(ctx, session_id, "cancel", reason)


@tool_errors
async def session_stop(session_id: SessionRef, ctx: Context, reason: Reason = None) -> SessionOut:
    """Stop the session's agents: SIGTERM to each agent's process group, SIGKILL after [execution] stop_grace_s,
    whichever process of this node launched them. An executing session is failed (retry runs its agents again);
    in another state the agents still running are stopped and the session stays. Each agent in the result says
    how it ended (`ended_by`: SIGTERM or SIGKILL)."""
    call = call_of(ctx)
    sid = await session_id_of(call, session_id, Capability.FIRE, Trigger.FAIL)
    if call.app.agents is None:
        raise InvalidInput("this server runs no agent supervisor")
    stopped = await call.app.agents.stop_session(sid, call.principal.actor, reason)
    return await session_out(call, stopped.session, stopped.agents)


@tool_errors
async def audit_query(
    ctx: Context,
    session_id: Annotated[str | None, Field(description="Only this session (id or prefix).", max_length=64)] = None,
    actor: Annotated[
        str | None, Field(description="e.g. operator:alice, system, agent:TOKENID.", max_length=200)
    ] = None,
    state: Annotated[str | None, Field(description="Only transitions that entered this state.", max_length=32)] = None,
    outcome: Annotated[Literal["applied", "blocked"] | None, Field(description="applied or blocked.")] = None,
    since: Annotated[str | None, Field(description="ISO 8601, inclusive.", max_length=64)] = None,
    until: Annotated[str | None, Field(description="ISO 8601, inclusive.", max_length=64)] = None,
    limit: Annotated[int, Field(description="At most this many rows.", ge=1, le=10000)] = 1000,
) -> TransitionList:
    """Who moved which session where, when, and what the guards said: the transition log, filtered, oldest first."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.AUDIT)
    sid = await call.app.sessions.resolve_id(session_id) if session_id else None
    query = TransitionQuery(sid, actor, state, outcome, parse_when(since), parse_when(until), limit)
    return TransitionList.of(await call.app.audit.transitions(query))


@tool_errors
async def project_session_merge(session_id: SessionRef, ctx: Context, reason: Reason = None) -> FireOut:
    """Merge an approved session (awaiting_merge) into its base: rebase first if the base moved, then
    fast-forward (or --no-ff, as configured); the worktree and branch are removed after. A conflict or a dirty
    worktree changes nothing: the session stays awaiting_merge and the error names the files."""
    return await _fire(ctx, session_id, "merge", reason)


@tool_errors
async def session_review(
    session_id: SessionRef,
    ctx: Context,
    patch: Annotated[bool, Field(description="Include the full diff (capped; see patch_truncated).")] = False,
) -> ReviewOut:
    """What a session changed: diff against its base (stat, and the patch if asked), its commits, and dirty,
    untracked or conflicted files in its worktree. Reads only."""
    call = call_of(ctx)
    sid = await session_id_of(call, session_id)
    return ReviewOut.of(sid, await call.app.workspaces.review(sid), with_patch=patch)


@tool_errors
async def session_review_checkpoint(
    session_id: SessionRef,
    ctx: Context,
    note: Annotated[str, Field(description="What you checked and concluded.", max_length=5000)] = "",
) -> CheckpointOut:
    """Record the session's current review (diff stat, commits, worktree state) with a note, for the audit trail."""
    call = call_of(ctx)
    sid = await session_id_of(call, session_id, Capability.DECIDE)
    snapshot = await call.app.workspaces.checkpoint(sid, note, call.principal.actor)
    return CheckpointOut.of(snapshot, await call.app.workspaces.review(sid))


@tool_errors
async def context_discover(
    ctx: Context,
    project: ProjectRef = None,
    refresh: Annotated[bool, Field(description="Ignore the cached snapshot (kept up to 30 s by default).")] = False,
) -> ContextOut:
    """The project's git context (branch, clean or not, staged/unstaged/untracked/conflicted counts, rebase or
    merge in progress, recent commits, worktrees) and tracker context (open, in progress, ready, blocked, current
    plan progress), with the snapshot's age. An agent gets its own session's project."""
    call = call_of(ctx)
    if call.principal.session_id is not None:
        await call.app.operators.authorize(
            call.principal, Capability.READ_SESSION, session_id=call.principal.session_id
        )
        project_id = (await call.app.sessions.get(call.principal.session_id)).project_id
    else:
        await call.app.operators.authorize(call.principal, Capability.READ)
        project_id = (await call.app.tracker.resolve_project(project)).id
    return ContextOut.of(await call.app.context.discover(project_id, refresh=refresh))


@tool_errors
async def policies_list(ctx: Context, project: ProjectRef = None) -> PolicyList:
    """The policies guarding a project's transitions: name, description, priority, severity, triggers, enabled
    and settings, as configured (global [policies.*] with the project's own overrides). Without `project`: the
    only project's, or the global set when there are several or none."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.READ)
    name = (await call.app.tracker.resolve_project(project)).name if project else await _only_project(call)
    return PolicyList.of(name, call.app.sessions.policies(name), call.app.sessions.test_command(name))


async def _only_project(call: Call) -> str | None:
    projects = [p for p in await call.app.tracker.list_projects() if p.archived_at is None]
    return projects[0].name if len(projects) == 1 else None


@tool_errors
async def policies_check(
    session_id: SessionRef,
    trigger: Annotated[str, Field(description="The trigger to check, e.g. approve, merge, start.", max_length=64)],
    ctx: Context,
    run_tests: Annotated[
        bool, Field(description="Run require_tests' command if no stored run of the head can be reused.")
    ] = True,
) -> PolicyCheckOut:
    """Dry run: what firing `trigger` on the session now would meet, policy by policy, with every violation and
    suggestion. Writes nothing (a test run it needs runs but is not stored; the output says whether a stored run
    was reused). An operator checking approve counts their own approval. Agents: their own session only."""
    call = call_of(ctx)
    sid = await session_id_of(call, session_id)
    check = await call.app.sessions.check(sid, trigger, actor=call.principal.actor, run_tests=run_tests)
    return PolicyCheckOut.of(check)


@tool_errors
async def save_output(
    path: Annotated[
        str,
        Field(
            description="Where to save it, relative to the session folder, e.g. 'reports/tests.txt'. No '..', "
            "no absolute path, no component starting with '.', '-' or '~'; 'manifest.json' is taskgate's.",
            min_length=1,
            max_length=1024,
        ),
    ],
    content: Annotated[str, Field(description="The file's content (10 MB at most by default).", max_length=14_000_000)],
    ctx: Context,
    session_id: Annotated[
        str | None,
        Field(
            description="Session id or a unique prefix (4+ characters); an agent may leave it out: its own session.",
            min_length=1,
            max_length=64,
        ),
    ] = None,
    encoding: Annotated[
        Literal["text", "base64"], Field(description="text (saved as UTF-8) or base64 (for binary content).")
    ] = "text",
) -> OutputOut:
    """Save a file into the session's folder (data/agent-outputs/<session id>/) and list it in the folder's
    manifest.json; an earlier file of the same path is replaced. Every write stays inside the folder: '..',
    absolute paths, NUL and control characters and symbolic links are refused. Agents: their own session only
    (session_id may be left out)."""
    call = call_of(ctx)
    if session_id is None:
        if call.principal.session_id is None:
            raise InvalidInput("session_id is required (only an agent, whose token names its session, may omit it)")
        session_id = call.principal.session_id
    sid = await session_id_of(call, session_id, Capability.SAVE_OUTPUT)
    if call.app.outputs is None:
        raise StorageError("this server has no session folders configured")
    await call.app.sessions.refuse_unless_held(sid)  # the folder is on the disk of the node holding the session
    record = await call.app.outputs.save_output(SaveOutput(sid, path, content, encoding, call.principal.actor))
    return OutputOut.of(sid, record)


TOOLS: list[Callable[..., Awaitable[Any]]] = [
    ping,
    project_init,
    plan_add,
    plan_list,
    task_add,
    task_list,
    project_ready_tasks,
    project_session_start,
    project_sessions_ready,
    project_decide,
    session_execute,
    session_status,
    session_history,
    session_state_at,
    session_fire,
    session_suspend,
    session_resume,
    session_cancel,
    session_stop,
    project_session_merge,
    session_review,
    session_review_checkpoint,
    context_discover,
    audit_query,
    *AUDIT_TOOLS,
    policies_list,
    policies_check,
    save_output,
    *WORKFLOW_TOOLS,
    *BROWSE_TOOLS,
    *NODE_TOOLS,
    *TRACKER_TOOLS,
    *ADMIN_TOOLS,
    *QUESTION_TOOLS,
]
