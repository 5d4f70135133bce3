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

Git acts only on what taskgate owns. Run in a folder that is not a checkout of its own, git walks up and acts
on the enclosing one: an emptied session worktree would let a rebase, a `reset --hard` or a `clean` hit the
project checkout. So no git command runs in a session worktree (or in the checkout that has the base branch)
before `_checkout` has verified it: no symbolic link, git's top level there is the folder itself, its common
git dir is the project's, it is listed by the project's `git worktree list`, and its HEAD is the expected
branch. In the usual case one `rev-parse` establishes all of it (`_linked_checkout_at_once`: the listing is
read from the files `git worktree list` reads); anything unusual gets the full two-process check. Later
commands in it run with GIT_DIR and GIT_WORK_TREE pinned to what was verified, so a folder emptied or deleted
after the check still cannot lead git to another checkout (only a folder swapped for a symbolic link within
those milliseconds, by hand, is beyond what a path can pin). Every command also gets an explicit `-C
<folder>`: GitPython silently runs git in the process's own working directory when its folder does not exist.

The base branch only moves forward: the merge builds the new commit first, checks that it descends from the
base as read, then moves the base by a compare-and-swap (`update-ref <new> <old>`) or, when a checkout has the
base, by `merge --ff-only` there (git refuses anything but a fast-forward and any overwrite of local changes).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from taskgate.application.workspaces.ports import (
    BranchChange,
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
from taskgate.domain.errors import BranchGone, InvalidInput, VcsError, WorktreeMismatch

GIT_TIMEOUT_S = 300
_FALLBACK_IDENTITY = ("-c", "user.name=taskgate", "-c", "user.email=taskgate@localhost")
_CONFLICT_CODES = {"DD", "AU", "UD", "UA", "DU", "AA", "UU"}
_LOG_FORMAT = "--format=%H%x1f%s%x1f%an%x1f%aI"
_HEX = "0123456789abcdef"
_REPO_STATES = (
    ("rebase-merge", "rebasing"),
    ("rebase-apply", "rebasing"),
    ("MERGE_HEAD", "merging"),
    ("CHERRY_PICK_HEAD", "cherry-picking"),
    ("REVERT_HEAD", "reverting"),
    ("BISECT_LOG", "bisecting"),
)
# git runs without prompts, pagers, the repository's hooks or its fsmonitor command on our own operations (both
# are code from the repository's config, which agents can write until they run sandboxed: taskgate's worktree,
# review and merge steps must not run it). Config by environment (git >= 2.31) leaves the argv as it is, and
# outranks every config file.
_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "LC_ALL": "C",
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "core.hooksPath",
    "GIT_CONFIG_VALUE_0": "/dev/null",
    "GIT_CONFIG_KEY_1": "core.fsmonitor",
    "GIT_CONFIG_VALUE_1": "false",
}


def _run(cwd: str | Path, args: tuple[str, ...], env: dict[str, str] = _ENV) -> tuple[int, str, str]:
    """(status, stdout, stderr) of `git -C cwd args…`. `-C` makes git fail on a missing folder, where
    GitPython would run it in the process's own working directory."""
    from git import Git  # GitPython (~40 ms to import) loads at the first git call, not with taskgate

    return Git(str(cwd)).execute(
        ["git", "-C", str(cwd), *args],
        with_extended_output=True,
        with_exceptions=False,
        kill_after_timeout=GIT_TIMEOUT_S,
        env=env,
        strip_newline_in_stdout=False,
    )


def _git(cwd: str | Path, *args: str, check: bool = True, env: dict[str, str] = _ENV) -> str:
    """Run `git args…` in `cwd` and return stdout. Raises: VcsError with git's own message when it fails."""
    status, out, err = _run(cwd, args, env)
    if check and status != 0:
        raise VcsError(f"git {args[0]} failed: {(err or out).strip()[-600:] or f'exit {status}'}")
    return out


def _ok(cwd: str | Path, *args: str, env: dict[str, str] = _ENV) -> bool:
    return _run(cwd, args, env)[0] == 0


