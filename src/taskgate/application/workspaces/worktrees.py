"""Session workspaces: each session's git worktree and branch, from `initialize` to `cleanup_done`.

This is the `SessionEffects` implementation for git (see application/sessions/effects.py):

- initialize: before, fix the branch and worktree names; after, create the worktree, copy the `.worktreeinclude`
  files and run the `after_create` hook (hooks.py), take the context snapshot and fire `context_discovered` (if git
  or the hook fails: remove what was made, cancel the session and report why).
- merge: before, rebase (or merge base in) when the base moved, then ff-only (or no-ff) into base. A conflict
  is logged as a blocked `merge` naming the files, and nothing changes. After: `cleanup_done`.
- compensate (auto_revert): before, reset the worktree to base and discard it. After: `cleanup_done`.
- cleanup_done: before, run the `before_remove` hook (its failure is recorded, not blocking), remove the worktree
  and delete the branch.
- cancel: after, remove the worktree and delete the branch, best effort: a failure is recorded as an event
  and the next start prunes the orphan.

Worktrees live in `<project root>/<worktrees_dir>/<session id>` (or `<worktrees_dir>/<project name>/<session id>` for an
absolute folder outside the project); branches follow the configured pattern.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import replace
from typing import Any

from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.application.sessions import crashpoints
from taskgate.application.sessions.commands import MERGE_REQUESTED, FireResult, FireTrigger
from taskgate.application.sessions.effects import NOTHING, Aftermath
from taskgate.application.sessions.engine import SessionService
from taskgate.application.workspaces.context import ContextScout, jsonable
from taskgate.application.workspaces.hooks import WorktreeHooks
from taskgate.application.workspaces.merges import WorkspaceMerges
from taskgate.application.workspaces.options import GitOptions
from taskgate.application.workspaces.ports import VcsProvider, WorkspaceContext
from taskgate.application.workspaces.reconcile import WorkspaceReconciliation
from taskgate.domain.entities import Project, Session, SessionSnapshot
from taskgate.domain.errors import (
    HookFailed,
    InvalidInput,
    TaskgateError,
    VcsError,
    WorktreeNotCreated,
)
from taskgate.domain.naming import branch_name
from taskgate.domain.states import SessionState, Trigger

SYSTEM_ACTOR = "system"
RemoteMerge = Callable[[Session, FireTrigger], Awaitable[FireTrigger | None]]
_ENDED = frozenset({SessionState.MERGED, SessionState.COMPLETED, SessionState.CANCELLED, SessionState.ROLLED_BACK})
_BEFORE = frozenset({Trigger.INITIALIZE, Trigger.APPROVE, Trigger.MERGE, Trigger.COMPENSATE, Trigger.CLEANUP_DONE})


class WorkspaceService(WorkspaceReconciliation, WorkspaceMerges):
    """Worktree effects of transitions, the operator's review context, and reconciliation with the disk."""

    def __init__(
        self, uow: UnitOfWorkFactory, vcs: VcsProvider, clock: Clock, options: GitOptions, scout: ContextScout
    ) -> None:
        self._uow, self._vcs, self._clock, self._options, self._scout = uow, vcs, clock, options, scout
        self._sessions: SessionService | None = None
        self._hooks: WorktreeHooks | None = None
        self._remote_merge: RemoteMerge | None = None

    def use_remote_merge(self, merge: RemoteMerge) -> None:
        """Ask `merge` first at every merge: a project with a forge merges its pull request there (it returns the
        transition's changes), one without gets None and the local merge (the composition root's call)."""
        self._remote_merge = merge

    def use_hooks(self, hooks: WorktreeHooks) -> None:
        """Run the project's lifecycle hooks and copy its `.worktreeinclude` files (the composition root's call)."""
        self._hooks = hooks

    @property
    def hooks(self) -> WorktreeHooks | None:
        return self._hooks

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
        if trigger in (Trigger.MERGE, Trigger.COMPENSATE, Trigger.FORGE_MERGED):
            crashpoints.reached("compensate.rolled_back" if trigger == Trigger.COMPENSATE else "merge.merged")
            return Aftermath(self._fire(session, Trigger.CLEANUP_DONE, reason=f"automatic after {trigger.value}"))
        if trigger == Trigger.CANCEL:
            return Aftermath(warning=await self._discard_quietly(session) or "")
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
        if session.state in _ENDED:  # its worktree and branch are gone by design: what it landed, or nothing
            return await self._landed_context(session, project)
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

    async def _landed_context(self, session: Session, project: Project) -> WorkspaceContext:
        """A merged (or merged and completed) session's review: what its merge landed on the base, from the history
        (`before..commit`; a session merged before `from` was recorded: the merge commit's first parent for a no-ff
        merge, else the fork point it was created at). Raises: VcsError for a session that ended without a merge."""
        merge = session.state_data.get("merge")
        if not isinstance(merge, dict) or not merge.get("commit"):
            raise VcsError(
                f"session {session.id} is {session.state.value} without a merge: its worktree and branch were removed "
                f"when it ended, and nothing of it is on '{self._base(session)}' to review (its log: session history)"
            )
        commit = str(merge["commit"])
        before = merge.get("from") or (
            f"{commit}^1" if merge.get("mode") == "no-ff" else str(session.state_data.get("base_commit") or "")
        )
        into = str(merge.get("into") or self._base(session))
        landed = await self._vcs.merged_context(project.root_path, into, str(before), commit,
                                                max_patch_bytes=self._options.max_patch_bytes)  # fmt: skip
        # named after the branch that was merged (it is gone), not the base it landed on
        return replace(landed, branch=f"{session.branch_name or 'its branch'} (merged into {into})")

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

    # -- internals -------------------------------------------------------------------------------------------------

    async def _names(self, session: Session) -> dict[str, Any]:
        async with self._uow(write=False) as uow:
            task = await uow.tasks.get(session.task_id, with_blockers=False)
            project = await uow.projects.get(session.project_id)
        branch = branch_name(self._options.branch_pattern, task_id=task.id, session_id=session.id, title=task.title)
        path = str(self._options.worktrees_of(project.root_path, project.name) / session.id)
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
            await self._set_up(session, project)
        except (VcsError, HookFailed) as exc:
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

    async def _set_up(self, session: Session, project: Project) -> None:
        """The new worktree readied like the user's checkout: `.worktreeinclude` files, then `after_create`. A failure
        removes the worktree and its branch (nothing half-made is left) and raises. Raises: HookFailed, VcsError."""
        if self._hooks is None:
            return
        assert session.worktree_path is not None
        try:
            try:
                await self._hooks.include(session, project)
            except TaskgateError as exc:
                raise exc if isinstance(exc, VcsError) else VcsError(f".worktreeinclude: {exc}") from None
            done = await self._hooks.run("after_create", session, project)
            if done is not None and done.failed:
                raise HookFailed(done.message(), "after_create")
        except (VcsError, HookFailed):
            with suppress(TaskgateError):  # else the cancel that follows removes it (or records why it could not)
                await self._vcs.remove_worktree(project.root_path, session.worktree_path, session.branch_name)
            raise

    async def _discard(self, session: Session) -> str | None:
        """Remove the session's worktree and branch, after its `before_remove` hook; returns that hook's failure
        (recorded, never blocking). Raises: VcsError from git."""
        if session.worktree_path is None:
            return None
        project = await self._project(session.project_id)
        failure = None
        if self._hooks is not None and session.state_data.get("base_commit"):  # set up in full (context_discovered)
            done = await self._hooks.run("before_remove", session, project)
            failure = done.message() if done is not None and done.failed else None
        await self._vcs.remove_worktree(project.root_path, session.worktree_path, session.branch_name)
        return failure

    async def _discard_quietly(self, session: Session) -> str | None:
        """Cancel must never fail on git: a failure is recorded, and the next start prunes the orphan. Returns what
        went wrong (a failed `before_remove` hook, the removal's error), as the cancel's warning."""
        try:
            return await self._discard(session)
        except TaskgateError as exc:
            async with self._uow(write=True) as uow:
                await self._held(uow, session.id, "the worktree.cleanup_failed event")
                payload = {"error": str(exc), "worktree": session.worktree_path}
                await uow.events.append("worktree.cleanup_failed", self._clock.now(), payload, session.id)
                await uow.commit()
            return f"the worktree could not be removed: {exc}"

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

    async def _annotate(self, session_id: str, data: dict[str, Any], event: tuple[str, dict] | None = None) -> None:
        assert self._sessions is not None, "WorkspaceService.attach was not called"
        await self._sessions.annotate(session_id, data, event)

    async def _load(self, session_id: str) -> tuple[Session, Project]:
        async with self._uow(write=False) as uow:
            session = await uow.sessions.get(session_id)
            return session, await uow.projects.get(session.project_id)

    async def _project(self, project_id: int) -> Project:
        async with self._uow(write=False) as uow:
            return await uow.projects.get(project_id)


def _checkpoint_data(context: WorkspaceContext) -> dict[str, Any]:
    return jsonable(context)
