"""Workflows and checklists: the catalogue, and running them on sessions."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated

import typer

from taskgate.application.sessions.commands import StartTask
from taskgate.application.workflows.edits import RunInputs
from taskgate.application.workflows.engine import WorkflowEngine
from taskgate.application.workflows.library import WorkflowService
from taskgate.application.workflows.views import StackView, stack_view_json
from taskgate.bootstrap import App, load_settings, workflow_catalogue
from taskgate.domain.errors import InvalidInput, TaskgateError
from taskgate.domain.states import SessionState
from taskgate.domain.workflows.definitions import agent_types_used, matches_pattern
from taskgate.domain.workflows.mermaid import to_mermaid as to_workflow_mermaid
from taskgate.domain.workflows.visibility import Viewer, allows
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import (
    JsonOpt,
    _local_actor,
    _operator_actor,
    _or_fail,
    emit,
    fail,
    group,
    run,
    say,
)
from taskgate.entrypoints.cli.driving import (
    _RUNNABLE,
    SessionArg,
    _drive,
    _engine,
    _marks,
    _Outcome,
    _report,
    _to_executing,
)
from taskgate.entrypoints.render import console, err_console

workflow_app = group(
    "workflow",
    help="Workflows (built-in, and the project's own in .taskgate/workflows): list, show, validate, graph, create; "
    "run them on sessions and edit their "
    "stacks (push, advance, back, break, restart); their step runs.",
    no_args_is_help=True,
)
checklist_app = group(
    "checklist",
    help="Checklists (built-in, and .taskgate/checklists); push them onto sessions, tick items.",
    no_args_is_help=True,
)


def _workflows() -> WorkflowService:
    """The workflow catalogue of the config dir (no database)."""
    try:
        return workflow_catalogue(load_settings())
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
    """The catalogue's workflows by category, built-in and the project's own (`source`); invalid ones marked
    (`workflow validate` says why). Workflows whose `visible_to` leaves out the operator the CLI acts as are not
    shown."""
    catalogue = _workflows()
    viewer = Viewer.operator(_or_fail(load_settings).operator.default)  # the operator the CLI acts as
    matching = [e for e in catalogue.entries(category) if matches_pattern(pattern, e.id, e.description)]
    entries = [e for e in matching if allows(e.visible_to, viewer)]
    emit(entries, as_json, lambda: render.workflows_table(entries))
    if len(entries) < len(matching) and not as_json:
        err_console.print(f"{len(matching) - len(entries)} workflow(s) not shown: their visible_to does not name "
                          f"{viewer}", highlight=False, markup=False)  # fmt: skip
    if not entries and not as_json:
        _how_to_add("workflow", catalogue)


@workflow_app.command("show")
def workflow_show(name: Annotated[str, typer.Argument(help="The workflow's id.")], as_json: JsonOpt = False) -> None:
    """A workflow's steps, their types and routes."""
    workflow = _or_fail(lambda: _workflows().workflow(name))
    if as_json:
        render.print_json(workflow.as_dict())
    else:
        console.print(render.workflow_table(workflow))