def _common_dir(repo_root: str) -> Path:
    path = Path(repo_root) / ".git"
    if path.is_dir():
        return path
    return Path(_git(repo_root, "rev-parse", "--path-format=absolute", "--git-common-dir").strip()).resolve()


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
    from git import Repo, SymbolicReference

    repo = Repo(repo_root)
    try:
        has_origin = any(r.name == "origin" for r in repo.remotes)
        try:  # reading the ref file directly: repo.commit() would start a `git cat-file` process (~4 ms)
            return SymbolicReference.dereference_recursive(repo, f"refs/heads/{ref}"), has_origin
        except (ValueError, OSError):
            return _rev(repo_root, ref) or None, has_origin
    finally:
        repo.close()


# -- which folder git acts on ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Checkout:
    """A folder verified by `_checkout`. Commands run here with GIT_DIR and GIT_WORK_TREE pinned to what was
    verified, so git never goes looking for a repository above the folder (see the module docstring)."""

    path: str  # resolved
    git_dir: str  # absolute: <common dir>/worktrees/<name> for a linked worktree

    @property
    def env(self) -> dict[str, str]:
        return {**_ENV, "GIT_DIR": self.git_dir, "GIT_WORK_TREE": self.path}

    def git(self, *args: str, check: bool = True) -> str:
        return _git(self.path, *args, check=check, env=self.env)

    def run(self, *args: str) -> tuple[int, str, str]:
        return _run(self.path, args, self.env)


def _require_branch(repo_root: str, branch: str, path: str) -> str:
    """The commit of `branch`. Raises: BranchGone, before anything looks at (or into) its worktree."""
    head = _rev(repo_root, f"refs/heads/{branch}")
    if not head:
        raise _branch_gone(repo_root, branch, path)
    return head


def _branch_gone(repo_root: str, branch: str, path: str) -> BranchGone:
    """BranchGone, naming the branch's last commit when the worktree's own reflog still holds it: git keeps a
    registered worktree's `logs/HEAD` in its admin folder (`<common dir>/worktrees/<name>`), also once its branch is
    deleted and its folder removed, until `git worktree prune`. Reads files only."""
    admins = _common_dir(repo_root) / "worktrees"
    wanted = os.path.realpath(path)
    for admin in sorted(admins.iterdir()) if admins.is_dir() else ():
        if _listed_path(admin) != wanted:
            continue
        try:
            lines = (admin / "logs" / "HEAD").read_text().splitlines()
        except OSError:
            break
        fields = lines[-1].split() if lines else []
        if len(fields) > 1 and len(fields[1]) in (40, 64) and not fields[1].strip(_HEX):
            return BranchGone(branch, path, repo_root, last_commit=fields[1])
    return BranchGone(branch, path, repo_root)


def _session_worktree(repo_root: str, path: str, branch: str | None) -> _Checkout | None:
    """The session's worktree at `path`, verified; None when nothing at all is there (recreatable from the
    branch). `branch` None accepts whichever branch is registered there. A rebase of the branch in progress is
    accepted: reads only read, merge refuses it before changing anything, reset aborts it first.
    Raises: WorktreeMismatch."""
    if not os.path.lexists(path):
        return None
    advice = "move it away and taskgate recreates the worktree from its branch at the next merge"
    return _checkout(repo_root, path, branch, linked=True, rebasing=True, advice=advice)


def _checkout(
    repo_root: str, path: str, branch: str | None, *, linked: bool, rebasing: bool = False, advice: str
) -> _Checkout:
    """`path` as a registered checkout of the project with `branch` checked out (or, with `rebasing`, being
    rebased). `linked` also refuses the project's main checkout. Raises: WorktreeMismatch naming what it is."""
    if linked and (verified := _linked_checkout_at_once(repo_root, path, branch)) is not None:
        return verified
    expected = f"the {'worktree' if linked else 'checkout'} of branch '{branch or '(any)'}' of {repo_root}"

    def refuse(found: str) -> VcsError:
        return WorktreeMismatch(path, expected, found, advice)

    checkout = _own_checkout(repo_root, path, linked, refuse)
    entry = next((e for e in _worktrees(repo_root) if str(Path(e.path).resolve()) == checkout.path), None)
    if entry is None:
        raise refuse(f"a checkout that `git worktree list` of {repo_root} does not list")
    _check_head(entry, checkout.git_dir, branch, rebasing, refuse)
    return checkout


