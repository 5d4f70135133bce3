"""Sessions: start, fire, decide, execute, watch, merge, review and what they left behind."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from taskgate.application.operators.decisions import Decide
from taskgate.application.sessions.commands import FireTrigger, StartTask
from taskgate.application.workflows.views import stack_view_json
from taskgate.domain import session_fsm
from taskgate.domain.access import DECISION_TRIGGERS
from taskgate.domain.agents.usage import session_usage
from taskgate.domain.entities import Project, Session
from taskgate.domain.states import SessionState
from taskgate.domain.workflows.visibility import Viewer
from taskgate.entrypoints import agent_lines, render
from taskgate.entrypoints.cli.common import (
    JsonOpt,
    ProjectOpt,
    _local_actor,
    _operator_actor,
    _timestamp_or_fail,
    emit,
    run,
    run_in_project,
    session_app,
)
from taskgate.entrypoints.cli.driving import (
    _drive,
    _engine,
    _marks,
    _Outcome,
    _outcome,
    _report,
    _until_launched,
)
from taskgate.entrypoints.cli.interrupts import INTERRUPTED_EXIT, Interrupted, interruptible, print_stopped
from taskgate.entrypoints.cli.logs import latest_run
from taskgate.entrypoints.cli.session_page import print_session
from taskgate.entrypoints.render import console, err_console, terminal_safe

if TYPE_CHECKING:
    from taskgate.bootstrap import App

WorkflowOpt = Annotated[
    str | None, typer.Option("--workflow", "-w", help="The workflow the session runs (default: [workflows] default).")
]


@session_app.command("start")
def session_start(
    task_id: Annotated[str, typer.Argument(help="The task to work on.")],
    operator: Annotated[str | None, typer.Option("--operator", help="Operator id (default: operator.default).")] = None,
    workflow: WorkflowOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start work on a task: create (or reuse the ready) session and fire `start` (WIP-limited). With --workflow
    (or a `[workflows] default`) the session runs that workflow once it executes (`session execute`)."""

    async def work(services: App):
        operator_id, actor = _operator_actor(services, operator)
        chosen = _engine(services).chosen(workflow, Viewer.operator(operator_id))  # refused before any write
        await services.tracker.prepare_start(task_id)
        result = await services.sessions.start_task(StartTask(task_id, actor, operator_id))
        view = await _engine(services).attach(result.session.id, chosen, actor)
        return (await services.sessions.get(result.session.id)) if view else result.session, view

    session, view = run(work)
    if as_json:
        render.print_json(session)
        return
    console.print(f"session [bold]{session.id}[/bold] for {escape(task_id)} is now [green]{session.state}[/green]")
    if view is not None:
        where = f"workflow [bold]{escape(view.breadcrumb)}[/bold] is on its stack"
        console.print(f"{where}; it runs from `session execute`", highlight=False)


