"""The stand-in's "remote": plain git on a bare repository, read live on every request."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

# commit-tree needs an identity; GitHub's own merge commits are committed by "GitHub <noreply@github.com>"
_IDENTITY = {
    "GIT_AUTHOR_NAME": "GitHub",
    "GIT_AUTHOR_EMAIL": "noreply@github.com",
    "GIT_COMMITTER_NAME": "GitHub",
    "GIT_COMMITTER_EMAIL": "noreply@github.com",
}


class GitError(RuntimeError):
    """A git command failed."""


@dataclass(frozen=True)
class DiffStat:
    """What GitHub counts for a pull request: commits, changed files, added and deleted lines."""

    commits: int
    changed_files: int
    additions: int
    deletions: int


class BareRepo:
    """Read and write the bare repository with git subprocesses (no caching: branch heads are read live)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _git(self, *args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            ["git", "--git-dir", str(self.path), *args],
            capture_output=True,
            text=True,
            env={**os.environ, **_IDENTITY, **(env or {})},
        )
        if check and proc.returncode != 0:
            raise GitError(f"git {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def branches(self) -> dict[str, str]:
        """Every branch name → its current sha."""
        out = self._git("for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads").stdout
        return dict(line.split(" ", 1) for line in out.splitlines() if line)

    def resolve(self, ref: str) -> str | None:
        """The commit sha `ref` (a branch, a tag or a sha) names, or None."""
        proc = self._git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        return proc.stdout.strip() or None

    def head(self, branch: str) -> str | None:
        """The branch's current sha, or None when there is no such branch."""
        return self.resolve(f"refs/heads/{branch}")

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        """Whether `ancestor` is reachable from `descendant`."""
        return self._git("merge-base", "--is-ancestor", ancestor, descendant, check=False).returncode == 0

    def merge_tree(self, base: str, head: str) -> str | None:
        """The tree of merging `head` into `base` (git merge-tree --write-tree), or None on a conflict."""
        proc = self._git("merge-tree", "--write-tree", base, head, check=False)
        if proc.returncode == 1:
            return None
        if proc.returncode != 0:
            raise GitError(f"git merge-tree {base} {head}: {proc.stderr.strip()}")
        return proc.stdout.split("\n", 1)[0].strip()

    def diff_stat(self, base: str, head: str) -> DiffStat:
        """Commits on `head` not on `base` and the three-dot diff between them, as GitHub counts them."""
        commits = int(self._git("rev-list", "--count", f"{base}..{head}").stdout.strip())
        files = additions = deletions = 0
        for line in self._git("diff", "--numstat", f"{base}...{head}").stdout.splitlines():
            added, deleted, _ = line.split("\t", 2)
            files += 1
            # binary files show "-": GitHub counts them as changed files with no lines
            additions += int(added) if added.isdigit() else 0
            deletions += int(deleted) if deleted.isdigit() else 0
        return DiffStat(commits, files, additions, deletions)

    def diff_hunk(self, base: str, head: str, path: str) -> str:
        """The first hunk of `path`'s three-dot diff (what GitHub shows above a review comment)."""
        out = self._git("diff", "--unified=3", f"{base}...{head}", "--", path, check=False).stdout
        start = out.find("@@")
        return out[start:].rstrip("\n") if start >= 0 else f"@@ -0,0 +1 @@ {path}"

    def commit_message(self, sha: str) -> str:
        """The full message of a commit."""
        return self._git("log", "-1", "--format=%B", sha).stdout.strip()

    def commit(self, tree: str, parents: list[str], message: str) -> str:
        """A new commit object (not on any branch yet)."""
        args = ["commit-tree", tree, "-m", message]
        for parent in parents:
            args += ["-p", parent]
        return self._git(*args).stdout.strip()

    def move_branch(self, branch: str, new: str, old: str) -> None:
        """Point `branch` at `new`, only if it still points at `old` (like a push without force)."""
        self._git("update-ref", f"refs/heads/{branch}", new, old)
