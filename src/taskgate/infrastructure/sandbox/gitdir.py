"""The session's private git dir: what a sandboxed agent's git sees instead of the project's `.git`.

A linked worktree commits into the project's shared `.git`, which no filesystem rule can open for one branch only
(docs/design/sandbox.md §2.1). So inside the sandbox, `<worktree>/.git` is a read-only file saying `gitdir:
<private>`, a git dir of the session's own whose `objects/info/alternates` names the project's object store (shown
read-only): the agent's commits land in its private objects and refs; the project's refs, config, hooks and
objects are beyond its reach. On the host nothing changes: the linked worktree, its branch, review, merge and
cleanup stay as they were.

`prepare` (before an agent starts) points the private branch at the project's, unless the private one holds
commits not yet brought home; `bring_back` (after each agent) fetches the private branch into
`refs/taskgate/incoming/<session>` (hooks off, objects checked) and moves the project's branch by a
compare-and-swap against the value read under the repository lock, then refreshes the linked worktree's index.

How races are prevented: both run under the project's repository lock (`git._repo_lock`, an flock shared with
every other git effect of taskgate, across processes), so two agents of one session ending together bring their
branch home one after the other, and no merge or worktree removal interleaves.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from taskgate.domain.errors import VcsError
from taskgate.infrastructure.git import _ENV, _git, _ok, _repo_lock, _rev  # the hardened runner and the shared lock

# The private dir's own config: no gc (its objects/info is read-only inside, and it lives for one session), no
# maintenance, the project's identity for the agent's commits.
_CONFIG = (("core.bare", "false"), ("gc.auto", "0"), ("maintenance.auto", "false"), ("core.logAllRefUpdates", "true"))


def prepare(project_root: str, worktree: str, branch: str, git_dir: str, dot_git: str) -> None:
    """Make (or bring up to date) the private git dir of the session whose worktree is `worktree` on `branch`,
    and the `gitdir:` file shown as its `.git` inside the sandbox."""
    with _repo_lock(project_root):
        head = _rev(project_root, f"refs/heads/{branch}")
        if not head:
            raise VcsError(f"branch '{branch}' is gone from {project_root}: the agent cannot start")
        if not os.path.isdir(git_dir):
            _create(project_root, git_dir)
        private = _private_rev(git_dir, f"refs/heads/{branch}")
        # the private branch ahead (commits of a run not brought home yet) stays: bring_back takes them
        ahead = bool(private) and private != head and _ok(git_dir, "merge-base", "--is-ancestor", head, private,
                                                          env={**_ENV, "GIT_DIR": git_dir})  # fmt: skip
        if private != head and not ahead:  # new, or taskgate moved the project's branch (a rebase): start there
            _copy_index(worktree, git_dir)  # first: a crash before the ref moves redoes both at the next start
            _private(git_dir, "update-ref", f"refs/heads/{branch}", head)
        wanted = f"ref: refs/heads/{branch}"
        if _read(Path(git_dir, "HEAD")) != wanted:  # a file read saves a git process at each start
            _private(git_dir, "symbolic-ref", "HEAD", f"refs/heads/{branch}")
    if _read(Path(dot_git)) != f"gitdir: {git_dir}":
        Path(dot_git).write_text(f"gitdir: {git_dir}\n")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def bring_back(project_root: str, worktree: str, branch: str, git_dir: str, session_id: str) -> str | None:
    """Bring the private branch's commits home: the project's `branch` moves to the private tip by a
    compare-and-swap. Returns the new commit, or None when there was nothing new. Raises: VcsError (the project's
    branch is left as it was)."""
    if not _private_rev(git_dir, f"refs/heads/{branch}"):
        return None
    incoming = f"refs/taskgate/incoming/{session_id}"
    with _repo_lock(project_root):
        old = _rev(project_root, f"refs/heads/{branch}")
        if not old:
            raise VcsError(f"branch '{branch}' is gone from {project_root}; the agent's work stays in {git_dir}")
        _git(project_root, "-c", "transfer.fsckObjects=true", "fetch", "--quiet", "--no-tags", "--no-write-fetch-head",
             "--", git_dir, f"+refs/heads/{branch}:{incoming}")  # fmt: skip
        new = _rev(project_root, incoming)
        if not new or new == old:
            return None
        # the worktree's index first, then the branch: a crash between them leaves the branch where it was, and the
        # next bring_back fetches and does both again (the index never lags the branch it stands for)
        admin = _linked_git_dir(project_root, worktree)
        _git(worktree, "--git-dir", admin, "--work-tree", worktree, "read-tree", new)
        try:
            _git(project_root, "update-ref", "-m", "taskgate: the sandboxed agent's commits", "--",
                 f"refs/heads/{branch}", new, old)  # fmt: skip
        except VcsError:
            _git(worktree, "--git-dir", admin, "--work-tree", worktree, "read-tree", old)
            raise
        _git(worktree, "--git-dir", admin, "--work-tree", worktree, "update-index", "-q", "--refresh", check=False)
        return new


def _private(git_dir: str, *args: str, check: bool = True) -> str:
    """`git args…` on the private dir, named explicitly (no discovery: it has no work tree of its own)."""
    return _git(git_dir, *args, check=check, env={**_ENV, "GIT_DIR": git_dir})


def _private_rev(git_dir: str, ref: str) -> str:
    return _private(git_dir, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}",
                    check=False).strip()  # fmt: skip


def remove(git_dir: str) -> None:
    """Remove a private git dir (the session's worktree is going); its work was brought home after each run."""
    shutil.rmtree(git_dir, ignore_errors=True)


def _create(project_root: str, git_dir: str) -> None:
    """Made whole in a folder beside it, then renamed into place: a crash half-way leaves no private dir without
    its alternates (whose absence would fail every later start) but a leftover the next attempt replaces."""
    Path(git_dir).parent.mkdir(parents=True, exist_ok=True)
    building = f"{git_dir}.new"
    shutil.rmtree(building, ignore_errors=True)
    _build(project_root, building)
    os.rename(building, git_dir)


def _build(project_root: str, git_dir: str) -> None:
    _git(project_root, "init", "--quiet", "--bare", "--", git_dir)
    for key, value in _CONFIG:
        _private(git_dir, "config", key, value)
    # the project's identity (global config included: the agent cannot read it), else one that says "agent": a
    # CLI that finds none writes one into the repository's config (aider), which is read-only here
    for key, fallback in (("user.name", "taskgate agent"), ("user.email", "agent@taskgate.invalid")):
        value = _git(project_root, "config", "--get", key, check=False).strip()
        _private(git_dir, "config", key, value or fallback)
    hooks = _git(project_root, "rev-parse", "--path-format=absolute", "--git-path", "hooks").strip()
    _private(git_dir, "config", "core.hooksPath", hooks)  # the project's pre-commit etc. still run, read-only, inside
    objects = _git(project_root, "rev-parse", "--path-format=absolute", "--git-path", "objects").strip()
    Path(git_dir, "objects", "info", "alternates").write_text(objects + "\n")


def _copy_index(worktree: str, git_dir: str) -> None:
    """The linked worktree's index (stat data fresh) as the private one, so the agent's first `git status` does
    not rehash every file."""
    source = Path(_linked_git_dir_of(worktree), "index")
    if source.is_file():
        shutil.copyfile(source, Path(git_dir, "index"))


def _linked_git_dir_of(worktree: str) -> str:
    text = Path(worktree, ".git").read_text().strip()
    return text.removeprefix("gitdir:").strip()


def _linked_git_dir(project_root: str, worktree: str) -> str:
    """The worktree's admin folder in the project, found from the project's side (the `.git` file in the worktree
    is the agent's to read only, but the folder is checked to be the project's)."""
    found = _linked_git_dir_of(worktree)
    common = _git(project_root, "rev-parse", "--path-format=absolute", "--git-common-dir").strip()
    if not os.path.realpath(found).startswith(os.path.realpath(common) + os.sep):
        raise VcsError(f"{worktree}/.git does not point into {common}: not refreshing its index")
    return found