def _linked_checkout_at_once(repo_root: str, path: str, branch: str | None) -> _Checkout | None:
    """The usual case of `_checkout(linked=True)` in one git process instead of two: `path` is the project's
    registered linked worktree with `refs/heads/<branch>` (any branch when None) checked out. The same checks as
    the full path, read differently: git's own `rev-parse` (top level, git dir, common dir, and the branch HEAD
    names) instead of `rev-parse` plus `git worktree list`, whose entry for the folder is read from the same
    files git reads for it (`<common dir>/worktrees/<id>/gitdir`). None whenever anything is not exactly that
    (a detached HEAD, a rebase in progress, an unborn branch, an odd path), and the full check then runs and
    names what it found, so refusals and their messages are unchanged."""
    where = Path(path)
    if where.is_symlink() or not where.is_dir():
        return None
    status, out, _ = _run(path, ("rev-parse", "--path-format=absolute", "--show-toplevel", "--git-dir",
                                 "--git-common-dir", "--symbolic-full-name", "HEAD"))  # fmt: skip
    lines = out.splitlines()
    if status != 0 or len(lines) != 4:
        return None
    top, git_dir, common, head_ref = lines
    real, admin, common_dir = str(where.resolve()), Path(git_dir).resolve(), Path(common).resolve()
    if str(Path(top).resolve()) != real or common_dir != _common_dir(repo_root).resolve():
        return None
    if admin.parent != common_dir / "worktrees" or not _admin_points_at(git_dir, real):
        return None  # not linked, or not where `git worktree list` looks for the project's worktrees
    if _listed_path(admin) != real:
        return None
    if not head_ref.startswith("refs/heads/") or branch not in (None, head_ref.removeprefix("refs/heads/")):
        return None
    return _Checkout(real, git_dir)


def _listed_path(admin: Path) -> str | None:
    """The folder `git worktree list` shows for the linked worktree whose admin folder is `admin`, resolved as
    `_checkout` compares it: its `gitdir` file without the trailing `/.git`, relative to `admin` if relative."""
    try:
        recorded = (admin / "gitdir").read_text().rstrip().removesuffix("/.git")
    except OSError:
        return None
    return str((admin / recorded).resolve()) if recorded else None


def _own_checkout(repo_root: str, path: str, linked: bool, refuse: Callable[[str], VcsError]) -> _Checkout:
    """`path` is a checkout of its own (git finds no other from there) of the project's repository."""
    where = Path(path)
    if where.is_symlink():
        raise refuse(f"a symbolic link to {os.readlink(path)} (remove the link itself, not what it points to)")
    if not where.is_dir():
        raise refuse("not a folder")
    top, git_dir, common = _locate(path)
    real = str(where.resolve())
    if top != real:
        raise refuse(_describe_folder(where, top))
    if Path(common).resolve() != _common_dir(repo_root).resolve():
        raise refuse(f"a checkout of another repository (git dir {common})")
    if linked and Path(git_dir).resolve() == Path(common).resolve():
        raise refuse("the main checkout of a repository, not a linked worktree")
    if linked and not _admin_points_at(git_dir, real):
        raise refuse(f"a copy of another worktree (its .git names {git_dir}, which belongs elsewhere)")
    return _Checkout(real, git_dir)


def _admin_points_at(git_dir: str, real: str) -> bool:
    """Whether the worktree's admin folder names `real` as its worktree (what `git worktree list` shows)."""
    try:
        recorded = Path(git_dir, "gitdir").read_text().strip()
    except OSError:
        return False
    return (Path(git_dir) / recorded).resolve() == Path(real, ".git")


