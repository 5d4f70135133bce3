"""The top-level command list (`entrypoints/cli/commands.py`) is the Typer app's: the fast `taskgate --help` cannot
drift from what the app registers, and each command is registered by the modules `main()` loads for it."""

from __future__ import annotations

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from taskgate.entrypoints.cli import app, commands, help_page


def _top_level() -> tuple[typer.core.TyperGroup, typer.Context]:
    group = get_command(app)
    return group, typer.Context(group, info_name="taskgate", **group.context_settings)


def test_the_typer_app_registers_exactly_the_listed_commands_in_their_order_with_their_one_line_help():
    group, ctx = _top_level()
    names = group.list_commands(ctx)
    assert names == [command.name for command in commands.COMMANDS]
    shown = {name: group.get_command(ctx, name).get_short_help_str(limit=10_000) for name in names}
    assert shown == {command.name: command.summary for command in commands.COMMANDS}


@pytest.mark.parametrize("width", [50, 78, 118, 160])
def test_the_fast_help_page_is_the_page_the_typer_app_prints(width):
    typer_page = CliRunner().invoke(app, ["--help"], prog_name="taskgate", terminal_width=width)
    assert typer_page.exit_code == 0
    assert help_page.page("taskgate", width) == typer_page.output


def test_the_root_options_and_help_options_are_the_typer_apps():
    group, ctx = _top_level()
    options = {opt for param in group.get_params(ctx) for opt in param.opts}
    assert options == {option.flag for option in commands.ROOT_OPTIONS} | set(commands.HELP_OPTIONS)


def _callback_modules(command) -> set[str]:
    """The modules of the functions behind `command` and, for a group, behind every sub-command."""
    found = {command.callback.__module__} if getattr(command, "callback", None) else set()
    for sub in getattr(command, "commands", {}).values():
        found |= _callback_modules(sub)
    return found


def test_each_command_is_defined_in_the_modules_main_loads_for_it():
    group, ctx = _top_level()
    for listed in commands.COMMANDS:
        defined_in = _callback_modules(group.get_command(ctx, listed.name)) - {"taskgate.entrypoints.cli.common"}
        assert defined_in, listed.name
        assert defined_in <= {f"taskgate.entrypoints.cli.{module}" for module in listed.modules}, listed.name


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        ([], None),
        (["--help"], "--help"),
        (["--config", "x.toml"], None),
        (["--config", "x.toml", "-h"], "-h"),
        (["--config=x.toml", "session", "list"], "session"),
        (["--config"], "--config"),  # no value: Typer says so
        (["fsm", "--help"], "fsm"),
    ],
)
def test_the_command_word_is_found_after_the_root_options(argv, word):
    assert commands.command_in(argv)[0] == word


def test_an_unknown_word_loads_every_module_so_typer_can_list_them():
    assert commands.modules_for("sesion") == commands.ALL_MODULES
    assert commands.modules_for(None) == commands.ALL_MODULES
    assert commands.modules_for("fsm") == ("audit",)


def test_usage_groups_an_agent_type_under_the_preset_it_is_built_on():
    from taskgate.entrypoints.cli.usage import preset_of
    from taskgate.infrastructure.settings import AgentSettings, Settings

    settings = Settings.model_construct(agents={
        "planner": AgentSettings(preset="claude"), "codex": AgentSettings(timeout_s=60),
        "coder": AgentSettings(command=["my-coder"]), "mine": AgentSettings(command=["x"]),
    })  # fmt: skip
    assert [preset_of(settings, name) for name in ("planner", "codex", "coder", "mine", "aider")] == [
        "claude", "codex", "custom", "custom", "aider"]  # fmt: skip
    assert preset_of(None, "claude") == "claude"
