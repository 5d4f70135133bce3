"""The worktree commands of the `taskgate` executable, as a user runs them on a real git repository."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli, seed

IDENTITY = ["-c", "user.name=agent", "-c", "user.email=agent@example.invalid"]


def commit(cwd: Path, name: str, content: str, message: str) -> None:
    (cwd / name).write_text(content)
    subprocess.run(["git", "add", "--", name], cwd=cwd, check=True, capture_output=True)
    subprocess.run(["git", *IDENTITY, "commit", "-q", "-m", message], cwd=cwd, check=True, capture_output=True)


def test_review_checkpoint_merge_worktrees_and_context_from_the_command_line(tmp_path):
    repo = make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    seed(cli)
    session = cli.json("session", "start", "DEMO-1")
    worktree = Path(session["worktree_path"])
    commit(worktree, "api.py", "def api(): ...\n", "feat: api")

    [row] = cli.json("worktrees")
    assert (row["session_id"], row["state"], row["orphan"]) == (session["id"], "planning", False) and row["bytes"] > 0
    review = cli.json("session", "review", session["id"][:8])
    assert review["ahead"] == 1 and [f["path"] for f in review["diff_stat"]] == ["api.py"]
    assert "checkpoint" in cli.ok("session", "checkpoint", session["id"][:8], "-m", "api ok")
    context = cli.json("context")
    assert context["git"]["branch"] == "main" and context["tracker"]["blocked"] == 1

    commit(repo, "api.py", "def other(): ...\n", "feat: a different api on main")
    for trigger in ("plan_complete", "work_complete", "approve"):
        cli.ok("session", "fire", session["id"][:8], trigger)
    error = cli.fails("session", "merge", session["id"][:8])
    assert "conflicts in api.py" in error and "awaiting_merge" in error
    assert cli.json("session", "show", session["id"])["state"] == "awaiting_merge"

    subprocess.run(["git", *IDENTITY, "merge", "-q", "-X", "ours", "main", "-m", "resolve"], cwd=worktree, check=True)
    assert "changed after it was approved" in cli.fails("session", "merge", session["id"][:8])  # fix unreviewed
    cli.ok("session", "fire", session["id"][:8], "reverify", "--reason", "conflict resolved")
    cli.ok("session", "decide", session["id"][:8], "approve", "--reason", "resolution is fine")
    merged = cli.ok("session", "merge", session["id"][:8])
    assert "awaiting_merge → merged" in merged and "then cleanup_done: merged → completed" in merged
    assert cli.json("worktrees") == [] and not worktree.exists()


def test_reconcile_reports_then_prunes_an_orphan_and_flags_a_vanished_worktree(tmp_path):
    make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    seed(cli)
    alive = cli.json("session", "start", "DEMO-1")
    cli.ok("task", "add", "Another", "--plan", "1")
    gone = cli.json("session", "start", "DEMO-3")
    shutil.rmtree(alive["worktree_path"])
    # an orphan: the worktree of a session whose row says cancelled (as after a crash mid-cancel)
    subprocess.run(["git", "worktree", "add", "-q", "-b", "feature/DEMO-9/0123abcd",
                    str(tmp_path / "repo" / ".worktrees" / "0123abcd-0000-4000-8000-000000000000")],
                   cwd=tmp_path / "repo", check=True, capture_output=True)  # fmt: skip

    report = cli.json("worktrees", "reconcile", "--report-only")
    assert report["missing_worktrees"] == [alive["id"]] and len(report["orphan_worktrees"]) == 1
    assert report["orphan_branches"] == ["feature/DEMO-9/0123abcd"] and report["pruned"] is False
    assert "worktree_missing" in cli.json("session", "show", alive["id"])["state_data"]

    report = cli.json("worktrees", "reconcile")
    assert report["pruned"] is True and len(report["orphan_worktrees"]) == 1
    assert [r["session_id"] for r in cli.json("worktrees")] == [gone["id"]]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *IDENTITY, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_a_merge_into_an_emptied_worktree_folder_is_refused_and_leaves_main_and_the_users_branch(tmp_path):
    repo = make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    seed(cli)
    session = cli.json("session", "start", "DEMO-1")
    worktree, short = Path(session["worktree_path"]), session["id"][:8]
    commit(worktree, "api.py", "def api(): ...\n", "feat: api")
    for trigger in ("plan_complete", "work_complete", "approve"):
        cli.ok("session", "fire", short, trigger)
    git(repo, "checkout", "-q", "-b", "human-work")
    commit(repo, "human.txt", "mine\n", "wip: the user's own work")
    git(repo, "checkout", "-q", "main")
    commit(repo, "upstream.txt", "theirs\n", "feat: meanwhile on main")
    git(repo, "checkout", "-q", "human-work")
    main, human = git(repo, "rev-parse", "main"), git(repo, "rev-parse", "human-work")
    shutil.rmtree(worktree)
    worktree.mkdir()  # emptied by hand: the folder stays

    error = cli.fails("session", "merge", short)

    assert str(worktree) in error and "empty folder" in error and "move it away" in error
    assert cli.json("session", "show", session["id"])["state"] == "awaiting_merge"
    assert (git(repo, "rev-parse", "main"), git(repo, "rev-parse", "human-work")) == (main, human)
    assert git(repo, "branch", "--show-current") == "human-work"
    assert git(repo, "status", "--porcelain") == "?? .taskgate/"  # only the folder init wrote, for the user to commit

    worktree.rmdir()
    assert "then cleanup_done: merged → completed" in cli.ok("session", "merge", short)
    assert git(repo, "rev-parse", "main^") == main and git(repo, "rev-parse", "human-work") == human


def test_a_merge_after_the_branch_was_deleted_by_hand_names_the_branch_not_every_file(tmp_path):
    repo = make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    seed(cli)
    session = cli.json("session", "start", "DEMO-1")
    worktree, short, branch = Path(session["worktree_path"]), session["id"][:8], session["branch_name"]
    commit(worktree, "api.py", "def api(): ...\n", "feat: api")
    for trigger in ("plan_complete", "work_complete", "approve"):
        cli.ok("session", "fire", short, trigger)
    main = git(repo, "rev-parse", "main")
    git(repo, "update-ref", "-d", f"refs/heads/{branch}")  # git branch -D refuses a checked-out branch; this not

    error = cli.fails("session", "merge", short)

    assert f"branch '{branch}'" in error and "no longer exists" in error, error
    assert "uncommitted" not in error and "README.md" not in error, error
    assert cli.json("session", "show", session["id"])["state"] == "awaiting_merge"
    assert git(repo, "rev-parse", "main") == main
    assert "no longer exists" in cli.fails("session", "review", short)
