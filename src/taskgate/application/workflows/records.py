"""How the workflow engine writes: a session's stack, its step runs and their events, in one version-checked
transaction per change (see application/workflows/engine.py for why and how races are prevented)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sessions.engine import SessionService
from taskgate.domain.agents.kinds import why_stopped
from taskgate.domain.entities import Session, StepRun, StepStatus
from taskgate.domain.errors import ConcurrentModification
from taskgate.domain.states import Trigger
from taskgate.domain.workflows.definitions import Step
from taskgate.domain.workflows.run import (
    RUN_OUTPUT_LIMIT,
    Frame,
    FrameKind,
    FrameStatus,
    clip,
    dump_stack,
    load_stack,
)

StepEvent = tuple[str, dict[str, Any]]  # an event kind and its payload, appended with the write it records


@dataclass(slots=True)
class Carry:
    """Writes of a step's outcome that travel with its routing, so both land in one transaction."""

    finish: list[tuple[int | None, StepStatus, str, str | None]] = field(default_factory=list)
    events: list[StepEvent] = field(default_factory=list)
    runs: list[StepRun] = field(default_factory=list)  # run rows written already ended (a condition, a refusal)

    def then(self, later: Carry | None) -> Carry:
        """These writes, followed by `later`'s."""
        if later is None:
            return self
        return Carry([*self.finish, *later.finish], [*self.events, *later.events], [*self.runs, *later.runs])


def _frame_name(frame: Frame) -> str:
    if frame.kind is FrameKind.group:
        return f"{frame.workflow}/{frame.name}"
    if frame.kind is FrameKind.checklist:
        return f"checklist:{frame.name}"
    return frame.name


class StepRecords:
    """The engine's writes (a mixin of WorkflowEngine). Every one locks the session row, checks and bumps its
    version, so a change made meanwhile by another process fails with ConcurrentModification."""

    _uow: UnitOfWorkFactory
    _clock: Clock
    _written: dict[str, Session | None]
    _launcher: Any
    _sessions: SessionService

    async def _save(
        self,
        session: Session,
        stack: list[Frame],
        *,
        runs: Sequence[StepRun] = (),
        finish: Sequence[tuple[int | None, StepStatus, str, str | None]] = (),
        events: Sequence[StepEvent] = (),
        claim: tuple[Frame, StepRun] | None = None,
        carry: Carry | None = None,
    ) -> Session:
        """Write the stack (version checked and bumped), step runs started (`runs`), ended (`finish`: run id,
        status, output, error) and claimed (`claim`: the frame whose `run_id` the new run gets), and events,
        in one transaction. Raises: ConcurrentModification when the session moved since it was read."""
        async with self._uow(write=True) as uow:
            updated = await self._save_in(uow, session, stack, runs=runs, finish=finish, events=events, claim=claim,
                                          carry=carry)  # fmt: skip
            await uow.commit()
        return updated

    async def _save_in(
        self,
        uow: UnitOfWork,
        session: Session,
        stack: list[Frame],
        *,
        runs: Sequence[StepRun] = (),
        finish: Sequence[tuple[int | None, StepStatus, str, str | None]] = (),
        events: Sequence[StepEvent] = (),
        claim: tuple[Frame, StepRun] | None = None,
        carry: Carry | None = None,
    ) -> Session:
        """`_save`'s writes inside `uow` (the caller commits)."""
        if carry is not None:
            runs, finish, events = [*carry.runs, *runs], [*carry.finish, *finish], [*carry.events, *events]
        # a stack edit on another node's session would drive its steps here, away from its worktree
        current = await self._sessions.fence(uow, session.id, "the workflow stack and its step runs")
        if current.version != session.version:
            raise ConcurrentModification(session.id, session.version, current.version)
        now = self._clock.now()
        for run in runs:
            await uow.step_runs.add(run)
        for run_id, status, output, error in finish:
            await self._finish_run(uow, run_id, status, output, error, now)
        if claim is not None:  # starts when the runs it follows ended (`now`), so it is never listed before them
            claim[0].run_id = await uow.step_runs.add(replace(claim[1], started_at=now))
        for kind, payload in events:
            await uow.events.append(kind, now, payload, session.id)
        updated = await self._write(uow, current, stack, now)
        if session.id in self._written:  # a drive runs: its next pass starts from this
            self._written[session.id] = updated
        return updated

    async def _write(self, uow, current: Session, stack: list[Frame], now: datetime) -> Session:
        updated = replace(current, workflow_stack=dump_stack(stack), version=current.version + 1, updated_at=now)
        await uow.sessions.update(updated, expected_version=current.version)
        return updated

    async def _open_run(
        self,
        session: Session,
        stack: list[Frame],
        top: Frame,
        step: Step,
        status: StepStatus,
        frame_status: FrameStatus,
        *,
        event: StepEvent | None = None,
        push: Frame | None = None,
    ) -> Session:
        """Claim the step: its run row and the frame's new status (and a child frame to push), written together
        before any agent starts."""
        top.status = frame_status
        if push is not None:
            stack.append(push)
        run = self._run(session, top, stack.index(top) + 1, step, status, self._clock.now())
        return await self._save(session, stack, events=[event] if event else (), claim=(top, run))

    def _run(self, session: Session, top: Frame, depth: int, step: Step, status: StepStatus, now: datetime,
             output: str = "") -> StepRun:  # fmt: skip
        return StepRun(session.id, depth, _frame_name(top), step.id, top.attempt, status, now, output_summary=output)

    async def _finish_run(self, uow, run_id: int | None, status: StepStatus, output: str, error, now) -> None:
        if run_id is not None:  # a run closed already (by a stack edit, say) keeps its first outcome
            await uow.step_runs.finish(run_id, status, now, clip(output, RUN_OUTPUT_LIMIT), error)

    async def _close_run(self, run_id: int | None, status: StepStatus, note: str) -> None:
        async with self._uow(write=True) as uow:
            await self._finish_run(uow, run_id, status, note, None, self._clock.now())
            await uow.commit()

    async def _close_open_runs(self, session: Session, cmd: FireTrigger) -> None:
        """The session left executing (failed, cancelled, …): its open runs end `cancelled`, the top frame's
        `rejected` when an operator rejected the work. Their error says who stopped them and why, in the words a
        retry tells the agents (see `_interrupted`)."""
        why = why_stopped(cmd.trigger, cmd.actor, cmd.reason)
        stack = load_stack(session.workflow_stack)
        rejected = stack[-1].run_id if stack and cmd.trigger == Trigger.REJECT.value else None
        async with self._uow(write=True) as uow:
            for run in await uow.step_runs.open_runs(session.id):
                status = StepStatus.REJECTED if run.id == rejected else StepStatus.CANCELLED
                await uow.step_runs.update(replace(run, status=status, ended_at=self._clock.now(), error=why))
            await uow.commit()

    async def _abandon_step(self, session: Session, top: Frame, status: StepStatus, note: str) -> None:
        """Stop the current step's agents (if any) and close its run: a hand edit moves the frame elsewhere."""
        if top.run_id is None:
            return
        async with self._uow(write=False) as uow:
            run = await uow.step_runs.get(top.run_id)
        if run.agent_ids and self._launcher is not None:
            await self._launcher.stop_agents(session.id, run.agent_ids)
        await self._close_run(top.run_id, status, note)
