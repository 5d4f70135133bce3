"""Starting a step: a condition evaluated, an approval or a checklist waited for, a nested workflow or group
pushed, or an agent step's agents launched with their prompts ("claim, then act": the step's run row and the
frame marked `running` commit with the agents' rows, before any agent process starts)."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from taskgate.application.agents.outputs import OutputService
from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.application.workflows.passes import AGENT_STEPS
from taskgate.application.workflows.ports import WorkflowOptions
from taskgate.application.workflows.prompts import PromptFacts, step_prompts
from taskgate.application.workflows.records import Carry
from taskgate.application.workflows.storage import ProjectFiles
from taskgate.domain.entities import Session, StepStatus
from taskgate.domain.errors import Forbidden, InvalidInput, TaskgateError
from taskgate.domain.workflows.definitions import ContextMode, Step, StepType, Workflow
from taskgate.domain.workflows.expressions import ExpressionError, parse_condition
from taskgate.domain.workflows.run import (
    MAX_DEPTH,
    Frame,
    FrameKind,
    FrameStatus,
    child_results,
    condition_target,
    frame_context,
    iteration_problem,
    record,
)
from taskgate.domain.workflows.templating import VariableError


class StepStarts:
    """Starting the top frame's current step (a mixin of WorkflowEngine)."""

    _uow: UnitOfWorkFactory
    _clock: Clock
    _options: WorkflowOptions
    _launcher: Any  # StepLauncher | None
    _files: ProjectFiles | None
    _outputs: OutputService | None
    _roots: dict[int, str]

    async def _start(
        self, session: Session, stack: list[Frame], top: Frame, step: Step, steps, carry: Carry | None = None
    ) -> bool:
        """Start the top frame's pending step. `carry` (the routing that led here) is accepted only for agent
        steps, whose claim it joins; the other kinds are started by the driver's next pass."""
        assert carry is None or step.type in AGENT_STEPS
        problem = iteration_problem(top, self._options.limits) or self._past_deadline(top)
        if problem:
            await self._fail(session, stack, problem, carry)
            return False
        top.iterations += 1
        if step.type is StepType.condition:
            return await self._condition(session, stack, top, step, steps)
        if step.type is StepType.approval:
            event = ("workflow.waiting", {"step": step.id, "message": step.message})
            await self._open_run(session, stack, top, step, StepStatus.WAITING, FrameStatus.waiting, event=event)
            return False
        if step.type is StepType.checklist:
            return await self._wait_for_items(session, stack, top, step)
        if step.type in (StepType.workflow, StepType.group):
            return await self._push_child(session, stack, top, step)
        return await self._launch(session, stack, top, step, carry)

    async def _wait_for_items(self, session: Session, stack: list[Frame], top: Frame, step: Step) -> bool:
        source = step.items or self.checklist(step.checklist or "").items
        top.items = [{"id": i.id, "text": i.text, "required": i.required} for i in source]
        top.checked = []
        event = ("workflow.waiting", {"step": step.id, "checklist": [i["id"] for i in top.items]})
        await self._open_run(session, stack, top, step, StepStatus.WAITING, FrameStatus.waiting, event=event)
        return True

    async def _condition(self, session: Session, stack: list[Frame], top: Frame, step: Step, steps) -> bool:
        context = await self._context(session, top)
        try:
            value = parse_condition(step.when or "false").evaluate(context)
        except ExpressionError as exc:
            await self._fail(session, stack, f"step '{step.id}': {exc}")
            return False
        now = self._clock.now()
        record(top, step.id, StepStatus.SUCCEEDED, "true" if value else "false", 1)
        target = condition_target(step, value, steps)
        run = self._run(session, top, len(stack), step, StepStatus.SUCCEEDED, now, output=f"when → {value}")
        return await self._goto(session, stack, top, target, carry=Carry(runs=[replace(run, ended_at=now)]))

    async def _launch(
        self, session: Session, stack: list[Frame], top: Frame, step: Step, carry: Carry | None = None
    ) -> bool:
        """Claim the step and start its agents. The claim (its run row with the agents' ids, the frame
        `running`, and `carry`) commits in the launcher's transaction with the agents' rows, before any agent
        process starts. A step whose agents cannot be launched fails with a run row saying why."""
        run = self._run(session, top, stack.index(top) + 1, step, StepStatus.RUNNING, self._clock.now())

        async def claim(uow: UnitOfWork, agent_ids: tuple[str, ...]) -> None:
            top.status, top.agents = FrameStatus.running, list(agent_ids)
            await self._save_in(uow, session, stack, claim=(top, replace(run, agent_ids=agent_ids)), carry=carry)

        try:
            if self._launcher is None:
                raise InvalidInput("no agent launcher is configured")
            specs = await self._agent_specs(session, top, step)
            timeout = step.timeout_ms / 1000 if step.timeout_ms else None
            instructions = top.variables.get("instructions", "")
            await self._launcher.launch_step(session.id, specs, instructions=instructions, timeout_s=timeout,
                                             claim=claim)  # fmt: skip
        except (InvalidInput, VariableError) as exc:  # an unknown agent type, a prompt that does not resolve,
            top.status, top.run_id = FrameStatus.pending, None  # no worktree: nothing of the claim was written
            refused = replace(run, status=StepStatus.FAILED, ended_at=self._clock.now(), error=str(exc))
            earlier = (carry or Carry()).then(Carry(runs=[refused]))
            return await self._finish_step(session, stack, StepStatus.FAILED, str(exc), earlier)
        return True

    async def _relaunch(self, session: Session, stack: list[Frame], top: Frame, step: Step) -> bool:
        """A running step that names no agents: written by an older release, whose claim and agents did not
        share one transaction. Its run is closed and its agents launched now."""
        never = Carry(finish=[(top.run_id, StepStatus.CANCELLED, "", "its agents never started; launched again")])
        top.status, top.run_id = FrameStatus.pending, None
        return await self._launch(session, stack, top, step, never)

    async def _push_child(self, session: Session, stack: list[Frame], top: Frame, step: Step) -> bool:
        if len(stack) >= MAX_DEPTH:
            await self._fail(session, stack, f"step '{step.id}': the stack is {MAX_DEPTH} frames deep (the limit)")
            return False
        child = self._child_frame(top, step)
        child.baseline = await self._changes(session)  # to tell which files the nested frame changed
        event = ("workflow.pushed", {"frame": child.label, "by_step": step.id, "depth": len(stack) + 1})
        await self._open_run(
            session, stack, top, step, StepStatus.RUNNING, FrameStatus.running, event=event, push=child
        )
        return True

    def _child_frame(self, top: Frame, step: Step) -> Frame:
        """The frame a `workflow` or `group` step of `top` pushes."""
        if step.type is StepType.workflow:
            child = self._workflow_frame(self.workflow(step.workflow or ""), parent=top, parent_step=step.id)
            if top.variables.get("instructions"):  # the operator's, for the work this step redoes
                child.variables["instructions"] = top.variables["instructions"]
            if step.input and step.input in top.results:
                child.variables["input"] = str(top.results[step.input].get("output", ""))
            return child
        mode = step.context_mode or ContextMode.isolated
        return Frame(
            FrameKind.group, step.id, workflow=top.workflow, context_mode=mode, summarize=step.summarize,
            parent_step=step.id, results=child_results(top, mode), variables=dict(top.variables),
            max_iterations=top.max_iterations, started_at=self._now(), deadline=top.deadline,
        )  # fmt: skip

    def _workflow_frame(self, workflow: Workflow, *, parent: Frame | None, parent_step: str | None) -> Frame:
        """A new frame running `workflow` (variables inherited from `parent`, but not its instructions)."""
        now = self._clock.now()
        deadline = (now + timedelta(seconds=workflow.max_duration_s)).isoformat() if workflow.max_duration_s else None
        variables = dict(parent.variables) if parent else {}
        variables.pop("instructions", None)
        variables.update(workflow.variables)
        return Frame(FrameKind.workflow, workflow.id, workflow=workflow.id, parent_step=parent_step,
                     variables=variables, max_iterations=workflow.max_iterations, started_at=now.isoformat(),
                     deadline=deadline)  # fmt: skip

    def _past_deadline(self, frame: Frame) -> str | None:
        if frame.deadline and self._clock.now() > datetime.fromisoformat(frame.deadline):
            return f"{frame.label} ran past its max_duration (deadline {frame.deadline})"
        return None

    async def _context(self, session: Session, top: Frame) -> dict[str, Any]:
        """What a condition sees: the frame's results and variables, the task, the session."""
        task = await self._task(session)
        facts = {"id": task.id, "title": task.title, "description": task.description, "priority": task.priority,
                 "labels": list(getattr(task, "labels", ()) or ())}  # fmt: skip
        return frame_context(top, facts, {"id": session.id, "state": session.state.value})

    async def _agent_specs(self, session: Session, top: Frame, step: Step) -> list[tuple[str, str]]:
        """(agent type, prompt) per agent of the step (prompts.py); what they were given is recorded in
        the session's manifest as its inputs."""
        task = await self._task(session)
        root = await self._root(session.project_id)
        folder = self._outputs.folder(session.id) if self._outputs is not None else ""
        task_facts = {"id": task.id, "title": task.title, "description": task.description, "priority": task.priority}
        facts = PromptFacts(task_facts, str(root), session.id, folder)
        try:
            prompts = step_prompts(step, top, facts, self._files)
        except Forbidden as exc:  # a load: file outside the project fails the step like any bad prompt
            raise InvalidInput(str(exc)) from None
        if self._outputs is not None:
            with suppress(TaskgateError):  # the manifest is a record: failing to write it never stops the step
                step_inputs = {"workflow": top.workflow, "frame": top.label, "step": step.id, **prompts.inputs}
                await self._outputs.record_inputs(session.id, {f"{_frame_key(top)}/{step.id}": step_inputs})
        return prompts.specs

    async def _root(self, project_id: int) -> str:
        """The project's root path; a project's root never changes once registered: read once per process."""
        root = self._roots.get(project_id)
        if root is None:
            async with self._uow(write=False) as uow:
                root = self._roots[project_id] = (await uow.projects.get(project_id)).root_path
        return root


def _frame_key(frame: Frame) -> str:
    return f"{frame.workflow}/{frame.name}" if frame.kind is FrameKind.group else frame.name
