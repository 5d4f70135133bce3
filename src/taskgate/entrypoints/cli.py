"""The `taskgate` command line (Typer + Rich). Every command exits non-zero with a one-line reason on error."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Awaitable, Callable
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.markup import escape

from taskgate import __version__
from taskgate.application.beads_import import BeadsImporter, ImportBeads, ImportReport
from taskgate.application.decisions import Decide
from taskgate.application.operators import AddOperator
from taskgate.application.ports import TransitionQuery
from taskgate.application.sessions import FireTrigger, StartTask
from taskgate.application.timestamps import parse_timestamp
from taskgate.application.tracker import AddTask
from taskgate.application.workflow_engine import StackView, WorkflowEngine, stack_view_json
from taskgate.application.workflows import WorkflowService
from taskgate.bootstrap import App, bootstrap, database_report, load_settings, workflow_catalogue
from taskgate.domain import session_fsm
from taskgate.domain.access import DECISION_TRIGGERS, Capability, Principal
from taskgate.domain.entities import Outcome, Project, Session
from taskgate.domain.errors import InvalidInput, TaskgateError
from taskgate.domain.states import SessionState
from taskgate.domain.workflows import matches_pattern
from taskgate.domain.workflows import to_mermaid as to_workflow_mermaid
from taskgate.entrypoints import render
from taskgate.entrypoints.render import console, err_console

T = TypeVar("T")

# Help is plain text (Typer passes rich_markup_mode down to every sub-command): under Rich markup, help that names
# config tables (`[agents.NAME]`, `[[mcp.tokens]]`, `[sweeper]`) lost them.
app = typer.Typer(
    help="taskgate: run AI coding agents in guarded, audited sessions.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)
plan_app = typer.Typer(help="Plans (phases) of a project.", no_args_is_help=True)
task_app = typer.Typer(help="Tasks of the built-in tracker.", no_args_is_help=True)
session_app = typer.Typer(help="Sessions: one guarded state machine per task.", no_args_is_help=True)
audit_app = typer.Typer(help="Audit queries over the transition log.", no_args_is_help=True)
project_app = typer.Typer(help="Registered projects.", no_args_is_help=True)
token_app = typer.Typer(help="Bearer tokens for the MCP HTTP transport.", no_args_is_help=True)
worktrees_app = typer.Typer(help="Session worktrees on disk: list them, reconcile them with the sessions.")
operator_app = typer.Typer(help="Operators, their roles and permissions (admins only).", no_args_is_help=True)
policies_app = typer.Typer(help="Policies that guard transitions: list them, dry-run them.", no_args_is_help=True)
for sub, name in (
    (operator_app, "operator"),
    (policies_app, "policies"),
    (worktrees_app, "worktrees"),
    (token_app, "token"),
    (project_app, "project"),
    (plan_app, "plan"),
    (task_app, "task"),
    (session_app, "session"),
    (audit_app, "audit"),
):
    app.add_typer(sub, name=name)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ProjectOpt = Annotated[str | None, typer.Option("--project", "-p", help="Project id, name or key.")]


def fail(message: str, code: int = 1) -> None:
    """Print a one-line error to stderr and exit with `code`. The message is text, never Rich markup: errors
    quote config tables (`[agents.NAME]`, `[[mcp.tokens]]`) and people's input."""
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def run(work: Callable[[App], Awaitable[T]]) -> T:
    """Open taskgate (settings, database, migrations), run `work`, close. Errors become one line and exit 1."""

    async def main() -> T:
        services = await bootstrap(load_settings())
        try:
            return await work(services)
        finally:
            await services.close()

    try:
        return asyncio.run(main())
    except TaskgateError as exc:
        fail(str(exc))
    except Exception as exc:  # the promise is one line, never a traceback, unless asked for
        if os.environ.get("TASKGATE_DEBUG"):
            raise
        fail(f"internal error: {type(exc).__name__}: {exc} (set TASKGATE_DEBUG=1 for a traceback)", 3)
    raise AssertionError("unreachable")


def run_in_project(project: str | None, work: Callable[[App, Project], Awaitable[T]]) -> T:
    """`run`, with the project named by `project` (or implied by the current directory) resolved first."""

    async def with_project(services: App) -> T:
        return await work(services, await services.tracker.resolve_project(project, os.getcwd()))

    return run(with_project)


def emit(value: object, as_json: bool, as_table: Callable[[], object]) -> None:
    """Print `value` as JSON, or the renderable `as_table()` builds."""
    if as_json:
        render.print_json(value)
    else:
        console.print(as_table())


def _timestamp_or_fail(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return parse_timestamp(text)
    except InvalidInput as exc:
        fail(str(exc))
    raise AssertionError("unreachable")


@app.callback()
def _root(
    config: Annotated[
        Path | None, typer.Option("--config", help="Config file (else $TASKGATE_CONFIG, else ./config/taskgate.toml).")
    ] = None,
) -> None:
    if config is not None:
        os.environ["TASKGATE_CONFIG"] = str(config)


@app.command()
def version() -> None:
    """Print taskgate's version."""
    print(__version__)


@app.command()
def info(as_json: JsonOpt = False) -> None:
    """Say which config file, data directory and database taskgate uses, and the schema revision."""

    async def work(services: App) -> dict[str, object]:
        settings = services.settings
        assert settings is not None
        return {
            "version": __version__,
            "config_file": str(settings.config_file) if settings.config_file else None,
            "data_dir": str(settings.data_dir),
            **await database_report(services),
            "default_operator": settings.operator.default,
            "wip_limit": settings.policies.wip_limit.limit,
        }

    report = run(work)
    if as_json:
        render.print_json(report)
        return
    for key, value in report.items():
        shown = value if value is not None else "(none: built-in defaults)" if key == "config_file" else "-"
        console.print(f"[bold]{key:>17}[/bold]  {escape(str(shown))}", highlight=False)


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="A directory inside the git repository to register.")] = Path("."),
    name: Annotated[str | None, typer.Option(help="Project name (default: the repository folder's name).")] = None,
) -> None:
    """Register a git repository as a project, and set up the default local operator."""

    async def work(services: App):
        project = await services.tracker.init_project(str(path), name, _local_actor(services))
        assert services.settings is not None
        operator = await services.tracker.ensure_operator(services.settings.operator.default)
        return project, operator

    project, operator = run(work)
    console.print(
        f"project [bold]{escape(project.name)}[/bold] (id {project.id}, key {project.key}) at "
        f"{escape(project.root_path)}"
    )
    console.print(f"operator [bold]{escape(operator.id)}[/bold] ready; task ids look like {project.key}-1")


