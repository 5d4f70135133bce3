"""Git acts only on what taskgate owns (issue 13, "never lose work"), on real repositories.

Fault injection found a merge that rewrote `main` non-fast-forward and rebased a user's branch: the session's
worktree folder had been emptied by hand, so git, run there, acted on the enclosing project checkout. Each
test below is one such fault: the folder at a session's worktree path is something else (an empty folder, a
symbolic link, another repository), the base is checked out with local changes, the session's branch was
deleted by hand, and a compensation resets a worktree that is not one. In every case nothing that taskgate
does not own changes: not `main`, not the user's branch, not the project checkout's files.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from taskgate.application.sessions.commands import FireTrigger
from taskgate.domain.entities import Session
from taskgate.domain.errors import BranchGone, VcsError, WorktreeMismatch
from taskgate.domain.states import SessionState
from taskgate.infrastructure.git import GitPythonVcs
from tests.builders import ACTOR, fire, seed, start
from tests.conftest import Services, make_git_repo, open_database, wire
from tests.integration.workspaces.test_worktrees import awaiting_merge, branches, commit, git


@pytest.fixture
async def services(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Services]:
    """SQLite only: what is under test is git, and the session's state as the real store keeps it."""
    database, url = await open_database("sqlite", request, tmp_path)
    yield wire("sqlite", database, url)
    await database.dispose()


def empty(folder: Path) -> None:
    """Empty a folder by hand, keeping the folder itself."""
    for child in folder.iterdir():
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()


def human_work_checked_out(repo: Path) -> tuple[str, str]:
    """The reported set-up: the project checkout is on the user's own branch `human-work`, and someone has
    committed to `main` since the session branched. Returns (main, human-work) heads."""
    git(repo, "checkout", "-q", "-b", "human-work")
    human = commit(repo, "human.txt", "the user's own work\n", "wip: the user's own work")
    git(repo, "checkout", "-q", "main")
    upstream = commit(repo, "upstream.txt", "someone else's work\n", "feat: meanwhile on main")
    git(repo, "checkout", "-q", "human-work")
    return upstream, human


async def merge_refused(services: Services, session: Session) -> VcsError:
    with pytest.raises(VcsError) as refused:
        await services.sessions.fire(FireTrigger(session.id, "merge", ACTOR))
    after = await services.sessions.get(session.id)
    assert (after.state, after.version) == (SessionState.AWAITING_MERGE, session.version)
    return refused.value


def assert_untouched(repo: Path, main: str, human: str) -> None:
    assert git(repo, "rev-parse", "main") == main
    assert git(repo, "rev-parse", "human-work") == human
    assert git(repo, "symbolic-ref", "HEAD") == "refs/heads/human-work"
    assert git(repo, "status", "--porcelain") == ""


# -- (a) the reported scenario -------------------------------------------------------------------------------------


async def test_a_merge_into_an_emptied_worktree_folder_is_refused_and_moves_no_branch(services, git_repo):
    session, worktree = await awaiting_merge(services, git_repo)
    main, human = human_work_checked_out(git_repo)
    branch_head = git(git_repo, "rev-parse", session.branch_name)
    empty(worktree)

    refused = await merge_refused(services, session)

    assert isinstance(refused, WorktreeMismatch) and str(worktree) in str(refused)
    assert "empty folder" in str(refused) and "move it away" in str(refused)
    assert_untouched(git_repo, main, human)
    assert git(git_repo, "rev-parse", session.branch_name) == branch_head and worktree.is_dir()
    assert git(git_repo, "log", "-1", "--format=%s", "human-work") == "wip: the user's own work"

    worktree.rmdir()  # what the refusal says to do: taskgate recreates the worktree from the branch
    done = await services.sessions.fire(FireTrigger(session.id, "merge", ACTOR))
    assert done.session.state == SessionState.COMPLETED
    assert git(git_repo, "rev-parse", "main^") == main  # rebased onto the new main, then a fast-forward
    assert git(git_repo, "log", "-1", "--format=%s", "main") == "feat: add the feature"
    assert git(git_repo, "rev-parse", "human-work") == human


