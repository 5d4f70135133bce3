"""Text people typed reaches the operator's terminal without anything a terminal acts on: a task title, a plan or
operator name or a reason holding escape sequences (colours, clear screen, window title), C1 controls (CSI,
NEL) or bidi overrides prints its visible text only, in every table and error line; JSON keeps the text as is."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from rich.markup import escape

from taskgate.entrypoints.render import SafeConsole, safe_markup, table, terminal_safe
from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli

# colour, window title (ended by BEL), C1 CSI (clear screen), NEL, a bidi override, clear screen and cursor home
NASTY = "\x1b[31mRED\x1b[0m \x1b]0;pwned\x07 \x9b2J \u0085 \u202eevil\u202c \x1b[2J\x1b[H done"
UNSAFE = ("\x1b", "\x07", "\x9b", "\x85", "\u202e", "\u202c")


def assert_safe(out: str) -> None:
    found = [c for c in UNSAFE if c in out]
    assert not found, f"{found} in {out!r}"


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    make_git_repo(tmp_path / "repo")
    return Cli(tmp_path)


def printed(cli: Cli, *args: str) -> str:
    """stdout and stderr of a command that succeeds, checked for anything a terminal acts on."""
    done = cli.run(*args)
    assert done.returncode == 0, f"taskgate {' '.join(args)} failed: {done.stderr!r}"
    assert_safe(done.stdout)
    assert_safe(done.stderr)
    return done.stdout


def refused(cli: Cli, *args: str) -> str:
    """The one error line of a command that fails, checked for anything a terminal acts on."""
    done = cli.run(*args)
    assert done.returncode != 0, f"taskgate {' '.join(args)} should have failed"
    assert_safe(done.stdout)
    assert_safe(done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_titles_names_and_reasons_with_escape_sequences_print_only_their_text(cli: Cli):
    cli.ok("init", "repo", "--name", "demo")
    printed(cli, "plan", "add", "Phase 1")  # plan names are checked (see the errors below)
    assert "RED" in printed(cli, "task", "add", f"title {NASTY}", "--plan", "1", "-d", NASTY)
    task = cli.json("task", "add", f"second {NASTY}", "--plan", "1")
    assert task["title"] == f"second {NASTY}"  # stored and shown as JSON as it was typed

    for command in (("task", "list"), ("task", "ready")):
        out = printed(cli, *command)
        assert "title RED" in out and "second RED" in out and "evil  done" in out and "pwned" not in out, command

    started = printed(cli, "session", "start", task["id"])
    short = started.split()[1][:8]
    printed(cli, "session", "fire", short, "plan_complete", "--reason", f"because {NASTY}")
    assert short in printed(cli, "session", "list")
    assert "RED" in printed(cli, "session", "history", short)
    printed(cli, "session", "show", short)
    printed(cli, "session", "status", short)

    operator = printed(cli, "operator", "add", "bob", "--name", f"Bob {NASTY}")
    assert "Bob RED" in operator
    assert "Bob RED" in printed(cli, "operator", "list")


def test_errors_that_echo_what_was_typed_print_only_its_text(cli: Cli):
    cli.ok("init", "repo", "--name", "demo")

    error = refused(cli, "plan", "add", NASTY)  # quoted (repr) by the refusal: shown as \\x1b..., never sent
    assert "is invalid" in error

    error = refused(cli, "session", "start", f"DEMO-9{NASTY}")
    assert "DEMO-9" in error and "RED" in error

    error = refused(cli, "project", "archive", NASTY)
    assert "RED" in error

    error = refused(cli, "task", "add", "a task", "--blocked-by", NASTY)
    assert "RED" in error


# -- render.table and the console, without a subprocess ------------------------------------------------------


def rendered(renderable: object, *, console: Console | None = None) -> str:
    out = console or Console(file=io.StringIO(), width=200, color_system=None)
    out.print(renderable)
    return out.file.getvalue()  # type: ignore[attr-defined]


def test_table_cells_and_titles_drop_what_a_terminal_acts_on_and_keep_their_markup():
    for markup in (True, False):
        data = escape if markup else str  # markup cells hold escaped data
        rows = [[data(NASTY), "[red]no[/red]", 7], [None, data("[b]literal[/b]"), NASTY]]
        title = data(f"about {NASTY}")
        out = rendered(table(title, ["a", "b", "c"], rows, markup=markup))  # a plain Rich console: the table is safe
        assert_safe(out)
        assert "about RED" in out and "RED  2J" in out and "evil  done" in out and "pwned" not in out
        assert "[b]literal[/b]" in out
        assert ("no" in out and "[red]" not in out) if markup else "[red]no[/red]" in out

    colours = SafeConsole(file=io.StringIO(), width=200, force_terminal=True, color_system="standard")
    coloured = rendered(table("t", ["a", "b"], [[escape(NASTY), "[red]no[/red]"]]), console=colours)
    assert "\x1b[31mno\x1b[0m" in coloured  # Rich's own colours stay
    assert "\x1b[31mRED" not in coloured and "\x1b]0;" not in coloured and "\x1b[2J" not in coloured


def test_cells_that_are_not_strings_are_data():
    class Odd:
        def __str__(self) -> str:
            return "[bold]odd[/bold]\x1b[2J"

    out = rendered(table("t", ["a"], [[Odd()], [3]]))
    assert "[bold]odd[/bold]" in out and "\x1b" not in out and "3" in out


def test_cutting_an_escape_sequence_out_never_makes_a_tag_of_data():
    # cut first, `[` and `b]` around an OSC, or ESC and the backslash that escapes a `[`, would become [b]
    for data in ("[\x1b]0;x\x07b]bold?", "\x1b\\[b]bold?"):
        out = rendered(table("t", ["a"], [[escape(data)]]))
        assert "bold?" in out and "\x1b" not in out
        assert "b]bold?" in out
    assert str(safe_markup(escape("[\x1b]0;x\x07b]"))) == "[b]"
    assert safe_markup("[red]clean[/red]") == "[red]clean[/red]"  # nothing to cut: the markup itself


def test_the_console_cuts_escape_sequences_from_every_string_it_prints():
    console = SafeConsole(file=io.StringIO(), width=200, force_terminal=True, color_system="standard")
    console.print(f"[green]ok[/green] {escape(NASTY)}")
    console.print(NASTY, markup=False, highlight=False)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[32mok\x1b[0m" in out
    plain = out.replace("\x1b[32m", "").replace("\x1b[0m", "")
    assert_safe(plain)
    assert plain.count("RED  2J  evil  done") == 2
    assert terminal_safe(NASTY) == "RED  2J  evil  done"
