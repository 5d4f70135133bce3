"""Errors of taskgate, raised by the domain and application layers and mapped at every boundary.

    TaskgateError
    ├── NotFound
    │   ├── ProjectNotFound, PlanNotFound, TaskNotFound, SessionNotFound, OperatorNotFound
    ├── InvalidInput            bad argument: malformed timestamp, empty title, unknown trigger, ...
    ├── InvalidTransition       trigger not allowed from the session's current state
    ├── PolicyViolation         a guard refused; carries the violations
    ├── ConflictError
    │   ├── ConcurrentModification   version changed under us / lock could not be taken
    │   ├── SessionAlreadyActive     one active session per task
    │   └── AlreadyExists            unique name or path taken
    ├── ProjectArchived         archived projects are read-only
    ├── Unauthenticated         no or an unknown/revoked token
    ├── Forbidden               the caller may not do this (agent scope, operator mismatch)
    ├── StorageError            the database failed in a way the caller cannot fix
    ├── VcsError                a git operation failed; the message carries git's own reason
    │   ├── MergeConflict       the branch does not merge cleanly; carries the conflicting files
    │   ├── WorktreeMismatch    the folder at a worktree path is not that worktree; git was not run there
    │   ├── WorktreeNotCreated  a new session's worktree could not be made: the session was cancelled
    │   └── BranchGone          a session's branch was deleted outside taskgate
    ├── HookFailed              a worktree lifecycle hook (`[hooks]`) exited non-zero or ran past its timeout
    ├── TrackerError            an external tracker (Beads' `bd`) is missing, timed out or failed
    └── ForgeError              the forge's API or remote refused or failed (ForgeHeadMoved: a merge's head moved)

Every message names the thing that was wrong and, where there is one, what to do next.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskgate.domain.policies.violations import Violation


class TaskgateError(Exception):
    """Base of every error taskgate raises on purpose. Nothing was written when one is raised, unless `wrote` says
    otherwise (and then its message says what was)."""

    wrote = False


class NotFound(TaskgateError):
    """A referenced entity does not exist."""

    kind = "entity"

    def __init__(self, ident: object) -> None:
        self.ident = ident
        super().__init__(f"{self.kind} {ident!s} not found")


class ProjectNotFound(NotFound):
    kind = "project"


class PlanNotFound(NotFound):
    kind = "plan"


class TaskNotFound(NotFound):
    kind = "task"


class SessionNotFound(NotFound):
    kind = "session"


class StepRunNotFound(NotFound):
    kind = "step run"


class OperatorNotFound(NotFound):
    kind = "operator"


class WritebackNotFound(NotFound):
    kind = "tracker write-back"


class InvalidInput(TaskgateError):
    """An argument is malformed or out of range."""


class InvalidTransition(TaskgateError):
    """The trigger is not allowed from the session's current state."""

    def __init__(self, session_id: str, state: str, trigger: str, allowed: Sequence[str], since: str = "") -> None:
        """`since` names what brought the session to `state` ("was cancelled (cancel by operator:bob at …)"),
        so that a caller who lost a race to it hears the winner's outcome, not only the state."""
        self.session_id, self.state, self.trigger, self.allowed = session_id, state, trigger, list(allowed)
        self.since = since
        hint = ", ".join(self.allowed) if self.allowed else "none (the session is terminal)"
        if since:
            message = f"session {session_id} {since}: trigger '{trigger}' is not allowed in state '{state}'"
        else:
            message = f"trigger '{trigger}' is not allowed for session {session_id} in state '{state}'"
        super().__init__(f"{message}; allowed: {hint}")


class PolicyViolation(TaskgateError):
    """One or more guards with error severity refused the transition."""

    def __init__(
        self, trigger: str, violations: Sequence[Violation], session_id: str | None = None, note: str = ""
    ) -> None:
        self.trigger, self.violations, self.session_id = trigger, list(violations), session_id
        details = "; ".join(v.describe() for v in self.violations)
        target = f" session {session_id}" if session_id else ""
        tail = f"; {note}" if note else ""
        super().__init__(f"'{trigger}' refused for{target or ' new session'}: {details}{tail}")


class ConflictError(TaskgateError):
    """The request collides with the current state of the data."""


class ConcurrentModification(ConflictError):
    """The session changed between read and write (optimistic version check failed)."""


class SessionAlreadyActive(ConflictError):
    """A task already has a session that has not reached a terminal state."""


