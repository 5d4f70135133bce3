"""One pass of the driver: the next thing the session's stack needs, from the session as the driver's last write
left it (or as read afresh), and collecting a running agent step's agents."""

from __future__ import annotations

from typing import Any

from taskgate.application.ports import UnitOfWorkFactory
from taskgate.domain.entities import Agent, AgentStatus, Session, StepStatus
from taskgate.domain.errors import TaskgateError
from taskgate.domain.states import SessionState
from taskgate.domain.workflow_run import Frame, FrameKind, FrameStatus, add_usage, enter, find_step, load_stack
from taskgate.domain.workflows import Step, StepType

AGENT_STEPS = frozenset({StepType.agent, StepType.parallel})
LIVE = frozenset({AgentStatus.QUEUED, AgentStatus.RUNNING})


class DriverPasses:
    """The driver's passes (a mixin of WorkflowEngine)."""

    _uow: UnitOfWorkFactory
    _sessions: Any  # SessionService
    _written: dict[str, Session | None]

    async def _step_once(self, session_id: str) -> bool:
        """Do the next thing the session's stack needs; False when the driver must stop and wait."""
        session = self._written.get(session_id) or await self._sessions.get(session_id)
        self._written[session_id] = None
        if session.state != SessionState.EXECUTING:
            return False
        stack = load_stack(session.workflow_stack)
        if not stack:
            await self._complete(session)
            return False
        top = stack[-1]
        if top.kind is FrameKind.checklist:
            if top.missing_items():
                return False
            await self._pop(session, stack, StepStatus.SUCCEEDED, f"checklist {top.name} done")
            return True
        try:
            steps = self._steps(top)
        except TaskgateError as exc:
            await self._fail(session, stack, f"{top.label}: {exc}")
            return False
        if top.step is None:
            enter(top, steps[0].id)
            await self._save(session, stack)
            return True
        step = find_step(steps, top.step)
        if step is None:
            await self._fail(session, stack, f"{top.label} has no step '{top.step}' any more (the file changed)")
            return False
        return await self._advance_frame(session, stack, top, step, steps)

    async def _advance_frame(self, session: Session, stack: list[Frame], top: Frame, step: Step, steps) -> bool:
        if top.status is FrameStatus.pending:
            return await self._start(session, stack, top, step, steps)
        if top.status is FrameStatus.running:
            return await self._collect(session, stack, top, step, steps)
        if top.status is FrameStatus.waiting:
            closed, run = await self._closed_run(top)
            if closed:  # closed when the session left executing, and a retry brought it back
                return await self._interrupted(session, stack, top, step, steps, run)
            if step.type is StepType.checklist and not top.missing_items():
                return await self._finish_step(session, stack, StepStatus.SUCCEEDED, "every required item checked")
            return False
        if top.status is FrameStatus.retry:
            return await self._retry(session, stack, top)
        return await self._route(session, stack, top, step, steps)

    async def _collect(self, session: Session, stack: list[Frame], top: Frame, step: Step, steps) -> bool:
        """A running agent step: when its agents all ended, its outcome; else wait (False)."""
        if step.type not in AGENT_STEPS:  # a child frame ran for it and is gone: count the step done
            return await self._finish_step(session, stack, StepStatus.SUCCEEDED, "")
        closed, run = await self._closed_run(top)
        if closed:  # its agents were stopped when the session left executing; a retry brought it back
            return await self._interrupted(session, stack, top, step, steps, run)
        if not top.agents:  # a running step that names no agents: not written since a claim and its agents
            return await self._relaunch(session, stack, top, step)  # share one transaction (an older release)
        async with self._uow(write=False) as uow:
            mine = await uow.agents.many(top.agents)
        if any(a.status in LIVE for a in mine):
            return False
        for agent in mine:  # what the agent CLIs reported of their runs, summed per frame (nested results carry it)
            top.usage = add_usage(top.usage, agent.report)
        status, output = agents_outcome(step, mine)
        return await self._finish_step(session, stack, status, output)


def agents_outcome(step: Step, agents: list[Agent]) -> tuple[StepStatus, str]:
    """The step's status and output from its ended agents (a parallel step needs `min_success` of them)."""
    ok = [a for a in agents if a.status == AgentStatus.COMPLETED]
    need = len(agents) if step.type is StepType.agent else (step.min_success or len(agents))
    if len(agents) == 1:
        output = agents[0].output_tail or ""
    else:
        output = "\n".join(
            f"[{a.agent_type}] {a.status.value}: {(a.output_tail or '').strip()[-1500:]}" for a in agents
        )
    if len(ok) >= need:
        return StepStatus.SUCCEEDED, output
    failed = "; ".join(f"{a.agent_type} {a.id[:8]}: {a.error or a.status.value}" for a in agents if a not in ok)
    return StepStatus.FAILED, f"{len(ok)} of {len(agents)} agents succeeded, {need} needed: {failed}\n{output}"
