"""`GitPythonVcs`: the VcsProvider over GitPython; every call runs off the event loop (GitPython blocks).

GitPython has no worktree API, so worktrees are driven through its command wrapper (`Git.execute`, argv
lists, never a shell). Repo objects are opened per call and closed at once: GitPython leaks file handles in
long-running processes.

How races are prevented: every call that changes a repository's shared metadata (worktree add/remove,
branch create/delete, rebase, merge into base, prune) holds an exclusive `flock` on
`<git common dir>/taskgate.lock` for its duration. flock locks belong to open file descriptions, so the lock
serialises threads of this process and other taskgate processes alike, and it dies with its holder (no stale
lock after a crash). Reads (status, diff, log) take no lock: git's own lock files keep them consistent.

Names and paths reach this module validated (domain/naming.py); `--` still separates options from every
ref and path argument, so nothing given to git can be taken for an option.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from git import Git, InvalidGitRepositoryError, NoSuchPathError, Repo, SymbolicReference

from taskgate.application.ports import (
    CommitInfo,
    FileStat,
    MergeOutcome,
    RepoContext,
    RepositoryInfo,
    WorkspaceContext,
    WorktreeCreated,
    WorktreeEntry,
    WorktreeState,
)
from taskgate.domain.errors import InvalidInput, VcsError

GIT_TIMEOUT_S = 300
_FALLBACK_IDENTITY = ("-c", "user.name=taskgate", "-c", "user.email=taskgate@localhost")
_CONFLICT_CODES = {"DD", "AU", "UD", "UA", "DU", "AA", "UU"}
_LOG_FORMAT = "--format=%H%x1f%s%x1f%an%x1f%aI"
_REPO_STATES = (
    ("rebase-merge", "rebasing"),
    ("rebase-apply", "rebasing"),
    ("MERGE_HEAD", "merging"),
    ("CHERRY_PICK_HEAD", "cherry-picking"),
    ("REVERT_HEAD", "reverting"),
    ("BISECT_LOG", "bisecting"),
)
# git runs without prompts, pagers or the repository's hooks on our own operations (a hook is code from the
# repository, which agents can write: taskgate's worktree and merge steps must not run it). Config by
# environment (git >= 2.31) leaves the argv as it is.
_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "LC_ALL": "C",
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "core.hooksPath",
    "GIT_CONFIG_VALUE_0": "/dev/null",
}


def _git(cwd: str | Path, *args: str, check: bool = True) -> str:
    """Run `git args…` in `cwd` and return stdout. Raises: VcsError with git's own message when it fails."""
    status, out, err = Git(str(cwd)).execute(
        ["git", *args],
        with_extended_output=True,
        with_exceptions=False,
        kill_after_timeout=GIT_TIMEOUT_S,
        env=_ENV,
        strip_newline_in_stdout=False,
    )
    if check and status != 0:
        raise VcsError(f"git {args[0]} failed: {(err or out).strip()[-600:] or f'exit {status}'}")
    return out


def _ok(cwd: str | Path, *args: str) -> bool:
    status, _, _ = Git(str(cwd)).execute(
        ["git", *args], with_extended_output=True, with_exceptions=False, kill_after_timeout=GIT_TIMEOUT_S, env=_ENV
    )
    return status == 0


def _common_dir(repo_root: str) -> Path:
    path = Path(repo_root) / ".git"
    return path if path.is_dir() else Path(_git(repo_root, "rev-parse", "--git-common-dir").strip()).resolve()


