"""The workspaces' port: git, as the sessions' worktrees and branches need it (VcsProvider), and what it answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RepositoryInfo:
    root: str
    head_branch: str | None


@dataclass(frozen=True, slots=True)
class WorktreeCreated:
    """What `create_worktree` made: the folder, its new branch, and the base it started from."""

    path: str
    branch: str
    base_ref: str
    base_commit: str


@dataclass(frozen=True, slots=True)
class CommitInfo:
    sha: str
    subject: str
    author: str
    at: datetime


@dataclass(frozen=True, slots=True)
class FileStat:
    path: str
    added: int  # -1 for binary files
    deleted: int


@dataclass(frozen=True, slots=True)
class WorkspaceContext:
    """What an operator reviews: the branch against its base, and the state of the worktree."""

    branch: str
    base_ref: str
    base_commit: str
    head_commit: str
    ahead: int
    behind: int
    diff_stat: list[FileStat]
    patch: str
    patch_truncated: bool
    commits: list[CommitInfo]
    dirty: list[str]
    untracked: list[str]
    conflicts: list[str]


@dataclass(frozen=True, slots=True)
class WorktreeState:
    """What policies look at in a session worktree: the branch head, uncommitted files, commits not on base."""

    branch: str
    head_commit: str
    dirty: list[str]
    untracked: list[str]
    conflicts: list[str]
    commits: list[CommitInfo]


@dataclass(frozen=True, slots=True)
class BranchChange:
    """What a branch changes against its fork point with base, at one head: the part of `workspace_context`
    an approval records (the head, and the diff its change id is computed from), read with the same git commands
    and the same truncation, so the values are the same."""

    head_commit: str
    diff_stat: list[FileStat]
    patch: str
    patch_truncated: bool


@dataclass(frozen=True, slots=True)
class MergeOutcome:
    """A merge that happened (`merged`) or was refused with the conflicting files, leaving nothing changed."""

    merged: bool
    base_ref: str
    merged_commit: str | None = None
    rebased: bool = False
    conflicts: list[str] = field(default_factory=list)
    detail: str = ""
    base_before: str | None = None  # the base's commit the merge moved it from (what was merged is this..merged)


@dataclass(frozen=True, slots=True)
class WorktreeEntry:
    """One entry of `git worktree list`; `missing` when its folder is gone."""

    path: str
    branch: str | None
    head: str | None
    missing: bool = False


@dataclass(frozen=True, slots=True)
class RepoContext:
    """The project repository at a glance (the context scout's git half)."""

    branch: str | None
    head: str | None
    clean: bool
    staged: int
    unstaged: int
    untracked: int
    conflicted: int
    state: str  # clean | merging | rebasing | cherry-picking | reverting | bisecting
    recent_commits: list[CommitInfo]
    worktrees: list[WorktreeEntry]


class VcsProvider(Protocol):
    """Git operations on a project repository and its session worktrees. Mutating calls on one repository are
    serialised by the adapter; every name and path argument has been validated (see domain/naming.py).

    Nothing runs in a worktree folder that is not the registered worktree of the session's branch: a folder
    that is there but is something else (emptied, a symbolic link, another repository, another branch) raises
    WorktreeMismatch and nothing changes; a folder that is entirely gone is read as empty (and merge recreates
    it from the branch). A session branch deleted outside taskgate raises BranchGone before anything else.
    The base branch only ever moves forward."""

    async def inspect_repository(self, path: str) -> RepositoryInfo:
        """Raises: InvalidInput when `path` is not inside a git repository."""

    async def create_worktree(self, repo_root: str, path: str, branch: str, base: str) -> WorktreeCreated:
        """A new worktree at `path` on a new `branch` from `base` (after a fetch when `origin` exists).

        Raises: VcsError (base missing, branch or path taken); nothing is left behind on failure.
        """

    async def remove_worktree(self, repo_root: str, path: str, branch: str | None) -> None:
        """Remove the worktree (even if dirty or already deleted by hand) and delete its branch. Idempotent."""

    async def delete_branch(self, repo_root: str, branch: str) -> None:
        """Delete a local branch (forced); a missing branch is fine."""

    async def reset_worktree(
        self, path: str, commit: str, *, repo_root: str | None = None, branch: str | None = None
    ) -> None:
        """Discard every change in the worktree: hard reset to `commit` and remove untracked files; nothing to
        do when its folder is gone. Give `repo_root` and `branch` (the session's): without them the project
        is the checkout enclosing the worktrees folder and any branch registered at `path` is accepted.

        Raises: WorktreeMismatch (nothing was run there).
        """

    async def workspace_context(
        self, repo_root: str, path: str, branch: str, base: str, *, max_patch_bytes: int = 200_000
    ) -> WorkspaceContext:
        """Diff, commits and worktree state of a session branch against `base`.

        Raises: BranchGone; WorktreeMismatch; VcsError (base missing).
        """

    async def merged_context(
        self, repo_root: str, base: str, before: str, merged: str, *, max_patch_bytes: int = 200_000
    ) -> WorkspaceContext:
        """What a merge landed on `base`: the diff, stat and commits of `before..merged` (the base before the merge,
        and the commit it moved to), read from the history alone: no worktree or branch is needed, so a merged and
        cleaned-up session can still be reviewed. Raises: VcsError when either commit is unknown."""

    async def worktree_state(self, repo_root: str, path: str, branch: str, base: str) -> WorktreeState:
        """The cheap subset of `workspace_context` that policies need (no diff). Raises: as workspace_context."""

    async def branch_change(
        self, repo_root: str, path: str, branch: str, base: str, *, max_patch_bytes: int = 200_000
    ) -> BranchChange:
        """The head, diff stat and patch of `workspace_context`, the same values, without the commits, counts and
        worktree status (what an approval records). The worktree is still checked to be the session's.

        Raises: as workspace_context.
        """

    async def merge(
        self, repo_root: str, path: str, branch: str, base: str, *, strategy: str, mode: str
    ) -> MergeOutcome:
        """Bring `base` into the branch if it moved (`strategy` rebase|merge), then merge into `base` (`mode`
        ff-only|no-ff). A conflict aborts and returns the files; nothing is half-applied. `base` moves only by
        a fast-forward from the commit read at the start; where it is checked out, its files follow and
        unrelated local changes there are kept.

        Raises: BranchGone; WorktreeMismatch (the session's worktree, or the base's checkout, is not what it
        should be); VcsError (dirty worktree, local changes in the base's checkout that the merge would
        overwrite, base moved meanwhile, ...). Nothing changed in every case.
        """

    async def base_exists(self, repo_root: str, base: str) -> bool:
        """Whether a worktree can branch from `base`: the local branch, or `origin/<base>`, exists (no fetch)."""

    async def is_merged(self, repo_root: str, commit: str, base: str) -> bool:
        """Whether `commit` is in the history of branch `base` (false when either does not exist)."""

    async def repo_context(self, repo_root: str, *, recent: int = 10) -> RepoContext: ...
    async def worktrees(self, repo_root: str) -> list[WorktreeEntry]: ...
    async def branches(self, repo_root: str, prefix: str) -> list[str]:
        """Local branch names starting with `prefix`."""

    async def prune(self, repo_root: str) -> None:
        """Forget worktrees whose folder is gone (`git worktree prune`)."""

    async def disk_usage(self, path: str) -> int:
        """Bytes used under `path` (0 when it does not exist)."""


@dataclass(frozen=True, slots=True)
class HookResult:
    """How one run of a lifecycle hook ended. `exit_code` is None when it was killed at its timeout or could not be
    started (`error` then says why)."""

    exit_code: int | None
    duration_s: float
    last_line: str
    timed_out: bool = False
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True, slots=True)
class IncludedFiles:
    """What `.worktreeinclude` brought into a new worktree: the files copied, and those left out with why."""

    listed: bool  # whether the repository has a `.worktreeinclude`
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "path: why"


class WorktreeSetup(Protocol):
    """What readies a session worktree the way the user's own checkout is: the git-ignored files the repository's
    `.worktreeinclude` lists, copied in, and the project's lifecycle hooks, run as shell commands."""

    async def copy_included(self, repo_root: str, worktree: str) -> IncludedFiles:
        """Copy into `worktree` the files of `repo_root` that are untracked, ignored by git, and matched by a
        pattern of `<repo_root>/.worktreeinclude` (gitignore syntax); modes kept, nothing outside either folder
        read or written, files already in the worktree left as they are. No `.worktreeinclude`: nothing."""

    async def run_hook(
        self, name: str, command: str, *, cwd: str, env: dict[str, str], timeout_s: float, log_path: str
    ) -> HookResult:
        """Run `sh -c command` in `cwd` with `env` plus the service's PATH and HOME (nothing else), in a process
        group of its own (killed, SIGTERM then SIGKILL, at `timeout_s`); its output is appended to `log_path` under
        a line naming the hook and the time."""

    async def append_log(self, log_path: str, text: str) -> None:
        """Append `text` to the log (created if missing, never through a symbolic link)."""
