"""Setting a repository up and saying where everything is: `taskgate init`, `taskgate info`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from taskgate import __version__
from taskgate.application.tracker import check_project_name
from taskgate.bootstrap import (
    App,
    config_dir,
    database_report,
    find_config_file,
    load_settings,
    project_layout,
    workflow_catalogue,
)
from taskgate.domain.errors import TaskgateError
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import JsonOpt, _local_actor, command, fail, run
from taskgate.entrypoints.render import console

_WHAT = {
    ".taskgate/taskgate.toml": "the configuration: commit it",
    ".taskgate/.gitignore": "keeps .taskgate/data/, the database and session folders, out of git",
    ".taskgate/workflows/": "your team's workflows, over the built-in ones",
    ".taskgate/checklists/": "your team's checklists",
    ".taskgate/agents/": "scripts of your own agent types",
}


@command("init")
def init(
    path: Annotated[Path, typer.Argument(help="A folder inside the git repository to set up.")] = Path("."),
    name: Annotated[str | None, typer.Option(help="Project name (default: the repository folder's name).")] = None,
) -> None:
    """Set a git repository up for taskgate in one step: .taskgate/ with a commented taskgate.toml, a .gitignore
    that keeps the database and session folders (.taskgate/data/) out of git, and folders for the team's own
    workflows, checklists and agents; then register the project and the local operator. Running it again changes
    nothing. (When a config already applies here, e.g. --config or a checkout's config/taskgate.toml, the project is
    registered in that config's database and no .taskgate/ is written.)"""
    try:
        if name is not None:
            name = check_project_name(name)
        root = project_layout.repository_root(path)
        found = find_config_file()
    except TaskgateError as exc:
        fail(str(exc))
    own = root / ".taskgate" / "taskgate.toml"
    layout = None
    if found is None or found == own:
        existed = project_layout.has_layout(root)
        if not existed:  # the config (and with it the database's place) must exist before taskgate opens
            layout = project_layout.set_up(root)
        os.environ["TASKGATE_CONFIG"] = str(own)
    else:
        console.print(f"using the config that applies here: {escape(str(found))}", highlight=False)

    async def work(services: App):
        project, created = await services.tracker.register_project(str(root), name, _local_actor(services))
        assert services.settings is not None
        operator = await services.tracker.ensure_operator(services.settings.operator.default)
        return project, created, operator, services.settings

    project, created, operator, settings = run(work)
    if found == own or (found is None and layout is None):
        layout = project_layout.set_up(root)  # a re-run: only what went missing is created
    _say_what_init_did(layout, project, created, operator, settings)


def _say_what_init_did(layout, project, created: bool, operator, settings) -> None:
    if layout is not None:
        made = {item.replace(os.sep, "/") for item in layout.created}
        for item, what in _WHAT.items():
            if item in made:
                console.print(f"created {escape(item)}  ({what})", highlight=False, markup=False)
    where = f"{escape(project.name)} (id {project.id}, key {project.key}) at {escape(project.root_path)}"
    if created:
        console.print(f"project [bold]{where}[/bold] registered", highlight=False)
    else:
        console.print(f"project [bold]{where}[/bold] was registered already", highlight=False)
    console.print(f"database {escape(settings.resolved_database_url)}", highlight=False)
    console.print(f"operator [bold]{escape(operator.id)}[/bold] ready; task ids look like {project.key}-1")
    if layout is not None and not layout.created and not created:
        console.print("already set up: nothing changed")
    elif layout is not None:
        console.print(
            "next: commit .taskgate/, then `taskgate agents list` (agent CLIs found), `taskgate doctor`, "
            '`taskgate task add "..."`, `taskgate workflow run feature-development --task ' + f"{project.key}-1`",
            highlight=False,
            markup=False,
        )


@command("info")
def info(as_json: JsonOpt = False) -> None:
    """Say where everything is: config file, data directory, database (and its schema revision), session folders,
    worktrees, the built-in catalogue and the project's own workflows, checklists and agents, and this node's id."""

    async def work(services: App) -> dict[str, object]:
        settings = services.settings
        assert settings is not None
        folders = workflow_catalogue(settings).source.folders()  # type: ignore[attr-defined]
        return {
            "version": __version__,
            "config_file": str(settings.config_file) if settings.config_file else None,
            "data_dir": str(settings.data_dir),
            **await database_report(services),
            "session_folders": str(settings.data_dir / "agent-outputs"),
            "worktrees": f"<project root>/{settings.git.worktrees_dir}/<session id>",
            **folders,
            "project_agents": str(config_dir(settings) / "agents"),
            "default_operator": settings.operator.default,
            "wip_limit": settings.policies.wip_limit.limit,
            "node_id": settings.resolved_node_id,
        }

    report = run(work)
    if as_json:
        render.print_json(report)
        return
    for key, value in report.items():
        shown = value if value is not None else "(none: built-in defaults)" if key == "config_file" else "-"
        console.print(f"[bold]{key:>18}[/bold]  {escape(str(shown))}", highlight=False)


__all__ = ["info", "init", "load_settings"]