# -- (b) a symbolic link, (c) another repository -------------------------------------------------------------------


@pytest.mark.parametrize("target", ["another folder", "the project checkout"])
async def test_a_worktree_replaced_by_a_symlink_is_refused_and_cancel_removes_only_the_link(
    services, git_repo, tmp_path, target
):
    session, worktree = await awaiting_merge(services, git_repo)
    main, human = human_work_checked_out(git_repo)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not taskgate's\n")
    worktree.rename(tmp_path / "aside")
    worktree.symlink_to(elsewhere if target == "another folder" else git_repo)

    refused = await merge_refused(services, session)
    assert isinstance(refused, WorktreeMismatch) and "symbolic link" in str(refused)
    with pytest.raises(WorktreeMismatch):
        await services.workspaces.review(session.id)
    assert_untouched(git_repo, main, human)

    await fire(services, session, "cancel")
    assert not worktree.is_symlink() and not worktree.exists()
    assert (elsewhere / "keep.txt").read_text() == "not taskgate's\n"
    assert_untouched(git_repo, main, human)
    assert (git_repo / "human.txt").exists() and (tmp_path / "aside" / "feature.txt").exists()


async def test_a_worktree_folder_holding_another_repository_is_refused_and_never_removed(services, git_repo):
    session, worktree = await awaiting_merge(services, git_repo)
    main, human = human_work_checked_out(git_repo)
    shutil.rmtree(worktree)
    other = make_git_repo(worktree)
    (other / "precious.txt").write_text("uncommitted work of another repository\n")
    other_head = git(other, "rev-parse", "HEAD")

    refused = await merge_refused(services, session)
    assert isinstance(refused, WorktreeMismatch) and "another repository" in str(refused)
    assert_untouched(git_repo, main, human)

    cancelled = await fire(services, session, "cancel")  # cancel never fails on git: it records what it could not do
    assert cancelled.state == SessionState.CANCELLED
    async with services.uow(write=False) as uow:
        [event] = [e for e in await uow.events.list(session.id) if e["kind"] == "worktree.cleanup_failed"]
    assert "another repository" in event["payload"]["error"]
    assert (other / "precious.txt").exists() and git(other, "rev-parse", "HEAD") == other_head
    assert_untouched(git_repo, main, human)


# -- (d) the base checked out with local changes -------------------------------------------------------------------


async def test_local_changes_in_the_base_checkout_that_the_merge_does_not_touch_are_kept(services, git_repo):
    session, _ = await awaiting_merge(services, git_repo)
    (git_repo / "README.md").write_text("the user's unsaved edit\n")
    (git_repo / "notes.txt").write_text("the user's notes\n")
    main = git(git_repo, "rev-parse", "main")

    done = await services.sessions.fire(FireTrigger(session.id, "merge", ACTOR))

    assert done.session.state == SessionState.COMPLETED
    assert git(git_repo, "rev-parse", "main^") == main and (git_repo / "feature.txt").read_text() == "the feature\n"
    assert (git_repo / "README.md").read_text() == "the user's unsaved edit\n"
    assert (git_repo / "notes.txt").read_text() == "the user's notes\n"
    assert git(git_repo, "status", "--porcelain") == "M README.md\n?? notes.txt"


