"""`taskgate policies list` and `taskgate policies check` as a user runs them, with a per-project config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli, seed

IDENTITY = ["-c", "user.name=agent", "-c", "user.email=agent@example.invalid"]
FAILING = [sys.executable, "-c", "import sys; print('FAILED test_api.py::test_get'); sys.exit(1)"]


def configure(workdir: Path) -> None:
    (workdir / "config").mkdir()
    (workdir / "config" / "taskgate.toml").write_text(
        f"[policies.review_approval]\nmin_approvals = 1\n\n"
        f"[projects.demo]\ntest_command = {json.dumps(FAILING)}\ntest_timeout_s = 60\n\n"
        "[projects.demo.policies.commit_message_format]\nenabled = true\n"
    )


def test_policies_list_and_a_dry_run_check_then_the_refused_approve(tmp_path):
    make_git_repo(tmp_path / "repo")
    configure(tmp_path)
    cli = Cli(tmp_path)
    seed(cli)
    listed = cli.json("policies", "list", "-p", "demo")
    assert listed["test_command"] == FAILING
    enabled = {p["name"]: p["enabled"] for p in listed["policies"]}
    assert enabled["commit_message_format"] and enabled["require_tests"]
    assert "require_tests" in cli.ok("policies", "list")

    session = cli.json("session", "start", "DEMO-1")
    worktree = Path(session["worktree_path"])
    (worktree / "api.py").write_text("def api(): ...\n")
    subprocess.run(["git", "add", "api.py"], cwd=worktree, check=True)
    subprocess.run(["git", *IDENTITY, "commit", "-q", "-m", "added api"], cwd=worktree, check=True)
    for trigger in ("plan_complete", "work_complete"):
        cli.ok("session", "fire", session["id"][:8], trigger)

    before = cli.table_counts()
    done = cli.run("policies", "check", session["id"][:8], "approve", "--json")
    assert done.returncode == 2, done.stderr
    check = json.loads(done.stdout)
    assert not check["allowed"] and check["test_run"]["exit_code"] == 1 and check["test_run"]["stored"] is False
    failed = {r["policy"] for r in check["guard_results"] if not r["passed"]}
    assert failed == {"require_tests", "commit_message_format"}
    text = cli.run("policies", "check", session["id"][:8], "approve")
    assert text.returncode == 2 and "would be refused" in text.stdout and "FAILED test_api.py" in text.stdout
    assert cli.table_counts() == before  # a dry run writes nothing

    error = cli.fails("session", "fire", session["id"][:8], "approve")
    assert "require_tests" in error and "commit_message_format" in error
    assert cli.json("session", "show", session["id"])["state"] == "verifying"


def test_a_typo_in_the_policy_config_fails_the_start_naming_the_key(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "taskgate.toml").write_text("[policies.review_approval]\nmin_aprovals = 2\n")
    assert "policies.review_approval.min_aprovals" in Cli(tmp_path).fails("policies", "list")