class AlreadyExists(ConflictError):
    """A unique name, key or path is already taken."""


class ProjectArchived(TaskgateError):
    """Archived projects are read-only."""

    def __init__(self, name: str) -> None:
        super().__init__(f"project '{name}' is archived and read-only")


class Unauthenticated(TaskgateError):
    """No credentials, or credentials taskgate does not know (or has revoked)."""


class Forbidden(TaskgateError):
    """The caller is known but may not do this."""


class StorageError(TaskgateError):
    """The database failed; the message says how, without a traceback."""


class VcsError(TaskgateError):
    """A git operation failed (base branch missing, dirty worktree, ...); nothing was half-applied."""


class MergeConflict(VcsError):
    """The session branch does not merge into its base without conflicts."""

    def __init__(self, session_id: str, files: Sequence[str], detail: str = "") -> None:
        self.session_id, self.files = session_id, list(files)
        shown = ", ".join(self.files[:20]) + (" ..." if len(self.files) > 20 else "")
        super().__init__(
            f"session {session_id} does not merge cleanly: conflicts in {shown or 'unknown files'}; "
            f"nothing was changed and the session stays awaiting_merge{'; ' + detail if detail else ''}"
        )


class WorktreeNotCreated(VcsError):
    """A new session's worktree could not be created; the session was cancelled (so its task is free again)."""

    wrote = True


class WorktreeMismatch(VcsError):
    """A folder taskgate would run git in is not the checkout it should be (emptied, a symbolic link, another
    repository, another branch). Git would have acted on whatever encloses it, so nothing was run there."""

    def __init__(self, path: str, expected: str, found: str, advice: str) -> None:
        self.path, self.found = path, found
        super().__init__(f"{path} is not {expected}: it is {found}. Nothing was changed; {advice}")


class BranchGone(VcsError):
    """A session's branch was deleted outside taskgate (its worktree, if any, has nothing to stand on). The advice
    follows what git still holds: the last commit from the worktree's own reflog while the worktree is registered;
    once it is gone too (and pruned), the commit is only reachable as a dangling object."""

    def __init__(self, branch: str, path: str, repo_root: str, last_commit: str | None = None) -> None:
        self.branch, self.path, self.last_commit = branch, path, last_commit
        gone = f"branch '{branch}' of the session at {path} no longer exists in {repo_root} (deleted outside taskgate)"
        if last_commit:
            advice = (
                f"its last commit was {last_commit} (the worktree's reflog): to keep its work, recreate the branch "
                f"there (`git branch {branch} {last_commit}`), else cancel the session"
            )
        else:
            advice = (
                f"its worktree is gone too, so no reflog names its last commit: git keeps it as a dangling commit "
                f"until it is garbage-collected (`git fsck --lost-found` lists them; `git show <commit>` shows one). "
                f"To keep its work, recreate the branch at it (`git branch {branch} <commit>`), else cancel the session"
            )
        super().__init__(f"{gone}. Nothing was changed; {advice}")


class HookFailed(TaskgateError):
    """A worktree lifecycle hook (`[hooks]` in taskgate.toml) failed; the message names the hook, its command, how it
    ended, its last line of output and the log holding the rest."""

    def __init__(self, message: str, hook: str) -> None:
        super().__init__(message)
        self.hook = hook


class TrackerError(TaskgateError):
    """An external tracker could not be used; the message says which command failed and why."""


class ClaimRefused(TrackerError):
    """The tracker would not let this orchestrator claim the issue (someone else has it, or it is not open)."""

    def __init__(self, issue_id: str, said: str) -> None:
        super().__init__(f"cannot claim {issue_id} in the tracker: {said}")
        self.issue_id = issue_id


class ForgeError(TaskgateError):
    """The forge (its API or its git remote) refused or failed; the message names the call, what the forge said, and
    what to check (the token's variable, the remote, the URL). Never carries the token."""


class ForgeHeadMoved(ForgeError):
    """The pull request's head is not the commit that was approved: the forge refused the compare-and-swap merge."""


class WrongNode(ConflictError):
    """The session's worktree is held by another node (docs/nodes.md): what needs it runs there, not here."""

    def __init__(self, session_id: str, holder: str, here: str, detail: str) -> None:
        self.session_id, self.holder, self.here = session_id, holder, here
        super().__init__(
            f"session {session_id} is held by node {holder}, not this node ({here}): its worktree is on that node's "
            f"disk. Nothing was changed. {detail}"
        )