def _locate(path: str) -> tuple[str, str, str]:
    """(top level, git dir, common git dir) of the checkout git finds from `path`, all absolute; ("", "", "")
    when git finds none."""
    status, out, _ = _run(path, ("rev-parse", "--path-format=absolute", "--show-toplevel", "--git-dir",
                                 "--git-common-dir"))  # fmt: skip
    lines = out.splitlines()
    if status != 0 or len(lines) != 3:
        return "", "", ""
    return str(Path(lines[0]).resolve()), lines[1], lines[2]


def _describe_folder(where: Path, top: str) -> str:
    if not top:
        return "a folder outside any git repository"
    kind = "an empty folder" if not any(where.iterdir()) else "a folder that is no checkout of its own"
    return f"{kind} (git run there would act on the enclosing checkout {top})"


def _check_head(
    entry: WorktreeEntry, git_dir: str, branch: str | None, rebasing: bool, refuse: Callable[[str], VcsError]
) -> None:
    """The checkout's HEAD is `refs/heads/<branch>` (any branch when None), or a rebase of it when allowed."""
    rebased = None if entry.branch else _rebased_branch(git_dir)
    found = entry.branch or (rebased if rebasing else None)
    if found is not None and branch in (None, found):
        return
    if entry.branch:
        raise refuse(f"a worktree of branch '{entry.branch}'")
    if rebased:
        raise refuse(f"a worktree in the middle of a rebase of '{rebased}' (finish or abort it there first)")
    raise refuse(f"a worktree with a detached HEAD at {(entry.head or '?')[:12]}")


def _rebased_branch(git_dir: str) -> str | None:
    """The branch a rebase in progress in `git_dir` is rewriting, or None."""
    for folder in ("rebase-merge", "rebase-apply"):
        head_name = Path(git_dir, folder, "head-name")
        if head_name.is_file():
            name = head_name.read_text().strip()
            return name.removeprefix("refs/heads/") if name.startswith("refs/heads/") else None
    return None


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

    async def reset_worktree(
        self, path: str, commit: str, *, repo_root: str | None = None, branch: str | None = None
    ) -> None:
        """See VcsProvider.reset_worktree. Raises: WorktreeMismatch when `path` is not that worktree."""
        await asyncio.to_thread(_reset_worktree, path, commit, repo_root, branch)

    async def workspace_context(
        self, repo_root: str, path: str, branch: str, base: str, *, max_patch_bytes: int = 200_000
    ) -> WorkspaceContext:
        return await asyncio.to_thread(_workspace_context, repo_root, path, branch, base, max_patch_bytes)

    async def merged_context(
        self, repo_root: str, base: str, before: str, merged: str, *, max_patch_bytes: int = 200_000
    ) -> WorkspaceContext:
        return await asyncio.to_thread(_merged_context, repo_root, base, before, merged, max_patch_bytes)

    async def worktree_state(self, repo_root: str, path: str, branch: str, base: str) -> WorktreeState:
        """Three git processes, two of them one after the other: the worktree check (one `rev-parse` in the
        usual case) then its status, and beside them the log of the commits not on base, which reads only the
        repository. The branch head is read in-process first (BranchGone before anything else)."""
        head = await asyncio.to_thread(_branch_head, repo_root, branch, path)
        (dirty, untracked, conflicts), commits = await asyncio.gather(
            asyncio.to_thread(_worktree_status, repo_root, path, branch),
            asyncio.to_thread(_commits, repo_root, f"{base}..{head}"),
        )
        return WorktreeState(branch, head, dirty, untracked, conflicts, commits)

    async def branch_change(
        self, repo_root: str, path: str, branch: str, base: str, *, max_patch_bytes: int = 200_000
    ) -> BranchChange:
        """`workspace_context`'s head, diff stat and patch: the head read in-process, then three git processes
        side by side (the worktree check, the patch, the numstat), where `workspace_context` runs ten one after
        the other. `<base>...<head>` is git's own `diff $(git merge-base <base> <head>) <head>` (the first merge
        base when there are several, as `merge-base` prints), so the diff is that of the fork point. Errors come
        in `workspace_context`'s order: BranchGone, WorktreeMismatch, then base missing or git's own."""
        head = await asyncio.to_thread(_branch_head, repo_root, branch, path)
        checked, patch, numstat = await asyncio.gather(
            asyncio.to_thread(_session_worktree, repo_root, path, branch),
            asyncio.to_thread(_run, repo_root, ("diff", "--no-color", "--no-ext-diff", f"{base}...{head}", "--")),
            asyncio.to_thread(_run, repo_root, ("diff", "--numstat", "-z", "--no-renames", f"{base}...{head}", "--")),
            return_exceptions=True,
        )
        for outcome in (checked, patch, numstat):
            if isinstance(outcome, BaseException):
                raise outcome
        assert not isinstance(patch, BaseException) and not isinstance(numstat, BaseException)
        if patch[0] != 0 or numstat[0] != 0:
            await asyncio.to_thread(_fork_point, repo_root, base, head)  # raises what workspace_context would
            failed = patch if patch[0] != 0 else numstat
            raise VcsError(f"git diff failed: {(failed[2] or failed[1]).strip()[-600:] or f'exit {failed[0]}'}")
        text = patch[1]
        return BranchChange(head, _numstat(numstat[1]), text[:max_patch_bytes], len(text) > max_patch_bytes)

    async def merge(
        self, repo_root: str, path: str, branch: str, base: str, *, strategy: str, mode: str
    ) -> MergeOutcome:
        return await asyncio.to_thread(_merge, repo_root, path, branch, base, strategy, mode)

    async def base_exists(self, repo_root: str, base: str) -> bool:
        return await asyncio.to_thread(_base_exists, repo_root, base)

    async def is_merged(self, repo_root: str, commit: str, base: str) -> bool:
        return await asyncio.to_thread(_ok, repo_root, "merge-base", "--is-ancestor", commit, f"refs/heads/{base}")

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
    from git import InvalidGitRepositoryError, NoSuchPathError, Repo

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
        if os.path.lexists(path):
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


