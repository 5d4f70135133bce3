"""What every command shares: the Typer app and its groups, one-line errors, opening taskgate, printing."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.markup import escape

from taskgate.application.timestamps import parse_timestamp
from taskgate.bootstrap import App, bootstrap, load_settings
from taskgate.domain.entities import Project
from taskgate.domain.errors import InvalidInput, TaskgateError
from taskgate.entrypoints import render
from taskgate.entrypoints.render import console, err_console, terminal_safe

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
    quote config tables (`[agents.NAME]`, `[[mcp.tokens]]`) and people's input; and nothing in it a terminal
    would act on is printed (titles, names and tracker errors may hold escape sequences)."""
    err_console.print(f"[red]error:[/red] {escape(terminal_safe(message))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def say(text: object) -> None:
    """Print a line of plain text (never Rich markup, never highlighted) to stdout, without anything in it a
    terminal would act on, through the builtin `print` (outputs other tools read: mermaid, `file:line: message`)."""
    print(terminal_safe(str(text)))


def run(work: Callable[[App], Awaitable[T]]) -> T:
    """Open taskgate (settings, database, migrations), run `work`, close. Errors become one line and exit 1."""

    async def main() -> T:
        from taskgate.entrypoints.mcp.agent_endpoint import serve_agents_locally  # only commands that open taskgate

        services = await bootstrap(load_settings())
        serve_agents_locally(services)  # agents this command launches reach taskgate's MCP tools through it
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


def _local_actor(services: App) -> str:
    """The CLI acts as the configured local operator."""
    return _operator_actor(services, None)[1]


def _operator_actor(services: App, operator: str | None) -> tuple[str, str]:
    assert services.settings is not None
    operator_id = operator or services.settings.operator.default
    return operator_id, f"operator:{operator_id}"


def _or_fail(work: Callable[[], T]) -> T:
    try:
        return work()
    except TaskgateError as exc:
        fail(str(exc))
    raise AssertionError("unreachable")
