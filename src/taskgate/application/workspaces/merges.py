"""A session's merge in git, and the approval it lands: an approval records the head and the change it saw; the merge
refuses a branch that changed since (unless a resumed merge finds it on the base already), records that it was asked for
before git moves anything, then rebases (or merges the base in) and fast-forwards the base by compare-and-swap."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from taskgate.application.sessions import crashpoints
from taskgate.application.sessions.commands import MERGE_REQUESTED, EffectRefused, FireTrigger
from taskgate.application.workspaces.ports import BranchChange, WorkspaceContext
from taskgate.domain.entities import Session
from taskgate.domain.errors import (
    BranchGone,
    ConflictError,
    MergeConflict,
    VcsError,
    WorktreeMismatch,
)
from taskgate.domain.policies.violations import Violation


class WorkspaceMerges:
    """Approve and merge in git: the approved head and change recorded, checked again before the merge, the merge asked
    for recorded before git moves anything, then rebase (or merge) and fast-forward."""

    _remote_merge = None  # set by WorkspaceService.use_remote_merge: a forge's merge, asked first

    async def _merge(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        project = await self._project(session.project_id)
        if not session.branch_name or not session.worktree_path:
            raise VcsError(f"session {session.id} has no branch to merge")
        await self._refuse_unapproved_change(session)
        await self._record_merge_request(session, cmd)
        crashpoints.reached("merge.requested")
        if self._remote_merge is not None and (through := await self._remote_merge(session, cmd)) is not None:
            return through  # the project has a forge: merged there (application/forge/publish.py)
        forget = {MERGE_REQUESTED: None}  # a refused merge is no longer owed: a restart must not try it again
        try:
            outcome = await self._vcs.merge(
                project.root_path,
                session.worktree_path,
                session.branch_name,
                self._base(session),
                strategy=self._options.merge_strategy,
                mode=self._options.merge_mode,
            )
        except VcsError as exc:
            # a worktree that is not ours, or a branch that is gone, says what to do in its own message
            owned = isinstance(exc, WorktreeMismatch | BranchGone)
            violation = Violation("merge", str(exc), suggestion="" if owned else "fix the worktree, then merge again")
            raise EffectRefused(exc, [violation], {"state_data": forget}) from None
        crashpoints.reached("merge.git_done")
        if not outcome.merged:
            error = MergeConflict(session.id, outcome.conflicts, outcome.detail)
            violation = Violation(
                "merge",
                f"conflicts in {', '.join(outcome.conflicts)}",
                suggestion=f"resolve them on branch {session.branch_name} (rebase onto {outcome.base_ref}), then merge",
            )
            raise EffectRefused(error, [violation], {"state_data": {"merge_conflicts": outcome.conflicts, **forget}})
        merge = {"commit": outcome.merged_commit, "into": outcome.base_ref, "rebased": outcome.rebased,
                 "mode": self._options.merge_mode, "from": outcome.base_before}  # fmt: skip
        reason = cmd.reason or f"merged into {outcome.base_ref} at {str(outcome.merged_commit)[:12]}"
        changes = {"state_data": {"merge": merge, "merge_conflicts": None, "worktree_missing": None, **forget}}
        return replace(cmd, reason=reason, changes=changes)

    async def _record_approved(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        """The approval is of this head and this change: recorded with it, so a merge can tell whether what it
        lands is what was approved. A session without a branch yet is approved as it is.

        Read with `branch_change` (the head, and the diff the change id hashes, at that head), not the whole
        review context: the same values, three git processes side by side instead of ten one after the other.
        Raises: as `review` (a gone branch or a foreign worktree still refuses the approval)."""
        if not session.branch_name or not session.worktree_path:
            return cmd
        change = await self._branch_change(session)
        approved = {"head": change.head_commit, "change": change_id(change)}
        changes = dict(cmd.changes or {})
        changes["state_data"] = {**dict(changes.get("state_data") or {}), APPROVED: approved}
        return replace(cmd, changes=changes)

    async def _refuse_unapproved_change(self, session: Session) -> None:
        """The branch moved after the approval (a conflict fixed by hand, a commit pushed later): unless the change
        is the same (a rebase onto a moved base that changed none of it), it needs a new verification.
        Raises: EffectRefused (a blocked merge row naming both heads), nothing else written."""
        approved = session.state_data.get(APPROVED)
        if not isinstance(approved, dict):
            return  # approved before approvals were recorded
        try:
            change = await self._branch_change(session)
        except VcsError:
            return  # a branch or worktree that is gone or foreign: the merge itself refuses it, naming it
        if change.head_commit == approved["head"] or change_id(change) == approved["change"]:
            return
        if session.state_data.get(MERGE_REQUESTED) and await self._landed(session, change.head_commit):
            # A resumed merge whose git work was done before a crash (`merge.git_done`): the head is the one the
            # interrupted merge rebased and landed, after this same check had passed on the approved head. It is
            # on the base already, so nothing unreviewed can land: let the merge find it merged and record it.
            return
        hint = "fire reverify to send it back to verifying for a new decision (MCP session_fire, CLI session fire)"
        message = (
            f"branch {session.branch_name} changed after it was approved (approved {approved['head'][:12]}, now "
            f"{change.head_commit[:12]}): what would be merged is not what was reviewed"
        )
        violation = Violation("approved_head", message, suggestion=hint)
        raise EffectRefused(ConflictError(f"{message}; {hint}"), [violation])

    async def _branch_change(self, session: Session) -> BranchChange:
        """The head and change of the session's branch against the base `review` uses (the same values as its
        context). Raises: as `review`; the caller (`fire`) has already refused a session this node does not hold."""
        assert session.branch_name and session.worktree_path
        project = await self._project(session.project_id)
        return await self._vcs.branch_change(
            project.root_path,
            session.worktree_path,
            session.branch_name,
            str(session.state_data.get("base_ref") or self._base(session)),
            max_patch_bytes=self._options.max_patch_bytes,
        )

    async def _landed(self, session: Session, commit: str) -> bool:
        """Whether `commit` is in the history of the session's base branch (a merge landed it)."""
        project = await self._project(session.project_id)
        return await self._vcs.is_merged(project.root_path, commit, self._base(session))

    async def _record_merge_request(self, session: Session, cmd: FireTrigger) -> None:
        """Write who asked for the merge onto the session before git moves anything, so that a crash anywhere
        between here and `merged` is carried on at restart (`resume`). Not a transition: the version stays,
        so the caller's expected_version still holds."""
        if session.state_data.get(MERGE_REQUESTED):
            return  # resuming, or approve_and_merge recorded it with its approval
        request = {"by": cmd.actor, "at": self._clock.now().isoformat()}
        await self._annotate(session.id, {MERGE_REQUESTED: request})


APPROVED = "approved"  # state_data key: the head and the change an approval saw, checked again at merge


def change_id(context: WorkspaceContext | BranchChange) -> str:
    """What a branch changes against its fork point, independent of where it sits: the diff's file headers and
    added/removed lines, without blob ids and line numbers (like `git patch-id`), hashed. A rebase that changes
    none of the branch's lines keeps it; a conflict fixed by hand changes it. The same value from a review
    context and from `branch_change` (both carry the same numstat and patch, truncated alike)."""
    kept = [
        line
        for line in context.patch.splitlines()
        if line.startswith(("diff --git", "+", "-")) and not line.startswith(("index ", "@@"))
    ]
    stat = ";".join(f"{f.path}:{f.added}:{f.deleted}" for f in context.diff_stat)
    return hashlib.sha256("\n".join([stat, *kept]).encode()).hexdigest()
