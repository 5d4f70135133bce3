"""`taskgate task import-beads` as a user runs it: a subprocess, a real git repo, the SQLite file."""

from __future__ import annotations

import json
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
    done = cli.run("task", "import-beads", path)
    assert done.returncode == 3, done.stderr  # imported, but not every line: scripts must notice
    assert "importing 3 issues into project demo" in done.stdout
    assert "3 created, 0 updated, 0 unchanged, 0 deleted, 1 skipped, 2 ready" in done.stdout
    assert "skipped line 2: invalid JSON" in done.stdout and "1 line(s) skipped" in done.stdout
    assert [t["id"] for t in cli.json("task", "ready")] == ["bd-2", "bd-3"]
    counts = cli.table_counts()

    again = cli.run("task", "import-beads", path, "--json")
    report = json.loads(again.stdout)
    assert again.returncode == 3
    assert report["counts"] == {"created": 0, "updated": 0, "unchanged": 3, "deleted": 0, "skipped": 1, "ready": 2}
    assert report["skipped"] == [{"line": 2, "reason": report["skipped"][0]["reason"], "issue_id": None}]
    assert cli.table_counts() == counts


def test_strict_refuses_the_whole_file_and_writes_nothing(cli: Cli) -> None:
    path = export(cli, bead("bd-1", "Fine"), "{broken")
    refusal = cli.fails("task", "import-beads", path, "--strict")
    assert "1 malformed line(s), nothing imported (--strict); first: line 2: invalid JSON" in refusal
    assert cli.json("task", "list") == []


def test_a_tombstoned_blocker_blocks_nothing_and_a_reimport_after_a_deletion_frees_what_it_blocked(cli: Cli):
    tombstone = bead("t-a", "A", status="tombstone")
    blocked = bead("t-b", "B", deps=[("t-a", "blocks")])
    cli.run("task", "import-beads", export(cli, tombstone, blocked))
    assert [t["id"] for t in cli.json("task", "ready")] == ["t-b"]  # the issue's own repro

    path = export(cli, bead("t-c", "C"), bead("t-d", "D", deps=[("t-c", "blocks")]))
    assert json.loads(cli.ok("task", "import-beads", path, "--json"))["deleted"] == ["t-a", "t-b"]
    assert [t["id"] for t in cli.json("task", "ready")] == ["t-c"]
    path = export(cli, bead("t-d", "D", deps=[("t-c", "blocks")]))  # t-c deleted in Beads (gone from the file)
    report = json.loads(cli.run("task", "import-beads", path, "--json").stdout)
    assert report["deleted"] == ["t-c"]
    assert [t["id"] for t in cli.json("task", "ready")] == ["t-d"]


def test_any_byte_sequence_is_one_bad_line_and_unicode_line_separators_stay_inside_their_line(cli: Cli) -> None:
    path = cli.workdir / "issues.jsonl"
    lines = [
        rb'{"id":"u-1","title":"an escaped backslash: \\ud800 is text"}',
        rb'{"id":"u-2","title":"lone \ud800 surrogate"}',
        b'{"id":"u-3","title":"bad \xff\xfe bytes"}',
        rb'{"id":"u-4","title":"escaped \u0085 NEL, \u2028 LS and \u2029 PS"}',
        '{"id":"u-5","title":"raw \u0085 NEL, \u2028 LS and \u2029 PS inside"}'.encode(),  # as Go's encoder writes
        b'{"id":"u-6","title":"last"}',
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    done = cli.run("task", "import-beads", str(path), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert [(p["line"], p["issue_id"]) for p in report["skipped"]] == [(2, "u-2"), (3, None)]
    assert "lone surrogate" in report["skipped"][0]["reason"] and "not UTF-8" in report["skipped"][1]["reason"]
    assert sorted(report["created"]) == ["u-1", "u-4", "u-5", "u-6"]
    titles = {t["id"]: t["title"] for t in cli.json("task", "list")}
    assert titles["u-5"] == "raw \u0085 NEL, \u2028 LS and \u2029 PS inside"


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


def test_task_ready_shows_the_first_hundred_like_bd_ready_and_says_there_are_more(cli: Cli) -> None:
    cli.ok("task", "import-beads", export(cli, *(bead(f"bd-{n:03}", priority=n % 5) for n in range(105))))
    table = cli.ok("task", "ready")
    assert table.count("│ bd-") == 100 and "showing the first 100; --limit 0 for all" in table
    first = [t["id"] for t in cli.json("task", "ready", "--limit", "3")]
    assert first == ["bd-000", "bd-005", "bd-010"]  # most urgent first, then by id
    assert len(cli.json("task", "ready", "--limit", "0")) == 105
    assert "showing" not in cli.ok("task", "ready", "--limit", "0")
    assert "--limit must be 0 (all) or more" in cli.fails("task", "ready", "--limit", "-1")
