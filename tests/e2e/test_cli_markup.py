"""Text the CLI prints is text: errors, help and data that look like Rich markup (`[agents.NAME]`,
`[[mcp.tokens]]`, `[red]`) print as they are, never swallowed or styled."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli, seed


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    make_git_repo(tmp_path / "repo")
    return Cli(tmp_path)


def test_an_error_naming_a_config_table_prints_it(cli: Cli):
    seed(cli)
    session = cli.json("session", "start", "DEMO-1")

    error = cli.fails("session", "execute", session["id"][:8], "--agent", "nobody")

    assert "[agents.NAME]" in error and "nobody" in error


def test_help_naming_config_tables_prints_them(cli: Cli):
    assert "[[mcp.tokens]]" in cli.ok("token", "create", "--help")
    assert "[sweeper]" in cli.ok("sweep", "--help")


def test_a_config_error_names_the_webhooks_table(cli: Cli):
    (cli.workdir / "config").mkdir()
    hook = '[[webhooks]]\nname = "ci"\nurl = "http://127.0.0.1:9/hooks"\nsecret = "s"\n'
    (cli.workdir / "config" / "taskgate.toml").write_text(f'{hook}\n[escalation]\nwebhooks = ["ops"]\n')

    error = cli.fails("info")

    assert "escalation.webhooks names no [[webhooks]] entry: ops (configured: ci)" in error


def test_reasons_and_instructions_that_look_like_markup_print_as_they_are(cli: Cli):
    seed(cli)
    short = cli.json("session", "start", "DEMO-1")["id"][:8]
    cli.ok("session", "fire", short, "plan_complete", "--reason", "see [agents.NAME] and [red]this[/red]")

    history = cli.ok("session", "history", short)
    assert "see [agents.NAME] and [red]this[/red]" in history.replace("\n", "").replace("│", "").replace("  ", " ")