def _base_exists(repo_root: str, base: str) -> bool:
    commit, has_origin = _resolve_in_process(repo_root, base)
    return bool(commit) or (has_origin and bool(_rev(repo_root, f"refs/remotes/origin/{base}")))


def _existing_worktree(repo_root: str, path: str, branch: str, base: str) -> WorktreeCreated:
    """`path` exists: reuse it if it is this session's worktree (a retried initialisation), else refuse.
    Raises: WorktreeMismatch."""
    _checkout(repo_root, path, branch, linked=True, advice="move it away first")
    fork = _git(repo_root, "merge-base", "--", base, f"refs/heads/{branch}").strip()
    return WorktreeCreated(path=path, branch=branch, base_ref=base, base_commit=fork)


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
    where = Path(path)
    if where.is_absolute() and where.is_symlink():  # `worktree remove` would follow it and remove its target
        where.unlink()  # the link only: nothing it points to is touched
        _git(repo_root, "worktree", "prune")
        return
    if not where.is_absolute() or where.resolve() == Path(repo_root).resolve():
        raise VcsError(f"refusing to remove {path!r}: not a worktree folder")
    if _ok(repo_root, "worktree", "remove", "--force", "--force", "--", path):
        return
    _refuse_foreign(repo_root, path)
    # Not a registered worktree (any more), or its folder is half gone: remove what is left by hand.
    shutil.rmtree(path, ignore_errors=True)
    _git(repo_root, "worktree", "prune")


def _refuse_foreign(repo_root: str, path: str) -> None:
    """A folder holding a checkout of another repository is never removed by hand. Raises: WorktreeMismatch."""
    if not Path(path, ".git").exists():
        return
    _top, _git_dir, common = _locate(path)
    if common and Path(common).resolve() != _common_dir(repo_root).resolve():
        found = f"a checkout of another repository (git dir {common})"
        raise WorktreeMismatch(path, f"a worktree of {repo_root}", found, "move it away, then try again")


