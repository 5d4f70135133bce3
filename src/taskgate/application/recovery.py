"""Start-up recovery: carry forward whatever a crash (of this service, or of a CLI call) cut off.

Run once when `taskgate serve` starts, before the first request, in this order (each step needs the last):

1. **disk**: worktrees reconciled with the sessions (orphans pruned or reported, vanished worktrees
   flagged, interrupted initialisations carried on): `WorkspaceService.reconcile`;
2. **agents**: live ones re-attached by pid, ended ones finished from their exit file, queued ones that
   never started started, the rest failed: `AgentService.recover`;
3. **tokens**: every agent token whose agent or session ended while no service ran is revoked;
4. **sessions**: each session whose state still owes an interrupted operation something is resumed through
   `SessionService.resume`, i.e. through the same effects and follow-ups the interrupted call would have run
   (docs/failure-model.md lists every such state); each resumed session gets a `session.resumed` event;
5. **workflows**: every executing session with a workflow stack is driven again.

Each step touches only what this node holds (docs/nodes.md): its own agents, and sessions whose worktree it holds
(or that no node holds); another node's are left to it.

Nothing here is fatal: an error on one session is reported and the others go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from taskgate.application.agents.runs import LAUNCH
from taskgate.application.agents.supervisor import AgentService
from taskgate.application.operators.access import AccessService
from taskgate.application.sessions.commands import MERGE_REQUESTED, START_REQUESTED
from taskgate.application.sessions.engine import SessionService
from taskgate.application.workflows.engine import WorkflowEngine
from taskgate.application.workspaces.worktrees import WorkspaceService
from taskgate.domain.entities import Session
from taskgate.domain.errors import TaskgateError
from taskgate.domain.states import SessionState

# States that owe something whatever their data says (the rest owe only when a request is recorded on them).
_ALWAYS_OWED = frozenset({SessionState.CREATED, SessionState.MERGED, SessionState.ROLLED_BACK})


@dataclass
class RecoveryReport:
    """What start-up recovery did, one line per thing, and how long it took."""

    lines: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)  # session ids
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def owes_work(session: Session) -> bool:
    """Whether the session's state (and what is recorded on it) may owe an interrupted operation something.
    Cheap, from the row alone: `SessionService.resume` decides for real."""
    state, data = session.state, session.state_data
    return (
        state in _ALWAYS_OWED
        or (state == SessionState.READY and bool(data.get(START_REQUESTED)))
        or (state == SessionState.FAILED and session.compensation_plan == "auto_revert")
        or (state == SessionState.AWAITING_MERGE and bool(data.get(MERGE_REQUESTED)))
        or (state == SessionState.EXECUTING and not session.workflow_stack and LAUNCH in data)
    )


class Recovery:
    """The start-up sequence above, over the services the composition root built."""

    def __init__(
        self,
        sessions: SessionService,
        workspaces: WorkspaceService,
        access: AccessService,
        agents: AgentService | None = None,
        workflows: WorkflowEngine | None = None,
    ) -> None:
        self._sessions, self._workspaces, self._access = sessions, workspaces, access
        self._agents, self._workflows = agents, workflows

    async def run(self) -> RecoveryReport:
        """Run every step; never raises for one broken session or project (see `errors`)."""
        began, report = time.perf_counter(), RecoveryReport()
        disk = await self._workspaces.reconcile()
        report.resumed += disk.resumed
        report.errors += disk.errors
        if disk.orphan_worktrees or disk.orphan_branches or disk.missing_worktrees or disk.resumed or disk.errors:
            report.lines.append(f"worktrees: {disk.summary()}")
        report.lines += [f"session {sid}: resumed its interrupted initialisation" for sid in disk.resumed]
        if self._agents is not None:
            report.lines += await self._agents.recover()
        revoked = await self._access.revoke_dangling()
        if revoked:
            report.lines.append(f"tokens: revoked {len(revoked)} token(s) of agents or sessions that ended")
        await self._resume_sessions(report)
        if self._workflows is not None:  # after the agents: the drivers then find their agents re-attached
            report.lines += await self._workflows.recover()
        report.seconds = time.perf_counter() - began
        return report

    async def _resume_sessions(self, report: RecoveryReport) -> None:
        for session in await self._sessions.active_sessions():
            if session.id in report.resumed or not owes_work(session):
                continue
            if not self._sessions.holds(session):  # its worktree is another node's: that node carries it on
                report.lines.append(f"session {session.id}: left to node {session.node_id}")
                continue
            try:
                done = await self._sessions.resume(session.id)
            except TaskgateError as exc:
                report.errors.append(f"session {session.id}: {exc}")
                report.lines.append(f"session {session.id}: could not be resumed from {session.state.value}: {exc}")
                continue
            if done:
                report.resumed.append(session.id)
                report.lines.append(f"session {session.id}: resumed: {'; '.join(done)}")
