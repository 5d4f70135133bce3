"""A step's outcome and where it leads: recorded in its frame, routed (`on_success`, `on_failure`, retries with
their delay, the loop guard), and frames popped with their outcome handed to the step that pushed them. The
outcome's writes travel with the routing's (`Carry`), so a step's end and what follows are one transaction."""

from __future__ import annotations

from contextlib import suppress
from datetime import datetime, timedelta
from typing import Any

from taskgate.application.ports import Clock
from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.workflows.passes import AGENT_STEPS
from taskgate.application.workflows.ports import SYSTEM_ACTOR, WorkflowOptions, WorktreeChanges
from taskgate.application.workflows.records import Carry
from taskgate.domain.entities import Session, StepStatus
from taskgate.domain.errors import ConcurrentModification, InvalidTransition, TaskgateError
from taskgate.domain.states import Trigger
from taskgate.domain.workflows.definitions import END, Step, StepType, changes_target, retry_delay_ms
from taskgate.domain.workflows.run import (
    Frame,
    FrameKind,
    FrameStatus,
    add_usage,
    changed_files,
    clip,
    enter,
    fingerprint,
    last_output,
    merge_back,
    nested_result,
    record,
    repeat_problem,
    route,
    summary,
)


class Routing:
    """Outcomes, routing and pops (a mixin of WorkflowEngine)."""

    _clock: Clock
    _options: WorkflowOptions
    _sessions: Any  # SessionService
    _workspaces: WorktreeChanges | None

    def _outcome(self, top: Frame, status: StepStatus, output: str) -> Carry:
        """Record the outcome of the top frame's current step in the frame; its run row and event ride along
        with whatever routing writes next (one transaction)."""
        error = output if status is StepStatus.FAILED else None
        top.status, top.outcome = FrameStatus.done, {"status": status.value, "output": clip(output)}
        event = {"step": top.step, "frame": top.label, "attempt": top.attempt, "status": status.value}
        return Carry([(top.run_id, status, output, error)], [("workflow.step", event)])

    async def _finish_step(
        self, session: Session, stack: list[Frame], status: StepStatus, output: str, earlier: Carry | None = None
    ) -> bool:
        """The top frame's current step ended with `status`: record it and route it (after `earlier`'s writes),
        in one transaction."""
        top = stack[-1]
        carry = (earlier or Carry()).then(self._outcome(top, status, output))
        step = self._find(top, top.step or "")
        if step is None:  # the file changed under the running step: routing fails the session with why
            await self._save(session, stack, carry=carry)
            return True
        return await self._route(session, stack, top, step, self._steps(top), carry)

    async def _route(
        self, session: Session, stack: list[Frame], top: Frame, step: Step, steps, carry: Carry | None = None
    ) -> bool:
        """Route the top frame's recorded outcome: a retry, the loop guard, the next step, or the frame's end."""
        outcome = top.outcome or {"status": StepStatus.FAILED.value, "output": ""}
        status, output = StepStatus(outcome["status"]), str(outcome.get("output", ""))
        if status is StepStatus.FAILED and top.attempt <= step.max_retries and step.type is not StepType.approval:
            return await self._schedule_retry(session, stack, top, step, carry)
        record(top, step.id, status, output, top.attempt, outcome.get("nested"))
        instructions = top.variables.get("instructions", "") if status is StepStatus.CHANGES_REQUESTED else ""
        loop = repeat_problem(top, step.id, fingerprint(status.value, output, instructions), self._options.limits)
        if loop:
            await self._fail(session, stack, loop, carry)
            return False
        if status is StepStatus.CHANGES_REQUESTED:  # no step before it runs agents: the approval is asked again
            target = changes_target(step, steps) or step.id
        else:
            target = route(step, status, steps)
        if target is None:
            if len(stack) == 1 or status is StepStatus.REJECTED:
                what = "was rejected" if status is StepStatus.REJECTED else "failed"
                await self._fail(session, stack, f"step '{step.id}' of {top.label} {what}: {output}"[:2000], carry)
                return False
            await self._pop(session, stack, StepStatus.FAILED, f"step '{step.id}' failed: {output}", carry=carry)
            return True
        return await self._goto(session, stack, top, target, carry=carry)

    async def _schedule_retry(
        self, session: Session, stack: list[Frame], top: Frame, step: Step, carry: Carry | None
    ) -> bool:
        delay = retry_delay_ms(step, top.attempt) / 1000
        top.status, top.retry_at = FrameStatus.retry, (self._clock.now() + timedelta(seconds=delay)).isoformat()
        retry = {"step": step.id, "attempt": top.attempt + 1, "delay_s": delay}
        await self._save(session, stack, carry=carry, events=[("workflow.retry", retry)])
        return True

    async def _retry(self, session: Session, stack: list[Frame], top: Frame) -> bool:
        """A failed step waiting for its next attempt: wait out the delay (a kick later), or make it pending."""
        due = datetime.fromisoformat(top.retry_at) if top.retry_at else self._clock.now()
        remaining = (due - self._clock.now()).total_seconds()
        if remaining > 0:
            self._after_delay(session.id, remaining)
            return False
        top.status, top.attempt, top.retry_at, top.outcome = FrameStatus.pending, top.attempt + 1, None, None
        top.iterations -= 1 if top.iterations else 0  # a retry is the same step run, counted once
        await self._save(session, stack)
        return True

    async def _goto(self, session: Session, stack: list[Frame], top: Frame, target: str, carry: Carry | None) -> bool:
        """Move the top frame to `target` (or end it). An agent step is started at once, so the routing that
        led to it joins its claim: one commit instead of two."""
        if target == END:
            top.outcome = {"status": StepStatus.SUCCEEDED.value, "output": ""}
            await self._pop(session, stack, StepStatus.SUCCEEDED, "", carry=carry)
            return True
        enter(top, target)
        following = self._find(top, target)
        if following is not None and following.type in AGENT_STEPS:
            return await self._start(session, stack, top, following, (), carry)
        await self._save(session, stack, carry=carry)
        return True

    async def _pop(
        self, session: Session, stack: list[Frame], status: StepStatus, output: str, carry: Carry | None = None
    ) -> None:
        """The top frame ended: hand its outcome to the step below that pushed it (if any), then drop it."""
        child = stack.pop()
        events = [("workflow.popped", {"frame": child.label, "status": status.value, "depth": len(stack)})]
        finish = []
        if stack and child.parent_step is not None and stack[-1].step == child.parent_step:
            output = await self._hand_back(session, stack[-1], child, status, output)
            finish.append((stack[-1].run_id, status, output, output if status is StepStatus.FAILED else None))
        await self._save(session, stack, finish=finish, events=events, carry=carry)

    async def _hand_back(self, session: Session, parent: Frame, child: Frame, status: StepStatus, output: str) -> str:
        """A child frame that ended (or was ended early by workflow_continue) gives the step that pushed it its
        outcome: shared results merged back, the output (a summary, else the child's last output on success),
        the structured result and the usage. Returns the output."""
        merge_back(parent, child)
        steps = self._steps(child)
        if child.kind is FrameKind.group and child.summarize:
            output = summary(child, steps)
        elif status is StepStatus.SUCCEEDED:
            output = last_output(child)
        files = changed_files(child.baseline, await self._changes(session)) if child.baseline is not None else None
        parent.usage = add_usage(parent.usage, child.usage)
        parent.status = FrameStatus.done
        parent.outcome = {"status": status.value, "output": clip(output),
                          "nested": nested_result(child, steps, status, files)}  # fmt: skip
        return output

    async def _changes(self, session: Session) -> dict[str, str] | None:
        """The worktree's changes against its base (path → added/deleted, or dirty/untracked); None when unknown."""
        if self._workspaces is None or not session.worktree_path:
            return None
        try:
            context = await self._workspaces.review(session.id)
        except TaskgateError:
            return None
        changes = {f.path: f"{f.added}/{f.deleted}" for f in context.diff_stat}
        changes.update({p: "dirty" for p in context.dirty})
        changes.update({p: "untracked" for p in context.untracked})
        return changes

    async def _fail(self, session: Session, stack: list[Frame], reason: str, carry: Carry | None = None) -> None:
        """Fail the session with `reason`; the top frame stays on its step, so `retry` runs it again."""
        top = stack[-1]
        finish = [(top.run_id, StepStatus.FAILED, "", reason)]
        top.status, top.attempt, top.run_id, top.outcome, top.retry_at = FrameStatus.pending, 1, None, None, None
        top.iterations, top.trail = 0, []
        event = {"frame": top.label, "step": top.step, "reason": reason}
        session = await self._save(session, stack, finish=finish, events=[("workflow.failed", event)], carry=carry)
        cmd = FireTrigger(session.id, Trigger.FAIL.value, SYSTEM_ACTOR, reason=reason[:2000],
                          expected_version=session.version, changes={"compensation_plan": "manual_review"})  # fmt: skip
        with suppress(InvalidTransition, ConcurrentModification):
            await self._sessions.fire(cmd)