@project_app.command("list")
def project_list(as_json: JsonOpt = False) -> None:
    """List registered projects."""
    projects = run(lambda services: services.tracker.list_projects())
    rows = ([p.id, p.name, p.key, p.status.value, p.root_path] for p in projects)
    emit(
        projects, as_json, lambda: render.table("Projects", ["id", "name", "key", "status", "root"], rows, markup=False)
    )


@project_app.command("archive")
def project_archive(project: Annotated[str, typer.Argument(help="Project id, name or key.")]) -> None:
    """Archive a project: read-only, no new sessions. Refused while it has active sessions."""

    async def work(services: App):
        found = await services.tracker.resolve_project(project)
        return await services.tracker.archive_project(found.id, _local_actor(services))

    archived = run(work)
    console.print(f"project [bold]{escape(archived.name)}[/bold] archived")


@plan_app.command("add")
def plan_add(
    name: Annotated[str, typer.Argument(help="Plan name, e.g. 'Phase 1'.")],
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a plan (phase) to a project."""
    plan = run_in_project(
        project, lambda services, found: services.tracker.add_plan(found.id, name, _local_actor(services))
    )
    emit(plan, as_json, lambda: f"plan [bold]{plan.name}[/bold] added (id {plan.id})")


@plan_app.command("list")
def plan_list(project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """List the plans of a project."""

    plans = run_in_project(project, lambda services, found: services.tracker.list_plans(found.id))
    emit(
        plans,
        as_json,
        lambda: render.table(
            "Plans", ["id", "name", "status"], ([p.id, p.name, p.status.value] for p in plans), markup=False
        ),
    )


@task_app.command("add")
def task_add(
    title: Annotated[str, typer.Argument(help="What the task is.")],
    description: Annotated[str, typer.Option("--description", "-d")] = "",
    plan: Annotated[int | None, typer.Option("--plan", help="Plan id.")] = None,
    priority: Annotated[int, typer.Option("--priority", help="0 (most urgent) .. 4.")] = 2,
    blocked_by: Annotated[
        list[str] | None, typer.Option("--blocked-by", help="A blocking task id (repeatable).")
    ] = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a task to the built-in tracker. A closed plan (its tasks all completed) is reopened by it."""

    def add(services: App, found: Project):
        command = AddTask(found.id, title, description, plan, priority, blocked_by or [], _local_actor(services))
        return services.tracker.add(command)

    added = run_in_project(project, add)
    task, note = added.task, added.note()
    reopened = added.reopened.id if added.reopened else None
    emit(
        {**render.jsonable(task), "plan_reopened": reopened},
        as_json,
        lambda: f"task [bold]{task.id}[/bold] added: {task.title}" + (f"\n{note}" if note else ""),
    )


@task_app.command("list")
def task_list(
    plan: Annotated[int | None, typer.Option("--plan")] = None,
    status: Annotated[str | None, typer.Option("--status")] = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List tasks, oldest first."""

    tasks = run_in_project(project, lambda services, found: services.tracker.list_tasks(found.id, plan, status))
    emit(tasks, as_json, lambda: render.tasks_table(tasks))


@task_app.command("ready")
def task_ready(project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """Tasks that can start now: open, no active session, every blocker completed, plan not closed; most urgent
    first."""

    tasks = run_in_project(project, lambda services, found: services.tracker.ready_tasks(found.id))
    emit(tasks, as_json, lambda: render.tasks_table(tasks, "Ready tasks"))


@task_app.command("import-beads")
def task_import_beads(
    path: Annotated[Path, typer.Argument(help="A Beads JSONL export, e.g. .beads/issues.jsonl.")],
    plan: Annotated[int | None, typer.Option("--plan", help="Plan id for the new tasks.")] = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Import Beads issues as built-in tasks (again: updates them). Malformed lines are reported and skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {path}: {exc}")

    async def work(services: App, found: Project) -> ImportReport:
        assert services.uow is not None and services.clock is not None
        importer = BeadsImporter(services.uow, services.clock)
        say = None if as_json else (lambda message: console.print(message, highlight=False, markup=False))
        return await importer.import_jsonl(ImportBeads(found.id, text, plan, _local_actor(services)), say)

    report = run_in_project(project, work)
    if as_json:
        render.print_json({"counts": report.counts(), **render.jsonable(report)})
        return
    counts = report.counts()
    console.print(", ".join(f"{n} {what}" for what, n in counts.items()), highlight=False)
    for problem in report.skipped:
        console.print(f"  skipped line {problem.line}: {problem.reason}", highlight=False, markup=False)
    for problem in report.warnings:
        console.print(f"  note, line {problem.line}: {problem.reason}", highlight=False, markup=False)
    if report.reopened_plan is not None:
        console.print(f"plan {report.reopened_plan} was closed and is open again", highlight=False)


def _local_actor(services: App) -> str:
    """The CLI acts as the configured local operator."""
    return _operator_actor(services, None)[1]


def _operator_actor(services: App, operator: str | None) -> tuple[str, str]:
    assert services.settings is not None
    operator_id = operator or services.settings.operator.default
    return operator_id, f"operator:{operator_id}"


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
        chosen = _engine(services).chosen(workflow)  # an unknown name is refused before anything is written
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
        outcome = await _drive(services, full_id, known=known, quiet=as_json) if result.session.workflow_stack else None
        if outcome is None and trigger in _RELAUNCHING and services.workflows is not None:
            # retry and request_changes relaunched the session's agents in this process: supervise them to the end
            done = services.workflows.wait(full_id)
            await (done if as_json else render.follow_agents(services, full_id, until=done))
        return result, outcome

    result, outcome = run(work)
    if as_json:
        render.print_json(result.record)
    elif outcome is not None:
        _report(outcome)


_RELAUNCHING = frozenset({"retry", "request_changes"})


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
        return await services.sessions.get(await services.sessions.resolve_id(session_id))

    session = run(work)
    if as_json:
        render.print_json(render.session_json(session))
        return
    allowed = session_fsm.allowed_triggers(session.state, session.prior_state)
    for key, value in render.jsonable(session).items():
        shown = escape(str(value)) if value not in (None, {}, []) else "-"  # state_data holds people's text
        console.print(f"[bold]{key:>17}[/bold]  {shown}", highlight=False)
    if session.escalated_at is not None:
        at, short = session.escalated_at.isoformat(timespec="seconds"), session.id[:8]
        note = f"waiting too long for a decision: taskgate session decide {short} approve|request_changes|reject"
        console.print(f"[bold]{'escalated':>17}[/bold]  [bold red]{at}[/bold red] ({note})", highlight=False)
    console.print(f"[bold]{'next triggers':>17}[/bold]  {', '.join(allowed) or '-'}", highlight=False)


@session_app.command("status")
def session_status(session_id: Annotated[str, typer.Argument()], as_json: JsonOpt = False) -> None:
    """A session's state and its workflow: depth, breadcrumb (workflow › step › nested workflow › step), and
    what it waits for (an approval's message, checklist items to tick) with the commands that answer it."""

    async def work(services: App):
        session = await services.sessions.get(await services.sessions.resolve_id(session_id))
        return session, _engine(services).view(session)

    session, view = run(work)
    if as_json:
        allowed = session_fsm.allowed_triggers(session.state, session.prior_state)
        render.print_json({**render.jsonable(session), "next_triggers": list(allowed),
                           "workflow": stack_view_json(view)})  # fmt: skip
        return
    render.print_workflow_status(session, view)


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
        if services.workflows is None:
            return result, None
        # the decision kicked what follows (the workflow's next step, or agents relaunched by request_changes) in
        # this process: drive it here until it must wait for a person or ends
        if before.workflow_stack or result.session.workflow_stack:
            return result, await _drive(services, full_id, known=known, quiet=as_json)
        if as_json or result.session.state != SessionState.EXECUTING:
            await services.workflows.wait(full_id)
        else:
            await render.follow_agents(services, full_id, until=services.workflows.wait(full_id))
        return result, None

    result, outcome = run(work)
    if as_json:
        render.print_json(result.decision)
    elif outcome is not None:
        _report(outcome)


@session_app.command("execute")
def session_execute(
    session_id: Annotated[str, typer.Argument()],
    agent: Annotated[list[str] | None, typer.Option("--agent", help="Agent type to launch (repeat).")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Supervise the agents until they end.")] = True,
) -> None:
    """planning → executing, launch the session's agents into its worktree, and follow them until they end.

    This command supervises the agents it starts. With --no-wait it returns once every agent has started
    (agents beyond the concurrency limits start as earlier ones end, so it may wait for those); they run on
    in their own process groups, and the next `taskgate serve` re-attaches to them. `session watch` follows
    them."""

    async def work(services: App):
        assert services.agents is not None
        full_id = await services.sessions.resolve_id(session_id)
        known = await _marks(services, full_id)
        launched = await services.agents.execute(full_id, _local_actor(services), agent or [])
        if launched.session.workflow_stack and not launched.agents:
            view = _engine(services).view(launched.session)
            console.print(
                f"session {full_id[:8]} is executing workflow {view.breadcrumb}", highlight=False, markup=False
            )
            if wait:
                return await _drive(services, full_id, known=known, quiet=False)
            await _until_launched(services, full_id, known)
            return await _outcome(services, full_id)
        console.print(f"session {full_id[:8]} is executing; {len(launched.agents)} agent(s) launched")
        if wait:
            await render.follow_agents(services, full_id, until=services.agents.wait(full_id))
        else:
            await services.agents.started(full_id)
        return await services.sessions.get(full_id)

    done = run(work)
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

        await render.follow_agents(services, full_id, until=settled(), interval=interval)
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


@session_app.command("review")
def session_review(
    session_id: Annotated[str, typer.Argument()],
    patch: Annotated[bool, typer.Option("--patch", help="Print the full diff too.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """What the session changed: diff stat against its base, commits, and the state of its worktree."""

    async def work(services: App):
        return await services.workspaces.review(await services.sessions.resolve_id(session_id))

    review = run(work)
    if as_json:
        render.print_json(review)
        return
    console.print(render.review_table(review))
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


class AuditFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


@audit_app.command("transitions")
def audit_transitions(
    session: Annotated[str | None, typer.Option("--session", help="Session id or prefix.")] = None,
    actor: Annotated[str | None, typer.Option("--actor", help="e.g. operator:alice or system.")] = None,
    state: Annotated[str | None, typer.Option("--state", help="Transitions that entered this state.")] = None,
    outcome: Annotated[str | None, typer.Option("--outcome", help="applied or blocked.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="ISO 8601, inclusive.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="ISO 8601, inclusive.")] = None,
    limit: Annotated[int, typer.Option("--limit")] = 1000,
    fmt: Annotated[AuditFormat, typer.Option("--format")] = AuditFormat.table,
    as_json: JsonOpt = False,
) -> None:
    """Query the transition log: who moved which session where, when, and what the guards said."""
    since_at, until_at = _timestamp_or_fail(since), _timestamp_or_fail(until)

    async def work(services: App):
        session_id = await services.sessions.resolve_id(session) if session else None
        return await services.audit.transitions(
            TransitionQuery(session_id, actor, state, outcome, since_at, until_at, limit)
        )

    records = run(work)
    if as_json or fmt == AuditFormat.json:
        render.print_json(records)
    elif fmt == AuditFormat.csv:
        print(render.transitions_csv(records), end="")
    else:
        console.print(render.transitions_table(records))


class FsmFormat(StrEnum):
    table = "table"
    mermaid = "mermaid"
    json = "json"


@app.command()
def fsm(fmt: Annotated[FsmFormat, typer.Option("--format")] = FsmFormat.table) -> None:
    """The session state machine, generated from the transition table."""
    if fmt == FsmFormat.mermaid:
        print(session_fsm.to_mermaid())
        return
    rows = [
        (
            r.trigger.value,
            ", ".join(sorted(s.value for s in r.sources)) or "(new)",
            r.dest.value,
            r.when_prior.value if r.when_prior else "",
            r.initiator.value,
            r.description,
        )
        for r in session_fsm.TRANSITIONS
    ]
    if fmt == FsmFormat.json:
        keys = ["trigger", "sources", "dest", "when_prior", "initiator", "description"]
        render.print_json([dict(zip(keys, row, strict=True)) for row in rows])
        return
    console.print(render.table("Session transitions", ["trigger", "from", "to", "when prior", "by", "what"], rows))


@app.command()
def demo(
    workdir: Annotated[Path | None, typer.Option(help="Where to put the scratch repo and database.")] = None,
) -> None:
    """Run the guided demo on a scratch git repository and a fresh SQLite database."""
    from taskgate.entrypoints.demo import run_demo

    try:
        asyncio.run(run_demo(workdir))
    except TaskgateError as exc:
        fail(str(exc))


@app.command()
def serve(
    http: Annotated[bool, typer.Option("--http", help="Streamable HTTP (bearer tokens) instead of stdio.")] = False,
    host: Annotated[str | None, typer.Option(help="HTTP host (default: mcp.host, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default: mcp.port, 8765).")] = None,
) -> None:
    """Run the MCP server: over stdio as the local operator, or over HTTP for token holders."""
    from taskgate.entrypoints.mcp.runner import serve_http, serve_stdio

    try:
        settings = load_settings()
        if http:
            serve_http(settings, host or settings.mcp.host, port or settings.mcp.port)
        else:
            serve_stdio(settings)
    except TaskgateError as exc:
        fail(str(exc))


@token_app.command("create")
def token_create(
    operator: Annotated[str | None, typer.Option("--operator", help="An operator token for this operator id.")] = None,
    agent: Annotated[bool, typer.Option("--agent", help="An agent token, scoped to --session.")] = False,
    session: Annotated[str | None, typer.Option("--session", help="The session an agent token reaches.")] = None,
    label: Annotated[str, typer.Option("--label", help="A note to recognise the token by.")] = "",
    config_entry: Annotated[
        bool,
        typer.Option(
            "--config-entry",
            help="Store nothing: print the token and a [[mcp.tokens]] entry (its hash) for the config.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Issue a bearer token. It is shown once; only its hash is stored (in the database, or in your config)."""
    if agent == (operator is not None) or (agent and not session) or (session and not agent):
        fail("give either --operator ID, or --agent --session ID")
    if config_entry:
        _print_config_entry(operator, session, label)
        return

    async def work(services: App):
        await _as_admin(services)
        if agent:
            assert session is not None
            return await services.access.create_agent_token(await services.sessions.resolve_id(session), label)
        assert operator is not None
        return await services.access.create_operator_token(operator, label)

    issued = run(work)
    if as_json:
        render.print_json({**render.jsonable(issued.token), "token_hash": None, "token": issued.secret})
        return
    console.print(f"token {issued.token.id} ({issued.token.kind}) created; it is shown only this once:")
    print(issued.secret)


def _print_config_entry(operator: str | None, session: str | None, label: str) -> None:
    from taskgate.application.access import AccessService

    secret, digest = AccessService.new_secret()
    owner = f'operator = "{operator}"' if operator else f'session = "{session}"'
    console.print("the token (shown only this once; give it to the client):", highlight=False)
    print(secret)
    console.print("add this to config/taskgate.toml (it holds only the hash):", highlight=False)
    print(f'[[mcp.tokens]]\n{owner}\nsha256 = "{digest}"\nlabel = "{label}"')


@token_app.command("list")
def token_list(as_json: JsonOpt = False) -> None:
    """List issued tokens (never their secrets)."""
    tokens = run(lambda services: services.access.list_tokens())
    rows = (
        [
            t.id,
            t.kind,
            t.operator_id or "",
            t.session_id or "",
            t.label,
            t.created_at.isoformat(timespec="seconds"),
            "revoked" if t.revoked_at else "active",
        ]
        for t in tokens
    )
    emit(
        [{**render.jsonable(t), "token_hash": None} for t in tokens],
        as_json,
        lambda: render.table(
            "Tokens", ["id", "kind", "operator", "session", "label", "created", "status"], rows, markup=False
        ),
    )


@token_app.command("revoke")
def token_revoke(token_id: Annotated[str, typer.Argument(help="The token id (see token list).")]) -> None:
    """Revoke a token: it stops working at once."""

    async def work(services: App):
        await _as_admin(services)
        return await services.access.revoke(token_id)

    token = run(work)
    console.print(f"token {token.id} revoked")


@policies_app.command("list")
def policies_list(project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """The policies of a project (with -p; else the only project's, or the global set): priority, severity,
    triggers, enabled, settings."""

    async def work(services: App):
        name = (await services.tracker.resolve_project(project, os.getcwd())).name if project else None
        if name is None:
            projects = [p for p in await services.tracker.list_projects() if p.archived_at is None]
            name = projects[0].name if len(projects) == 1 else None
        return name, services.sessions.policies(name), services.sessions.test_command(name)

    name, entries, command = run(work)
    if as_json:
        render.print_json({"project": name, "test_command": list(command), "policies": [e.as_dict() for e in entries]})
        return
    console.print(render.policies_table(name, entries, command))


@policies_app.command("check")
def policies_check(
    session_id: Annotated[str, typer.Argument(help="Session id or a unique prefix of it.")],
    trigger: Annotated[str, typer.Argument(help="The trigger to dry-run, e.g. approve, merge, start.")],
    run_tests: Annotated[
        bool, typer.Option("--run-tests/--no-run-tests", help="Run require_tests' command if no stored run fits.")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Dry run: what firing TRIGGER on the session now would meet, policy by policy. Writes nothing.
    Exits 0 when the trigger would be allowed, 2 when a policy would refuse it."""

    async def work(services: App):
        full_id = await services.sessions.resolve_id(session_id)
        return await services.sessions.check(full_id, trigger, actor=_local_actor(services), run_tests=run_tests)

    check = run(work)
    if as_json:
        render.print_json(render.policy_check_data(check))
    else:
        render.print_policy_check(check)
    if not check.allowed:
        raise typer.Exit(2)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()


@app.command("context")
def context(
    project: ProjectOpt = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="Ignore the cached snapshot.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The project's git and tracker context (what the context_discover MCP tool returns)."""

    async def work(services: App, found: Project):
        return await services.context.discover(found.id, refresh=refresh)

    found = run_in_project(project, work)
    if as_json:
        render.print_json(found.as_dict())
        return
    console.print(render.context_panel(found))


@worktrees_app.callback(invoke_without_command=True)
def worktrees(ctx: typer.Context, project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """List session worktrees with their session, state and disk use (orphans are marked)."""
    if ctx.invoked_subcommand is not None:
        return

    async def work(services: App):
        found = await services.tracker.resolve_project(project, os.getcwd()) if project else None
        return await services.workspaces.list_worktrees(found.id if found else None)

    rows = run(work)
    emit(rows, as_json, lambda: render.worktrees_table(rows))


@worktrees_app.command("reconcile")
def worktrees_reconcile(
    report_only: Annotated[bool, typer.Option("--report-only", help="Only report orphans; prune nothing.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """What `taskgate serve` does at start: prune (or report) orphan worktrees and branches, flag sessions whose
    worktree vanished, and finish initialisations a crash interrupted."""

    async def work(services: App):
        return await services.workspaces.reconcile(prune=False if report_only else None)

    report = run(work)
    if as_json:
        render.print_json(report)
        return
    console.print(report.summary(), highlight=False)
    found = (
        ("orphan worktree", report.orphan_worktrees),
        ("orphan branch", report.orphan_branches),
        ("missing worktree of session", report.missing_worktrees),
        ("error", report.errors),
    )
    for label, items in found:
        for item in items:
            console.print(f"  {label}: {item}", highlight=False, markup=False)


@app.command("sweep")
def sweep(as_json: JsonOpt = False) -> None:
    """Run the sweeper once (what `taskgate serve` does every [sweeper] interval_s): time out sessions past their
    deadline, escalate or fail verifications waiting for a decision, abandon sessions whose agents went silent."""
    from taskgate.bootstrap import build_sweeper

    report = run(lambda services: build_sweeper(services.settings or load_settings(), services).sweep_once())
    if as_json:
        render.print_json(report)
        return
    console.print(report.summary(), highlight=False)
    for action in report.actions:
        console.print(
            f"  {action.session_id} {action.action} ({action.from_state} -> {action.to_state}): {action.reason}",
            highlight=False,
            markup=False,
        )
    for skip in report.skipped:
        console.print(f"  {skip.session_id} skipped {skip.action}: {skip.why}", highlight=False, markup=False)
    for agent_id in report.silent_agents:
        console.print(f"  agent {agent_id} marked failed (no heartbeat)", highlight=False)
    for error in report.errors:
        console.print(f"  error: {error}", highlight=False, markup=False)


webhooks_app = typer.Typer(help="Webhook deliveries of the events log (see docs/events.md).", no_args_is_help=True)
app.add_typer(webhooks_app, name="webhooks")


def _dispatcher(services: App):
    """The configured webhook dispatcher. Raises: InvalidInput when no `[[webhooks]]` are configured."""
    from taskgate.bootstrap import build_outbox

    assert services.uow is not None and services.clock is not None
    dispatcher = build_outbox(services.settings or load_settings(), services.uow, services.clock)
    if dispatcher is None:
        raise InvalidInput("no webhooks configured: add a [[webhooks]] table to the config (see docs/events.md)")
    return dispatcher


@webhooks_app.command("status")
def webhooks_status(as_json: JsonOpt = False) -> None:
    """Deliveries per webhook: pending, delivered, failed (gave up), and the oldest pending one."""

    async def work(services: App):
        return await _dispatcher(services).status()

    rows = run(work)
    columns = ["webhook", "url", "events", "pending", "delivered", "failed", "oldest pending", "attempts", "next try"]
    emit(
        rows,
        as_json,
        lambda: render.table(
            "Webhooks",
            [*columns, "last error"],
            (
                [
                    s.name,
                    s.url,
                    ", ".join(s.events),
                    s.pending,
                    s.delivered,
                    s.failed,
                    f"event {s.oldest_pending_event_id}" if s.oldest_pending_event_id else "",
                    s.attempts or "",
                    s.next_attempt_at.isoformat(timespec="seconds") if s.next_attempt_at else "",
                    s.last_error,
                ]
                for s in rows
            ),
            markup=False,
        ),
    )


@webhooks_app.command("deliver")
def webhooks_deliver(
    once: Annotated[bool, typer.Option("--once", help="Deliver what is due now, then exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between idle rounds.")] = 1.0,
) -> None:
    """Send the pending webhook deliveries, printing each attempt. Without --once it keeps going (like `taskgate
    serve` does in the background) until interrupted; with --once it stops when nothing more is due now."""

    async def work(services: App):
        dispatcher = _dispatcher(services)
        totals = [0, 0, 0, 0]
        while True:
            report = await dispatcher.run_once()
            for line in report.lines:
                console.print(line, highlight=False, markup=False, soft_wrap=True)
            for i, n in enumerate((report.enqueued, report.delivered, report.retried, report.failed)):
                totals[i] += n
            if report.sent == 0:
                if once:
                    return totals
                await asyncio.sleep(interval)

    try:
        enqueued, delivered, retried, failed = run(work)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    console.print(
        f"enqueued {enqueued}, delivered {delivered}, will retry {retried}, gave up {failed}", highlight=False
    )


RoleOpt = Annotated[list[str] | None, typer.Option("--role", help="architect, developer, reviewer, qa or admin.")]
PermissionOpt = Annotated[
    list[str] | None, typer.Option("--permission", help="An extra permission: read, write, approve, override, admin.")
]


async def _as_admin(services: App) -> str:
    """The local operator, refused unless it may administer operators."""
    operator_id, actor = _operator_actor(services, None)
    await services.operators.authorize(Principal.operator(operator_id), Capability.ADMINISTER)
    return actor


@operator_app.command("add")
def operator_add(
    operator_id: Annotated[str, typer.Argument()],
    role: RoleOpt = None,
    name: Annotated[str | None, typer.Option()] = None,
    email: Annotated[str | None, typer.Option()] = None,
    max_active: Annotated[int, typer.Option("--max-active", help="Sessions it may have in progress.")] = 5,
    permission: PermissionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add an operator with roles (default: developer)."""

    async def work(services: App):
        actor = await _as_admin(services)
        cmd = AddOperator(operator_id, role or ["developer"], name, email, max_active, permission or [], actor)
        return await services.operators.add(cmd)

    operator = run(work)
    emit(operator, as_json, lambda: render.operators_table([operator]))


@operator_app.command("grant")
def operator_grant(
    operator_id: Annotated[str, typer.Argument()],
    role: RoleOpt = None,
    permission: PermissionOpt = None,
    max_active: Annotated[int | None, typer.Option("--max-active")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Give an operator more roles or permissions, or another capacity."""
    if not (role or permission or max_active):
        fail("nothing to grant: pass --role, --permission or --max-active")

    async def work(services: App):
        actor = await _as_admin(services)
        return await services.operators.grant(
            operator_id, roles=role or [], permissions=permission or [], max_active_sessions=max_active, actor=actor
        )

    operator = run(work)
    emit(operator, as_json, lambda: render.operators_table([operator]))


@operator_app.command("list")
def operator_list(as_json: JsonOpt = False) -> None:
    """Operators with their roles, effective permissions and capacity."""
    operators = run(lambda services: services.operators.list())
    emit(operators, as_json, lambda: render.operators_table(operators))


workflow_app = typer.Typer(
    help="Workflows of config/workflows: list, show, validate, graph, create; run them on sessions and edit their "
    "stacks (push, advance, back, break, restart); their step runs.",
    no_args_is_help=True,
)
checklist_app = typer.Typer(help="Checklists of config/checklists; push them onto sessions, tick items.",
                            no_args_is_help=True)  # fmt: skip
app.add_typer(workflow_app, name="workflow")
app.add_typer(checklist_app, name="checklist")


def _workflows() -> WorkflowService:
    """The workflow catalogue of the config dir (no database)."""
    try:
        return workflow_catalogue(load_settings())
    except TaskgateError as exc:
        fail(str(exc))
    raise AssertionError("unreachable")


def _or_fail(work: Callable[[], T]) -> T:
    try:
        return work()
    except TaskgateError as exc:
        fail(str(exc))
    raise AssertionError("unreachable")


PatternArg = Annotated[
    str | None, typer.Argument(help="A glob on the id (`bug-*`), or words to find in the id or description.")
]


@workflow_app.command("list")
def workflow_list(
    pattern: PatternArg = None,
    category: Annotated[str | None, typer.Option("--category", "-c", help="Only this category.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The catalogue's workflows by category (invalid ones marked; `workflow validate` says why)."""
    entries = [e for e in _workflows().entries(category) if matches_pattern(pattern, e.id, e.description)]
    emit(entries, as_json, lambda: render.workflows_table(entries))


@workflow_app.command("show")
def workflow_show(name: Annotated[str, typer.Argument(help="The workflow's id.")], as_json: JsonOpt = False) -> None:
    """A workflow's steps, their types and routes."""
    workflow = _or_fail(lambda: _workflows().workflow(name))
    if as_json:
        render.print_json(workflow.as_dict())
    else:
        console.print(render.workflow_table(workflow))


@workflow_app.command("validate")
def workflow_validate(
    files: Annotated[list[Path] | None, typer.Argument(help="Files to check (default: the whole catalogue).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check workflow and checklist files; one `file:line: message (hint: …)` line per problem, exit 1 if any."""
    result = _or_fail(lambda: _workflows().validate(files or []))
    if as_json:
        render.print_json({
            "ok": result.ok,
            "workflows": sorted(result.workflows),
            "checklists": sorted(result.checklists),
            "problems": [dataclasses.asdict(p) for p in result.problems],
        })  # fmt: skip
    else:
        for problem in result.problems:
            print(problem)
        if result.ok:
            print(f"ok: {len(result.workflows)} workflow(s) and {len(result.checklists)} checklist(s) are valid")
    if not result.ok:
        if not as_json:
            count = len({p.file for p in result.problems})
            err_console.print(
                f"[red]error:[/red] {len(result.problems)} problem(s) in {count} file(s)", highlight=False
            )
        raise typer.Exit(1)


@workflow_app.command("graph")
def workflow_graph(name: Annotated[str, typer.Argument(help="The workflow's id.")]) -> None:
    """The workflow as a mermaid flowchart (paste it into a ```mermaid block)."""
    print(to_workflow_mermaid(_or_fail(lambda: _workflows().workflow(name))))


@workflow_app.command("create")
def workflow_create(
    name: Annotated[str, typer.Argument(help="The new workflow's id (and file name).")],
    template: Annotated[str, typer.Option("--template", "-t", help="A template, or an existing workflow's id.")],
    category: Annotated[
        str | None, typer.Option("--category", "-c", help="Folder under workflows/ (default: the template's).")
    ] = None,
) -> None:
    """Write workflows/<category>/NAME.yaml from a template (never overwriting), then validate it."""
    created = _or_fail(lambda: _workflows().create(name, template, category))
    print(f"created {created.file} from template {created.template}")
    for problem in created.problems:
        print(problem)
    if created.problems:
        fail(f"{created.file} was created but has {len(created.problems)} problem(s); edit it and run validate")


@checklist_app.command("list")
def checklist_list(pattern: PatternArg = None, as_json: JsonOpt = False) -> None:
    """The valid checklists (`workflow validate` reports the others)."""
    found = _workflows().catalogue().checklists.values()
    checklists = sorted((c for c in found if matches_pattern(pattern, c.id, c.description)), key=lambda c: c.id)
    emit([c.as_dict() for c in checklists], as_json, lambda: render.checklists_table(checklists))


@checklist_app.command("show")
def checklist_show(name: Annotated[str, typer.Argument(help="The checklist's id.")], as_json: JsonOpt = False) -> None:
    """A checklist's items."""
    checklist = _or_fail(lambda: _workflows().checklist(name))
    emit(checklist.as_dict(), as_json, lambda: render.checklist_table(checklist))


# -- running workflows on sessions ------------------------------------------------------------------------------

SessionArg = Annotated[str, typer.Argument(help="Session id or a unique prefix of it.")]
_RUNNABLE = {SessionState.READY, SessionState.PLANNING, SessionState.EXECUTING}


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """Where a session stands after this process drove its workflow: the session, its stack, why it failed."""

    session: Session
    view: StackView
    reason: str | None = None


def _engine(services: App) -> WorkflowEngine:
    if services.workflows is None:
        raise InvalidInput("this taskgate runs no workflow engine")
    return services.workflows


async def _marks(services: App, session_id: str) -> dict[int, str]:
    """The step runs seen before a change, so that only what the change causes is printed."""
    if services.workflows is None:
        return {}
    return render.step_marks(await services.workflows.step_runs(session_id))


async def _outcome(services: App, session_id: str) -> _Outcome:
    session = await services.sessions.get(session_id)
    reason = None
    if session.state == SessionState.FAILED:
        records = await services.sessions.history(session_id, 20)
        failed = [r for r in records if r.outcome == Outcome.APPLIED and r.to_state == SessionState.FAILED.value]
        reason = failed[-1].reason if failed else None
    return _Outcome(session, _engine(services).view(session), reason)


async def _drive(services: App, session_id: str, *, known: dict[int, str], quiet: bool) -> _Outcome:
    """Drive the session's workflow in this process until it must wait for a person or ends (state changes kick
    a driver in the process that made them; with no `serve` running, this one is the only driver), printing
    each step run as it starts and ends unless `quiet`."""
    engine = _engine(services)
    if quiet:
        await engine.wait(session_id)
    else:
        await render.follow_steps(services, session_id, until=engine.wait(session_id), known=known)
    return await _outcome(services, session_id)


async def _until_launched(services: App, session_id: str, known: dict[int, str]) -> None:
    """`--no-wait`: until the current step's agents started (or it waits for a person, a retry's delay, or the
    session left executing); the agents then run on in their own process groups."""
    engine = _engine(services)

    async def launched() -> None:
        while True:
            session = await services.sessions.get(session_id)
            view = engine.view(session)
            runs = [r for r in await engine.step_runs(session_id) if r.id not in known]
            if session.state != SessionState.EXECUTING or view.waiting is not None or not view.depth:
                return
            if view.frames[-1]["status"] == "retry" or any(r.status.value == "running" and r.agent_ids for r in runs):
                assert services.agents is not None
                await services.agents.started(session_id)
                return
            await asyncio.sleep(0.1)

    await render.follow_steps(services, session_id, until=_first_of(launched(), engine.wait(session_id)), known=known)


async def _first_of(*work: Awaitable[None]) -> None:
    tasks = [asyncio.ensure_future(w) for w in work]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)


def _report(outcome: _Outcome) -> bool:
    """Print where the session stands; False when it failed."""
    return render.print_workflow_outcome(outcome.session, outcome.view, outcome.reason)


async def _to_executing(services: App, session_id: str, actor: str) -> None:
    """Fire what the session needs to execute its workflow: start (ready), plan_complete (planning); an executing
    session's driver is kicked in this process."""
    session = await services.sessions.get(session_id)
    if session.state == SessionState.READY:
        session = (await services.sessions.fire(FireTrigger(session_id, "start", actor))).session
    if session.state == SessionState.PLANNING:
        assert services.agents is not None
        await services.agents.execute(session_id, actor, [])
    elif session.state == SessionState.EXECUTING:
        _engine(services).kick(session_id)


@workflow_app.command("run")
def workflow_run(
    name: Annotated[str, typer.Argument(help="The workflow's id.")],
    task: Annotated[str | None, typer.Option("--task", "-t", help="Start a session for this task.")] = None,
    session: Annotated[str | None, typer.Option("--session", "-s", help="Run it on this session.")] = None,
    operator: Annotated[str | None, typer.Option("--operator", help="Operator id (default: operator.default).")] = None,
) -> None:
    """Run workflow NAME in the foreground: on a new session for --task, or on --session (pushed if its stack is
    empty). It starts the session if it is ready, executes it if it is planning, then drives it here, printing
    each step run as it starts and ends, until it finishes (verifying), pauses for a person (an approval, a
    checklist: the command to continue is printed) or fails (exit 1, with the reason)."""
    if (task is None) == (session is None):
        fail("give either --task TASK or --session ID")

    async def work(services: App) -> _Outcome:
        engine = _engine(services)
        operator_id, actor = _operator_actor(services, operator)
        workflow = engine.chosen(name)  # an unknown name is refused before anything is written
        assert workflow is not None
        if task is not None:
            started = await services.sessions.start_task(StartTask(task, actor, operator_id))
            session_id = started.session.id
            await engine.attach(session_id, workflow, actor)
            console.print(f"session {session_id} for {task} runs workflow {name}", highlight=False, markup=False)
        else:
            assert session is not None
            session_id = await services.sessions.resolve_id(session)
            await _onto(services, session_id, name, actor)
        known = await _marks(services, session_id)
        await _to_executing(services, session_id, actor)
        return await _drive(services, session_id, known=known, quiet=False)

    try:
        outcome = run(work)
    except KeyboardInterrupt:
        err_console.print("interrupted: agents already started run on; `taskgate serve` picks the workflow up")
        raise typer.Exit(130) from None
    if not _report(outcome):
        raise typer.Exit(1)


async def _onto(services: App, session_id: str, name: str, actor: str) -> None:
    """Put workflow `name` on the session for `workflow run --session`: pushed onto an empty stack; a stack that
    holds it already just runs on. Raises: InvalidInput (another workflow runs, or the state does not run)."""
    current = await services.sessions.get(session_id)
    if current.state not in _RUNNABLE:
        hint = {SessionState.SUSPENDED: "resume it first (taskgate session fire ID resume)",
                SessionState.FAILED: "retry it (taskgate session fire ID retry)"}.get(current.state, "")  # fmt: skip
        raise InvalidInput(f"session {session_id} is {current.state.value}: a workflow runs from ready, planning or "
                           f"executing" + (f"; {hint.replace('ID', session_id)}" if hint else ""))  # fmt: skip
    view = _engine(services).view(current)
    if not view.depth:
        await _engine(services).add_workflow(session_id, name, actor)
        console.print(f"workflow {name} pushed onto session {session_id}", highlight=False, markup=False)
    elif not any(f["kind"] == "workflow" and f["name"] == name for f in view.frames):
        raise InvalidInput(f"session {session_id} already runs {view.breadcrumb}; nest {name} with "
                           f"`taskgate workflow push {session_id} {name}`")  # fmt: skip


def _stack_edit(session_id: str, edit: Callable[[WorkflowEngine, str, str], Awaitable[StackView]],
                done: Callable[[StackView], str], as_json: bool) -> None:  # fmt: skip
    """Run one stack edit as the local operator, then drive what it kicked in this process and say where the
    session stands (`done` says what the edit did, from the stack right after it)."""

    async def work(services: App) -> _Outcome:
        full_id = await services.sessions.resolve_id(session_id)
        known = await _marks(services, full_id)
        view = await edit(_engine(services), full_id, _local_actor(services))
        if not as_json:
            console.print(done(view), highlight=False, markup=False)
        return await _drive(services, full_id, known=known, quiet=as_json)

    outcome = run(work)
    if as_json:
        render.print_json(stack_view_json(outcome.view))
    else:
        _report(outcome)


def _crumb(view: StackView) -> str:
    return view.breadcrumb or "(the stack is empty)"


@workflow_app.command("push")
def workflow_push(session_id: SessionArg, name: Annotated[str, typer.Argument(help="The workflow's id.")],
                  as_json: JsonOpt = False) -> None:  # fmt: skip
    """Push workflow NAME onto the session's stack: it runs on top (nested) and hands back to the frame below
    when it ends. On an empty stack it becomes the session's workflow."""
    _stack_edit(session_id, lambda e, sid, actor: e.add_workflow(sid, name, actor),
                lambda view: f"pushed {name}: depth {view.depth}: {view.breadcrumb}", as_json)  # fmt: skip


@workflow_app.command("advance")
def workflow_advance(session_id: SessionArg, as_json: JsonOpt = False) -> None:
    """Move the top frame past its current step by hand (counted as skipped, routed as a success); its agents
    are stopped. An approval is answered with `session decide` instead."""
    _stack_edit(session_id, lambda e, sid, actor: e.advance(sid, actor), lambda v: f"advanced: {_crumb(v)}", as_json)


@workflow_app.command("back")
def workflow_back(session_id: SessionArg, as_json: JsonOpt = False) -> None:
    """Return the top frame to the step it ran before the current one."""
    _stack_edit(session_id, lambda e, sid, actor: e.back(sid, actor), lambda v: f"back at: {_crumb(v)}", as_json)


@workflow_app.command("break")
def workflow_break(session_id: SessionArg, as_json: JsonOpt = False) -> None:
    """Leave the nested top frame (depth above 1); the step that pushed it counts as skipped."""
    _stack_edit(session_id, lambda e, sid, actor: e.break_frame(sid, actor), lambda v: f"left the frame: {_crumb(v)}",
                as_json)  # fmt: skip


@workflow_app.command("restart")
def workflow_restart(session_id: SessionArg, as_json: JsonOpt = False) -> None:
    """Run the top frame again from its first step, its results cleared."""
    _stack_edit(session_id, lambda e, sid, actor: e.restart(sid, actor), lambda v: f"restarted: {_crumb(v)}", as_json)


@workflow_app.command("steps")
def workflow_steps(
    session_id: SessionArg,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="Newest N runs.")] = 200,
    as_json: JsonOpt = False,
) -> None:
    """The session's step runs, oldest first: frame, depth, step, attempt, status, times, agents, output."""

    async def work(services: App):
        full_id = await services.sessions.resolve_id(session_id)
        return full_id, await _engine(services).step_runs(full_id, limit)

    full_id, runs = run(work)
    emit(runs, as_json, lambda: render.step_runs_table(runs, f"Step runs of session {full_id}"))


@checklist_app.command("push")
def checklist_push(session_id: SessionArg, name: Annotated[str, typer.Argument(help="The checklist's id.")],
                   as_json: JsonOpt = False) -> None:  # fmt: skip
    """Push checklist NAME onto the session's stack: its workflow waits until the required items are ticked."""
    _stack_edit(session_id, lambda e, sid, actor: e.add_checklist(sid, name, actor),
                lambda view: f"pushed checklist {name}: depth {view.depth}: {view.breadcrumb}", as_json)  # fmt: skip


@checklist_app.command("check")
def checklist_check(session_id: SessionArg, item: Annotated[str, typer.Argument(help="The item's id.")],
                    as_json: JsonOpt = False) -> None:  # fmt: skip
    """Tick ITEM of the checklist the session waits on (ticking twice changes nothing)."""
    _stack_edit(session_id, lambda e, sid, actor: e.check_item(sid, item, actor), lambda _: f"ticked {item}", as_json)
