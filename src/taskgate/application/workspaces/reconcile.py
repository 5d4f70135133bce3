"""The worktrees on disk against the sessions: `taskgate worktrees` lists them with their sessions, state and size; at
start-up, orphans (of no active session) are pruned or reported, a session whose worktree folder vanished is flagged,
and an initialisation a crash cut off is carried on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from taskgate.application.workspaces.options import _UUID
from taskgate.application.workspaces.ports import WorktreeEntry
from taskgate.domain.entities import Project, Session
from taskgate.domain.errors import (
    TaskgateError,
)
from taskgate.domain.states import TERMINAL_STATES, SessionState


class WorkspaceReconciliation:
    """The worktrees on disk: listed with their sessions, and reconciled at start-up."""

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

    def _is_session_folder(self, project: Project, path: str) -> bool:
        folder = PurePosixPath(path)
        return folder.parent == self._options.worktrees_of(project.root_path, project.name) and bool(
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


_UNPREPARED = frozenset({SessionState.CREATED, SessionState.INITIALIZING})


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