def _reset_worktree(path: str, commit: str, repo_root: str | None, branch: str | None) -> None:
    """Hard reset the session's worktree to `commit` and remove every untracked file, after leaving a rebase
    or merge in progress. Nothing at `path`: nothing to do. Raises: WorktreeMismatch (nothing run there)."""
    if repo_root is None:  # an older caller: the project is the checkout enclosing the worktrees folder
        repo_root = _enclosing_root(path)
        if repo_root is None:
            return
    with _repo_lock(repo_root):  # reset moves the branch ref: the same lock as every other ref change
        worktree = _session_worktree(repo_root, path, branch)
        if worktree is None:
            return
        for args in (("rebase", "--abort"), ("merge", "--abort")):
            worktree.run(*args)  # leave any half-done operation first; failing means there was none
        worktree.git("reset", "--quiet", "--hard", commit)
        worktree.git("clean", "-q", "-f", "-d", "-x")


def _enclosing_root(path: str) -> str | None:
    """The checkout enclosing `path`'s parent folder (worktrees live inside the project), or None when there is
    nothing at `path`. Raises: WorktreeMismatch when `path` exists outside any repository."""
    if not os.path.lexists(path):
        return None
    top, _git_dir, _common = _locate(str(Path(path).parent))
    if not top:
        raise WorktreeMismatch(path, "a taskgate worktree", "a folder outside any git repository", "move it away")
    return top


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
    head = _require_branch(repo_root, branch, path)
    dirty, untracked, conflicts = _worktree_status(repo_root, path, branch)
    base_commit, fork = _fork_point(repo_root, base, head)
    behind, ahead = (
        int(n) for n in _git(repo_root, "rev-list", "--left-right", "--count", f"{base_commit}...{head}").split()
    )
    patch = _git(repo_root, "diff", "--no-color", "--no-ext-diff", fork, head)
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


def _merged_context(repo_root: str, base: str, before: str, merged: str, max_patch: int) -> WorkspaceContext:
    start, end = _rev(repo_root, before), _rev(repo_root, merged)
    if not start or not end:
        missing = before if not start else merged
        raise VcsError(f"commit {missing[:12]} of the merge into '{base}' is not in {repo_root} (garbage-collected?)")
    patch = _git(repo_root, "diff", "--no-color", "--no-ext-diff", start, end)
    commits = _commits(repo_root, f"{start}..{end}")
    return WorkspaceContext(
        branch=base, base_ref=base, base_commit=start, head_commit=end, ahead=len(commits), behind=0,
        diff_stat=_numstat(_git(repo_root, "diff", "--numstat", "-z", "--no-renames", start, end)),
        patch=patch[:max_patch], patch_truncated=len(patch) > max_patch, commits=commits,
        dirty=[], untracked=[], conflicts=[],
    )  # fmt: skip


def _fork_point(repo_root: str, base: str, head: str) -> tuple[str, str]:
    """(base commit, merge base of it and `head`). Raises: VcsError when base is missing or they share none."""
    base_commit = _rev(repo_root, base)
    if not base_commit:
        raise VcsError(f"base '{base}' does not exist in {repo_root}")
    return base_commit, _git(repo_root, "merge-base", "--", base_commit, head).strip()


def _branch_head(repo_root: str, branch: str, path: str) -> str:
    """The commit of `branch`, read in-process (no git process): from its loose ref file when it holds an object
    id (git reads that file first, and writes it by an atomic rename), else by GitPython (packed refs, a
    symbolic ref). Raises: BranchGone."""
    git_dir = Path(repo_root, ".git")
    try:
        head = Path(git_dir, "refs", "heads", branch).read_text().strip() if git_dir.is_dir() else ""
    except OSError:
        head = ""
    if len(head) not in (40, 64) or head.strip(_HEX):
        head = _resolve_in_process(repo_root, branch)[0] or ""
    if not head:
        raise _branch_gone(repo_root, branch, path)
    return head


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