@workflow_app.command("triggers")
def workflow_triggers(as_json: JsonOpt = False) -> None:
    """Which workflow each starting trigger starts (`task_ready`, `label:<name>`): what dispatch runs on a ready
    task when [dispatch] auto_start is on (a label trigger beats task_ready), and whether it is on."""
    from taskgate.bootstrap import dispatch_report

    catalogue = _workflows()
    workflows = catalogue.catalogue().workflows
    routes = catalogue.trigger_routes(workflows)
    rows = [
        {"trigger": trigger, "workflows": [name], "source": catalogue.origin(workflows[name].file),
         "file": workflows[name].file, "note": _replaced(routes.replaced.get(trigger, ()))}
        for trigger, name in routes.workflows.items()
    ] + [
        {"trigger": trigger, "workflows": list(names), "source": "", "file": "",
         "note": "contested: declared by several workflows, starts nothing (see workflow validate)"}
        for trigger, names in routes.contested.items()
    ]  # fmt: skip
    rows.sort(key=lambda r: (r["trigger"] != "task_ready", r["trigger"]))
    line, problems = _or_fail(lambda: dispatch_report(load_settings()))
    if as_json:
        render.print_json({"dispatch": {"on": not line.startswith("off"), "detail": line, "problems": problems},
                           "triggers": rows})  # fmt: skip
        return
    cells = ([r["trigger"], ", ".join(r["workflows"]), r["source"], r["note"]] for r in rows)
    console.print(render.table("Triggers", ["trigger", "workflow", "source", "note"], cells, markup=False))
    if not rows:
        say("no workflow has a task_ready or label:<name> trigger (docs/workflows.md#triggers-and-dispatch)")
    say(f"dispatch {line}")
    for problem in problems:
        say(f"dispatch: {problem}")


def _replaced(names: tuple[str, ...]) -> str:
    return f"replaces the built-in {', '.join(names)}" if names else ""


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
            "notes": [dataclasses.asdict(n) for n in result.notes],
        })  # fmt: skip
    else:
        for note in result.notes:  # how an OpenAgents-style file was read: not wrong, worth knowing
            say(dataclasses.replace(note, message=f"note: {note.message}"))
        for problem in result.problems:
            say(problem)
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
    say(to_workflow_mermaid(_or_fail(lambda: _workflows().workflow(name))))


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
    say(f"created {created.file} from template {created.template}")
    if created.dropped_triggers:
        say(f"its triggers {', '.join(created.dropped_triggers)} were left out: a copy starts by hand until you add "
            f"them (a project workflow's trigger replaces a built-in one's)")  # fmt: skip
    for problem in created.problems:
        say(problem)
    if created.problems:
        fail(f"{created.file} was created but has {len(created.problems)} problem(s); edit it and run validate")


@checklist_app.command("list")
def checklist_list(pattern: PatternArg = None, as_json: JsonOpt = False) -> None:
    """The valid checklists (`workflow validate` reports the others)."""
    catalogue = _workflows()
    found = catalogue.catalogue().checklists.values()
    checklists = sorted((c for c in found if matches_pattern(pattern, c.id, c.description)), key=lambda c: c.id)
    rows = [{**c.as_dict(), "source": catalogue.origin(c.file)} for c in checklists]
    emit(rows, as_json, lambda: render.checklists_table(checklists, catalogue.origin))
    if not checklists and not as_json:
        _how_to_add("checklist", catalogue)


def _how_to_add(kind: str, catalogue: WorkflowService) -> None:
    """What an empty listing says: where the project's own files go, and how to start one."""
    folders = getattr(catalogue.source, "folders", dict)()
    where = folders.get(f"project_{kind}s", f"<config dir>/{kind}s")
    how = ("taskgate workflow create NAME --template basic" if kind == "workflow"
           else "a YAML file with id, description and items (docs/workflows.md)")  # fmt: skip
    err_console.print(f"no {kind}s match; add your own under {where}/ ({how})", highlight=False, markup=False)


@checklist_app.command("show")
def checklist_show(name: Annotated[str, typer.Argument(help="The checklist's id.")], as_json: JsonOpt = False) -> None:
    """A checklist's items."""
    checklist = _or_fail(lambda: _workflows().checklist(name))
    emit(checklist.as_dict(), as_json, lambda: render.checklist_table(checklist))