@contextmanager
def _repo_lock(repo_root: str) -> Iterator[None]:
    """Exclusive per-repository lock across threads and processes (see the module docstring)."""
    with open(_common_dir(repo_root) / "taskgate.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _identity(cwd: str | Path) -> tuple[str, ...]:
    """Rebases and merge commits need an identity; fall back to taskgate's when the repository has none."""
    return () if _ok(cwd, "config", "user.email") else _FALLBACK_IDENTITY


def _rev(cwd: str | Path, ref: str) -> str:
    """The commit `ref` names, or "" when there is none."""
    return _git(cwd, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}", check=False).strip()


def _resolve_in_process(repo_root: str, ref: str) -> tuple[str | None, bool]:
    """(commit of `ref` or None, whether an `origin` remote exists), read by GitPython without running git."""
    repo = Repo(repo_root)
    try:
        has_origin = any(r.name == "origin" for r in repo.remotes)
        try:  # reading the ref file directly: repo.commit() would start a `git cat-file` process (~4 ms)
            return SymbolicReference.dereference_recursive(repo, f"refs/heads/{ref}"), has_origin
        except (ValueError, OSError):
            return _rev(repo_root, ref) or None, has_origin
    finally:
        repo.close()


class GitPythonVcs:
    """The VcsProvider for real repositories. Stateless: safe to share between tasks and threads."""

    async def inspect_repository(self, path: str) -> RepositoryInfo:
        """The repository holding `path`. Raises: InvalidInput when there is none."""
        return await asyncio.to_thread(_inspect, path)

    async def create_worktree(self, repo_root: str, path: str, branch: str, base: str) -> WorktreeCreated:
        """See VcsProvider.create_worktree. Idempotent: an existing worktree of `branch` at `path` is reused."""
        return await asyncio.to_thread(_create_worktree, repo_root, path, branch, base)

    async def remove_worktree(self, repo_root: str, path: str, branch: str | None) -> None:
        await asyncio.to_thread(_remove_worktree, repo_root, path, branch)

    async def delete_branch(self, repo_root: str, branch: str) -> None:
        await asyncio.to_thread(_remove_worktree, repo_root, None, branch)

    async def reset_worktree(self, path: str, commit: str) -> None:
        await asyncio.to_thread(_reset_worktree, path, commit)

    async def workspace_context(
        self, repo_root: str, path: str, branch: str, base: str, *, max_patch_bytes: int = 200_000
    ) -> WorkspaceContext:
        return await asyncio.to_thread(_workspace_context, repo_root, path, branch, base, max_patch_bytes)

    async def worktree_state(self, repo_root: str, path: str, branch: str, base: str) -> WorktreeState:
        return await asyncio.to_thread(_worktree_state, repo_root, path, branch, base)

    async def merge(
        self, repo_root: str, path: str, branch: str, base: str, *, strategy: str, mode: str
    ) -> MergeOutcome:
        return await asyncio.to_thread(_merge, repo_root, path, branch, base, strategy, mode)

    async def repo_context(self, repo_root: str, *, recent: int = 10) -> RepoContext:
        return await asyncio.to_thread(_repo_context, repo_root, recent)

    async def worktrees(self, repo_root: str) -> list[WorktreeEntry]:
        return await asyncio.to_thread(_worktrees, repo_root)

    async def branches(self, repo_root: str, prefix: str) -> list[str]:
        # for-each-ref matches whole path components only ("feat" would miss "feature/x"): filter here.
        out = await asyncio.to_thread(_git, repo_root, "for-each-ref", "--format=%(refname:short)", "refs/heads/")
        return [line for line in out.splitlines() if line and line.startswith(prefix)]

    async def prune(self, repo_root: str) -> None:
        await asyncio.to_thread(_locked, repo_root, lambda: _git(repo_root, "worktree", "prune"))

    async def disk_usage(self, path: str) -> int:
        return await asyncio.to_thread(_disk_usage, path)


def _locked(repo_root: str, action):
    with _repo_lock(repo_root):
        return action()


def _inspect(path: str) -> RepositoryInfo:
    try:
        target = Path(path).expanduser().resolve()
        if not target.exists():
            raise InvalidInput(f"path {target} does not exist")
        repo = Repo(target, search_parent_directories=True)
    except (InvalidGitRepositoryError, NoSuchPathError):
        raise InvalidInput(f"{target} is not inside a git repository (run `git init` there first)") from None
    except (OSError, ValueError, RuntimeError) as exc:  # name too long, NUL byte, unknown ~user, no access
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidInput(f"path '{path[:200]}' cannot be used: {reason}") from None
    try:
        if repo.bare or repo.working_tree_dir is None:
            raise InvalidInput(f"{target} is a bare repository; taskgate needs a working tree")
        head = None if repo.head.is_detached else repo.active_branch.name
        return RepositoryInfo(root=str(Path(repo.working_tree_dir).resolve()), head_branch=head)
    finally:
        repo.close()


# -- worktrees ---------------------------------------------------------------------------------------------------


def _create_worktree(repo_root: str, path: str, branch: str, base: str) -> WorktreeCreated:
    with _repo_lock(repo_root):
        _exclude_worktrees_dir(repo_root, path)
        if Path(path).exists():
            return _existing_worktree(repo_root, path, branch, base)
        base_ref, base_commit = _base_commit(repo_root, base)
        if not base_commit:
            raise VcsError(f"base '{base_ref}' does not exist in {repo_root}; set git.base_branch")
        try:
            _git(repo_root, "worktree", "add", "--quiet", "-b", branch, "--", path, base_commit)
        except VcsError as exc:
            if "already exists" in str(exc) and _rev(repo_root, f"refs/heads/{branch}"):
                raise VcsError(f"branch '{branch}' already exists in {repo_root}; it was left untouched") from None
            _remove_leftovers(repo_root, path, branch)  # the branch is ours: `-b` failed before or after making it
            raise
        return WorktreeCreated(path=path, branch=branch, base_ref=base_ref, base_commit=base_commit)


def _base_commit(repo_root: str, base: str) -> tuple[str, str | None]:
    """(`origin/<base>` after a fetch when the repository has an `origin` remote, else `base`; its commit)."""
    commit, has_origin = _resolve_in_process(repo_root, base)
    if not has_origin:
        return base, commit
    try:
        _git(repo_root, "fetch", "--quiet", "origin", "--", base)
    except VcsError as exc:
        raise VcsError(f"fetching '{base}' from origin failed: {exc}") from None
    return f"origin/{base}", _rev(repo_root, f"origin/{base}") or None


def _existing_worktree(repo_root: str, path: str, branch: str, base: str) -> WorktreeCreated:
    """`path` exists: reuse it if it is this session's worktree (a retried initialisation), else refuse."""
    for entry in _worktrees(repo_root):
        if entry.path == path and not entry.missing:
            if entry.branch != branch:
                raise VcsError(f"{path} is already a worktree of branch '{entry.branch}', not '{branch}'")
            fork = _git(repo_root, "merge-base", "--", base, entry.head or branch).strip()
            return WorktreeCreated(path=path, branch=branch, base_ref=base, base_commit=fork)
    raise VcsError(f"{path} exists and is not a worktree of this repository; move it away first")


def _exclude_worktrees_dir(repo_root: str, path: str) -> None:
    """Keep the worktrees folder out of the project's own `git status` without touching tracked files."""
    try:
        relative = Path(path).parent.relative_to(repo_root)
    except ValueError:
        return  # worktrees live outside the repository: nothing to hide
    exclude = _common_dir(repo_root) / "info" / "exclude"
    line = f"/{relative.as_posix()}/"
    current = exclude.read_text() if exclude.exists() else ""
    if line not in current.splitlines():
        exclude.parent.mkdir(parents=True, exist_ok=True)
        exclude.write_text(current + ("" if current.endswith("\n") or not current else "\n") + line + "\n")


def _remove_worktree(repo_root: str, path: str | None, branch: str | None) -> None:
    with _repo_lock(repo_root):
        _remove_leftovers(repo_root, path, branch)


def _remove_leftovers(repo_root: str, path: str | None, branch: str | None) -> None:
    """Remove the worktree however much of it exists, then its branch; missing pieces are fine."""
    if path:
        _remove_folder(repo_root, path)
    if branch and not _ok(repo_root, "branch", "-D", "--", branch) and _rev(repo_root, f"refs/heads/{branch}"):
        raise VcsError(f"branch '{branch}' could not be deleted")


def _remove_folder(repo_root: str, path: str) -> None:
    if not Path(path).is_absolute() or Path(path).resolve() == Path(repo_root).resolve():
        raise VcsError(f"refusing to remove {path!r}: not a worktree folder")
    if _ok(repo_root, "worktree", "remove", "--force", "--force", "--", path):
        return
    # Not a registered worktree (any more), or its folder is half gone: remove what is left by hand.
    shutil.rmtree(path, ignore_errors=True)
    _git(repo_root, "worktree", "prune")


def _reset_worktree(path: str, commit: str) -> None:
    if not Path(path).is_dir():
        return
    for args in (("rebase", "--abort"), ("merge", "--abort")):
        _ok(path, *args)  # leave any half-done operation first; failing means there was none
    _git(path, "reset", "--quiet", "--hard", commit)
    _git(path, "clean", "-q", "-f", "-d", "-x")


def _worktrees(repo_root: str) -> list[WorktreeEntry]:
    entries: list[WorktreeEntry] = []
    for block in _git(repo_root, "worktree", "list", "--porcelain", "-z").split("\0\0"):
        fields = dict(_porcelain_field(f) for f in block.split("\0") if f)
        if "worktree" in fields:
            path = fields["worktree"]
            branch = fields.get("branch", "").removeprefix("refs/heads/") or None
            entries.append(WorktreeEntry(path, branch, fields.get("HEAD"), missing=not Path(path).exists()))
    return entries


def _porcelain_field(text: str) -> tuple[str, str]:
    key, _, value = text.partition(" ")
    return key, value


def _disk_usage(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue  # removed while we walked
    return total


# -- review context ------------------------------------------------------------------------------------------------


def _workspace_context(repo_root: str, path: str, branch: str, base: str, max_patch: int) -> WorkspaceContext:
    head = _rev(repo_root, f"refs/heads/{branch}")
    if not head:
        raise VcsError(f"branch '{branch}' no longer exists in {repo_root}")
    base_commit = _rev(repo_root, base)
    if not base_commit:
        raise VcsError(f"base '{base}' does not exist in {repo_root}")
    fork = _git(repo_root, "merge-base", "--", base_commit, head).strip()
    behind, ahead = (
        int(n) for n in _git(repo_root, "rev-list", "--left-right", "--count", f"{base_commit}...{head}").split()
    )
    patch = _git(repo_root, "diff", "--no-color", "--no-ext-diff", fork, head)
    dirty, untracked, conflicts = _worktree_status(path)
    return WorkspaceContext(
        branch=branch,
        base_ref=base,
        base_commit=base_commit,
        head_commit=head,
        ahead=ahead,
        behind=behind,
        diff_stat=_numstat(_git(repo_root, "diff", "--numstat", "-z", "--no-renames", fork, head)),
        patch=patch[:max_patch],
        patch_truncated=len(patch) > max_patch,
        commits=_commits(repo_root, f"{fork}..{head}"),
        dirty=dirty,
        untracked=untracked,
        conflicts=conflicts,
    )


def _worktree_state(repo_root: str, path: str, branch: str, base: str) -> WorktreeState:
    """Two git processes (status, log); the branch head is read from its ref file in-process."""
    head, _ = _resolve_in_process(repo_root, branch)
    if not head:
        raise VcsError(f"branch '{branch}' no longer exists in {repo_root}")
    dirty, untracked, conflicts = _worktree_status(path)
    commits = _commits(repo_root, f"{base}..{head}")
    return WorktreeState(branch, head, dirty, untracked, conflicts, commits)


def _numstat(out: str) -> list[FileStat]:
    stats = []
    for record in out.split("\0"):
        parts = record.split("\t", 2)
        if len(parts) == 3:
            added, deleted, name = parts
            stats.append(FileStat(name, int(added) if added != "-" else -1, int(deleted) if deleted != "-" else -1))
    return stats


def _commits(cwd: str | Path, revision_range: str, limit: int = 200) -> list[CommitInfo]:
    out = _git(cwd, "log", f"--max-count={limit}", _LOG_FORMAT, revision_range, "--", check=False)
    commits = []
    for line in out.splitlines():
        parts = line.split("\x1f")
        if len(parts) == 4:
            commits.append(CommitInfo(parts[0], parts[1], parts[2], datetime.fromisoformat(parts[3])))
    return commits


def _status_entries(cwd: str | Path) -> list[tuple[str, str]]:
    """(XY code, path) pairs of `git status --porcelain -z`; rename sources are skipped."""
    records = _git(cwd, "status", "--porcelain", "-z", "--untracked-files=all").split("\0")
    entries, skip = [], False
    for record in records:
        if skip or len(record) < 4:
            skip = False
            continue
        code, name = record[:2], record[3:]
        skip = code[0] in "RC"  # the next record is the rename's source path
        entries.append((code, name))
    return entries


def _worktree_status(path: str) -> tuple[list[str], list[str], list[str]]:
    if not Path(path).is_dir():
        return [], [], []
    entries = _status_entries(path)
    conflicts = [name for code, name in entries if code in _CONFLICT_CODES]
    untracked = [name for code, name in entries if code == "??"]
    dirty = [name for code, name in entries if code != "??" and code not in _CONFLICT_CODES]
    return dirty, untracked, conflicts


def _repo_context(repo_root: str, recent: int) -> RepoContext:
    entries = _status_entries(repo_root)
    repo = Repo(repo_root)
    try:
        branch = None if repo.head.is_detached else repo.active_branch.name
        head = repo.head.commit.hexsha if repo.head.is_valid() else None
        git_dir = Path(repo.git_dir)
    finally:
        repo.close()
    staged = sum(1 for code, _ in entries if code not in _CONFLICT_CODES and code[0] not in " ?!")
    unstaged = sum(1 for code, _ in entries if code not in _CONFLICT_CODES and code[1] not in " ?!")
    return RepoContext(
        branch=branch,
        head=head,
        clean=not entries,
        staged=staged,
        unstaged=unstaged,
        untracked=sum(1 for code, _ in entries if code == "??"),
        conflicted=sum(1 for code, _ in entries if code in _CONFLICT_CODES),
        state=next((name for marker, name in _REPO_STATES if (git_dir / marker).exists()), "clean"),
        recent_commits=_commits(repo_root, "HEAD", limit=recent) if head else [],
        worktrees=_worktrees(repo_root),
    )


# -- merge -------------------------------------------------------------------------------------------------------


def _merge(repo_root: str, path: str, branch: str, base: str, strategy: str, mode: str) -> MergeOutcome:
    with _repo_lock(repo_root):
        _ensure_worktree(repo_root, path, branch)
        _refuse_unclean(path)
        base_commit = _rev(repo_root, f"refs/heads/{base}")
        if not base_commit:
            raise VcsError(f"base branch '{base}' does not exist in {repo_root}")
        rebased = False
        if not _ok(repo_root, "merge-base", "--is-ancestor", base_commit, f"refs/heads/{branch}"):
            conflicts = _bring_base_in(path, base_commit, strategy)
            if conflicts:
                return MergeOutcome(False, base, conflicts=conflicts, detail=f"{strategy} onto '{base}' conflicted")
            rebased = True
        merged = _merge_into_base(repo_root, branch, base, base_commit, mode)
        return MergeOutcome(True, base, merged_commit=merged, rebased=rebased)


def _ensure_worktree(repo_root: str, path: str, branch: str) -> None:
    """A worktree deleted by hand is recreated from its branch (its commits are all in the branch)."""
    if Path(path).is_dir():
        return
    if not _rev(repo_root, f"refs/heads/{branch}"):
        raise VcsError(f"the worktree {path} and its branch '{branch}' are both gone; nothing left to merge")
    _git(repo_root, "worktree", "prune")
    _git(repo_root, "worktree", "add", "--quiet", "--", path, branch)


def _refuse_unclean(path: str) -> None:
    dirty, untracked, conflicts = _worktree_status(path)
    changed = conflicts + dirty + untracked
    if changed:
        shown = ", ".join(changed[:10]) + (" ..." if len(changed) > 10 else "")
        raise VcsError(
            f"the worktree has uncommitted changes ({shown}); commit or discard them before merging. Nothing changed"
        )
    if any((Path(_git(path, "rev-parse", "--git-dir").strip()) / m).exists() for m, _ in _REPO_STATES[:3]):
        raise VcsError("a rebase or merge is in progress in the worktree; finish or abort it first")


def _bring_base_in(path: str, base_commit: str, strategy: str) -> list[str]:
    """Rebase the branch onto base (or merge base in). On conflict abort and return the conflicting files."""
    args = (
        ("rebase", "--quiet", base_commit) if strategy == "rebase" else ("merge", "--quiet", "--no-edit", base_commit)
    )
    if _ok(path, *_identity(path), *args):
        return []
    conflicts = [name for code, name in _status_entries(path) if code in _CONFLICT_CODES]
    _git(path, args[0], "--abort")
    if not conflicts:
        raise VcsError(f"git {args[0]} onto the base failed without conflicts; the branch is unchanged")
    return conflicts


def _merge_into_base(repo_root: str, branch: str, base: str, base_commit: str, mode: str) -> str:
    checked_out = next((e.path for e in _worktrees(repo_root) if e.branch == base and not e.missing), None)
    message = f"Merge branch '{branch}' (taskgate)"
    if checked_out is not None:  # move the base through its own worktree so its files follow
        flag = ("--ff-only",) if mode == "ff-only" else ("--no-ff", "--no-edit", "-m", message)
        _git(checked_out, *_identity(checked_out), "merge", "--quiet", *flag, f"refs/heads/{branch}")
        return _rev(repo_root, f"refs/heads/{base}")
    head = _rev(repo_root, f"refs/heads/{branch}")
    new = head
    if mode != "ff-only":
        tree = f"{head}^{{tree}}"
        new = _git(repo_root, *_identity(repo_root), "commit-tree", tree, "-p", base_commit, "-p", head, "-m", message)
        new = new.strip()
    # Compare-and-swap: fails if someone else moved the base since we read it.
    _git(repo_root, "update-ref", "-m", message, f"refs/heads/{base}", new, base_commit)
    return new
