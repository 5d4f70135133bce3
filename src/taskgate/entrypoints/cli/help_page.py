"""`taskgate --help` without Typer: the top-level help page, drawn from `commands.py` as Typer draws it.

Loading Typer costs about 45 ms and the command modules several hundred more; the top-level page needs none of
it. It is laid out as Typer's plain (`rich_markup_mode=None`) help is: the same usage line, sections, column
widths and wrapping at the same width (the terminal's, at most 120 columns). `tests/unit/test_cli_startup.py`
compares this page with the one the Typer app prints, at several widths.
"""

from __future__ import annotations

import os

from taskgate.entrypoints.cli.commands import COMMANDS, HELP_OPTIONS, PROGRAM_HELP, ROOT_OPTIONS, command_in

MAX_WIDTH = 120
"""The widest help page, in columns (the Typer app's `max_content_width`)."""

_INDENT = 2
_COLUMN_MAX, _COLUMN_SPACING = 30, 2


def asks_for_help(argv: list[str]) -> bool:
    """True when the words after `taskgate` ask for the top-level help (`--help`, `-h`), or name no command."""
    word, _rest = command_in(argv)
    return word is None or word in HELP_OPTIONS


def width() -> int:
    """The page width: the terminal's (`$COLUMNS` first), at most `MAX_WIDTH`, minus 2, at least 50."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(1).columns
        except OSError:
            columns = 80
    return max(min(columns, MAX_WIDTH) - 2, 50)


def page(prog: str, columns: int) -> str:
    """The top-level help page of the program called `prog`, `columns` wide."""
    options = [(f"{option.flag} {option.metavar}", option.help) for option in ROOT_OPTIONS]
    options.append((", ".join(HELP_OPTIONS), "Show this message and exit."))
    commands = [(command.name, command.summary) for command in COMMANDS]
    usage = f"Usage: {prog} [OPTIONS] COMMAND [ARGS]..."
    return "".join([
        f"{usage}\n\n",
        _wrap(PROGRAM_HELP, columns, " " * _INDENT, " " * _INDENT),
        "\n\nOptions:\n",
        _definitions(options, columns),
        "\nCommands:\n",
        _definitions(commands, columns),
    ])  # fmt: skip


def _definitions(rows: list[tuple[str, str]], columns: int) -> str:
    """Two columns, the second wrapped: Click's `HelpFormatter.write_dl`, inside a section (indented by 2)."""
    first_column = min(max(len(term) for term, _ in rows), _COLUMN_MAX) + _COLUMN_SPACING
    text_width = max(columns - first_column - 2, 10)
    out = []
    for term, text in rows:
        out.append(" " * _INDENT + term)
        if len(term) <= first_column - _COLUMN_SPACING:
            out.append(" " * (first_column - len(term)))
        else:
            out.append("\n" + " " * (first_column + _INDENT))
        lines = _wrap(text, text_width, "", "").splitlines()
        out.append(lines[0] + "\n")
        out.extend(" " * (first_column + _INDENT) + line + "\n" for line in lines[1:])
    return "".join(out)


def _wrap(text: str, columns: int, first: str, rest: str) -> str:
    import textwrap  # ~5 ms (it loads `re`): only once a page is printed

    wrapper = textwrap.TextWrapper(columns, initial_indent=first, subsequent_indent=rest, replace_whitespace=False)
    return wrapper.fill(text)