@workflow_app.command("run")
def workflow_run(
    name: Annotated[str, typer.Argument(help="The workflow's id.")],
    task: Annotated[str | None, typer.Option("--task", "-t", help="Start a session for this task.")] = None,
    session: Annotated[str | None, typer.Option("--session", "-s", help="Run it on this session.")] = None,
    operator: Annotated[str | None, typer.Option("--operator", help="Operator id (default: operator.default).")] = None,
    input_text: Annotated[
        str | None, typer.Option("--input", "-i", help="Text the workflow's steps get as {{input}}.")
    ] = None,
    context: Annotated[
        str | None,
        typer.Option(
            "--context", help='A JSON object; each key k is {{context.k}} in prompts, e.g. \'{"area": "api"}\'.'
        ),
    ] = None,
) -> None:
    """Run workflow NAME in the foreground: on a new session for --task, or on --session (pushed if its stack is
    empty). --input and --context give the run its inputs (recorded in the session's manifest). It starts the
    session if it is ready, executes it if it is planning, then drives it here, printing each step run as it
    starts and ends, until it finishes (verifying), pauses for a person (an approval, a checklist: the command to
    continue is printed) or fails (exit 1, with the reason)."""
    if (task is None) == (session is None):
        fail("give either --task TASK or --session ID")
    inputs = _or_fail(lambda: RunInputs.parse(input_text, context)) if input_text or context else None

    async def work(services: App) -> _Outcome:
        engine = _engine(services)
        operator_id, actor = _operator_actor(services, operator)
        # an unknown name, or one whose visible_to leaves the operator out, is refused before anything is written
        workflow = engine.chosen(name, Viewer.operator(operator_id))
        assert workflow is not None and services.agents is not None
        services.agents.check_installed(agent_types_used(workflow.steps))  # a missing CLI, before anything
        if task is not None:
            await services.tracker.prepare_start(task)
            started = await services.sessions.start_task(StartTask(task, actor, operator_id))
            session_id = started.session.id
            await engine.attach(session_id, workflow, actor, inputs)
            console.print(f"session {session_id} for {task} runs workflow {name}", highlight=False, markup=False)
        else:
            assert session is not None
            session_id = await services.sessions.resolve_id(session)
            await _onto(services, session_id, name, actor, inputs)
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


async def _onto(services: App, session_id: str, name: str, actor: str, inputs: RunInputs | None = None) -> None:
    """Put workflow `name` on the session for `workflow run --session`: pushed onto an empty stack; a stack that
    holds it already just runs on (refused with `inputs`: they were given when it started). Raises: InvalidInput
    (another workflow runs, or the state does not run)."""
    current = await services.sessions.get(session_id)
    if current.state not in _RUNNABLE:
        hint = {SessionState.SUSPENDED: "resume it first (taskgate session fire ID resume)",
                SessionState.FAILED: "retry it (taskgate session fire ID retry)"}.get(current.state, "")  # fmt: skip
        raise InvalidInput(f"session {session_id} is {current.state.value}: a workflow runs from ready, planning or "
                           f"executing" + (f"; {hint.replace('ID', session_id)}" if hint else ""))  # fmt: skip
    view = _engine(services).view(current)
    if not view.depth:
        await _engine(services).add_workflow(session_id, name, actor, Viewer.of_actor(actor), inputs=inputs)
        console.print(f"workflow {name} pushed onto session {session_id}", highlight=False, markup=False)
    elif not any(f["kind"] == "workflow" and f["name"] == name for f in view.frames):
        raise InvalidInput(f"session {session_id} already runs {view.breadcrumb}; nest {name} with "
                           f"`taskgate workflow push {session_id} {name}`")  # fmt: skip
    elif inputs is not None:
        raise InvalidInput(
            f"session {session_id} already runs {name}; its --input and --context were given when "
            "it started (run it without them to go on)"
        )


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
    _stack_edit(session_id, lambda e, sid, actor: e.add_workflow(sid, name, actor, Viewer.of_actor(actor)),
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


@workflow_app.command("continue")
def workflow_continue(session_id: SessionArg, as_json: JsonOpt = False) -> None:
    """End the nested top frame early (depth above 1); the step that pushed it succeeds with what it did so far."""
    _stack_edit(session_id, lambda e, sid, actor: e.continue_frame(sid, actor),
                lambda v: f"ended the frame early: {_crumb(v)}", as_json)  # fmt: skip


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
