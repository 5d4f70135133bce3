"""One pass of the driver: read what the session's stack needs now, in one read transaction, then do it.

A pass reads at most once. The session comes from the driver's own last write when the pass follows one (every
write is version-checked, so a change made meanwhile by anyone else fails the next save and the driver reads
afresh); otherwise it is read with the rest. With it, in the same transaction: the top frame's current run (only
when the session was read afresh: after the driver's own write that run is open, see `_closed_run`), its agents
(a running agent step) and the session's task (what conditions and prompts see, read fresh for every step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from taskgate.application.ports import UnitOfWorkFactory
from taskgate.domain.agents.transcripts import result_of
from taskgate.domain.entities import Agent, AgentStatus, Session, StepRun, StepStatus, Task
from taskgate.domain.errors import TaskgateError
from taskgate.domain.states import SessionState
from taskgate.domain.workflows.definitions import Step, StepType
from taskgate.domain.workflows.run import Frame, FrameKind, FrameStatus, add_usage, enter, find_step, load_stack

AGENT_STEPS = frozenset({StepType.agent, StepType.parallel})
LIVE = frozenset({AgentStatus.QUEUED, AgentStatus.RUNNING})


@dataclass(slots=True)
class PassReads:
    """What one pass of the driver read, in one read transaction."""

    session: Session
    fresh: bool  # read from the database, not taken from the driver's own last write
    run: StepRun | None = None  # the top frame's current run (read only when `fresh`)
    agents: list[Agent] = field(default_factory=list)  # the top frame's agents, when its step runs them
    task: Task | None = None  # the session's task, when the pass may start a step


class DriverPasses:
    """The driver's passes (a mixin of WorkflowEngine)."""

    _uow: UnitOfWorkFactory
    _written: dict[str, Session | None]
    _reads: dict[str, PassReads]

    async def _step_once(self, session_id: str) -> bool:
        """Do the next thing the session's stack needs; False when the driver must stop and wait."""
        reads = self._reads[session_id] = await self._read_pass(session_id)
        session = reads.session
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

    async def _read_pass(self, session_id: str) -> PassReads:
        """The pass's reads (module docstring); no transaction at all when the driver's last write says it all."""
        written = self._written.get(session_id)
        self._written[session_id] = None
        top = _top_of(written) if written is not None else None
        if written is not None and not _needs_reads(top):
            return PassReads(written, fresh=False)
        async with self._uow(write=False) as uow:
            session = written or await uow.sessions.get(session_id)
            reads = PassReads(session, fresh=written is None)
            if session.state != SessionState.EXECUTING:
                return reads
            top = top if written is not None else _top_of(session)
            if top is None or top.kind is FrameKind.checklist:
                return reads
            if reads.fresh and top.run_id is not None and top.status in (FrameStatus.running, FrameStatus.waiting):
                reads.run = await uow.step_runs.get(top.run_id)
            if top.status is FrameStatus.running and top.agents:
                reads.agents = await uow.agents.many(top.agents)
            reads.task = await uow.tasks.get(session.task_id, with_blockers=False)
        return reads

    async def _advance_frame(self, session: Session, stack: list[Frame], top: Frame, step: Step, steps) -> bool:
        if top.status is FrameStatus.pending:
            return await self._start(session, stack, top, step, steps)
        if top.status is FrameStatus.running:
            return await self._collect(session, stack, top, step, steps)
        if top.status is FrameStatus.waiting:
            closed, run = self._closed_run(session.id, top)
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
        closed, run = self._closed_run(session.id, top)
        if closed:  # its agents were stopped when the session left executing; a retry brought it back
            return await self._interrupted(session, stack, top, step, steps, run)
        if not top.agents:  # a running step that names no agents: not written since a claim and its agents
            return await self._relaunch(session, stack, top, step)  # share one transaction (an older release)
        mine = self._reads[session.id].agents
        if any(a.status in LIVE for a in mine):
            return False
        for agent in mine:  # what the agent CLIs reported of their runs, summed per frame (nested results carry it)
            top.usage = add_usage(top.usage, agent.report)
        status, output = agents_outcome(step, mine)
        return await self._finish_step(session, stack, status, output)

    async def _task(self, session: Session) -> Task:
        """The session's task as this pass read it (read now when the pass did not)."""
        reads = self._reads.get(session.id)
        if reads is not None and reads.task is not None and reads.task.id == session.task_id:
            return reads.task
        async with self._uow(write=False) as uow:
            return await uow.tasks.get(session.task_id, with_blockers=False)


def agents_outcome(step: Step, agents: list[Agent]) -> tuple[StepStatus, str]:
    """The step's status and output from its ended agents (a parallel step needs `min_success` of them)."""
    ok = [a for a in agents if a.status == AgentStatus.COMPLETED]
    need = len(agents) if step.type is StepType.agent else (step.min_success or len(agents))
    if len(agents) == 1:
        output = result_of(agents[0])
    else:  # each agent's whole result, under a line naming it
        output = "\n\n".join(f"[{a.agent_type}] {a.status.value}:\n{result_of(a)}" for a in agents)
    if len(ok) >= need:
        return StepStatus.SUCCEEDED, output
    failed = "; ".join(f"{a.agent_type} {a.id[:8]}: {a.error or a.status.value}" for a in agents if a not in ok)
    return StepStatus.FAILED, f"{len(ok)} of {len(agents)} agents succeeded, {need} needed: {failed}\n{output}"


def _top_of(session: Session) -> Frame | None:
    stack = session.workflow_stack
    return Frame.from_json(stack[-1]) if stack else None


def _needs_reads(top: Frame | None) -> bool:
    """Whether a pass that follows the driver's own write must read anything: agents to collect, or the task
    for a step it may start (a checklist frame, an empty stack or a retry's wait need neither)."""
    if top is None or top.kind is FrameKind.checklist:
        return False
    return top.status is not FrameStatus.retry
