"""What every command shares: the Typer app and its groups, one-line errors, opening taskgate, printing.

Nothing here loads the database layer or the MCP SDK: `run` imports `bootstrap` when a command opens taskgate,
so commands that do not (`fsm`, `workflow validate`, any `--help`) start without them."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.markup import escape
from typer.core import TyperGroup

from taskgate.application.timestamps import parse_timestamp
from taskgate.domain.entities import Project
from taskgate.domain.errors import InvalidInput, TaskgateError
from taskgate.entrypoints import render
from taskgate.entrypoints.cli import commands
from taskgate.entrypoints.render import err_console, terminal_safe

if TYPE_CHECKING:
    from taskgate.bootstrap import App

T = TypeVar("T")


class ListedGroup(TyperGroup):
    """The top-level group: lists its commands in `commands.COMMANDS`' order, whichever module registered first."""

    def list_commands(self, ctx: Any) -> list[str]:
        """The registered commands' names, in the order of `commands.COMMANDS` (any other name last)."""
        order = {command.name: index for index, command in enumerate(commands.COMMANDS)}
        return sorted(super().list_commands(ctx), key=lambda name: order.get(name, len(order)))


# Help is plain text (Typer passes rich_markup_mode down to every sub-command): under Rich markup, help that names
# config tables (`[agents.NAME]`, `[[mcp.tokens]]`, `[sweeper]`) lost them. `help_page.py` prints the top-level
# help the same way without loading Typer; it relies on these settings (plain text, 120 columns at most).
app = typer.Typer(
    cls=ListedGroup,
    help=commands.PROGRAM_HELP,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120, "help_option_names": list(commands.HELP_OPTIONS)},
)


def command(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a top-level command `name` (listed in `commands.py`, whose one-line help it shows in `taskgate
    --help`); its docstring is its own `--help`."""
    return app.command(name, short_help=commands.summary(name))


def group(name: str, help: str | None = None, **settings: Any) -> typer.Typer:
    """A top-level group `name` (listed in `commands.py`), added to `app`; `help` (default: the one-line help of
    `commands.py`) heads its own `--help`."""
    sub = typer.Typer(help=help or commands.summary(name), short_help=commands.summary(name), **settings)
    app.add_typer(sub, name=name)
    return sub


operator_app = group("operator", no_args_is_help=True)
policies_app = group("policies", no_args_is_help=True)
worktrees_app = group("worktrees")
token_app = group("token", no_args_is_help=True)
project_app = group("project", no_args_is_help=True)
plan_app = group("plan", no_args_is_help=True)
task_app = group("task", no_args_is_help=True)
session_app = group("session", no_args_is_help=True)
audit_app = group("audit", no_args_is_help=True)

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
        from taskgate.bootstrap import bootstrap, load_settings  # only commands that open taskgate load these
        from taskgate.entrypoints.mcp.agent_endpoint import serve_agents_locally
        from taskgate.infrastructure.quick_reads import remember

        services = await bootstrap(load_settings())
        remember(services.settings)  # this configuration started: read commands may now skip loading it
        serve_agents_locally(services)  # agents this command launches reach taskgate's MCP tools through it
        try:
            return await work(services)
        finally:
            await services.close()

    try:
        return asyncio.run(main())
    except TaskgateError as exc:
        fail(str(exc))
    except ReaderGone as gone:  # whoever read our output stopped (`… | head`): no error of ours, nothing to say
        raise gone.pipe from None
    except Exception as exc:  # the promise is one line, never a traceback, unless asked for
        if os.environ.get("TASKGATE_DEBUG"):
            raise
        fail(f"internal error: {type(exc).__name__}: {exc} (set TASKGATE_DEBUG=1 for a traceback)", 3)
    raise AssertionError("unreachable")


class ReaderGone(Exception):
    """A command's output stream was closed by its reader: a BrokenPipeError on stdout, and only there (one on a
    socket or a pipe to a subprocess is an error like any other). `run` hands the BrokenPipeError on to Typer,
    which ends every command whose reader stopped early the same way: quietly, exit status 1."""

    def __init__(self, pipe: BrokenPipeError) -> None:
        super().__init__(str(pipe))
        self.pipe = pipe


def run_in_project(project: str | None, work: Callable[[App, Project], Awaitable[T]]) -> T:
    """`run`, with the project named by `project` (or implied by the current directory) resolved first."""

    async def with_project(services: App) -> T:
        return await work(services, await services.tracker.resolve_project(project, os.getcwd()))

    return run(with_project)


emit = render.emit  # Print a value as JSON, or the renderable a function builds (render.py)


def _timestamp_or_fail(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return parse_timestamp(text)
    except InvalidInput as exc:
        fail(str(exc))
    raise AssertionError("unreachable")


_CONFIG = commands.ROOT_OPTIONS[0]


@app.callback()
def _root(
    config: Annotated[Path | None, typer.Option(_CONFIG.flag, metavar=_CONFIG.metavar, help=_CONFIG.help)] = None,
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
