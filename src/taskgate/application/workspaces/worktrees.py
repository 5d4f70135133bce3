"""Session workspaces: each session's git worktree and branch, from `initialize` to `cleanup_done`.

This is the `SessionEffects` implementation for git (see application/sessions/effects.py):

- initialize: before, fix the branch and worktree names; after, create the worktree, take the context
  snapshot and fire `context_discovered` (if git fails: fire `fail` and report git's reason).
- merge: before, rebase (or merge base in) when the base moved, then ff-only (or no-ff) into base. A conflict
  is logged as a blocked `merge` naming the files, and nothing changes. After: `cleanup_done`.
- compensate (auto_revert): before, reset the worktree to base and discard it. After: `cleanup_done`.
- cleanup_done: before, remove the worktree and delete the branch.
- cancel: after, remove the worktree and delete the branch, best effort: a failure is recorded as an event
  and the next start prunes the orphan.

Worktrees live in `<project root>/<worktrees_dir>/<session id>`; branches follow the configured pattern.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.application.sessions import crashpoints
from taskgate.application.sessions.commands import MERGE_REQUESTED, EffectRefused, FireResult, FireTrigger
from taskgate.application.sessions.effects import NOTHING, Aftermath
from taskgate.application.sessions.engine import SessionService
from taskgate.application.workspaces.context import ContextScout, jsonable
from taskgate.application.workspaces.ports import BranchChange, VcsProvider, WorkspaceContext, WorktreeEntry
from taskgate.domain.entities import Project, Session, SessionSnapshot
from taskgate.domain.errors import (
    BranchGone,
    ConflictError,
    InvalidInput,
    MergeConflict,
    TaskgateError,
    VcsError,
    WorktreeMismatch,
    WorktreeNotCreated,
)
from taskgate.domain.naming import DEFAULT_BRANCH_PATTERN, branch_name, check_branch_pattern, check_ref_name
from taskgate.domain.policies.violations import Violation
from taskgate.domain.states import TERMINAL_STATES, SessionState, Trigger

SYSTEM_ACTOR = "system"
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_PLACEHOLDER_RES = {
    "task_id": r"[A-Za-z0-9._-]+",
    "short_id": r"[0-9a-f]{8}",
    "session_id": _UUID,
    "slug": r"[a-z0-9.-]+",
}
_BEFORE = frozenset({Trigger.INITIALIZE, Trigger.APPROVE, Trigger.MERGE, Trigger.COMPENSATE, Trigger.CLEANUP_DONE})
APPROVED = "approved"  # state_data key: the head and the change an approval saw, checked again at merge
_UNPREPARED = frozenset({SessionState.CREATED, SessionState.INITIALIZING})


@dataclass(frozen=True, slots=True)
class GitOptions:
    """The `[git]` settings, as the application sees them."""

    base_branch: str = "main"
    branch_pattern: str = DEFAULT_BRANCH_PATTERN
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
        parts = PurePosixPath(self.worktrees_dir).parts
        if not parts or PurePosixPath(self.worktrees_dir).is_absolute() or any(p in {"..", ".git"} for p in parts):
            raise InvalidInput(
                f"git.worktrees_dir must be a relative folder inside the project, not {self.worktrees_dir!r}"
            )

    def branch_regex(self) -> re.Pattern[str]:
        """Matches exactly the branch names the pattern can produce (so pruning never touches a user's own)."""
        pattern, pos, parts = self.branch_pattern, 0, []
        for match in re.finditer(r"\{(\w+)\}", pattern):
            parts += [re.escape(pattern[pos : match.start()]), _PLACEHOLDER_RES[match.group(1)]]
            pos = match.end()
        return re.compile("".join([*parts, re.escape(pattern[pos:])]) + r"\Z")


@dataclass(frozen=True, slots=True)
class WorktreeRow:
    """One line of `taskgate worktrees`."""

    project: str
    path: str
    branch: str | None
    session_id: str | None
    state: str | None
    bytes: int
    missing: bool
    orphan: bool


@dataclass(slots=True)
class ReconcileReport:
    """What start-up reconciliation found and did."""

    orphan_worktrees: list[str]
    orphan_branches: list[str]
    pruned: bool
    missing_worktrees: list[str]  # session ids
    resumed: list[str]  # sessions left in initializing by a crash, carried on to ready
    errors: list[str]

    def summary(self) -> str:
        verb = "pruned" if self.pruned else "found (report only)"
        return (
            f"{len(self.orphan_worktrees)} orphan worktree(s) and {len(self.orphan_branches)} orphan branch(es) "
            f"{verb}; {len(self.missing_worktrees)} session(s) flagged with a missing worktree; "
            f"{len(self.resumed)} interrupted initialisation(s) resumed; {len(self.errors)} error(s)"
        )


class WorkspaceService:
    """Worktree effects of transitions, the operator's review context, and reconciliation with the disk."""

    def __init__(
        self, uow: UnitOfWorkFactory, vcs: VcsProvider, clock: Clock, options: GitOptions, scout: ContextScout
    ) -> None:
        self._uow, self._vcs, self._clock, self._options, self._scout = uow, vcs, clock, options, scout
        self._sessions: SessionService | None = None

    def attach(self, sessions: SessionService) -> None:
        """Become the session engine's effects (the composition root calls this once)."""
        self._sessions = sessions
        sessions.use_effects(self)

    # -- SessionEffects ------------------------------------------------------------------------------------------

    async def check_new_session(self, project: Project) -> None:
        """A session's worktree branches from the base: refuse its creation, with nothing written, when the base
        branch does not exist (a session created anyway would be cancelled at once, see `_prepare`)."""
        base = self._options.base_branch
        if not await self._vcs.base_exists(project.root_path, base):
            raise VcsError(
                f"the base branch '{base}' does not exist in {project.root_path} (nor as origin/{base}), so no "
                f"session can branch from it: create it, or set git.base_branch in the project's taskgate.toml"
            )

    def wants_before(self, trigger: Trigger) -> bool:
        return trigger in _BEFORE

    async def before(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        trigger = Trigger(cmd.trigger)
        if trigger == Trigger.INITIALIZE:
            return replace(cmd, changes=await self._names(session))
        if trigger == Trigger.APPROVE:
            return await self._record_approved(session, cmd)
        if trigger == Trigger.MERGE:
            return await self._merge(session, cmd)
        if trigger == Trigger.COMPENSATE and session.worktree_path:
            root = (await self._project(session.project_id)).root_path  # the owner: git checks it is that worktree
            base = session.state_data.get("base_commit", "HEAD")
            await self._vcs.reset_worktree(session.worktree_path, base, repo_root=root, branch=session.branch_name)
        await self._discard(session)  # compensate (auto_revert) and cleanup_done
        crashpoints.reached("compensate.reset" if trigger == Trigger.COMPENSATE else "cleanup.discarded")
        return cmd

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        trigger, session = Trigger(cmd.trigger), result.session
        if trigger == Trigger.INITIALIZE:
            crashpoints.reached("start.initializing")
            return await self._prepare(session)
        if trigger in (Trigger.MERGE, Trigger.COMPENSATE):
            crashpoints.reached("merge.merged" if trigger == Trigger.MERGE else "compensate.rolled_back")
            return Aftermath(self._fire(session, Trigger.CLEANUP_DONE, reason=f"automatic after {trigger.value}"))
        if trigger == Trigger.CANCEL:
            await self._discard_quietly(session)
        return NOTHING

    async def resume(self, session: Session) -> Aftermath:
        """What a crash left owed in git's part of the lifecycle: the worktree of an initialisation, the
        compensation of an auto_revert reject, a merge that was asked for, the clean-up of a merged or rolled
        back session. Each follow-up is the trigger the interrupted call would have fired next."""
        state, resumed = session.state, "resumed after a restart"
        if state == SessionState.INITIALIZING:
            return await self._prepare(session)
        if state == SessionState.FAILED and session.compensation_plan == "auto_revert":
            return Aftermath(self._fire(session, Trigger.COMPENSATE, reason=f"auto_revert {resumed}"))
        if state == SessionState.AWAITING_MERGE and session.state_data.get(MERGE_REQUESTED):
            by = session.state_data[MERGE_REQUESTED].get("by", "?")
            return Aftermath(self._fire(session, Trigger.MERGE, reason=f"merge requested by {by}, {resumed}"))
        if state in (SessionState.MERGED, SessionState.ROLLED_BACK):
            return Aftermath(
                self._fire(session, Trigger.CLEANUP_DONE, reason=f"automatic after {state.value}, {resumed}")
            )
        return NOTHING

    # -- review context --------------------------------------------------------------------------------------------

    async def review(self, session_id: str) -> WorkspaceContext:
        """Diff against base (stat and patch), commits, dirty/untracked files and conflicts of a session.

        Raises: SessionNotFound; WrongNode (another node holds it); VcsError when the session has no worktree yet
        or its branch is gone.
        """
        session, project = await self._load(session_id)
        if self._sessions is not None and not self._sessions.holds(session):
            await self._sessions.refuse_unless_held(session_id)  # its worktree is another node's
        if not session.branch_name or not session.worktree_path:
            raise VcsError(f"session {session.id} has no worktree yet (state '{session.state.value}')")
        return await self._vcs.workspace_context(
            project.root_path,
            session.worktree_path,
            session.branch_name,
            str(session.state_data.get("base_ref") or self._base(session)),  # origin/main when branched from it
            max_patch_bytes=self._options.max_patch_bytes,
        )

    async def worktree_problem(self, session: Session) -> str | None:
        """Why the session's worktree is not usable from this process (missing, another checkout, branch gone),
        or None when it is, or when the session has none yet. Reads only."""
        if not session.branch_name or not session.worktree_path:
            return None
        project = await self._project(session.project_id)
        base = str(session.state_data.get("base_ref") or self._base(session))
        try:
            await self._vcs.worktree_state(project.root_path, session.worktree_path, session.branch_name, base)
        except VcsError as exc:
            return str(exc)
        return None

    async def checkpoint(self, session_id: str, note: str, actor: str) -> SessionSnapshot:
        """Record the session's review context with a note, for the audit trail. Raises: as `review`."""
        if len(note) > 5000:
            raise InvalidInput("checkpoint note is longer than 5000 characters")
        context = await self.review(session_id)
        snapshot = SessionSnapshot(session_id, "checkpoint", actor, _checkpoint_data(context), self._clock.now(), note)
        async with self._uow(write=True) as uow:
            await self._held(uow, session_id, "a checkpoint")
            snapshot = replace(snapshot, id=await uow.snapshots.add(snapshot))
            payload = {"snapshot_id": snapshot.id, "note": note, "head": context.head_commit, "actor": actor}
            await uow.events.append("session.checkpoint", snapshot.at, payload, session_id)
            await uow.commit()
        return snapshot

    async def snapshots(self, session_id: str, kind: str | None = None, limit: int = 20) -> list[SessionSnapshot]:
        """Stored snapshots of a session, newest first. Raises: SessionNotFound."""
        async with self._uow(write=False) as uow:
            await uow.sessions.get(session_id)
            return await uow.snapshots.list(session_id, kind=kind, limit=limit)

    # -- worktrees on disk -----------------------------------------------------------------------------------------

    async def list_worktrees(self, project_id: int | None = None) -> list[WorktreeRow]:
        """Every worktree under the projects' worktree folders, with its session, state and disk use."""
        rows: list[WorktreeRow] = []
        for project, sessions in await self._projects_with_sessions(project_id, include_terminal=True):
            by_path = {s.worktree_path: s for s in sessions if s.worktree_path}
            for entry in await self._vcs.worktrees(project.root_path):
                if self._is_session_folder(project, entry.path):
                    rows.append(await self._row(project, entry, by_path.get(entry.path)))
        return rows

    async def reconcile(self, prune: bool | None = None) -> ReconcileReport:
        """At service start: prune (or report) orphans, flag sessions whose worktree vanished, and carry on
        initialisations a crash interrupted. `prune` overrides the configured `orphans` setting.
        Never raises for one broken project: errors are reported."""
        prune = self._options.orphans == "prune" if prune is None else prune
        report = ReconcileReport([], [], prune, [], [], [])
        for project, sessions in await self._projects_with_sessions(None, include_terminal=False):
            try:
                await self._reconcile_project(project, sessions, report)
            except TaskgateError as exc:
                report.errors.append(f"project {project.name}: {exc}")
        return report

    # -- internals -------------------------------------------------------------------------------------------------

    async def _names(self, session: Session) -> dict[str, Any]:
        async with self._uow(write=False) as uow:
            task = await uow.tasks.get(session.task_id, with_blockers=False)
            project = await uow.projects.get(session.project_id)
        branch = branch_name(self._options.branch_pattern, task_id=task.id, session_id=session.id, title=task.title)
        path = str(PurePosixPath(project.root_path, self._options.worktrees_dir, session.id))
        return {"branch_name": branch, "worktree_path": path, "state_data": {"base_branch": self._options.base_branch}}

    async def _prepare(self, session: Session) -> Aftermath:
        """Create the worktree and take the context snapshot; on failure fail the session and say why."""
        names: dict[str, Any] = {}
        if not session.branch_name or not session.worktree_path:  # initialize applied without its `before`
            names = await self._names(session)
            session = replace(session, branch_name=names["branch_name"], worktree_path=names["worktree_path"])
        assert session.branch_name and session.worktree_path
        project = await self._project(session.project_id)
        try:
            created = await self._vcs.create_worktree(
                project.root_path, session.worktree_path, session.branch_name, self._base(session)
            )
        except VcsError as exc:
            # Cancelled, not failed: a session that never had a worktree has no work to review, retry or
            # compensate, and a failed one would hold its task (one active session per task) until cancelled by hand
            reason = f"worktree could not be created: {exc}"
            error = WorktreeNotCreated(
                f"session {session.id} was cancelled: its worktree could not be created: {exc}. Fix that and start "
                f"the task again"
            )
            return Aftermath(self._fire(session, Trigger.CANCEL, reason=reason[:2000]), error=error)
        crashpoints.reached("start.worktree")
        context = await self._scout.discover(project.id, refresh=True)
        data = {"project": context.as_dict(), "worktree": jsonable(created)}
        snapshot = SessionSnapshot(session.id, "context", SYSTEM_ACTOR, data, self._clock.now())
        base = {"base_branch": self._base(session), "base_ref": created.base_ref, "base_commit": created.base_commit}
        changes = {**names, "state_data": base}
        return Aftermath(self._fire(session, Trigger.CONTEXT_DISCOVERED, changes=changes, snapshot=snapshot))

    async def _merge(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        project = await self._project(session.project_id)
        if not session.branch_name or not session.worktree_path:
            raise VcsError(f"session {session.id} has no branch to merge")
        await self._refuse_unapproved_change(session)
        await self._record_merge_request(session, cmd)
        crashpoints.reached("merge.requested")
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
                 "mode": self._options.merge_mode}  # fmt: skip
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

    async def _discard(self, session: Session) -> None:
        if session.worktree_path is None:
            return
        project = await self._project(session.project_id)
        await self._vcs.remove_worktree(project.root_path, session.worktree_path, session.branch_name)

    async def _discard_quietly(self, session: Session) -> None:
        """Cancel must never fail on git: a failure is recorded, and the next start prunes the orphan."""
        try:
            await self._discard(session)
        except TaskgateError as exc:
            async with self._uow(write=True) as uow:
                await self._held(uow, session.id, "the worktree.cleanup_failed event")
                payload = {"error": str(exc), "worktree": session.worktree_path}
                await uow.events.append("worktree.cleanup_failed", self._clock.now(), payload, session.id)
                await uow.commit()

    async def _held(self, uow: UnitOfWork, session_id: str, what: str) -> None:
        """Fence a write about the session (SessionService.fence); a bare row lock without the engine attached."""
        if self._sessions is not None:
            await self._sessions.fence(uow, session_id, what)
        else:
            await uow.sessions.get(session_id, lock=True)

    def _fire(self, session: Session, trigger: Trigger, *, reason: str | None = None, **extra: Any) -> FireTrigger:
        return FireTrigger(session.id, trigger.value, SYSTEM_ACTOR, reason=reason, **extra)

    def _base(self, session: Session) -> str:
        return str(session.state_data.get("base_branch") or self._options.base_branch)

    def _is_session_folder(self, project: Project, path: str) -> bool:
        folder = PurePosixPath(path)
        return folder.parent == PurePosixPath(project.root_path, self._options.worktrees_dir) and bool(
            re.fullmatch(_UUID, folder.name)
        )

    async def _row(self, project: Project, entry: WorktreeEntry, session: Session | None) -> WorktreeRow:
        active = session is not None and session.state not in TERMINAL_STATES
        size = 0 if entry.missing else await self._vcs.disk_usage(entry.path)
        state = session.state.value if session else None
        sid = session.id if session else None
        return WorktreeRow(project.name, entry.path, entry.branch, sid, state, size, entry.missing, not active)

    async def _reconcile_project(self, project: Project, sessions: list[Session], report: ReconcileReport) -> None:
        entries = await self._vcs.worktrees(project.root_path)
        live = {e.path for e in entries if not e.missing}
        owned_paths = {s.worktree_path for s in sessions if s.worktree_path}
        owned_branches = {s.branch_name for s in sessions if s.branch_name}
        orphans = [e for e in entries if self._is_session_folder(project, e.path) and e.path not in owned_paths]
        regex = self._options.branch_regex()
        prefix = self._options.branch_pattern.split("{", 1)[0]
        branches = [
            b for b in await self._vcs.branches(project.root_path, prefix) if regex.match(b) and b not in owned_branches
        ]
        branches = [b for b in branches if not any(e.branch == b and e not in orphans for e in entries)]
        report.orphan_worktrees += [e.path for e in orphans]
        report.orphan_branches += branches
        if report.pruned:
            await self._prune(project, orphans, branches)
        for session in sessions:  # all sessions own their worktrees above (none is an orphan); this node checks its own
            if self._sessions is None or self._sessions.holds(session):
                await self._check_session(project, session, live, report)

    async def _prune(self, project: Project, orphans: list[WorktreeEntry], branches: list[str]) -> None:
        for entry in orphans:
            await self._vcs.remove_worktree(project.root_path, entry.path, entry.branch)
        for branch in branches:
            await self._vcs.delete_branch(project.root_path, branch)
        await self._vcs.prune(project.root_path)
        async with self._uow(write=True) as uow:
            payload = {"worktrees": [e.path for e in orphans], "branches": branches}
            await uow.events.append("worktree.orphans_pruned", self._clock.now(), payload)
            await uow.commit()

    async def _check_session(self, project: Project, session: Session, live: set[str], report: ReconcileReport) -> None:
        if session.state == SessionState.INITIALIZING and self._sessions is not None:
            await self._resume_initialization(session, report)
            return
        if session.state in _UNPREPARED or not session.worktree_path or session.worktree_path in live:
            return
        report.missing_worktrees.append(session.id)
        if "worktree_missing" not in session.state_data:
            await self._flag_missing(session)

    async def _resume_initialization(self, session: Session, report: ReconcileReport) -> None:
        """A crash between `initialize` and `context_discovered`: creating the worktree is idempotent, so redo it
        (through the engine's `resume`, which also fires the start the operator asked for, if any)."""
        assert self._sessions is not None
        try:
            await self._sessions.resume(session.id)
            report.resumed.append(session.id)
        except TaskgateError as exc:
            report.errors.append(f"session {session.id}: {exc}")

    async def _flag_missing(self, session: Session) -> None:
        """Mark (not fail) a session whose worktree folder was deleted by hand; merge restores it from its branch."""
        now = self._clock.now()
        event = ("session.worktree_missing", {"path": session.worktree_path})
        await self._annotate(session.id, {"worktree_missing": now.isoformat()}, event)

    async def _annotate(self, session_id: str, data: dict[str, Any], event: tuple[str, dict] | None = None) -> None:
        assert self._sessions is not None, "WorkspaceService.attach was not called"
        await self._sessions.annotate(session_id, data, event)

    async def _projects_with_sessions(
        self, project_id: int | None, *, include_terminal: bool
    ) -> list[tuple[Project, list[Session]]]:
        states = None if include_terminal else set(SessionState) - TERMINAL_STATES
        async with self._uow(write=False) as uow:
            projects = [await uow.projects.get(project_id)] if project_id is not None else await uow.projects.list()
            return [
                (p, await uow.sessions.list(project_id=p.id, states=states))
                for p in projects
                if p.archived_at is None or project_id is not None
            ]

    async def _load(self, session_id: str) -> tuple[Session, Project]:
        async with self._uow(write=False) as uow:
            session = await uow.sessions.get(session_id)
            return session, await uow.projects.get(session.project_id)

    async def _project(self, project_id: int) -> Project:
        async with self._uow(write=False) as uow:
            return await uow.projects.get(project_id)


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


def _checkpoint_data(context: WorkspaceContext) -> dict[str, Any]:
    return jsonable(context)