@session_app.command("fire")
def session_fire(
    session_id: Annotated[str, typer.Argument(help="Session id or a unique prefix of it.")],
    trigger: Annotated[str, typer.Argument(help="Trigger name; see `taskgate fsm`.")],
    reason: Annotated[str | None, typer.Option("--reason", help="Why (recorded in the log).")] = None,
    expected_version: Annotated[int | None, typer.Option(help="Refuse if the session moved past this version.")] = None,
    operator: Annotated[str | None, typer.Option("--operator")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fire a trigger on a session (one guarded, logged transaction). approve, request_changes and reject are
    taken as the operator's decision, exactly as `session decide` takes them."""

    async def work(services: App):
        full_id = await services.sessions.resolve_id(session_id)
        operator_id, actor = _operator_actor(services, operator)
        known = await _marks(services, full_id)
        if trigger in DECISION_TRIGGERS:  # one way to decide: recorded, a resend replays it
            result = await services.decisions.fire(full_id, trigger, operator_id, reason=reason,
                                                   expected_version=expected_version)  # fmt: skip
        else:
            result = await services.sessions.fire(FireTrigger(full_id, trigger, actor, reason, expected_version))
        if not as_json:
            _print_fired(result)
        # retry, resume or plan_complete kick the session's workflow: this process drives it (no serve needed)
        outcome = None
        if result.session.workflow_stack:
            driving = _drive(services, full_id, known=known, quiet=as_json)
            outcome = await interruptible(services, full_id, actor, driving)
        if outcome is None and trigger in _RELAUNCHING and services.workflows is not None:
            # retry and request_changes relaunched the session's agents in this process: supervise them to the end
            done = services.workflows.wait(full_id)
            following = done if as_json else agent_lines.follow_agents(services, full_id, until=done)
            if isinstance(stopped := await interruptible(services, full_id, actor, following), Interrupted):
                return result, stopped  # Ctrl-C stopped what it relaunched (cli/interrupts.py)
        return result, outcome

    result, outcome = run(work)
    if isinstance(outcome, Interrupted):
        print_stopped(outcome.stopped)
        raise typer.Exit(INTERRUPTED_EXIT)
    if as_json:
        render.print_json(result.record)
    elif outcome is not None:
        _report(outcome)


_RELAUNCHING = frozenset({"retry", "request_changes", "resume"})  # resume: the run a budget stopped (budgets.md)


def _print_fired(result) -> None:
    console.print(
        f"{result.record.from_state} → [green]{result.record.to_state}[/green] "
        f"(session {result.session.id[:8]}, version {result.session.version})"
    )
    for record in result.follow_ups:
        console.print(f"  then {record.trigger}: {record.from_state} → [green]{record.to_state}[/green]")
    for warning in result.warnings:
        console.print(f"  [yellow]warning:[/yellow] {escape(warning)}")


@session_app.command("show")
def session_show(session_id: Annotated[str, typer.Argument()], as_json: JsonOpt = False) -> None:
    """Show one session."""

    async def work(services: App):
        session = await services.sessions.get(await services.sessions.resolve_id(session_id))
        agents = await services.agents.agents(session.id) if services.agents is not None else []
        pull = await services.forge.pull_request(session.id) if services.forge is not None else None
        asked = await services.questions.open([session.id]) if services.questions is not None else []
        return session, agents, pull, asked

    print_session(*run(work), as_json=as_json)


@session_app.command("status")
def session_status(session_id: Annotated[str, typer.Argument()], as_json: JsonOpt = False) -> None:
    """A session's state and its workflow: depth, breadcrumb (workflow › step › nested workflow › step), and
    what it waits for (an approval's message, checklist items to tick) with the commands that answer it; and its
    agents, each with what its CLI reported (final message, turns, tokens, cost)."""

    async def work(services: App):
        session = await services.sessions.get(await services.sessions.resolve_id(session_id))
        agents = await services.agents.agents(session.id) if services.agents is not None else []
        refused = await services.agents.sandbox_events(session.id) if services.agents is not None else []
        owed = await _owed_to_tracker(services, session.task_id)
        return session, _engine(services).view(session), agents, owed, refused

    session, view, agents, owed, refused = run(work)
    if as_json:
        allowed = session_fsm.allowed_triggers(session.state, session.prior_state)
        extra = {"workflow": stack_view_json(view), "agents": agents, "usage": session_usage(agents),
                 "tracker_writebacks": owed, "sandbox": refused}  # fmt: skip
        render.print_json({**render.jsonable(session), "next_triggers": list(allowed), **extra})
        return
    render.print_workflow_status(session, view)
    latest = {a.id for a in latest_run(agents)}
    for agent in agents:  # each with what its CLI reported: final message (whole for the latest run), usage
        console.print(f"  {agent_lines.agent_line(agent)}", markup=False, highlight=False, soft_wrap=True)
        for line in agent_lines.result_lines(agent) if agent.id in latest else []:
            console.print(f"    │ {line}", markup=False, highlight=False, soft_wrap=True)
    for label, line in agent_lines.usage_lines(agents):
        console.print(f"  {label}: {line}", markup=False, highlight=False, soft_wrap=True)
    for line in render.sandbox_lines(refused):
        console.print(terminal_safe(f"  {line}"), style="yellow", markup=False, highlight=False, soft_wrap=True)
    _print_owed(owed)


async def _owed_to_tracker(services: App, task_id: str) -> list:
    """The task's write-backs still owed to the tracker (pending or failed), newest first."""
    return await services.writebacks.open_rows([task_id]) if services.writebacks is not None else []


def _print_owed(owed: list) -> None:
    for row in owed:  # the tracker does not yet say what taskgate did: say so where the operator looks
        line = f"  tracker out of sync: {row.describe()} (taskgate tracker retry {row.id} | dismiss {row.id})"
        console.print(terminal_safe(line), style="yellow", markup=False, highlight=False, soft_wrap=True)


@session_app.command("decide")
def session_decide(
    session_id: Annotated[str, typer.Argument()],
    decision: Annotated[str, typer.Argument(help="approve, request_changes or reject")],
    reason: Annotated[str | None, typer.Option(help="Why; recorded with the decision.")] = None,
    instructions: Annotated[str | None, typer.Option(help="For request_changes: what to change.")] = None,
    override: Annotated[
        list[str] | None, typer.Option("--override", help="A policy to override (needs override + a reason).")
    ] = None,
    compensation: Annotated[
        str | None, typer.Option(help="For reject: auto_revert, manual_review (default) or approve_and_merge.")
    ] = None,
    expected_version: Annotated[
        int | None,
        typer.Option(
            help="The version you decided on (session status shows it): sent again after the session moved on, "
            "the first result is returned instead of deciding the next gate."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Decide on a session in verifying, or on the workflow approval step it waits on, as the local operator
    (idempotent: the same decision twice is one). A workflow then goes on in this process until it must wait for
    a person again or ends, printing its step runs."""

    async def work(services: App):
        full_id = await services.sessions.resolve_id(session_id)
        operator_id, _ = _operator_actor(services, None)
        cmd = Decide(full_id, operator_id, decision, reason, instructions, tuple(override or ()), compensation,
                     expected_version)  # fmt: skip
        before = await services.sessions.get(full_id)
        known = await _marks(services, full_id)
        result = await services.decisions.decide(cmd)
        if not as_json:
            console.print(result.summary(), highlight=False)
            for record in result.follow_ups:
                console.print(f"  then {record.trigger}: {record.from_state} → [green]{record.to_state}[/green]")
            for warning in result.warnings:
                console.print(f"  [yellow]warning:[/yellow] {escape(terminal_safe(warning))}")
            if (hint := next_after_decision(result.session)) is not None:
                console.print(f"  next: {escape(hint)}", highlight=False)
        if services.workflows is None:
            return result, None
        # the decision kicked what follows (the workflow's next step, or agents relaunched by request_changes) in
        # this process: drive it here until it must wait for a person or ends
        if before.workflow_stack or result.session.workflow_stack:
            return result, await _drive(services, full_id, known=known, quiet=as_json)
        if as_json or result.session.state != SessionState.EXECUTING:
            await services.workflows.wait(full_id)
        else:
            await agent_lines.follow_agents(services, full_id, until=services.workflows.wait(full_id))
        return result, None

    result, outcome = run(work)
    if as_json:
        render.print_json(result.decision)
    elif outcome is not None:
        _report(outcome)


def next_after_decision(session: Session) -> str | None:
    """What the operator can do next once a decision left the session where it is (a reject used to say nothing)."""
    short, task = session.id[:8], session.task_id
    if session.state == SessionState.FAILED:
        return (
            f"it waits for you (manual review): `taskgate session fire {short} retry` runs its agents again, told why "
            f"it failed; `taskgate session fire {short} cancel` frees task {task} for a new session"
        )
    if session.state in (SessionState.COMPLETED, SessionState.ROLLED_BACK, SessionState.CANCELLED):
        merge = session.state_data.get("merge")
        if isinstance(merge, dict):
            return f"its work is on {merge.get('into', 'the base')}; `taskgate session review {short}` shows it"
        return f"its work was discarded; task {task} is open again: `taskgate session start {task}` starts it anew"
    if session.state == SessionState.AWAITING_MERGE:
        return f"`taskgate session merge {short}` lands it (rebasing onto a moved base first)"
    if session.state == SessionState.EXECUTING:
        return f"its agents work on your instructions; `taskgate session watch {short}` follows them"
    return None


@session_app.command("execute")
def session_execute(
    session_id: Annotated[str, typer.Argument()],
    agent: Annotated[list[str] | None, typer.Option("--agent", help="Agent type to launch (repeat).")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Supervise the agents until they end.")] = True,
) -> None:
    """planning → executing, launch the session's agents into its worktree, and follow them until they end.

    This command supervises the agents it starts. With --no-wait it returns once every agent has started
    (agents beyond the concurrency limits start as earlier ones end, so it may wait for those); they run on
    in their own process groups, and the next `taskgate serve` re-attaches to them, but the MCP endpoint this
    command served them ends with it. `session watch` follows them."""

    async def work(services: App):
        assert services.agents is not None
        full_id = await services.sessions.resolve_id(session_id)
        known = await _marks(services, full_id)
        actor = _local_actor(services)
        launched = await services.agents.execute(full_id, actor, agent or [])
        if launched.session.workflow_stack and not launched.agents:
            view = _engine(services).view(launched.session)
            console.print(
                f"session {full_id[:8]} is executing workflow {view.breadcrumb}", highlight=False, markup=False
            )
            if wait:
                driving = _drive(services, full_id, known=known, quiet=False)
                return await interruptible(services, full_id, actor, driving)
            await _until_launched(services, full_id, known)
            return await _outcome(services, full_id)
        console.print(f"session {full_id[:8]} is executing; {len(launched.agents)} agent(s) launched")
        if wait:  # Ctrl-C stops the agents (their MCP endpoint is this process's): cli/interrupts.py
            following = agent_lines.follow_agents(services, full_id, until=services.agents.wait(full_id))
            if isinstance(done := await interruptible(services, full_id, actor, following), Interrupted):
                return done
        else:
            await services.agents.started(full_id)
        return await services.sessions.get(full_id)

    done = run(work)
    if isinstance(done, Interrupted):
        print_stopped(done.stopped)
        raise typer.Exit(INTERRUPTED_EXIT)
    if not wait:  # this process served the agents' MCP endpoint; it is gone with it
        err_console.print("note: the agents run on without taskgate's MCP tools (this command served them); run "
                          "`taskgate serve` for long runs", highlight=False, markup=False)  # fmt: skip
    if isinstance(done, _Outcome):
        _report(done)
        return
    console.print(f"session {done.id[:8]} is now [bold]{done.state.value}[/bold]")


@session_app.command("watch")
def session_watch(
    session_id: Annotated[str, typer.Argument()],
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 0.5,
) -> None:
    """Follow a session's agents live (status, heartbeat, last output line) until none is queued or running.

    It only reads: the process that launched the agents (`taskgate serve`, or `session execute`) supervises them."""

    async def work(services: App):
        assert services.agents is not None
        full_id = await services.sessions.resolve_id(session_id)

        async def settled() -> None:  # reads only: whoever supervises the agents (serve, execute) records them
            while any(a.status.value in {"queued", "running"} for a in await services.agents.agents(full_id)):
                await asyncio.sleep(interval)

        await agent_lines.follow_agents(services, full_id, until=settled(), interval=interval)
        return await services.sessions.get(full_id)

    session = run(work)
    console.print(f"session {session.id[:8]} is now [bold]{session.state.value}[/bold]")


@session_app.command("merge")
def session_merge(
    session_id: Annotated[str, typer.Argument()],
    reason: Annotated[str | None, typer.Option(help="Recorded in the transition log.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Merge an approved session into its base (rebasing first if the base moved), then clean it up.

    A conflict or a dirty worktree changes nothing and names the files; the session stays awaiting_merge."""
    session_fire(session_id, "merge", reason=reason, expected_version=None, operator=None, as_json=as_json)


@session_app.command("adopt")
def session_adopt(
    session_id: Annotated[str, typer.Argument(help="Session id or a unique prefix of it.")],
    without_worktree: Annotated[
        bool, typer.Option("--without-worktree", help="Adopt even when its worktree is not usable here (to end it).")
    ] = False,
    operator: Annotated[str | None, typer.Option("--operator")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Move a down node's session to this node (docs/nodes.md): its node must be marked down, its worktree usable
    here, and none of its agents still running on this host. An executing session is abandoned (its run died with
    its node): `session fire ID resume` runs it again here."""

    async def work(services: App):
        assert services.adoption is not None
        full_id = await services.sessions.resolve_id(session_id)
        _, actor = _operator_actor(services, operator)
        return await services.adoption.adopt(full_id, actor, without_worktree=without_worktree)

    adopted = run(work)
    if as_json:
        render.print_json(adopted)
        return
    session = adopted.session
    console.print(f"session {session.id[:8]} adopted from node {adopted.from_node} by node {session.node_id}; "
                  f"now {session.state.value}", highlight=False, markup=False)  # fmt: skip
    if adopted.agents_failed:
        console.print(f"  agents lost with the node, now failed: {', '.join(adopted.agents_failed)}", highlight=False)
    if adopted.worktree != "reachable":
        console.print(f"  without its worktree: {terminal_safe(adopted.worktree)}", highlight=False, markup=False)


@session_app.command("review")
def session_review(
    session_id: Annotated[str, typer.Argument()],
    patch: Annotated[bool, typer.Option("--patch", help="Print the full diff too.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """What the session changed: diff stat against its base, commits, and the state of its worktree; then one line
    per agent of the last run with what its CLI reported (final message, turns, tokens, cost)."""

    async def work(services: App):
        full_id = await services.sessions.resolve_id(session_id)
        agents = await services.agents.agents(full_id) if services.agents is not None else []
        session = await services.sessions.get(full_id)
        owed = await _owed_to_tracker(services, session.task_id)
        return await services.workspaces.review(full_id), latest_run(agents), owed

    review, agents, owed = run(work)
    if as_json:
        render.print_json({**render.jsonable(review), "agents": agents, "tracker_writebacks": owed})
        return
    console.print(render.review_table(review))
    for agent in agents:  # the last run's agents: what each said it did, and what it cost
        console.print(agent_lines.agent_line(agent), markup=False, highlight=False, soft_wrap=True)
    _print_owed(owed)
    if patch:
        console.print(review.patch + ("\n[yellow](patch truncated)[/yellow]" if review.patch_truncated else ""),
                      markup=False, highlight=False)  # fmt: skip


@session_app.command("checkpoint")
def session_checkpoint(
    session_id: Annotated[str, typer.Argument()],
    note: Annotated[str, typer.Option("--note", "-m", help="What you checked and concluded.")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Record a review checkpoint: the session's diff stat, commits and worktree state, with a note."""

    async def work(services: App):
        full_id = await services.sessions.resolve_id(session_id)
        return await services.workspaces.checkpoint(full_id, note, _local_actor(services))

    snapshot = run(work)
    if as_json:
        render.print_json(snapshot)
        return
    data = snapshot.data
    console.print(
        f"checkpoint {snapshot.id} of session {snapshot.session_id[:8]} recorded: {data['branch']} is "
        f"{data['ahead']} commit(s) ahead of {data['base_ref']}, {len(data['diff_stat'])} file(s) changed",
        highlight=False,
        markup=False,
    )


@session_app.command("outputs")
def session_outputs(session_id: Annotated[str, typer.Argument()], as_json: JsonOpt = False) -> None:
    """The files saved into the session folder (data/agent-outputs/ID/), as its manifest.json lists them."""

    async def work(services: App):
        assert services.outputs is not None, "the app was not built by bootstrap()"
        full_id = await services.sessions.resolve_id(session_id)
        return services.outputs.folder(full_id), await services.outputs.manifest(full_id)

    folder, manifest = run(work)
    if as_json:
        render.print_json({"folder": folder, **manifest})
        return
    rows = [(o["path"], o["bytes"], o["at"], o["by"], o["sha256"][:12]) for o in manifest["outputs"]]
    title = f"Outputs of session {manifest['session'][:8]} ({manifest['status'] or 'no manifest yet'}) in {folder}"
    console.print(render.table(title, ["path", "bytes", "saved at", "by", "sha256"], rows, markup=False))


@session_app.command("list")
def session_list(
    all_states: Annotated[bool, typer.Option("--all", help="Include completed and cancelled sessions.")] = False,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List active sessions (or all of them)."""

    def listing(services: App, found: Project):
        if all_states:
            return services.sessions.list_sessions(found.id)
        return services.sessions.active_sessions(found.id)

    sessions = run_in_project(project, listing)
    emit([render.session_json(s) for s in sessions], as_json, lambda: render.sessions_table(sessions))


@session_app.command("history")
def session_history(
    session_id: Annotated[str, typer.Argument()],
    limit: Annotated[int, typer.Option("--limit", help="Newest N rows.")] = 100,
    as_json: JsonOpt = False,
) -> None:
    """The session's transition log (applied and blocked), oldest first."""

    async def work(services: App):
        return await services.sessions.history(await services.sessions.resolve_id(session_id), limit)

    records = run(work)
    emit(records, as_json, lambda: render.transitions_table(records))


@session_app.command("state-at")
def session_state_at(
    session_id: Annotated[str, typer.Argument()],
    timestamp: Annotated[str, typer.Argument(help="ISO 8601; no zone means UTC.")],
    as_json: JsonOpt = False,
) -> None:
    """The state the session was in at TIMESTAMP, rebuilt by replaying its log."""
    at = _timestamp_or_fail(timestamp)

    async def work(services: App):
        return await services.sessions.state_at(await services.sessions.resolve_id(session_id), at)

    state = run(work)
    if as_json:
        render.print_json({"session_id": session_id, "at": at, "state": state})
        return
    print(state.value)
