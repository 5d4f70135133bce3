"""`taskgate task import-beads` as a user runs it: a subprocess, a real git repo, the SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli
from tests.support import bead, jsonl


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    assert "project demo" in cli.ok("init", "repo", "--name", "demo")
    return cli


def export(cli: Cli, *lines) -> str:
    path = cli.workdir / "issues.jsonl"
    path.write_text(jsonl(*lines))
    return str(path)


def test_an_export_imports_with_a_summary_and_again_changes_nothing(cli: Cli) -> None:
    path = export(
        cli,
        bead("bd-1", "Ship it", deps=[("bd-2", "blocks")]),
        "{broken",
        bead("bd-2", "Prepare", priority=0),
        bead("bd-3", "Linked", deps=[("bd-1", "related")]),
    )
    out = cli.ok("task", "import-beads", path)
    assert "importing 3 issues into project demo" in out
    assert "3 created, 0 updated, 0 unchanged, 1 skipped" in out
    assert "skipped line 2: invalid JSON" in out
    assert [t["id"] for t in cli.json("task", "ready")] == ["bd-2", "bd-3"]
    counts = cli.table_counts()

    again = cli.json("task", "import-beads", path)
    assert again["counts"] == {"created": 0, "updated": 0, "unchanged": 3, "skipped": 1}
    assert again["skipped"] == [{"line": 2, "reason": again["skipped"][0]["reason"], "issue_id": None}]
    assert cli.table_counts() == counts


def test_new_tasks_can_go_into_a_plan(cli: Cli) -> None:
    cli.ok("plan", "add", "Phase 1")
    cli.ok("task", "import-beads", export(cli, bead("bd-1", "Planned")), "--plan", "1")
    assert [t["plan_id"] for t in cli.json("task", "list")] == [1]


def test_open_issues_imported_into_a_closed_plan_reopen_it(cli: Cli) -> None:
    cli.ok("plan", "add", "Phase 1")
    cli.ok("task", "add", "Only task", "--plan", "1")
    short = cli.json("session", "start", "DEMO-1")["id"][:8]
    for trigger in ("plan_complete", "work_complete", "approve", "merge"):
        cli.ok("session", "fire", short, trigger)
    assert [p["status"] for p in cli.json("plan", "list")] == ["closed"]
    out = cli.ok("task", "import-beads", export(cli, bead("bd-1", "Follow-up")), "--plan", "1")
    assert "plan 1 was closed and is open again" in out
    assert [p["status"] for p in cli.json("plan", "list")] == ["open"]
    assert [t["id"] for t in cli.json("task", "ready")] == ["bd-1"]


def test_a_missing_file_or_plan_fails_with_one_line(cli: Cli) -> None:
    assert "cannot read" in cli.fails("task", "import-beads", str(cli.workdir / "nope.jsonl"))
    assert "plan 7 not found" in cli.fails("task", "import-beads", export(cli, bead("bd-1")), "--plan", "7")
    assert cli.json("task", "list") == []