def _status_entries(cwd: str | Path | _Checkout) -> list[tuple[str, str]]:
    """(XY code, path) pairs of `git status --porcelain -z`; rename sources are skipped."""
    args = ("status", "--porcelain", "-z", "--untracked-files=all")
    records = (cwd.git(*args) if isinstance(cwd, _Checkout) else _git(cwd, *args)).split("\0")
    entries, skip = [], False
    for record in records:
        if skip or len(record) < 4:
            skip = False
            continue
        code, name = record[:2], record[3:]
        skip = code[0] in "RC"  # the next record is the rename's source path
        entries.append((code, name))
    return entries


def _worktree_status(repo_root: str, path: str, branch: str) -> tuple[list[str], list[str], list[str]]:
    """(dirty, untracked, conflicts) of the session's worktree; all empty when its folder is gone.
    Raises: WorktreeMismatch."""
    worktree = _session_worktree(repo_root, path, branch)
    return ([], [], []) if worktree is None else _split_status(worktree)


def _split_status(worktree: _Checkout) -> tuple[list[str], list[str], list[str]]:
    entries = _status_entries(worktree)
    conflicts = [name for code, name in entries if code in _CONFLICT_CODES]
    untracked = [name for code, name in entries if code == "??"]
    dirty = [name for code, name in entries if code != "??" and code not in _CONFLICT_CODES]
    return dirty, untracked, conflicts


def _repo_context(repo_root: str, recent: int) -> RepoContext:
    from git import Repo

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
        _require_branch(repo_root, branch, path)
        worktree = _ensure_worktree(repo_root, path, branch)
        _refuse_unclean(worktree)
        base_commit = _rev(repo_root, f"refs/heads/{base}")
        if not base_commit:
            raise VcsError(f"base branch '{base}' does not exist in {repo_root}")
        rebased = False
        if not _ok(repo_root, "merge-base", "--is-ancestor", base_commit, f"refs/heads/{branch}"):
            conflicts = _bring_base_in(worktree, base_commit, strategy)
            if conflicts:
                return MergeOutcome(False, base, conflicts=conflicts, detail=f"{strategy} onto '{base}' conflicted")
            rebased = True
        merged = _merge_into_base(repo_root, branch, base, base_commit, mode)
        return MergeOutcome(True, base, merged_commit=merged, rebased=rebased, base_before=base_commit)


def _ensure_worktree(repo_root: str, path: str, branch: str) -> _Checkout:
    """The session's worktree, verified. One whose folder was deleted by hand is recreated from its branch
    (its commits are all in the branch); a folder that is there but is not it is refused.
    Raises: WorktreeMismatch."""
    worktree = _session_worktree(repo_root, path, branch)
    if worktree is not None:
        return worktree
    _git(repo_root, "worktree", "prune")
    _git(repo_root, "worktree", "add", "--quiet", "--", path, branch)
    return _checkout(repo_root, path, branch, linked=True, advice="move it away, then merge again")


def _refuse_unclean(worktree: _Checkout) -> None:
    dirty, untracked, conflicts = _split_status(worktree)
    changed = conflicts + dirty + untracked
    if changed:
        shown = ", ".join(changed[:10]) + (" ..." if len(changed) > 10 else "")
        raise VcsError(
            f"the worktree has uncommitted changes ({shown}); commit or discard them before merging. Nothing changed"
        )
    if any((Path(worktree.git_dir) / marker).exists() for marker, _ in _REPO_STATES[:3]):
        raise VcsError("a rebase or merge is in progress in the worktree; finish or abort it first")


def _bring_base_in(worktree: _Checkout, base_commit: str, strategy: str) -> list[str]:
    """Rebase the branch onto base (or merge base in). On conflict abort and return the conflicting files."""
    args = (
        ("rebase", "--quiet", base_commit) if strategy == "rebase" else ("merge", "--quiet", "--no-edit", base_commit)
    )
    if worktree.run(*_identity(worktree.path), *args)[0] == 0:
        return []
    conflicts = [name for code, name in _status_entries(worktree) if code in _CONFLICT_CODES]
    worktree.git(args[0], "--abort")
    if not conflicts:
        raise VcsError(f"git {args[0]} onto the base failed without conflicts; the branch is unchanged")
    return conflicts


