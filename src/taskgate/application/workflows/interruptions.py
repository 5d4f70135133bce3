"""Steps cut off: when the session left executing (its open runs were closed then, see StepRecords) and a retry
brought it back, and when the process restarted (`recover`)."""

from __future__ import annotations

from typing import Any

from taskgate.application.workflows.passes import AGENT_STEPS, LIVE, PassReads
from taskgate.domain.entities import OPEN_STEP_STATUSES, Agent, Session, StepRun, StepStatus
from taskgate.domain.states import SessionState
from taskgate.domain.workflows.definitions import Step, StepType, changes_target
from taskgate.domain.workflows.run import Frame, FrameStatus, breadcrumb, load_stack, record


class Interruptions:
    """Carrying cut-off steps forward (a mixin of WorkflowEngine)."""

    _sessions: Any  # SessionService
    _launcher: Any  # StepLauncher | None
    _reads: dict[str, PassReads]

    async def recover(self) -> list[str]:
        """At start: drive every executing session with a stack that this node holds (after AgentService.recover,
        which re-attaches the agents still running and fails those whose process is gone). The driver then
        collects agents that ended while nobody watched and waits out a retry's remaining delay."""
        sessions = await self._sessions.list_sessions(states={SessionState.EXECUTING})
        report = []
        for session in sessions:
            if session.workflow_stack and self._sessions.holds(session):
                self.kick(session.id)
                report.append(
                    f"session {session.id}: workflow resumed at {breadcrumb(load_stack(session.workflow_stack))}"
                )
        return report

    def _closed_run(self, session_id: str, top: Frame) -> tuple[bool, StepRun | None]:
        """Whether the top frame's current run is closed (or missing) although the frame still runs or waits on
        it, i.e. the session left executing meanwhile (`_close_open_runs`); and the run.

        Decided from the pass's reads. A pass that follows the driver's own write did not read the run: that
        write left it open, and whatever closes it since (a transition out of executing, a stack edit) bumps the
        session's version, so the driver's next save fails and the pass after it reads the run afresh."""
        if top.run_id is None:
            return True, None
        reads = self._reads[session_id]
        if not reads.fresh or reads.run is None:
            return False, None
        return reads.run.status not in OPEN_STEP_STATUSES, reads.run

    async def _interrupted(
        self, session: Session, stack: list[Frame], top: Frame, step: Step, steps, closed: StepRun | None
    ) -> bool:
        """A retry brought back a session whose current step was cut off when it left executing. A rejected
        approval sends the work back to the step that makes it (`changes_target`), told why; any other step runs
        again (agents told why they were stopped); a checklist, or an approval closed otherwise, is asked again."""
        why = (closed.error or "") if closed is not None else ""
        if step.type is StepType.approval and closed is not None and closed.status is StepStatus.REJECTED:
            target = changes_target(step, steps)
            if target is not None:
                top.variables["instructions"] = why
                record(top, step.id, StepStatus.REJECTED, why, top.attempt)
                return await self._goto(session, stack, top, target, carry=None)
        if step.type in AGENT_STEPS:
            live = [a.id for a in await self._agents(top) if a.status in LIVE]
            if live and self._launcher is not None:
                await self._launcher.stop_agents(session.id, live)
            if why:
                top.variables["instructions"] = why
        top.status, top.run_id, top.agents = FrameStatus.pending, None, []
        await self._save(session, stack)
        return True

    async def _agents(self, top: Frame) -> list[Agent]:
        async with self._uow(write=False) as uow:
            return await uow.agents.many(top.agents) if top.agents else []
