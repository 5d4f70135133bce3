"""The `taskgate` executable as a user runs it: real subprocesses, a real git repo, real databases."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.conftest import make_git_repo

TASKGATE = str(Path(sys.executable).with_name("taskgate"))


class Cli:
    """Runs `taskgate` in a scratch directory whose data dir (and so SQLite file) is private to the test."""

    def __init__(self, workdir: Path, database_url: str | None = None) -> None:
        self.workdir = workdir
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
        self.env |= {
            "TASKGATE_DATA_DIR": str(workdir / "data"),
            "TASKGATE_OPERATOR__DEFAULT": "alice",
            "COLUMNS": "200",
        }
        if database_url:
            self.env["TASKGATE_DATABASE_URL"] = database_url

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [TASKGATE, *args], cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=120
        )

    def ok(self, *args: str) -> str:
        done = self.run(*args)
        assert done.returncode == 0, f"taskgate {' '.join(args)} failed: {done.stderr}"
        return done.stdout

    def json(self, *args: str):
        return json.loads(self.ok(*args, "--json"))

    def fails(self, *args: str) -> str:
        """Run a command that must fail: non-zero exit, exactly one line on stderr, no traceback."""
        done = self.run(*args)
        assert done.returncode != 0, f"taskgate {' '.join(args)} should have failed"
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
        assert "Traceback" not in done.stderr + done.stdout
        return lines[0]

    def table_counts(self) -> dict[str, int]:
        with sqlite3.connect(self.workdir / "data" / "taskgate.db") as conn:
            names = [r[0] for r in conn.execute("select name from sqlite_master where type='table'")]
            return {n: conn.execute(f'select count(*) from "{n}"').fetchone()[0] for n in names}


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    make_git_repo(tmp_path / "repo")
    return Cli(tmp_path)


@pytest.fixture(scope="module")
def seeded_cli(tmp_path_factory: pytest.TempPathFactory) -> tuple[Cli, str]:
    """A workspace with project demo, DEMO-1 started and DEMO-2 blocked by it."""
    root = tmp_path_factory.mktemp("seeded")
    make_git_repo(root / "repo")
    cli = Cli(root)
    seed(cli)
    return cli, cli.json("session", "start", "DEMO-1")["id"]


def seed(cli: Cli) -> None:
    assert "project demo" in cli.ok("init", "repo", "--name", "demo")
    assert "plan Phase 1 added (id 1)" in cli.ok("plan", "add", "Phase 1")
    assert cli.json("task", "add", "Build the API", "--plan", "1", "--priority", "1")["id"] == "DEMO-1"
    blocked = cli.json("task", "add", "Document it", "--plan", "1", "--blocked-by", "DEMO-1")
    assert blocked["blockers"] == ["DEMO-1"]


def test_a_user_drives_a_session_from_init_to_completion_through_the_cli(cli):
    seed(cli)
    assert [t["id"] for t in cli.json("task", "ready")] == ["DEMO-1"]
    session = cli.json("session", "start", "DEMO-1")
    assert session["state"] == "planning" and session["operator_id"] == "alice"
    short = session["id"][:8]
    for trigger in ("plan_complete", "work_complete", "approve"):
        assert "→" in cli.ok("session", "fire", short, trigger, "--reason", f"because {trigger}")
    merged = cli.ok("session", "fire", short, "merge", "--reason", "because merge")
    assert "awaiting_merge → merged" in merged and "then cleanup_done: merged → completed" in merged
    shown = cli.json("session", "show", short)
    assert shown["state"] == "completed" and shown["version"] == 9
    history = cli.json("session", "history", session["id"], "--limit", "3")
    assert [r["trigger"] for r in history] == ["approve", "merge", "cleanup_done"]
    assert history[-2]["actor"] == "operator:alice" and history[-2]["reason"] == "because merge"
    assert history[-1]["actor"] == "system" and history[-1]["reason"] == "automatic after merge"
    assert [t["id"] for t in cli.json("task", "ready")] == ["DEMO-2"]
    assert {t["status"] for t in cli.json("task", "list", "--status", "completed")} == {"completed"}


def test_a_task_added_to_a_plan_that_closed_reopens_it_and_can_start(cli):
    assert "project demo" in cli.ok("init", "repo", "--name", "demo")
    cli.ok("plan", "add", "Phase 1")
    cli.ok("task", "add", "Build the API", "--plan", "1")
    short = cli.json("session", "start", "DEMO-1")["id"][:8]
    for trigger in ("plan_complete", "work_complete", "approve", "merge"):
        cli.ok("session", "fire", short, trigger)
    assert [p["status"] for p in cli.json("plan", "list")] == ["closed"]  # its last task completed

    out = cli.ok("task", "add", "Document it", "--plan", "1")
    assert "task DEMO-2 added: Document it" in out and "plan 1 'Phase 1' was closed and is open again" in out
    assert [p["status"] for p in cli.json("plan", "list")] == ["open"]
    assert [t["id"] for t in cli.json("task", "ready")] == ["DEMO-2"]
    assert cli.json("task", "add", "And test it", "--plan", "1")["plan_reopened"] is None  # open: nothing to say
    assert cli.json("session", "start", "DEMO-2")["state"] == "planning"
    assert [p["status"] for p in cli.json("plan", "list")] == ["in_progress"]


def test_state_at_replays_history_and_accepts_zone_less_timestamps_as_utc(cli):
    seed(cli)
    session = cli.json("session", "start", "DEMO-1")
    history = cli.json("session", "history", session["id"])
    start_row = history[-1]
    assert cli.ok("session", "state-at", session["id"], start_row["at"]).strip() == "planning"
    created = datetime.fromisoformat(history[0]["at"]).astimezone(UTC).replace(tzinfo=None).isoformat()
    assert cli.ok("session", "state-at", session["id"], created).strip() == "created"
    now = datetime.now(UTC).isoformat()
    assert cli.json("session", "state-at", session["id"], now)["state"] == "planning"


def test_audit_transitions_filters_and_exports_table_json_and_csv(cli):
    seed(cli)
    session = cli.json("session", "start", "DEMO-1")
    by_system = cli.json("audit", "transitions", "--actor", "system")
    assert [r["trigger"] for r in by_system] == ["initialize", "context_discovered"]
    rows = list(
        csv.DictReader(io.StringIO(cli.ok("audit", "transitions", "--format", "csv", "--session", session["id"][:6])))
    )
    assert [r["trigger"] for r in rows] == ["create", "initialize", "context_discovered", "start"]
    assert json.loads(rows[-1]["guard_results"])[0]["policy"] == "wip_limit"
    assert len(cli.json("audit", "transitions", "--state", "planning", "--since", "2000-01-01")) == 1
    assert cli.json("audit", "transitions", "--until", "2000-01-01T00:00:00Z") == []
    table = cli.ok("audit", "transitions")
    assert "context_discovered" in table and "operator:alice" in table


def test_fsm_prints_the_mermaid_diagram_generated_from_the_table(cli):
    diagram = cli.ok("fsm", "--format", "mermaid")
    assert diagram.startswith("stateDiagram-v2") and "suspended --> verifying: resume [prior=verifying]" in diagram
    assert len(json.loads(cli.ok("fsm", "--format", "json"))) >= 19


def test_info_names_the_config_file_data_dir_and_database(cli, tmp_path):
    report = cli.json("info")
    assert report["config_file"] is None
    assert report["database_url"] == f"sqlite:///{tmp_path / 'data' / 'taskgate.db'}"
    assert report["schema_revision"] == report["head_revision"] is not None
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "taskgate.toml").write_text("[policies.wip_limit]\nlimit = 5\n")
    report = cli.json("info")
    assert report["config_file"] == str(tmp_path / "config" / "taskgate.toml") and report["wip_limit"] == 5


VERSION_RANGE = "expected_version must be from 1 to 2147483647, got 9223372036854775808"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["session", "start", "DEMO-2"], "task_unblocked"),
        (["session", "start", "NOPE-1"], "task NOPE-1 not found"),
        (["session", "fire", "{sid}", "merge"], "trigger 'merge' is not allowed"),
        (["session", "fire", "{sid}", "teleport"], "unknown trigger 'teleport'"),
        (["session", "fire", "{sid}", "plan_complete", "--expected-version", "1"], "is at version 4"),
        (["session", "show", "ffffffff"], "session ffffffff not found"),
        (["session", "state-at", "{sid}", "yesterday"], "malformed timestamp 'yesterday'"),
        (["session", "history", "{sid}", "--limit", "0"], "limit must be from 1 to 100000, got 0"),
        # integers out of range are invalid input, refused before the database (which would overflow) sees them
        (["session", "fire", "{sid}", "plan_complete", "--expected-version", str(2**63)], VERSION_RANGE),
        (["session", "decide", "{sid}", "approve", "--expected-version", str(2**63)], VERSION_RANGE),
        (["session", "fire", "{sid}", "plan_complete", "--expected-version", "0"], "expected_version must be from 1"),
        (["session", "history", "{sid}", "--limit", str(2**63)], "limit must be from 1 to 100000"),
        (["audit", "transitions", "--limit", str(2**63)], "limit must be from 1 to 100000"),
        (["task", "list", "--plan", str(2**31)], "plan_id must be from 1 to 2147483647, got 2147483648"),
        (["task", "add", "x", "--plan", str(2**63)], "plan_id must be from 1 to 2147483647"),
        (["audit", "transitions", "--state", "nirvana"], "unknown state 'nirvana'"),
        (["task", "add", "x", "--priority", "9"], "priority must be from 0 to 4, got 9"),
        (["task", "add", "x", "--plan", "42"], "plan 42 not found"),
        (["task", "list", "--status", "sleeping"], "unknown task status 'sleeping'"),
        (["init", "."], "is not inside a git repository"),
        (["init", "repo", "--name", "other"], "already registered as project 'demo'"),
        (["plan", "add", "../../etc"], "plan name '../../etc' is invalid"),
        (["project", "archive", "demo"], "has 1 active session"),
    ],
)
def test_bad_input_exits_non_zero_with_one_line_and_writes_nothing(seeded_cli, args, message):
    # Every case shares one seeded workspace: safe because each must leave every table unchanged.
    cli, sid = seeded_cli
    before = cli.table_counts()
    assert message in cli.fails(*[a.replace("{sid}", sid) for a in args])
    assert cli.table_counts() == before


def test_a_missing_explicit_config_file_is_named(cli):
    assert "does not exist" in cli.fails("--config", "nowhere.toml", "info")


def test_the_same_commands_run_on_postgresql_by_setting_only_the_database_url(tmp_path, pg_url):
    make_git_repo(tmp_path / "pgrepo")
    cli = Cli(tmp_path, database_url=pg_url)
    assert cli.json("info")["dialect"] == "postgresql"
    name = f"pg{os.getpid()}"
    cli.ok("init", "pgrepo", "--name", name)
    plan = cli.json("plan", "add", "Phase 1", "--project", name)
    task = cli.json("task", "add", "On PostgreSQL", "--plan", str(plan["id"]), "--project", name)
    session = cli.json("session", "start", task["id"])
    assert session["state"] == "planning"
    assert [r["trigger"] for r in cli.json("session", "history", session["id"])][-1] == "start"
    # past 32 bits: asyncpg would refuse the number in its own words; taskgate refuses it first, naming it
    for command in ("fire", "decide"):
        error = cli.fails("session", command, session["id"], "approve", "--expected-version", str(2**31))
        assert error == "error: expected_version must be from 1 to 2147483647, got 2147483648", error
    assert cli.json("session", "show", session["id"])["version"] == session["version"]


def test_a_config_entry_token_is_printed_with_its_hash_and_nothing_is_stored(seeded_cli):
    import hashlib

    cli, _sid = seeded_cli
    before = cli.table_counts()
    out = cli.ok("token", "create", "--operator", "alice", "--config-entry", "--label", "ci").splitlines()
    secret = next(line for line in out if line.startswith("tg_"))
    assert f'sha256 = "{hashlib.sha256(secret.encode()).hexdigest()}"' in out and 'operator = "alice"' in out
    assert cli.table_counts() == before
