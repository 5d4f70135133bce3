"""Stack edits and approvals: what operators and agents do to a session's workflow stack by hand (push a workflow
or a checklist, tick an item, advance, back, break, restart, answer an approval). Each edit runs under the
session's lock and saves in one version-checked transaction (see application/workflows/engine.py)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

from taskgate.application.workflows.records import StepEvent, StepRecords
from taskgate.application.workflows.views import StackView
from taskgate.domain.entities import Decision, Session, StepStatus
from taskgate.domain.errors import ConflictError, InvalidInput, InvalidTransition, TaskgateError
from taskgate.domain.states import SessionState
from taskgate.domain.workflows.definitions import Step, StepType, Workflow
from taskgate.domain.workflows.run import (
    MAX_DEPTH,
    Frame,
    FrameKind,
    FrameStatus,
    breadcrumb,
    child_results,
    enter,
    load_stack,
)
from taskgate.domain.workflows.templating import NAME as VARIABLE_NAME
from taskgate.domain.workflows.variables import session_folder_path
from taskgate.domain.workflows.visibility import Viewer, check_visible

PUSHABLE_STATES = frozenset(
    {
        SessionState.CREATED,
        SessionState.INITIALIZING,
        SessionState.READY,
        SessionState.PLANNING,
        SessionState.EXECUTING,
        SessionState.SUSPENDED,
    }
)


class StackEdits(StepRecords):
    """Stack edits and approval answers (a mixin of WorkflowEngine, which provides the catalogue, the lock,
    the view and the driver's kick)."""

    _sessions: Any
    _options: Any
    _outputs: Any  # OutputService | None
    # and, from WorkflowEngine: workflow, checklist, view, waiting, _lock, _kick_if_executing, _find, _now,
    # _workflow_frame, _steps, _hand_back

    async def add_workflow(
        self, session_id: str, name: str, actor: str, viewer: Viewer | None = None, *,
        inputs: RunInputs | None = None,
    ) -> StackView:  # fmt: skip
        """Push workflow `name` onto the session's stack (the root frame if the stack is empty), for `viewer` (who
        asks: the workflow's `visible_to` must allow it; None: the system). `inputs` (a run's `--input` and
        `--context`) become the new frame's variables and are recorded in the manifest.

        Raises: WorkflowNotFound, Forbidden (not visible to `viewer`), InvalidInput (stack too deep, the workflow
        already on it), InvalidTransition (the session is past executing), SessionNotFound.
        """
        workflow = self.workflow(name)
        check_visible(workflow.id, workflow.visible_to, viewer)  # before anything is read or written
        await self._place_folder(session_id, workflow)

        async def push(session: Session, stack: list[Frame]) -> list[StepEvent]:
            _check_depth(stack, session_id)
            if any(f.kind is FrameKind.workflow and f.name == name for f in stack):
                raise InvalidInput(f"workflow '{name}' is already on session {session_id}'s stack: {breadcrumb(stack)}")
            frame = self._workflow_frame(workflow, parent=stack[-1] if stack else None, parent_step=None)
            frame.variables.update(inputs.variables() if inputs is not None else {})
            stack.append(frame)
            pushed = {"workflow": name, "depth": len(stack), "actor": actor}
            return [("workflow.pushed", {**pushed, **({"inputs": inputs.as_dict()} if inputs is not None else {})})]

        view = await self._edit(session_id, "add_workflow_to_session", push)
        if self._outputs is not None:  # the session's workflow is named in its manifest, with what it was given
            with suppress(TaskgateError):
                if view.depth == 1:
                    described = {"name": name, "description": workflow.description}
                    await self._outputs.describe(session_id, workflow=described)
                if inputs is not None:
                    await self._outputs.record_inputs(session_id, {f"run/{name}": inputs.as_dict()})
        return view

    async def _place_folder(self, session_id: str, workflow: Workflow) -> None:
        """A root workflow with a `session_folder` template puts the session's folder there, before the push
        (a refusal, e.g. a folder that holds outputs already, writes nothing). Placing is idempotent, so a push
        refused afterwards leaves the folder's place chosen by this workflow, and nothing else."""
        if workflow.session_folder is None or self._outputs is None:
            return
        session = await self._sessions.get(session_id)
        if session.workflow_stack:  # nested: the session's folder is the root workflow's
            return
        relative = session_folder_path(workflow.session_folder, session.id, workflow.id,
                                       self._clock.now().date().isoformat(), session.task_id)  # fmt: skip
        await self._outputs.place(session_id, relative)

    def chosen(self, name: str | None, viewer: Viewer | None = None) -> Workflow | None:
        """The workflow a new session should run: `name`, else `[workflows] default`, else None. Call it
        before starting the session, so an unknown name (or one not visible to `viewer`) is refused before
        anything is written.

        Raises: WorkflowNotFound, Forbidden."""
        name = name or self._options.default_workflow
        workflow = self.workflow(name) if name else None
        if workflow is not None:
            check_visible(workflow.id, workflow.visible_to, viewer)
        return workflow

    async def attach(
        self, session_id: str, workflow: Workflow | None, actor: str, inputs: RunInputs | None = None
    ) -> StackView | None:
        """Push `workflow` (from `chosen`) as the session's root frame unless its stack already has one."""
        if workflow is None:
            return None
        session = await self._sessions.get(session_id)
        if session.workflow_stack:
            return self.view(session)
        return await self.add_workflow(session_id, workflow.id, actor, inputs=inputs)

    async def add_checklist(self, session_id: str, name: str, actor: str) -> StackView:
        """Push checklist `name`: the session's workflow waits until its required items are ticked."""
        checklist = self.checklist(name)

        async def push(session: Session, stack: list[Frame]) -> list[StepEvent]:
            _check_depth(stack, session_id)
            items = [{"id": i.id, "text": i.text, "required": i.required} for i in checklist.items]
            stack.append(Frame(FrameKind.checklist, checklist.id, items=items, started_at=self._now()))
            return [("workflow.pushed", {"checklist": checklist.id, "depth": len(stack), "actor": actor})]

        return await self._edit(session_id, "add_checklist_to_session", push)

    async def check_item(self, session_id: str, item: str, actor: str) -> StackView:
        """Tick `item` of the checklist the top frame waits on (ticking twice changes nothing).

        Raises: InvalidInput (no checklist waits, unknown item), SessionNotFound."""

        async def tick(session: Session, stack: list[Frame]) -> list[StepEvent]:
            top = stack[-1] if stack else None
            if (
                top is None
                or not top.items
                or (top.kind is not FrameKind.checklist and top.status is not FrameStatus.waiting)
            ):
                raise InvalidInput(
                    f"session {session_id} is not waiting on a checklist (stack: {breadcrumb(stack) or 'empty'})"
                )
            ids = [i["id"] for i in top.items]
            if item not in ids:
                raise InvalidInput(f"checklist item '{item}' is not on the list; items: {', '.join(ids)}")
            if item in top.checked:
                return []
            top.checked.append(item)
            return [("checklist.checked", {"item": item, "actor": actor, "missing": top.missing_items()})]

        return await self._edit(session_id, "checklist_check", tick)

    async def advance(self, session_id: str, actor: str) -> StackView:
        """Move the top frame past its current step by hand (it counts as skipped, routed as a success)."""

        async def skip(session: Session, stack: list[Frame]) -> list[StepEvent]:
            top = self._top(stack, session_id)
            on_list = top.kind is FrameKind.checklist or (top.items and top.status is FrameStatus.waiting)
            if on_list and (missing := top.missing_items()):
                raise InvalidInput(f"tick the checklist's required items first: {', '.join(missing)}")
            step = self._find(top, top.step) if top.step else None
            if step is not None and step.type is StepType.approval:
                raise InvalidInput(
                    f"step '{step.id}' is an approval: answer it with a decision (MCP project_decide, CLI "
                    "`taskgate session decide`)"
                )
            await self._abandon_step(session, top, StepStatus.SKIPPED, f"advanced by {actor}")
            top.status, top.outcome = FrameStatus.done, {"status": StepStatus.SKIPPED.value, "output": ""}
            return [("workflow.advanced", {"actor": actor, "step": top.step})]

        return await self._edit(session_id, "workflow_advance", skip)

    async def back(self, session_id: str, actor: str) -> StackView:
        """Return the top frame to the step it ran before the current one."""

        async def go_back(session: Session, stack: list[Frame]) -> list[StepEvent]:
            top = self._top(stack, session_id)
            if len(top.history) < 2:
                raise InvalidInput(f"{top.label} has no previous step to go back to")
            await self._abandon_step(session, top, StepStatus.CANCELLED, f"workflow_back by {actor}")
            previous = top.history[-2]
            top.history = top.history[:-2]
            enter(top, previous)
            return [("workflow.back", {"actor": actor, "step": previous})]

        return await self._edit(session_id, "workflow_back", go_back)

    async def break_frame(self, session_id: str, actor: str) -> StackView:
        """Leave the nested top frame (only when depth > 1); the step that pushed it counts as skipped."""

        async def leave(session: Session, stack: list[Frame]) -> list[StepEvent]:
            child = await self._leave_nested(session, stack, "workflow_break leaves", actor)
            parent = stack[-1]
            if child.parent_step is not None and parent.step == child.parent_step:
                await self._close_run(parent.run_id, StepStatus.SKIPPED, f"left by workflow_break ({actor})")
                parent.status, parent.outcome = FrameStatus.done, {"status": StepStatus.SKIPPED.value, "output": ""}
            return [("workflow.break", {"actor": actor, "left": child.label})]

        return await self._edit(session_id, "workflow_break", leave)

    async def continue_frame(self, session_id: str, actor: str) -> StackView:
        """End the nested top frame early as a success (only when depth > 1): its current step is stopped, and the
        step that pushed it succeeds with what the frame did so far (its last output and its structured result),
        so the frame below goes on along that step's success route. `break_frame` is the other way out."""

        async def finish_early(session: Session, stack: list[Frame]) -> list[StepEvent]:
            child = await self._leave_nested(session, stack, "workflow_continue ends", actor)
            parent = stack[-1]
            if child.parent_step is not None and parent.step == child.parent_step:
                note = f"ended early by workflow_continue ({actor})"
                await self._close_run(parent.run_id, StepStatus.SUCCEEDED, note)
                await self._hand_back(session, parent, child, StepStatus.SUCCEEDED, "")
            return [("workflow.continue", {"actor": actor, "left": child.label})]

        return await self._edit(session_id, "workflow_continue", finish_early)

    async def _leave_nested(self, session: Session, stack: list[Frame], what: str, actor: str) -> Frame:
        """The first half of break and continue: refuse at depth 1 (`what` says which, e.g. "workflow_break
        leaves"), stop the nested top frame's current step, and pop it. Returns the frame left."""
        if len(stack) < 2:
            raise InvalidInput(f"{what} a nested frame; session {session.id} is at depth {len(stack)}")
        child = stack[-1]
        await self._abandon_step(session, child, StepStatus.CANCELLED, f"{what.split()[0]} by {actor}")
        stack.pop()
        return child

    async def restart(self, session_id: str, actor: str) -> StackView:
        """Run the top frame again from its first step, with its results cleared."""

        async def from_the_top(session: Session, stack: list[Frame]) -> list[StepEvent]:
            top = self._top(stack, session_id)
            await self._abandon_step(session, top, StepStatus.CANCELLED, f"workflow_restart by {actor}")
            parent = stack[-2] if len(stack) > 1 else None
            top.results = child_results(parent, top.context_mode) if parent else {}
            top.own, top.trail, top.history, top.iterations, top.checked = [], [], [], 0, []
            top.step, top.status = None, FrameStatus.pending
            return [("workflow.restart", {"actor": actor, "frame": top.label})]

        return await self._edit(session_id, "workflow_restart", from_the_top)

    async def _edit(
        self, session_id: str, what: str, change: Callable[[Session, list[Frame]], Awaitable[list[StepEvent]]]
    ) -> StackView:
        """One stack edit (`what` names it in refusals): under the session's lock, `change` edits the stack as
        stored and returns the events that record it; stack and events are saved in one version-checked
        transaction (nothing is written when it returns none), then the driver is kicked if the session
        executes. Raises: whatever `change` raises (nothing written), InvalidTransition past executing."""
        async with self._lock(session_id):
            session, stack = await self._editable(session_id, what)
            events = await change(session, stack)
            if events:
                session = await self._save(session, stack, events=events)
        self._kick_if_executing(session)
        return self.view(session)

    def approval_step(self, session: Session) -> Step | None:
        """The approval step the session waits on, or None."""
        waiting = self.waiting(session) if session.state == SessionState.EXECUTING else None
        if waiting is None or waiting.kind != "approval" or waiting.step_id is None:
            return None
        return self._find(load_stack(session.workflow_stack)[-1], waiting.step_id)

    async def answer(self, session: Session, decision: Decision) -> Session:
        """Answer the approval step the session waits on with `decision` (approve → on_approve, reject →
        on_reject with the reason as instructions, request_changes → `changes_target`, with the instructions).
        The decision row, the step run, the stack and an event are written in one transaction.

        Raises: ConflictError when the session moved on meanwhile; AlreadyExists (the unique decision index)
        when another process recorded this operator's decision first."""
        status = {"approve": StepStatus.APPROVED, "reject": StepStatus.REJECTED,
                  "request_changes": StepStatus.CHANGES_REQUESTED}[decision.decision.value]  # fmt: skip
        async with self._lock(session.id), self._uow(write=True) as uow:
            current = await self._sessions.fence(uow, session.id, "the answer to a workflow approval step")
            step = self.approval_step(current)
            if current.version != session.version or step is None:
                raise ConflictError(f"session {session.id} moved on before the decision; read its status again")
            await uow.operators.lock(decision.operator_id)
            stack = load_stack(current.workflow_stack)
            top = stack[-1]
            now = self._clock.now()
            decided = replace(decision, at=now, outcome="applied", to_state=current.state.value)
            await uow.decisions.add(decided)
            payload = {"operator": decision.operator_id, "decision": decision.decision.value, "step": step.id,
                       "reason": decision.reason, "to_state": current.state.value}  # fmt: skip
            await uow.events.append("decision.recorded", now, payload, session.id)
            _instruct(top, step, decision)
            output = decision.instructions or decision.reason or ""
            await self._finish_run(uow, top.run_id, status, output, None, now)
            top.status, top.outcome = FrameStatus.done, {"status": status.value, "output": output}
            updated = await self._write(uow, current, stack, now)
            await uow.commit()
        self._kick_if_executing(updated)
        return updated

    async def _editable(self, session_id: str, what: str) -> tuple[Session, list[Frame]]:
        session = await self._sessions.get(session_id)
        if session.state not in PUSHABLE_STATES:
            allowed = ", ".join(sorted(s.value for s in PUSHABLE_STATES))
            raise InvalidTransition(session_id, session.state.value, what, [f"(states: {allowed})"])
        return session, load_stack(session.workflow_stack)


@dataclass(frozen=True, slots=True)
class RunInputs:
    """What a run gives its workflow (`workflow run --input TEXT --context JSON`): `input` is the root frame's
    `{{input}}`, each context key `k` is `{{context.k}}` (and conditions' `context.k`)."""

    input: str | None = None
    context: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | None, context_json: str | None) -> RunInputs:
        """From the command line. Raises: InvalidInput naming what is wrong (nothing is written)."""
        context: dict[str, str] = {}
        if context_json is not None:
            try:
                data = json.loads(context_json)
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"--context is not JSON: {exc.msg} at column {exc.colno}") from None
            if not isinstance(data, dict):
                raise InvalidInput(f"--context must be a JSON object of names to values, not {type(data).__name__}")
            for key, value in data.items():
                if not VARIABLE_NAME.fullmatch(key):
                    raise InvalidInput(f"--context key {key!r} is not a name (letters, digits, _ . -)")
                if isinstance(value, bool):
                    value = "true" if value else "false"
                if not isinstance(value, str | int | float):
                    raise InvalidInput(f"--context value of {key!r} must be text, a number or a boolean")
                context[key] = str(value)
        if text is not None and len(text) > MAX_INPUT:
            raise InvalidInput(f"--input is longer than {MAX_INPUT} characters")
        return cls(text, context)

    def variables(self) -> dict[str, str]:
        out = {f"context.{key}": value for key, value in self.context.items()}
        if self.input is not None:
            out["input"] = self.input
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"input": self.input, "context": dict(self.context)}


MAX_INPUT = 100_000


def _instruct(top: Frame, step: Step, decision: Decision) -> None:
    """What the steps after an approval are told: request_changes → the operator's instructions (or reason);
    a routed reject → why it was rejected; approve → nothing (earlier instructions are done with)."""
    kind, actor = decision.decision.value, f"operator:{decision.operator_id}"
    if kind == "request_changes":
        top.variables["instructions"] = decision.instructions or decision.reason or ""
    elif kind == "reject":
        why = decision.reason or "no reason given"
        top.variables["instructions"] = f"The work was rejected at step '{step.id}' (reject by {actor}): {why}"
    else:
        top.variables.pop("instructions", None)


def _check_depth(stack: list[Frame], session_id: str) -> None:
    if len(stack) >= MAX_DEPTH:
        raise InvalidInput(f"session {session_id}'s stack is {MAX_DEPTH} frames deep (the limit)")
