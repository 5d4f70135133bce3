"""`session list`, `session show ID` and `task ready` answered without Typer or the engine, when they can be.

People run these all day; loading the settings' models, SQLAlchemy's asyncio engine and Alembic made each take
over a second. `answer` parses the three commands' own options (nothing else), reads through
`infrastructure/quick_reads.py` and prints with the very functions the Typer commands print with. Anything it
does not know (another option, `--help`, a bad value) or that the fast read cannot answer exactly as the full
path would (`quick_reads.Unavailable`) returns False, and `main()` runs the command the full way, which answers or
reports the error in its own words. `TASKGATE_FULL_READS=1` turns this path off.
"""

from __future__ import annotations

import os
from collections.abc import Callable

_FLAGS = {"--json": "json", "--all": "all"}
_VALUED = {"--project": "project", "-p": "project", "--limit": "limit", "-n": "limit"}
_ALLOWED = {("session", "list"): {"json", "all", "project"}, ("session", "show"): {"json"},
            ("task", "ready"): {"json", "project", "limit"}}  # fmt: skip


def answer(argv: list[str]) -> bool:
    """Run `argv` here if it is one of the three read commands and the fast read can answer it; False when the
    full CLI must run it (nothing has been printed then)."""
    if os.environ.get("TASKGATE_FULL_READS"):
        return False
    parsed = _parse(argv)
    if parsed is None:
        return False
    command, options, positional = parsed
    run = _RUNS.get(command)
    if run is None or (command == ("session", "show")) != bool(positional) or len(positional) > 1:
        return False
    from taskgate.infrastructure.quick_reads import Unavailable, answering

    try:
        printing = answering(lambda reads: run(reads, options, positional))
    except Unavailable:
        return False
    printing()  # printed only once everything was read: a fallback never follows half an answer
    return True


def _parse(argv: list[str]) -> tuple[tuple[str, str], dict[str, str | bool], list[str]] | None:
    """(command, options, positional) for `[--config PATH] group command [options] [ID]`; None for anything else."""
    args = list(argv)
    if args and args[0].startswith("--config"):
        flag, _, value = args.pop(0).partition("=")
        if flag != "--config" or (not value and not args):
            return None
        os.environ["TASKGATE_CONFIG"] = value or args.pop(0)  # as the root option does (common._root)
    if len(args) < 2:
        return None
    command, rest = (args[0], args[1]), args[2:]
    allowed = _ALLOWED.get(command)
    if allowed is None:
        return None
    options: dict[str, str | bool] = {}
    positional: list[str] = []
    while rest:
        word = rest.pop(0)
        name, has_value, value = word.partition("=")
        if name in _FLAGS and not has_value:
            options[_FLAGS[name]] = True
        elif name in _VALUED and (has_value or rest):
            options[_VALUED[name]] = value if has_value else rest.pop(0)
        elif word.startswith("-"):
            return None  # --help, an option of another command, a typo: Typer says what it makes of it
        else:
            positional.append(word)
    if not set(options) <= allowed:
        return None
    return command, options, positional


def _session_list(reads, options, _positional) -> Callable[[], None]:
    from taskgate.entrypoints import render

    project = reads.project(options.get("project"), os.getcwd())
    sessions = reads.sessions(project.id, active=not options.get("all"))
    as_json = bool(options.get("json"))
    return lambda: render.emit(
        [render.session_json(s) for s in sessions], as_json, lambda: render.sessions_table(sessions)
    )


def _session_show(reads, options, positional) -> Callable[[], None]:
    from taskgate.entrypoints.cli.session_page import print_session

    shown = reads.session(positional[0])
    return lambda: print_session(*shown, as_json=bool(options.get("json")))


def _task_ready(reads, options, _positional) -> Callable[[], None]:
    from taskgate.entrypoints import render

    text = str(options.get("limit", "100"))
    if not text.isascii() or not text.isdigit():
        raise _unavailable()  # not a count Typer would take: it says so
    limit = int(text)
    project = reads.project(options.get("project"), os.getcwd())
    tasks = reads.ready_tasks(project.id, limit + 1 if limit else None)  # one more than shown: are there more
    more = bool(limit) and len(tasks) > limit
    tasks = tasks[:limit] if limit else tasks
    as_json = bool(options.get("json"))

    def printing() -> None:
        render.emit(tasks, as_json, lambda: render.tasks_table(tasks, "Ready tasks"))
        if more and not as_json:
            render.console.print(f"showing the first {limit}; --limit 0 for all, or --limit N", highlight=False)

    return printing


def _unavailable() -> Exception:
    from taskgate.infrastructure.quick_reads import Unavailable

    return Unavailable("the full path must answer")


_RUNS = {("session", "list"): _session_list, ("session", "show"): _session_show, ("task", "ready"): _task_ready}
