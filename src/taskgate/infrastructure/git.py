"""`GitPythonVcs`: the VcsProvider over GitPython, every call off the event loop (GitPython blocks).

Repo objects are opened per call and closed at once: GitPython leaks file handles in long-running processes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from git import InvalidGitRepositoryError, NoSuchPathError, Repo

from taskgate.application.ports import RepositoryInfo
from taskgate.domain.errors import InvalidInput


class GitPythonVcs:
    async def inspect_repository(self, path: str) -> RepositoryInfo:
        """The repository holding `path`. Raises: InvalidInput when there is none."""
        return await asyncio.to_thread(self._inspect, path)

    @staticmethod
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
