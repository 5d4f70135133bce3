"""Worktree lifecycle hooks and `.worktreeinclude` on real git repositories and real processes, on SQLite and
PostgreSQL: each hook runs at its point with its environment, its output in hooks.log and a `worktree.hook` event, a
failing after_create leaves nothing behind, a hook past its timeout loses its whole process group."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.workspaces.hooks import HOOK_EVENT, HOOKS_LOG, INCLUDED_EVENT, HookBook, Hooks, WorktreeHooks
from taskgate.domain.entities import TaskStatus
from taskgate.domain.errors import WorktreeNotCreated
from taskgate.domain.states import SessionState
from taskgate.infrastructure.session_folder import SessionFolderStore
from taskgate.infrastructure.system import SystemClock
from taskgate.infrastructure.worktree_setup import LocalWorktreeSetup
from tests.builders import fire, seed, start
from tests.conftest import Services


def git(cwd: Path | str, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def with_hooks(services: Services, folders: Path, **hooks: object) -> SessionFolderStore:
    store = SessionFolderStore(folders)
    book = HookBook(Hooks(**hooks))  # type: ignore[arg-type]
    setup = LocalWorktreeSetup()
    services.workspaces.use_hooks(WorktreeHooks(services.uow, SystemClock(), setup, book, store, services.sessions))
    return store


async def events(services: Services, session_id: str, kind: str) -> list[dict]:
    async with services.uow(write=False) as uow:
        return [e["payload"] for e in await uow.events.list(session_id) if e["kind"] == kind]


def branches(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").splitlines()


async def test_after_create_runs_in_the_new_worktree_with_its_environment_and_is_logged(
    sql_services, git_repo, tmp_path
):
    store = with_hooks(sql_services, tmp_path / "folders",
                       after_create='echo "setup in $PWD for $TASKGATE_TASK_ID on $TASKGATE_BRANCH"; '
                                    'env | sort > env.txt; echo done > made-by-hook.txt')  # fmt: skip
    seeded = await seed(sql_services, git_repo, tasks=1)
    session = await start(sql_services, seeded.tasks[0])
    worktree = Path(session.worktree_path)
    assert session.state == SessionState.PLANNING
    assert (worktree / "made-by-hook.txt").read_text() == "done\n"
    seen = dict(line.split("=", 1) for line in (worktree / "env.txt").read_text().splitlines())
    assert seen["TASKGATE_SESSION_ID"] == session.id and seen["TASKGATE_TASK_ID"] == seeded.tasks[0].id
    assert seen["TASKGATE_WORKTREE"] == str(worktree) and seen["TASKGATE_BRANCH"] == session.branch_name
    assert seen["TASKGATE_HOOK"] == "after_create" and seen["TASKGATE_PROJECT_ROOT"] == str(git_repo)
    assert "PATH" in seen and "HOME" in seen and "TASKGATE_CONFIG" not in seen
    assert (
        not set(seen) - {"PATH", "HOME", "PWD", "SHLVL", "_", "OLDPWD"} - {k for k in seen if k.startswith("TASKGATE_")}
    )
    log = Path(store.path(session.id), HOOKS_LOG).read_text()
    assert log.startswith("=== after_create ") and f"setup in {worktree} for {seeded.tasks[0].id}" in log
    assert "=== after_create: exit 0 after" in log
    [event] = await events(sql_services, session.id, HOOK_EVENT)
    assert event["hook"] == "after_create" and event["exit_code"] == 0 and event["duration_s"] >= 0
    assert "error" not in event


async def test_a_failing_after_create_cancels_the_session_and_leaves_no_worktree_or_branch(
    sql_services, git_repo, tmp_path
):
    store = with_hooks(
        sql_services, tmp_path / "folders", after_create="echo preparing; echo 'no rule to make setup' >&2; exit 2"
    )
    seeded = await seed(sql_services, git_repo, tasks=1)
    before = branches(git_repo)
    with pytest.raises(WorktreeNotCreated) as refused:
        await start(sql_services, seeded.tasks[0])
    [session] = await sql_services.sessions.list_sessions(seeded.project.id)
    log = str(Path(store.path(session.id), HOOKS_LOG))
    assert "hook after_create (`echo preparing; echo 'no rule to make setup' >&2; exit 2`) exited 2 after " in str(
        refused.value
    )
    assert str(refused.value).endswith(f": no rule to make setup; see {log}. Fix that and start the task again")
    assert session.state == SessionState.CANCELLED
    assert not Path(session.worktree_path).exists() and branches(git_repo) == before
    assert [
        line for line in git(git_repo, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree ")
    ] == [f"worktree {git_repo}"]
    assert (await sql_services.tracker.list_tasks(seeded.project.id))[0].status == TaskStatus.OPEN
    [event] = await events(sql_services, session.id, HOOK_EVENT)
    assert event["exit_code"] == 2 and event["last_line"] == "no rule to make setup" and "exited 2" in event["error"]
    assert "=== after_create: exit 2" in Path(log).read_text()
    assert not await events(sql_services, session.id, "worktree.cleanup_failed")  # before_remove did not run


async def test_a_hook_past_its_timeout_is_killed_with_its_whole_process_group(sql_services, git_repo, tmp_path):
    pid_file = tmp_path / "child.pid"
    with_hooks(sql_services, tmp_path / "folders", timeout_s=1.0,
               after_create=f"sleep 300 & echo $! > {pid_file}; echo waiting; wait")  # fmt: skip
    seeded = await seed(sql_services, git_repo, tasks=1)
    began = time.monotonic()
    with pytest.raises(
        WorktreeNotCreated, match=r"hook after_create \(`.*`\) was killed at its timeout of 1 s: waiting; see "
    ):
        await start(sql_services, seeded.tasks[0])
    assert time.monotonic() - began < 30
    child = int(pid_file.read_text())
    assert not _alive(child), "the hook's background child outlived its timeout"
    [session] = await sql_services.sessions.list_sessions(seeded.project.id)
    [event] = await events(sql_services, session.id, HOOK_EVENT)
    assert event["timed_out"] is True and event["exit_code"] is None


async def test_before_remove_runs_before_the_merged_worktree_goes_and_its_failure_does_not_block(
    sql_services, git_repo, tmp_path
):
    marks = tmp_path / "marks.txt"
    store = with_hooks(sql_services, tmp_path / "folders",
                       before_remove=f"ls > {marks}; echo cannot stop the dev server; exit 3")  # fmt: skip
    seeded = await seed(sql_services, git_repo, tasks=1)
    session = await start(sql_services, seeded.tasks[0])
    worktree = Path(session.worktree_path)
    (worktree / "feature.txt").write_text("x\n")
    git(worktree, "add", "feature.txt")
    git(worktree, "-c", "user.name=a", "-c", "user.email=a@example.invalid", "commit", "-q", "-m", "feat")
    done = await fire(sql_services, session, "plan_complete", "work_complete", "approve", "merge")
    assert done.state == SessionState.COMPLETED and not worktree.exists()
    assert "feature.txt" in marks.read_text().split()  # it ran in the worktree, while it was still there
    [event] = await events(sql_services, session.id, HOOK_EVENT)
    assert event["hook"] == "before_remove" and event["exit_code"] == 3
    assert event["error"].startswith("hook before_remove (`ls > ") and "exited 3 after" in event["error"]
    assert "cannot stop the dev server" in Path(store.path(session.id), HOOKS_LOG).read_text()


async def test_a_cancel_reports_a_failing_before_remove_as_a_warning_and_removes_the_worktree(
    sql_services, git_repo, tmp_path
):
    with_hooks(sql_services, tmp_path / "folders", before_remove="exit 7")
    seeded = await seed(sql_services, git_repo, tasks=1)
    session = await start(sql_services, seeded.tasks[0])
    result = await sql_services.sessions.fire(FireTrigger(session.id, "cancel", "alice"))
    assert result.session.state == SessionState.CANCELLED and not Path(session.worktree_path).exists()
    assert any("hook before_remove (`exit 7`) exited 7" in warning for warning in result.warnings)


async def test_worktreeinclude_copies_ignored_listed_files_only(sql_services, git_repo, tmp_path):
    store = with_hooks(sql_services, tmp_path / "folders", after_create="cat .env > seen-by-hook.txt")
    (git_repo / ".gitignore").write_text(".env\nconfig/local.yml\n*.secret\nbuild/\nunlisted.txt\n")
    (git_repo / ".worktreeinclude").write_text(
        "# copied into each new worktree\n.env\nconfig/local.yml\n*.secret\nREADME.md\ntracked.env\n"
    )
    (git_repo / "tracked.env").write_text("tracked\n")
    git(git_repo, "add", ".gitignore", ".worktreeinclude", "tracked.env")
    git(git_repo, "-c", "user.name=a", "-c", "user.email=a@example.invalid", "commit", "-q", "-m", "ignore rules")
    (git_repo / ".env").write_text("API_KEY=local\n")
    (git_repo / "config").mkdir()
    (git_repo / "config" / "local.yml").write_text("db: local\n")
    (git_repo / "deep" / "er").mkdir(parents=True)
    (git_repo / "deep" / "er" / "key.secret").write_text("s3cret\n")
    os.chmod(git_repo / "deep" / "er" / "key.secret", 0o600)
    (git_repo / "unlisted.txt").write_text("ignored but not listed\n")
    (git_repo / "untracked.secret.txt").write_text("not ignored\n")
    (git_repo / "outside.secret").symlink_to(tmp_path / "elsewhere.txt")
    (tmp_path / "elsewhere.txt").write_text("outside the repository\n")
    (git_repo / ".gitignore").write_text((git_repo / ".gitignore").read_text() + "outside.secret\n")
    git(git_repo, "-c", "user.name=a", "-c", "user.email=a@example.invalid", "commit", "-qam", "link ignored")
    (git_repo / "tracked.env").write_text("changed in the checkout\n")

    seeded = await seed(sql_services, git_repo, tasks=2)
    first = await start(sql_services, seeded.tasks[0])
    worktree = Path(first.worktree_path)
    assert (worktree / ".env").read_text() == "API_KEY=local\n"
    assert (worktree / "seen-by-hook.txt").read_text() == "API_KEY=local\n"  # copied before after_create ran
    assert (worktree / "config" / "local.yml").read_text() == "db: local\n"
    assert stat.S_IMODE((worktree / "deep" / "er" / "key.secret").stat().st_mode) == 0o600
    assert not (worktree / "unlisted.txt").exists() and not (worktree / "untracked.secret.txt").exists()
    assert not (worktree / "outside.secret").exists()
    assert (worktree / "tracked.env").read_text() == "tracked\n"  # tracked: the branch's, never the checkout's
    [included] = await events(sql_services, first.id, INCLUDED_EVENT)
    assert included["copied"] == [".env", "config/local.yml", "deep/er/key.secret"] and included["count"] == 3
    assert included["skipped"] == ["outside.secret: it leads out of the repository (a symbolic link)"]
    log = Path(store.path(first.id), HOOKS_LOG).read_text()
    assert "=== .worktreeinclude " in log and "copied config/local.yml" in log

    second = await start(sql_services, seeded.tasks[1])  # the first session's worktree is not a source
    [again] = await events(sql_services, second.id, INCLUDED_EVENT)
    assert again["copied"] == included["copied"]


async def test_no_worktreeinclude_and_no_hooks_change_nothing(sql_services, git_repo, tmp_path):
    store = with_hooks(sql_services, tmp_path / "folders")
    seeded = await seed(sql_services, git_repo, tasks=1)
    session = await start(sql_services, seeded.tasks[0])
    assert session.state == SessionState.PLANNING
    assert not await events(sql_services, session.id, INCLUDED_EVENT)
    assert not await events(sql_services, session.id, HOOK_EVENT)
    assert not Path(store.path(session.id), HOOKS_LOG).exists()


def _alive(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state == "Z":  # killed, not yet reaped by whoever adopted it
            return False
        time.sleep(0.05)
    return True


async def test_a_symbolic_link_planted_at_hooks_log_is_not_followed_and_the_hook_is_not_run(
    sql_services, git_repo, tmp_path
):
    ran = tmp_path / "ran.txt"
    store = with_hooks(sql_services, tmp_path / "folders", after_create="true", before_remove=f"touch {ran}")
    seeded = await seed(sql_services, git_repo, tasks=1)
    session = await start(sql_services, seeded.tasks[0])
    outside = tmp_path / "outside.txt"
    outside.write_text("not taskgate's\n")
    log = Path(store.path(session.id), HOOKS_LOG)
    log.unlink()
    log.symlink_to(outside)
    result = await sql_services.sessions.fire(FireTrigger(session.id, "cancel", "alice"))
    assert result.session.state == SessionState.CANCELLED and outside.read_text() == "not taskgate's\n"
    [warning] = [w for w in result.warnings if "before_remove" in w]
    assert warning.startswith(f"hook before_remove (`touch {ran}`) could not be started (cannot write the hooks' log ")
    assert "symbolic links" in warning and not ran.exists()
    [event] = [e for e in await events(sql_services, session.id, HOOK_EVENT) if e["hook"] == "before_remove"]
    assert event["exit_code"] is None and "cannot write the hooks' log" in event["error"]