def _merge_into_base(repo_root: str, branch: str, base: str, base_commit: str, mode: str) -> str:
    """Move `base` from `base_commit` to the branch (ff-only) or to a merge commit of both (no-ff), forward
    only. Raises: VcsError when that would not be a fast-forward, or `base` moved meanwhile; nothing moved."""
    message = f"Merge branch '{branch}' (taskgate)"
    new = _landing_commit(repo_root, branch, base_commit, mode, message)
    if not _ok(repo_root, "merge-base", "--is-ancestor", base_commit, new):
        raise VcsError(
            f"'{branch}' at {new[:12]} does not contain '{base}' at {base_commit[:12]}: moving '{base}' there "
            f"would drop its commits. '{base}' was not moved"
        )
    checkout = _base_checkout(repo_root, base)
    if checkout is None:
        # Compare-and-swap: git refuses if the base is no longer at base_commit (moved since we read it), so no
        # commit is ever dropped. Users' own git commands take no lock of ours: one checking the base out by hand
        # in the instant between the listing above and this line would keep its old files (git has that window).
        _git(repo_root, "update-ref", "-m", message, f"refs/heads/{base}", new, base_commit)
    else:
        _fast_forward(checkout, repo_root, base, base_commit, new)
    now = _rev(repo_root, f"refs/heads/{base}")
    if now != new:
        raise VcsError(f"'{base}' is at {now[:12]} after the merge, not at {new[:12]}: it moved meanwhile")
    return new


def _landing_commit(repo_root: str, branch: str, base_commit: str, mode: str, message: str) -> str:
    """What the base moves to: the branch head (ff-only), or a merge commit of base and branch (no-ff)."""
    head = _rev(repo_root, f"refs/heads/{branch}")
    if mode == "ff-only":
        return head
    args = ("commit-tree", f"{head}^{{tree}}", "-p", base_commit, "-p", head, "-m", message)
    return _git(repo_root, *_identity(repo_root), *args).strip()


def _base_checkout(repo_root: str, base: str) -> _Checkout | None:
    """The verified checkout that has `base` checked out (usually the project's), or None when none has.
    Raises: WorktreeMismatch when a folder registered with the base is not that checkout any more."""
    entry = next((e for e in _worktrees(repo_root) if e.branch == base and not e.missing), None)
    if entry is None:
        return None
    advice = f"restore that checkout (or check '{base}' out elsewhere), then merge again"
    return _checkout(repo_root, entry.path, base, linked=False, advice=advice)


def _fast_forward(checkout: _Checkout, repo_root: str, base: str, base_commit: str, new: str) -> None:
    """Move the checked-out base to `new` in its checkout, so that its files follow. Unrelated local changes
    stay as they are. Raises: VcsError when local changes would be overwritten, or the base moved."""
    # The base must still be at base_commit; from there `merge --ff-only` is its compare-and-swap: should a
    # commit land on the base in between (a user's, who takes no lock of ours), `new` is no longer a
    # fast-forward of it and git refuses, so the base never loses a commit.
    if _rev(repo_root, f"refs/heads/{base}") != base_commit:
        raise VcsError(f"'{base}' moved while the merge was prepared; it was not moved by taskgate, merge again")
    status, out, err = checkout.run("merge", "--ff-only", "--quiet", new)
    if status != 0:
        raise _fast_forward_refused(checkout.path, base, err or out)


def _fast_forward_refused(path: str, base: str, output: str) -> VcsError:
    """Git's refusal to fast-forward, told as what the user has to do."""
    files = [line.strip() for line in output.splitlines() if line.startswith("\t")]
    if "would be overwritten" in output and files:
        shown = ", ".join(files[:10]) + (" ..." if len(files) > 10 else "")
        return VcsError(
            f"'{base}' is checked out in {path} with uncommitted changes that the merge would overwrite "
            f"({shown}); commit, stash or move them there, then merge again. '{base}' was not moved"
        )
    return VcsError(f"fast-forwarding '{base}' in {path} failed: {output.strip()[-600:]}; '{base}' was not moved")
