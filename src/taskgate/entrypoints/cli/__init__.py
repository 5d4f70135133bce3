"""The `taskgate` command line (Typer + Rich), one module per concept. Every command exits non-zero with a
one-line reason on error.

`main()` loads only what the command line needs. The top-level help (`taskgate`, `--help`, `-h`) is printed from
`commands.py` without Typer (`help_page.py`); a command loads Typer and the module(s) that define it
(`commands.modules_for`), not the others; and the database layer and the MCP SDK load only when a command opens
taskgate (`common.run`) or serves. `taskgate serve` (stdio) starts without Typer (`serve_stdio.py`): an MCP client
waits for its tool list. `app`, the Typer app with every command registered, loads on first use."""

from __future__ import annotations

import os
import sys
from importlib import import_module

from taskgate.entrypoints.cli import commands, fast_reads, help_page


def main() -> None:
    """Console-script entry point."""
    argv = sys.argv[1:]
    if help_page.asks_for_help(argv):
        text = help_page.page(os.path.basename(sys.argv[0]), help_page.width())
        if commands.command_in(argv)[0] is None:  # no command at all: as Typer does, the page on stderr, exit 2
            sys.stderr.write(text)
            raise SystemExit(2)
        sys.stdout.write(text)
        return
    if commands.command_in(argv) == ("serve", []):
        from taskgate.entrypoints.cli.serve_stdio import serve_stdio

        serve_stdio(commands.root_option(argv, "--config"))
        return
    if fast_reads.answer(argv):  # session list / show, task ready: read without the engine when they can be
        return
    _load(commands.modules_for(commands.command_in(argv)[0]))
    from taskgate.entrypoints.cli.common import app

    app()


def _load(modules: tuple[str, ...]) -> None:
    """Import the command modules `modules` (their import registers their commands on the Typer app)."""
    for module in modules:
        import_module(f"{__name__}.{module}")


def __getattr__(name: str) -> object:
    """`app`: the Typer app (`typer.Typer`), every command module loaded. (Not annotated as such: `typing` and
    Typer are what `main()` avoids loading for the top-level help.)"""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _load(commands.ALL_MODULES)
    from taskgate.entrypoints.cli.common import app

    return app


__all__ = ["app", "main"]
