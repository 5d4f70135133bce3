"""One contract, two implementations: `FakeVcs` must behave like `GitPythonVcs` on a real repository.

Each implementation gets a driver with the same helpers (commit in a worktree, move the base on, make a
worktree dirty, delete its folder by hand, read branch heads and trees), so every check below runs unchanged
against both. The real repository comes from `make_git_repo`: one commit ("init", README.md) on `main`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from taskgate.application.workspaces.merges import change_id
from taskgate.application.workspaces.ports import BranchChange, VcsProvider, WorkspaceContext
from taskgate.domain.errors import BranchGone, VcsError, WorktreeMismatch
from taskgate.infrastructure.git import GitPythonVcs
from tests.conftest import make_git_repo
from tests.fakes import FakeVcs

BRANCH = "feature/t-1/aaaa0001"
OTHER = "feature/t-2/bbbb0002"
IDENTITY = ("-c", "user.name=contract", "-c", "user.email=contract@example.invalid")


class FakeDriver:
    """Drives `FakeVcs` through its test helpers."""

    kind = "fake"

    def __init__(self, tmp_path: Path) -> None:
        self.fake = FakeVcs()
        self.vcs: VcsProvider = self.fake
        self.root = str(tmp_path / "repo")

    def path(self, name: str) -> str:
        return f"{self.root}/.worktrees/{name}"

    def commit(self, path: str, files: list[str], message: str) -> str:
        return self.fake.commit(path, files, message)

    def advance_base(self, files: list[str], message: str) -> str:
        return self.fake.advance_base(self.root, files, message)

    def make_dirty(self, path: str, files: list[str]) -> None:
        self.fake.make_dirty(path, files)

    def make_untracked(self, path: str, files: list[str]) -> None:
        self.fake.make_untracked(path, files)

    def delete_folder(self, path: str) -> None:
        self.fake.delete_folder(path)

    def empty_folder(self, path: str) -> None:
        self.fake.replace_folder(path, "an empty folder")

    def delete_branch_by_hand(self, branch: str) -> None:
        self.fake.delete_branch_by_hand(self.root, branch)

    def head(self, branch: str) -> str | None:
        return self.fake.head(self.root, branch)

    def files_on(self, branch: str) -> set[str]:
        return self.fake.files_on(self.root, branch)

    def contains(self, branch: str, sha: str) -> bool:
        return self.fake.contains(self.root, branch, sha)


class GitDriver:
    """Drives `GitPythonVcs` on a real repository, changing files and committing with plain `git`."""

    kind = "git"

    def __init__(self, tmp_path: Path) -> None:
        self.vcs = GitPythonVcs()
        self.root = str(make_git_repo(tmp_path / "repo").resolve())

    def path(self, name: str) -> str:
        return f"{self.root}/.worktrees/{name}"

    def git(self, cwd: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *IDENTITY, *args], cwd=cwd, check=check, capture_output=True, text=True)

    def write(self, cwd: str, files: list[str], content: str) -> None:
        for name in files:
            target = Path(cwd, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content + "\n")

    def commit(self, path: str, files: list[str], message: str) -> str:
        self.write(path, files, message)
        self.git(path, "add", "--", *files)
        self.git(path, "commit", "-q", "-m", message)
        return self.git(path, "rev-parse", "HEAD").stdout.strip()

    def advance_base(self, files: list[str], message: str) -> str:
        return self.commit(self.root, files, message)  # `main` is checked out at the repository root

    def make_dirty(self, path: str, files: list[str]) -> None:
        self.write(path, files, "dirty")
        self.git(path, "add", "--", *files)

    def make_untracked(self, path: str, files: list[str]) -> None:
        self.write(path, files, "untracked")

    def delete_folder(self, path: str) -> None:
        shutil.rmtree(path)

    def empty_folder(self, path: str) -> None:
        for child in Path(path).iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()

    def delete_branch_by_hand(self, branch: str) -> None:
        self.git(self.root, "update-ref", "-d", f"refs/heads/{branch}")

    def head(self, branch: str) -> str | None:
        found = self.git(self.root, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False)
        return found.stdout.strip() or None

    def files_on(self, branch: str) -> set[str]:
        return set(self.git(self.root, "ls-tree", "-r", "--name-only", branch).stdout.split())

    def contains(self, branch: str, sha: str) -> bool:
        return self.git(self.root, "merge-base", "--is-ancestor", sha, branch, check=False).returncode == 0


Driver = FakeDriver | GitDriver


@pytest.fixture(params=["fake", "git"])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Driver:
    return FakeDriver(tmp_path) if request.param == "fake" else GitDriver(tmp_path)


async def create(driver: Driver, name: str = "s1", branch: str = BRANCH):
    return await driver.vcs.create_worktree(driver.root, driver.path(name), branch, "main")


async def context(driver: Driver, name: str = "s1", branch: str = BRANCH):
    return await driver.vcs.workspace_context(driver.root, driver.path(name), branch, "main")


async def merge(driver: Driver, name: str = "s1", *, strategy: str = "rebase", mode: str = "ff-only"):
    return await driver.vcs.merge(driver.root, driver.path(name), BRANCH, "main", strategy=strategy, mode=mode)


async def listed(driver: Driver) -> dict[str, tuple[str | None, bool]]:
    return {e.path: (e.branch, e.missing) for e in await driver.vcs.worktrees(driver.root)}


# -- create / remove -----------------------------------------------------------------------------------------------


async def test_a_new_worktree_is_listed_with_its_branch_and_starts_at_the_head_of_base(driver: Driver) -> None:
    created = await create(driver)
    assert (created.path, created.branch, created.base_ref) == (driver.path("s1"), BRANCH, "main")
    assert created.base_commit == driver.head("main")
    assert (await listed(driver))[driver.path("s1")] == (BRANCH, False)
    assert await driver.vcs.branches(driver.root, "feature/") == [BRANCH]


async def test_creating_the_same_worktree_again_returns_the_same_one(driver: Driver) -> None:
    first = await create(driver)
    again = await create(driver)
    assert again == first
    assert list((await listed(driver)).values()).count((BRANCH, False)) == 1


async def test_a_missing_base_is_refused_and_leaves_no_branch_or_worktree(driver: Driver) -> None:
    with pytest.raises(VcsError):
        await driver.vcs.create_worktree(driver.root, driver.path("s1"), BRANCH, "no-such-base")
    assert await driver.vcs.branches(driver.root, "feature/") == []
    assert driver.path("s1") not in await listed(driver)


async def test_a_path_already_used_by_another_branch_is_refused(driver: Driver) -> None:
    await create(driver, "s1", OTHER)
    with pytest.raises(VcsError):
        await create(driver, "s1", BRANCH)
    assert (await listed(driver))[driver.path("s1")] == (OTHER, False)
    assert await driver.vcs.branches(driver.root, "feature/") == [OTHER]


async def test_creating_a_branch_that_already_exists_is_refused_and_keeps_its_commits(driver: Driver) -> None:
    await create(driver)
    work = driver.commit(driver.path("s1"), ["work.txt"], "session work")
    driver.delete_folder(driver.path("s1"))  # not checked out anywhere any more
    with pytest.raises(VcsError):
        await create(driver, "s2")
    assert driver.head(BRANCH) == work


async def test_removing_a_worktree_deletes_its_branch_and_removing_again_is_fine(driver: Driver) -> None:
    await create(driver)
    await driver.vcs.remove_worktree(driver.root, driver.path("s1"), BRANCH)
    assert driver.path("s1") not in await listed(driver)
    assert await driver.vcs.branches(driver.root, "feature/") == []
    await driver.vcs.remove_worktree(driver.root, driver.path("s1"), BRANCH)


async def test_deleting_a_missing_branch_is_fine(driver: Driver) -> None:
    await driver.vcs.delete_branch(driver.root, "feature/never/existed")
    assert await driver.vcs.branches(driver.root, "") == ["main"]


async def test_branches_lists_names_starting_with_any_prefix(driver: Driver) -> None:
    await create(driver)
    assert await driver.vcs.branches(driver.root, "feat") == [BRANCH]


async def test_disk_usage_counts_a_worktree_and_is_zero_once_it_is_removed(driver: Driver) -> None:
    await create(driver)
    assert await driver.vcs.disk_usage(driver.path("s1")) > 0
    await driver.vcs.remove_worktree(driver.root, driver.path("s1"), BRANCH)
    assert await driver.vcs.disk_usage(driver.path("s1")) == 0


# -- review context ------------------------------------------------------------------------------------------------


async def test_a_commit_in_the_worktree_shows_up_in_the_workspace_context(driver: Driver) -> None:
    created = await create(driver)
    sha = driver.commit(driver.path("s1"), ["src/feature.py"], "add the feature")
    found = await context(driver)
    assert (found.ahead, found.behind) == (1, 0)
    assert (found.head_commit, found.base_commit) == (sha, created.base_commit)
    assert [c.subject for c in found.commits] == ["add the feature"]
    assert [s.path for s in found.diff_stat] == ["src/feature.py"]
    assert "src/feature.py" in found.patch and not found.patch_truncated
    assert (found.dirty, found.untracked, found.conflicts) == ([], [], [])


async def test_dirty_and_untracked_files_show_up_and_make_the_merge_refuse(driver: Driver) -> None:
    await create(driver)
    driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    driver.make_dirty(driver.path("s1"), ["notes.txt"])
    driver.make_untracked(driver.path("s1"), ["scratch.txt"])
    found = await context(driver)
    assert (found.dirty, found.untracked) == (["notes.txt"], ["scratch.txt"])
    base = driver.head("main")
    with pytest.raises(VcsError):
        await merge(driver)
    assert driver.head("main") == base


async def test_an_untracked_file_alone_makes_the_merge_refuse(driver: Driver) -> None:
    await create(driver)
    driver.make_untracked(driver.path("s1"), ["scratch.txt"])
    with pytest.raises(VcsError):
        await merge(driver)


@pytest.mark.parametrize("told", [True, False], ids=["owner-given", "owner-inferred"])
async def test_reset_discards_commits_dirty_and_untracked_changes(driver: Driver, told: bool) -> None:
    created = await create(driver)
    driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    driver.make_dirty(driver.path("s1"), ["README.md"])
    driver.make_untracked(driver.path("s1"), ["scratch.txt"])
    owner = {"repo_root": driver.root, "branch": BRANCH} if told else {}
    await driver.vcs.reset_worktree(driver.path("s1"), created.base_commit, **owner)
    found = await context(driver)
    assert (found.ahead, found.dirty, found.untracked) == (0, [], [])
    assert driver.head(BRANCH) == created.base_commit


async def test_repo_context_reports_the_base_its_recent_commits_and_the_worktrees(driver: Driver) -> None:
    await create(driver)
    driver.advance_base(["base.txt"], "base change")
    found = await driver.vcs.repo_context(driver.root)
    assert (found.branch, found.head, found.clean, found.state) == ("main", driver.head("main"), True, "clean")
    assert [c.subject for c in found.recent_commits] == ["base change", "init"]
    assert {(w.path, w.branch) for w in found.worktrees} == {(driver.root, "main"), (driver.path("s1"), BRANCH)}


async def test_a_worktree_whose_folder_was_deleted_is_listed_as_missing_until_pruned(driver: Driver) -> None:
    await create(driver)
    driver.delete_folder(driver.path("s1"))
    assert (await listed(driver))[driver.path("s1")] == (BRANCH, True)
    await driver.vcs.prune(driver.root)
    assert driver.path("s1") not in await listed(driver)
    assert await driver.vcs.branches(driver.root, "feature/") == [BRANCH]


# -- merge ---------------------------------------------------------------------------------------------------------


async def test_merge_when_base_did_not_move_fast_forwards_base_to_the_branch(driver: Driver) -> None:
    await create(driver)
    sha = driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    outcome = await merge(driver)
    assert (outcome.merged, outcome.rebased, outcome.base_ref) == (True, False, "main")
    assert outcome.merged_commit == sha == driver.head("main") == driver.head(BRANCH)


@pytest.mark.parametrize("strategy", ["rebase", "merge"])
async def test_merge_after_base_moved_elsewhere_brings_base_in_and_keeps_both_changes(
    driver: Driver, strategy: str
) -> None:
    await create(driver)
    driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    driver.advance_base(["other.txt"], "another session")
    outcome = await merge(driver, strategy=strategy)
    assert (outcome.merged, outcome.rebased, outcome.conflicts) == (True, True, [])
    assert outcome.merged_commit == driver.head("main") == driver.head(BRANCH)
    assert {"README.md", "feature.txt", "other.txt"} <= driver.files_on("main")


@pytest.mark.parametrize("strategy", ["rebase", "merge"])
async def test_merge_with_the_same_file_changed_on_both_sides_reports_it_and_changes_nothing(
    driver: Driver, strategy: str
) -> None:
    await create(driver)
    driver.commit(driver.path("s1"), ["shared.txt", "feature.txt"], "ours")
    driver.advance_base(["shared.txt", "other.txt"], "theirs")
    branch_head, base_head = driver.head(BRANCH), driver.head("main")
    outcome = await merge(driver, strategy=strategy)
    assert (outcome.merged, outcome.conflicts, outcome.merged_commit) == (False, ["shared.txt"], None)
    assert (driver.head(BRANCH), driver.head("main")) == (branch_head, base_head)
    found = await context(driver)
    assert (found.ahead, found.behind) == (1, 1)
    assert (found.dirty, found.untracked, found.conflicts) == ([], [], [])


async def test_a_no_ff_merge_records_a_merge_commit_containing_the_branch(driver: Driver) -> None:
    await create(driver)
    sha = driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    outcome = await merge(driver, mode="no-ff")
    assert outcome.merged and outcome.merged_commit == driver.head("main")
    assert driver.head("main") != sha
    assert driver.contains("main", sha)


@pytest.mark.parametrize("mode", ["ff-only", "no-ff"])
async def test_is_merged_says_whether_a_commit_is_in_the_base_before_and_after_a_rebasing_merge(
    driver: Driver, mode: str
) -> None:
    await create(driver)
    sha = driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    driver.advance_base(["other.txt"], "another session")
    assert not await driver.vcs.is_merged(driver.root, sha, "main")
    outcome = await merge(driver, mode=mode)
    rebased_head = driver.head(BRANCH)
    assert outcome.rebased and rebased_head != sha
    assert await driver.vcs.is_merged(driver.root, rebased_head, "main")
    assert not await driver.vcs.is_merged(driver.root, rebased_head, "no-such-branch")


async def test_merge_recreates_a_worktree_folder_deleted_by_hand(driver: Driver) -> None:
    await create(driver)
    sha = driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    driver.delete_folder(driver.path("s1"))
    outcome = await merge(driver)
    assert outcome.merged and driver.head("main") == sha
    assert (await listed(driver))[driver.path("s1")] == (BRANCH, False)


def change_of(found: WorkspaceContext | BranchChange) -> tuple:
    return (found.head_commit, found.diff_stat, found.patch, found.patch_truncated)


@pytest.mark.parametrize("max_patch", [200_000, 40], ids=["whole-patch", "truncated-patch"])
async def test_branch_change_is_the_head_and_diff_of_the_review_context(driver: Driver, max_patch: int) -> None:
    """What an approval records is read with `branch_change`; a merge compared it with the review context."""
    await create(driver)
    driver.commit(driver.path("s1"), ["src/feature.py", "docs/feature.md"], "feat: the feature")
    driver.advance_base(["upstream.txt"], "meanwhile on main")  # the fork point is no longer base's head
    driver.commit(driver.path("s1"), ["src/more.py"], "feat: more")
    driver.make_dirty(driver.path("s1"), ["README.md"])
    full = await driver.vcs.workspace_context(driver.root, driver.path("s1"), BRANCH, "main", max_patch_bytes=max_patch)
    change = await driver.vcs.branch_change(driver.root, driver.path("s1"), BRANCH, "main", max_patch_bytes=max_patch)
    assert change_of(change) == change_of(full)
    assert change.head_commit == driver.head(BRANCH) and change.patch_truncated == (max_patch == 40)
    assert change_id(change) == change_id(full)


async def test_branch_change_of_a_worktree_folder_deleted_by_hand_reads_the_branch(driver: Driver) -> None:
    await create(driver)
    driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    driver.delete_folder(driver.path("s1"))
    change = await driver.vcs.branch_change(driver.root, driver.path("s1"), BRANCH, "main")
    assert change_of(change) == change_of(await context(driver)) and change.head_commit == driver.head(BRANCH)


async def test_branch_change_refuses_a_missing_base_as_the_review_context_does(driver: Driver) -> None:
    await create(driver)
    for call in (driver.vcs.workspace_context, driver.vcs.branch_change):
        with pytest.raises(VcsError, match="base 'gone' does not exist"):
            await call(driver.root, driver.path("s1"), BRANCH, "gone")


async def test_worktree_state_is_the_cheap_subset_of_the_review_context(driver: Driver) -> None:
    await create(driver)
    driver.commit(driver.path("s1"), ["work.txt"], "feat: work")
    driver.make_dirty(driver.path("s1"), ["README.md"])
    driver.make_untracked(driver.path("s1"), ["new.txt"])
    full = await context(driver)
    state = await driver.vcs.worktree_state(driver.root, driver.path("s1"), BRANCH, "main")
    assert (state.branch, state.head_commit) == (BRANCH, full.head_commit)
    assert (state.dirty, state.untracked, state.conflicts) == (full.dirty, full.untracked, full.conflicts)
    assert [c.subject for c in state.commits] == [c.subject for c in full.commits] == ["feat: work"]
    with pytest.raises(VcsError):
        await driver.vcs.worktree_state(driver.root, driver.path("s1"), "feature/gone/00000000", "main")


# -- what taskgate does not own ------------------------------------------------------------------------------------


async def test_a_worktree_folder_emptied_by_hand_is_refused_by_every_call_and_nothing_moves(driver: Driver) -> None:
    created = await create(driver)
    driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    driver.advance_base(["upstream.txt"], "upstream")
    driver.empty_folder(driver.path("s1"))
    heads = driver.head("main"), driver.head(BRANCH)
    for call in (
        lambda: merge(driver),
        lambda: context(driver),
        lambda: driver.vcs.worktree_state(driver.root, driver.path("s1"), BRANCH, "main"),
        lambda: driver.vcs.branch_change(driver.root, driver.path("s1"), BRANCH, "main"),
        lambda: driver.vcs.reset_worktree(driver.path("s1"), created.base_commit, repo_root=driver.root, branch=BRANCH),
        lambda: driver.vcs.reset_worktree(driver.path("s1"), created.base_commit),
    ):
        with pytest.raises(WorktreeMismatch, match="empty folder"):
            await call()
    assert (driver.head("main"), driver.head(BRANCH)) == heads


async def test_a_worktree_folder_holding_another_branch_is_refused(driver: Driver) -> None:
    await create(driver, "s1", OTHER)
    await create(driver, "s2", BRANCH)
    driver.commit(driver.path("s2"), ["feature.txt"], "feature")
    base = driver.head("main")
    for call in (
        lambda: context(driver, "s1"),
        lambda: merge(driver, "s1"),
        lambda: driver.vcs.worktree_state(driver.root, driver.path("s1"), BRANCH, "main"),
        lambda: driver.vcs.branch_change(driver.root, driver.path("s1"), BRANCH, "main"),
    ):
        with pytest.raises(WorktreeMismatch, match=f"a worktree of branch '{OTHER}'"):
            await call()
    assert driver.head("main") == base


async def test_a_branch_deleted_by_hand_is_named_before_anything_looks_at_its_worktree(driver: Driver) -> None:
    await create(driver)
    driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    driver.delete_branch_by_hand(BRANCH)
    base = driver.head("main")
    for call in (
        lambda: merge(driver),
        lambda: context(driver),
        lambda: driver.vcs.worktree_state(driver.root, driver.path("s1"), BRANCH, "main"),
        lambda: driver.vcs.branch_change(driver.root, driver.path("s1"), BRANCH, "main"),
    ):
        with pytest.raises(BranchGone, match=f"branch '{BRANCH}' of the session at .* no longer exists"):
            await call()
    assert driver.head("main") == base and driver.head(BRANCH) is None


async def test_a_branch_deleted_by_hand_is_refused_naming_its_last_commit_from_the_worktrees_reflog(
    driver: Driver,
) -> None:
    await create(driver)
    sha = driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    driver.delete_branch_by_hand(BRANCH)
    with pytest.raises(BranchGone) as refused:
        await context(driver)
    assert refused.value.last_commit == sha
    assert f"`git branch {BRANCH} {sha}`" in str(refused.value) and "fsck" not in str(refused.value)


async def test_a_branch_and_worktree_both_deleted_by_hand_point_to_the_dangling_commit_not_a_reflog(
    driver: Driver,
) -> None:
    """Issue 36: the advice said to use the worktree's reflog, which had gone with the worktree."""
    await create(driver)
    driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    driver.delete_branch_by_hand(BRANCH)
    driver.delete_folder(driver.path("s1"))
    await driver.vcs.prune(driver.root)
    with pytest.raises(BranchGone) as refused:
        await merge(driver)
    assert refused.value.last_commit is None
    assert "git fsck --lost-found" in str(refused.value) and "reflog`" not in str(refused.value)


@pytest.mark.parametrize("mode", ["ff-only", "no-ff"])
async def test_merged_context_is_what_the_merge_landed_even_once_branch_and_worktree_are_gone(
    driver: Driver, mode: str
) -> None:
    await create(driver)
    driver.commit(driver.path("s1"), ["feature.txt"], "feature")
    driver.advance_base(["other.txt"], "another session")
    outcome = await merge(driver, mode=mode)
    assert outcome.base_before is not None and outcome.base_before != outcome.merged_commit
    await driver.vcs.remove_worktree(driver.root, driver.path("s1"), BRANCH)
    landed = await driver.vcs.merged_context(driver.root, "main", outcome.base_before, outcome.merged_commit)
    assert [f.path for f in landed.diff_stat] == ["feature.txt"]  # the other session's file was on main before
    assert "feature" in [c.subject for c in landed.commits] and landed.head_commit == outcome.merged_commit
    assert (landed.dirty, landed.untracked, landed.behind) == ([], [], 0)
