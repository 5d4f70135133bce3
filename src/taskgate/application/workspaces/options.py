"""The `[git]` settings as the workspaces see them (base branch, branch pattern, worktrees folder, merge strategy and
mode, what to do with orphans), checked when built."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from taskgate.domain.errors import (
    InvalidInput,
)
from taskgate.domain.naming import DEFAULT_BRANCH_PATTERN, check_branch_pattern, check_ref_name

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


_PLACEHOLDER_RES = {
    "task_id": r"[A-Za-z0-9._-]+",
    "short_id": r"[0-9a-f]{8}",
    "session_id": _UUID,
    "slug": r"[a-z0-9.-]+",
}


@dataclass(frozen=True, slots=True)
class GitOptions:
    """The `[git]` settings, as the application sees them."""

    base_branch: str = "main"
    branch_pattern: str = DEFAULT_BRANCH_PATTERN
    # relative: inside the project (`<root>/.worktrees/<session id>`); absolute: outside any repository, a folder
    # per project (`<dir>/<project name>/<session id>`), for a team that keeps its checkout clean of them
    worktrees_dir: str = ".worktrees"
    merge_strategy: str = "rebase"  # rebase | merge (bring a moved base into the branch)
    merge_mode: str = "ff-only"  # ff-only | no-ff (how the branch lands on base)
    orphans: str = "prune"  # prune | report (worktrees and branches of no active session, at start)
    max_patch_bytes: int = 200_000

    def __post_init__(self) -> None:
        check_branch_pattern(self.branch_pattern)
        check_ref_name(self.base_branch)
        if self.merge_strategy not in {"rebase", "merge"}:
            raise InvalidInput(f"git.merge_strategy must be rebase or merge, not {self.merge_strategy!r}")
        if self.merge_mode not in {"ff-only", "no-ff"}:
            raise InvalidInput(f"git.merge_mode must be ff-only or no-ff, not {self.merge_mode!r}")
        if self.orphans not in {"prune", "report"}:
            raise InvalidInput(f"git.orphans must be prune or report, not {self.orphans!r}")
        folder = PurePosixPath(self.worktrees_dir)
        if not folder.parts or any(p in {"..", ".git"} for p in folder.parts) or folder == PurePosixPath("/"):
            raise InvalidInput(
                f"git.worktrees_dir must be a folder inside the project (relative) or an absolute folder outside "
                f"it, without '..' or '.git', not {self.worktrees_dir!r}"
            )

    def worktrees_of(self, project_root: str, project_name: str) -> PurePosixPath:
        """The folder a project's session worktrees live in (see `worktrees_dir`). Raises: InvalidInput when an
        absolute folder is the project itself or lies inside it (use a relative one for that)."""
        folder = PurePosixPath(self.worktrees_dir)
        if not folder.is_absolute():
            return PurePosixPath(project_root, folder)
        root = PurePosixPath(project_root)
        if folder == root or root in folder.parents:
            raise InvalidInput(
                f"git.worktrees_dir {self.worktrees_dir!r} is inside the project {project_root}: give it relative"
            )
        return folder / project_name

    def branch_regex(self) -> re.Pattern[str]:
        """Matches exactly the branch names the pattern can produce (so pruning never touches a user's own)."""
        pattern, pos, parts = self.branch_pattern, 0, []
        for match in re.finditer(r"\{(\w+)\}", pattern):
            parts += [re.escape(pattern[pos : match.start()]), _PLACEHOLDER_RES[match.group(1)]]
            pos = match.end()
        return re.compile("".join([*parts, re.escape(pattern[pos:])]) + r"\Z")
