"""The tracker: version, projects, plans, tasks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from taskgate import __version__
from taskgate.application.trackers.beads_import import BeadsImporter, ImportBeads, ImportReport
from taskgate.application.trackers.builtin import AddTask
from taskgate.domain.entities import Project
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import (
    JsonOpt,
    ProjectOpt,
    _local_actor,
    command,
    emit,
    fail,
    plan_app,
    project_app,
    run,
    run_in_project,
    task_app,
)
from taskgate.entrypoints.render import console, terminal_safe

if TYPE_CHECKING:
    from taskgate.bootstrap import App


@command("version")
def version() -> None:
    """Print taskgate's version."""
    print(__version__)


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
    emit(plan, as_json, lambda: f"plan [bold]{escape(plan.name)}[/bold] added (id {plan.id})")


@plan_app.command("close")
def plan_close(
    plan_id: Annotated[int, typer.Argument(help="The plan's id.")],
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded).")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Close a plan by hand: none of its tasks starts or is listed ready until a task is added to it (which reopens
    it). Sessions already running go on."""
    plan = run(lambda services: services.tracker.close_plan(plan_id, _local_actor(services), reason))
    emit(plan, as_json, lambda: f"plan [bold]{escape(plan.name)}[/bold] (id {plan.id}) is closed")


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
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="A task label such as bug (repeatable): label: triggers.")
    ] = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a task to the built-in tracker. A closed plan (its tasks all completed) is reopened by it."""

    def add(services: App, found: Project):
        command = AddTask(found.id, title, description, plan, priority, blocked_by or [], _local_actor(services),
                          labels=label or ())  # fmt: skip
        return services.tracker.add(command)

    added = run_in_project(project, add)
    task, note = added.task, added.note()
    reopened = added.reopened.id if added.reopened else None
    emit(
        {**render.jsonable(task), "plan_reopened": reopened},
        as_json,
        lambda: (
            f"task [bold]{escape(task.id)}[/bold] added: {escape(task.title)}" + (f"\n{escape(note)}" if note else "")
        ),
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
def task_ready(
    project: ProjectOpt = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="At most this many (0: all), as bd ready.")] = 100,
    as_json: JsonOpt = False,
) -> None:
    """Tasks that can start now: open, no active session, every blocker completed, plan not closed; most urgent
    first. With [tracker] kind = "beads", bd ready's own list."""
    if limit < 0:
        fail("--limit must be 0 (all) or more")
    wanted = limit + 1 if limit else None  # one more than shown: says whether there are more

    tasks = run_in_project(project, lambda services, found: services.tracker.ready_tasks(found.id, wanted))
    more = bool(limit) and len(tasks) > limit
    tasks = tasks[:limit] if limit else tasks
    emit(tasks, as_json, lambda: render.tasks_table(tasks, "Ready tasks"))
    if more and not as_json:
        console.print(f"showing the first {limit}; --limit 0 for all, or --limit N", highlight=False)


SKIPPED_LINES_EXIT = 3  # the import ran, but some lines were not imported (1 would mean nothing was)


@task_app.command("import-beads")
def task_import_beads(
    path: Annotated[Path, typer.Argument(help="A Beads JSONL export, e.g. .beads/issues.jsonl.")],
    plan: Annotated[int | None, typer.Option("--plan", help="Plan id for the new tasks.")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Refuse the whole file if any line is malformed.")] = False,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Import Beads issues as built-in tasks (again: updates them; issues gone from Beads complete their tasks).
    Malformed lines are reported and skipped, and the exit code is then 3; --strict imports nothing instead."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        fail(f"cannot read {path}: {exc}")

    async def work(services: App, found: Project) -> ImportReport:
        assert services.uow is not None and services.clock is not None
        importer = BeadsImporter(services.uow, services.clock)
        say = (
            None if as_json else (lambda message: console.print(terminal_safe(message), highlight=False, markup=False))
        )
        return await importer.import_jsonl(ImportBeads(found.id, data, plan, _local_actor(services), strict), say)

    report = run_in_project(project, work)
    if as_json:
        render.print_json({"counts": report.counts(), **render.jsonable(report)})
        raise typer.Exit(SKIPPED_LINES_EXIT if report.skipped else 0)
    counts = report.counts()
    console.print(", ".join(f"{n} {what}" for what, n in counts.items()), highlight=False)
    for problem in report.skipped:
        console.print(f"  skipped line {problem.line}: {terminal_safe(problem.reason)}", highlight=False, markup=False)
    for problem in report.warnings:
        console.print(f"  note, line {problem.line}: {terminal_safe(problem.reason)}", highlight=False, markup=False)
    if report.reopened_plan is not None:
        console.print(f"plan {report.reopened_plan} was closed and is open again", highlight=False)
    if report.skipped:
        console.print(f"{len(report.skipped)} line(s) skipped: the rest was imported", highlight=False)
        raise typer.Exit(SKIPPED_LINES_EXIT)