@pytest.mark.parametrize("local", ["tracked", "untracked"])
async def test_local_changes_in_the_base_checkout_that_the_merge_would_overwrite_refuse_it(services, git_repo, local):
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    name = "README.md" if local == "tracked" else "feature.txt"
    commit(session.worktree_path, name, "the session's version\n", "feat: the session's change")
    session = await fire(services, session, "plan_complete", "work_complete", "approve")
    (git_repo / name).write_text("the user's unsaved edit\n")
    main = git(git_repo, "rev-parse", "main")

    refused = await merge_refused(services, session)

    assert (
        f"checked out in {git_repo}" in str(refused) and name in str(refused) and "'main' was not moved" in str(refused)
    )
    assert git(git_repo, "rev-parse", "main") == main and git(git_repo, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert (git_repo / name).read_text() == "the user's unsaved edit\n"


# -- (e) the branch deleted by hand --------------------------------------------------------------------------------


async def test_a_branch_deleted_by_hand_is_named_by_merge_and_review(services, git_repo):
    session, worktree = await awaiting_merge(services, git_repo)
    main = git(git_repo, "rev-parse", "main")
    git(git_repo, "update-ref", "-d", f"refs/heads/{session.branch_name}")

    refused = await merge_refused(services, session)
    with pytest.raises(BranchGone) as reviewed:
        await services.workspaces.review(session.id)

    for error in (refused, reviewed.value):
        assert isinstance(error, BranchGone) and f"branch '{session.branch_name}'" in str(error)
        assert "no longer exists" in str(error) and "uncommitted" not in str(error)
    assert git(git_repo, "rev-parse", "main") == main and (worktree / "feature.txt").exists()


# -- (f) reset (compensate) never reaches the enclosing checkout --------------------------------------------------


def replace(worktree: Path, repo: Path, kind: str) -> None:
    if kind == "emptied":
        empty(worktree)
    elif kind == "another repository":
        shutil.rmtree(worktree)
        make_git_repo(worktree)
    else:
        shutil.rmtree(worktree)
        worktree.symlink_to(repo)


def enclosing_state(repo: Path) -> tuple[str, str, str, str, str]:
    return (
        git(repo, "symbolic-ref", "HEAD"),
        git(repo, "rev-parse", "HEAD"),
        git(repo, "status", "--porcelain", "--ignored"),
        (repo / "human.txt").read_text(),
        (repo / "scratch.txt").read_text(),
    )


@pytest.mark.parametrize("kind", ["emptied", "another repository", "symlink to the project checkout"])
async def test_compensate_on_a_worktree_that_is_not_one_never_touches_the_enclosing_checkout(services, git_repo, kind):
    seeded = await seed(services, git_repo, tasks=1)
    session = await fire(services, await start(services, seeded.tasks[0]), "plan_complete")
    commit(session.worktree_path, "bad.txt", "wrong approach\n", "feat: the wrong approach")
    human_work_checked_out(git_repo)
    (git_repo / "human.txt").write_text("the user's unsaved edit\n")
    (git_repo / "scratch.txt").write_text("untracked, and `clean -x` would delete it\n")
    replace(Path(session.worktree_path), git_repo, kind)
    before = enclosing_state(git_repo)

    session = await fire(services, session, "reject", reason="wrong approach")
    with pytest.raises(WorktreeMismatch):
        await services.sessions.fire(FireTrigger(session.id, "compensate", ACTOR))
    with pytest.raises(WorktreeMismatch):
        await GitPythonVcs().reset_worktree(session.worktree_path, session.state_data["base_commit"])

    assert enclosing_state(git_repo) == before
    assert (await services.sessions.get(session.id)).state == SessionState.FAILED
    assert session.branch_name in branches(git_repo)


async def test_a_copy_of_another_sessions_worktree_is_refused_and_that_session_keeps_its_commits(git_repo, tmp_path):
    vcs, root = GitPythonVcs(), str(git_repo)
    ours, theirs = (f"{root}/.worktrees/{name}" for name in ("ours", "theirs"))
    created = await vcs.create_worktree(root, ours, "feature/t-1/aaaa0001", "main")
    await vcs.create_worktree(root, theirs, "feature/t-2/bbbb0002", "main")
    work = commit(theirs, "theirs.txt", "their work\n", "feat: their work")
    Path(ours).rename(tmp_path / "aside")
    shutil.copytree(theirs, ours)  # its .git names the other session's worktree

    with pytest.raises(WorktreeMismatch, match="copy of another worktree"):
        await vcs.reset_worktree(ours, created.base_commit, repo_root=root, branch="feature/t-1/aaaa0001")
    assert git(git_repo, "rev-parse", "feature/t-2/bbbb0002") == work
    assert Path(theirs, "theirs.txt").exists() and Path(ours, "theirs.txt").exists()
