"""`taskgate init` on a user's own repository, as a new user runs it: the real executable, a fresh `git init`,
no config of taskgate's checkout anywhere near, nothing in the environment but the user's own."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_cli import TASKGATE


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout


class User:
    """Runs `taskgate` the way a user does: in a folder of their repository, with no TASKGATE_* variables."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")} | {"COLUMNS": "200"}

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([TASKGATE, *args], cwd=cwd or self.repo, env=self.env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    def ok(self, *args: str, cwd: Path | None = None) -> str:
        done = self.run(*args, cwd=cwd)
        assert done.returncode == 0, f"taskgate {' '.join(args)} failed: {done.stderr}"
        return done.stdout

    def json(self, *args: str, cwd: Path | None = None):
        return json.loads(self.ok(*args, "--json", cwd=cwd))

    def fails(self, *args: str, cwd: Path | None = None) -> str:
        done = self.run(*args, cwd=cwd)
        assert done.returncode != 0, f"taskgate {' '.join(args)} should have failed"
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr, done.stderr
        return lines[0]


def fresh_repo(path: Path, branch: str = "trunk") -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", branch)
    git(path, "-c", "user.name=u", "-c", "user.email=u@example.invalid", "commit", "-q", "--allow-empty", "-m", "init")
    return path


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its content hash (the database's too)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.fixture
def user(tmp_path: Path) -> User:
    return User(fresh_repo(tmp_path / "my-repo"))


def test_init_sets_the_repository_up_in_one_step_and_says_what_it_did(user: User):
    out = user.ok("init")
    for said in (".taskgate/taskgate.toml", ".taskgate/.gitignore", ".taskgate/workflows/", ".taskgate/checklists/",
                 ".taskgate/agents/", "project my-repo", "key MYREPO", "registered"):  # fmt: skip
        assert said in out, out
    folder = user.repo / ".taskgate"
    config = (folder / "taskgate.toml").read_text()
    assert 'base_branch = "trunk"' in config  # the branch checked out, not a guess
    assert config.count("\n# ") > 20  # commented, like taskgate's own config
    assert (folder / "data" / "taskgate.db").is_file()
    # the database and session folders stay out of git: only the folder to commit shows, and data/ is ignored
    assert git(user.repo, "status", "--porcelain") == "?? .taskgate/\n"
    git(user.repo, "add", ".taskgate")
    staged = git(user.repo, "diff", "--cached", "--name-only").split()
    assert ".taskgate/taskgate.toml" in staged and not any("data/" in f for f in staged)
    assert "!! .taskgate/data/" in git(user.repo, "status", "--porcelain", "--ignored")


def test_init_twice_changes_nothing(user: User):
    user.ok("init")
    before = snapshot(user.repo / ".taskgate")
    out = user.ok("init")
    assert "already set up: nothing changed" in out and "registered already" in out
    assert snapshot(user.repo / ".taskgate") == before


def test_init_restores_what_went_missing_and_keeps_what_the_team_edited(user: User):
    user.ok("init")
    config = user.repo / ".taskgate" / "taskgate.toml"
    config.write_text(config.read_text() + "\n[policies.review_approval]\nmin_approvals = 2\n")
    (user.repo / ".taskgate" / ".gitignore").unlink()
    out = user.ok("init")
    assert "created .taskgate/.gitignore" in out and "taskgate.toml" not in out.split("project")[0]
    assert "min_approvals = 2" in config.read_text()


def test_info_shows_every_path_and_commands_work_from_any_folder_of_the_repository(user: User):
    user.ok("init")
    sub = user.repo / "src" / "deep"
    sub.mkdir(parents=True)
    report = user.json("info", cwd=sub)  # found by walking up to .taskgate/
    root = user.repo.resolve()
    assert report["config_file"] == str(root / ".taskgate" / "taskgate.toml")
    assert report["data_dir"] == str(root / ".taskgate" / "data")
    assert report["database_url"].endswith(str(root / ".taskgate" / "data" / "taskgate.db"))
    assert report["session_folders"] == str(root / ".taskgate" / "data" / "agent-outputs")
    assert report["project_workflows"] == str(root / ".taskgate" / "workflows")
    assert report["project_checklists"] == str(root / ".taskgate" / "checklists")
    assert report["project_agents"] == str(root / ".taskgate" / "agents")
    assert Path(report["builtin_catalogue"], "workflows", "development", "feature-development.yaml").is_file()
    assert report["worktrees"].endswith(".worktrees/<session id>")
    assert user.json("task", "add", "Make it", cwd=sub)["id"] == "MYREPO-1"


def test_the_built_in_catalogue_is_there_and_a_project_file_replaces_its_namesake(user: User):
    user.ok("init")
    listed = {e["id"]: e for e in user.json("workflow", "list")}
    assert {"feature-development", "bug-fix", "refactor", "comprehensive-test"} <= set(listed)
    assert {e["source"] for e in listed.values()} == {"built-in"}
    checklists = {c["id"]: c["source"] for c in user.json("checklist", "list")}
    assert checklists["release"] == "built-in"
    own = user.repo / ".taskgate" / "workflows" / "maintenance" / "bug-fix.yaml"
    own.parent.mkdir(parents=True)
    own.write_text("id: bug-fix\ndescription: Our own bug fix.\nsteps:\n  - id: ok\n    type: approval\n"
                   "    message: Looks fixed?\n")  # fmt: skip
    listed = {e["id"]: e for e in user.json("workflow", "list")}
    assert listed["bug-fix"]["source"] == "project" and listed["bug-fix"]["description"] == "Our own bug fix."
    assert listed["refactor"]["source"] == "built-in"
    assert user.json("workflow", "show", "bug-fix")["description"] == "Our own bug fix."


def test_an_empty_listing_says_how_to_add_one(user: User):
    user.ok("init")
    done = user.run("checklist", "list", "no-such-thing")
    assert done.returncode == 0 and "no checklists match; add your own under" in done.stderr
    assert str(user.repo.resolve() / ".taskgate" / "checklists") in done.stderr
    done = user.run("workflow", "list", "no-such-thing")
    assert "taskgate workflow create NAME --template basic" in done.stderr


def test_init_outside_a_git_repository_writes_nothing(tmp_path: Path):
    plain = tmp_path / "plain"
    plain.mkdir()
    error = User(plain).fails("init")
    assert "is not inside a git repository" in error and "git init" in error
    assert list(plain.iterdir()) == []


def test_init_of_a_repository_registered_as_another_project_writes_nothing(user: User):
    user.ok("init", "--name", "shop")
    before = snapshot(user.repo / ".taskgate")
    error = user.fails("init", "--name", "other")
    assert "already registered as project 'shop'" in error
    assert snapshot(user.repo / ".taskgate") == before


def test_a_bad_project_name_is_refused_before_anything_is_written(user: User):
    assert "project name '../x' is invalid" in user.fails("init", "--name", "../x")
    assert not (user.repo / ".taskgate").exists()


def test_the_hooks_table_init_writes_works_once_uncommented_with_a_worktreeinclude(user: User):
    user.ok("init")
    config = user.repo / ".taskgate" / "taskgate.toml"
    text = config.read_text()
    example = '# [hooks]\n# after_create = "make setup"'
    assert example in text and user.json("info")["hooks"] is None
    config.write_text(text.replace(example, '[hooks]\nafter_create = "echo set up > ready.txt; cat .env"'))
    (user.repo / ".gitignore").write_text(".env\n")
    (user.repo / ".worktreeinclude").write_text("# local files every worktree needs\n.env\n")
    (user.repo / ".env").write_text("TOKEN=local\n")
    assert user.json("info")["hooks"] == "after_create `echo set up > ready.txt; cat .env` (timeout 300 s)"
    user.ok("task", "add", "Make it")
    session = user.json("session", "start", "MYREPO-1")
    worktree = Path(session["worktree_path"])
    assert (worktree / "ready.txt").read_text() == "set up\n" and (worktree / ".env").read_text() == "TOKEN=local\n"
    log = (user.repo / ".taskgate" / "data" / "agent-outputs" / session["id"] / "hooks.log").read_text()
    assert "copied .env" in log and "$ echo set up > ready.txt; cat .env\nTOKEN=local\n" in log
    config.write_text(config.read_text().replace("after_create =", "after_creat ="))
    assert "hooks.after_creat: Extra inputs are not permitted" in user.fails("info")
