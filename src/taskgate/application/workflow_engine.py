"""Running workflows: a session's stack of frames, driven step by step while the session is `executing`.

The stack lives in `sessions.workflow_stack` (frames: domain/workflow_run.py); every step attempt is a row
of `step_runs`. `drive` moves the top frame one step at a time until it has to wait: for agents to end, for a
person (an approval, checklist items), or for a retry's delay. Agents ending, decisions, checklist ticks,
stack edits and entering `executing` each `kick` the driver again; when the stack is empty, `work_complete`
fires.

How races are prevented. In this process one asyncio lock per session serialises the driver and every stack
edit (push, advance, back, break, restart, checklist ticks, approval answers). Every save of the stack is a
write unit that locks the session row and checks its version, and bumps it: a second process (the CLI next to
`serve`) that read the stack before loses with ConcurrentModification and re-reads instead of acting twice. A
step's run row (with its agents' ids) and the frame marked `running` are written in the agent launcher's
transaction, together with the agents' rows and before any agent process starts ("claim, then act"): a
driver that lost the race rolls back its agents with its claim, so only one driver launches them.

Commits per step. A step's outcome and its routing are one transaction; when the routing leads to an agent
step, that step's claim and its agents' rows join it. An agent step therefore costs one commit of taskgate's
own (benchmarks/workflow_overhead.py), plus whatever the agent supervisor records while its agents run.

Restart: `recover` kicks every executing session that has a stack; the driver then collects agents that
ended while nobody watched (AgentService.recover, run first, re-attaches the agents still running and fails
those whose process is gone or never started) and waits out a retry's remaining delay.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from taskgate.application.effects import NOTHING, Aftermath, NoEffects
from taskgate.application.ports import Clock, StepClaim, UnitOfWork, UnitOfWorkFactory
from taskgate.application.sessions import FireResult, FireTrigger, SessionService
from taskgate.domain.agents import why_stopped
from taskgate.domain.entities import (
    OPEN_STEP_STATUSES,
    Agent,
    AgentStatus,
    Decision,
    Session,
    StepRun,
    StepStatus,
)
from taskgate.domain.errors import (
    ConcurrentModification,
    ConflictError,
    InvalidInput,
    InvalidTransition,
    TaskgateError,
)
from taskgate.domain.expressions import ExpressionError, parse_condition
from taskgate.domain.states import SessionState, Trigger
from taskgate.domain.variables import VariableError, resolve
from taskgate.domain.workflow_run import (
    MAX_DEPTH,
    OUTPUT_LIMIT,
    Frame,
    FrameKind,
    FrameStatus,
    LoopLimits,
    breadcrumb,
    child_results,
    condition_target,
    dump_stack,
    enter,
    find_group,
    find_step,
    fingerprint,
    frame_context,
    iteration_problem,
    load_stack,
    merge_back,
    record,
    repeat_problem,
    route,
    summary,
)
from taskgate.domain.workflows import (
    END,
    Catalogue,
    Checklist,
    ChecklistNotFound,
    ContextMode,
    Step,
    StepType,
    Workflow,
    WorkflowNotFound,
    changes_target,
    matches_pattern,
    retry_delay_ms,
)

SYSTEM_ACTOR = "system"
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
_CLOSE_ON = frozenset({SessionState.FAILED, SessionState.CANCELLED, SessionState.TIMED_OUT, SessionState.ABANDONED})
_AGENT_STEPS = frozenset({StepType.agent, StepType.parallel})
_LIVE = frozenset({AgentStatus.QUEUED, AgentStatus.RUNNING})


@dataclass(frozen=True, slots=True)
class WorkflowOptions:
    """`[workflows]` settings: the workflow a new session runs (None: none, agents run as configured) and
    the loop guard."""

    default_workflow: str | None = None
    limits: LoopLimits = field(default_factory=LoopLimits)


@dataclass(frozen=True, slots=True)
class Waiting:
    """What the top frame waits for, if a person must act: an approval (with its message) or checklist items."""

    kind: str  # approval | checklist
    step_id: str | None
    message: str
    items: tuple[dict[str, Any], ...] = ()
    missing: tuple[str, ...] = ()
    since_version: int = 0


@dataclass(frozen=True, slots=True)
class StackView:
    """The session's stack as `session_status` shows it."""

    session_id: str
    state: str
    depth: int
    breadcrumb: str
    frames: tuple[dict[str, Any], ...]
    waiting: Waiting | None
    version: int


_Event = tuple[str, dict[str, Any]]  # an event kind and its payload, appended with the write it records


@dataclass(slots=True)
class _Carry:
    """Writes of a step's outcome that travel with its routing, so both land in one transaction."""

    finish: list[tuple[int | None, StepStatus, str, str | None]] = field(default_factory=list)
    events: list[_Event] = field(default_factory=list)
    runs: list[StepRun] = field(default_factory=list)  # run rows written already ended (a condition, a refusal)

    def then(self, later: _Carry | None) -> _Carry:
        """These writes, followed by `later`'s."""
        if later is None:
            return self
        return _Carry([*self.finish, *later.finish], [*self.events, *later.events], [*self.runs, *later.runs])


class StepLauncher(Protocol):
    """What the engine needs of the agents (AgentService)."""

    async def launch_step(
        self,
        session_id: str,
        specs: Sequence[tuple[str, str]],
        *,
        instructions: str,
        timeout_s: float | None,
        claim: StepClaim | None = None,
    ) -> list[Agent]:
        """Launch the step's agents; `claim(uow, agent_ids)` runs in the transaction that writes their rows,
        before any of them starts."""
        ...

    async def stop_agents(self, session_id: str, agent_ids: Sequence[str]) -> None: ...
    async def wait(self, session_id: str) -> None: ...


class VerificationDecider(Protocol):
    """What the engine needs of DecisionService: to take an operator's approval as the verification decision."""

    async def decide(self, cmd: Any) -> Any: ...


class WorkflowEngine(NoEffects):
    """Runs workflow stacks; also a session effect (it drives a session that enters executing)."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        sessions: SessionService,
        catalogue: Callable[[], Catalogue],
        clock: Clock,
        options: WorkflowOptions | None = None,
        launcher: StepLauncher | None = None,
    ) -> None:
        self._uow, self._sessions, self._load_catalogue, self._clock = uow, sessions, catalogue, clock
        self._options = options or WorkflowOptions()
        self._launcher = launcher
        self._catalogue: Catalogue | None = None
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._queued: set[str] = set()  # sessions with a driver task that has not taken the lock yet
        self._tasks: dict[str, set[asyncio.Task]] = {}
        # the session as the running driver's last save left it: the driver's next pass starts from it instead
        # of reading it again. Safe because every write is version-checked: a change made meanwhile by anyone
        # else makes the next save fail with ConcurrentModification, after which the driver reads afresh.
        # (a key is present only while its session's drive runs; stack edits outside a drive record nothing)
        self._written: dict[str, Session | None] = {}
        self._roots: dict[int, str] = {}  # project id → root path (immutable), for `{project-root}`
        self._decisions: VerificationDecider | None = None

    def use_decisions(self, decisions: VerificationDecider) -> None:
        """Take a workflow's last approval as the verification decision through `decisions` (DecisionService),
        so its guards apply and the decision is recorded (the composition root attaches it)."""
        self._decisions = decisions

    def use_launcher(self, launcher: StepLauncher) -> None:
        """Attach the agents (the composition root does this once: agents and engine need each other)."""
        self._launcher = launcher

    @property
    def options(self) -> WorkflowOptions:
        return self._options

    # -- the catalogue -------------------------------------------------------------------------------------

    def catalogue(self, *, refresh: bool = False) -> Catalogue:
        """The validated catalogue, read once and again on `refresh` (or when a name is missing)."""
        if self._catalogue is None or refresh:
            self._catalogue = self._load_catalogue()
        return self._catalogue

    def workflow(self, name: str) -> Workflow:
        """A valid workflow by id. Raises: WorkflowNotFound (naming the ones there are)."""
        found = self.catalogue().workflows.get(name) or self.catalogue(refresh=True).workflows.get(name)
        if found is None:
            raise WorkflowNotFound(f"{name} (known: {', '.join(sorted(self.catalogue().workflows)) or 'none'})")
        return found

    def checklist(self, name: str) -> Checklist:
        """A valid checklist by id. Raises: ChecklistNotFound (naming the ones there are)."""
        found = self.catalogue().checklists.get(name) or self.catalogue(refresh=True).checklists.get(name)
        if found is None:
            raise ChecklistNotFound(f"{name} (known: {', '.join(sorted(self.catalogue().checklists)) or 'none'})")
        return found

    def query_workflows(self, pattern: str | None = None, category: str | None = None) -> list[Workflow]:
        """Valid workflows whose id or description matches `pattern` (a glob, or a substring), by category, id."""
        found = self.catalogue(refresh=True).workflows.values()
        out = [w for w in found if matches_pattern(pattern, w.id, w.description) and category in (None, w.category)]
        return sorted(out, key=lambda w: (w.category or "", w.id))

    def query_checklists(self, pattern: str | None = None) -> list[Checklist]:
        """Valid checklists whose id or description matches `pattern`, by id."""
        found = self.catalogue(refresh=True).checklists.values()
        return sorted((c for c in found if matches_pattern(pattern, c.id, c.description)), key=lambda c: c.id)

    # -- reading a stack ------------------------------------------------------------------------------------

    def view(self, session: Session) -> StackView:
        """Depth, breadcrumb, frames and what a person must do, from the stored stack."""
        stack = load_stack(session.workflow_stack)
        frames = tuple(
            {
                "kind": f.kind.value,
                "name": f.name,
                "step": f.step,
                "status": f.status.value,
                "attempt": f.attempt,
                "context_mode": f.context_mode.value,
                "iterations": f.iterations,
            }
            for f in stack
        )
        return StackView(
            session.id,
            session.state.value,
            len(stack),
            breadcrumb(stack),
            frames,
            self.waiting(session),
            session.version,
        )

    def waiting(self, session: Session) -> Waiting | None:
        """What the session's top frame waits for from a person, or None."""
        stack = load_stack(session.workflow_stack)
        if not stack:
            return None
        top = stack[-1]
        if top.kind is FrameKind.checklist:
            return Waiting("checklist", None, top.name, tuple(top.items), tuple(top.missing_items()), session.version)
        if top.status is not FrameStatus.waiting or top.step is None:
            return None
        step = self._find(top, top.step)
        if step is None:
            return None
        if step.type is StepType.approval:
            return Waiting("approval", step.id, step.message or "", since_version=session.version)
        return Waiting("checklist", step.id, step.description or step.checklist or step.id, tuple(top.items),
                       tuple(top.missing_items()), session.version)  # fmt: skip

    async def step_runs(self, session_id: str, limit: int = 200) -> list[StepRun]:
        async with self._uow(write=False) as uow:
            await uow.sessions.get(session_id)
            return await uow.step_runs.of_session(session_id, limit)

    # -- stack edits ----------------------------------------------------------------------------------------

    async def add_workflow(self, session_id: str, name: str, actor: str) -> StackView:
        """Push workflow `name` onto the session's stack (the root frame if the stack is empty).

        Raises: WorkflowNotFound, InvalidInput (stack too deep, the workflow already on it), InvalidTransition
        (the session is past executing), SessionNotFound.
        """
        workflow = self.workflow(name)

        async def push(session: Session, stack: list[Frame]) -> list[_Event]:
            _check_depth(stack, session_id)
            if any(f.kind is FrameKind.workflow and f.name == name for f in stack):
                raise InvalidInput(f"workflow '{name}' is already on session {session_id}'s stack: {breadcrumb(stack)}")
            stack.append(self._workflow_frame(workflow, parent=stack[-1] if stack else None, parent_step=None))
            return [("workflow.pushed", {"workflow": name, "depth": len(stack), "actor": actor})]

        return await self._edit(session_id, "add_workflow_to_session", push)

    def chosen(self, name: str | None) -> Workflow | None:
        """The workflow a new session should run: `name`, else `[workflows] default`, else None. Call it
        before starting the session, so an unknown name is refused before anything is written.

        Raises: WorkflowNotFound."""
        name = name or self._options.default_workflow
        return self.workflow(name) if name else None

    async def attach(self, session_id: str, workflow: Workflow | None, actor: str) -> StackView | None:
        """Push `workflow` (from `chosen`) as the session's root frame unless its stack already has one."""
        if workflow is None:
            return None
        session = await self._sessions.get(session_id)
        if session.workflow_stack:
            return self.view(session)
        return await self.add_workflow(session_id, workflow.id, actor)

    async def add_checklist(self, session_id: str, name: str, actor: str) -> StackView:
        """Push checklist `name`: the session's workflow waits until its required items are ticked."""
        checklist = self.checklist(name)

        async def push(session: Session, stack: list[Frame]) -> list[_Event]:
            _check_depth(stack, session_id)
            items = [{"id": i.id, "text": i.text, "required": i.required} for i in checklist.items]
            stack.append(Frame(FrameKind.checklist, checklist.id, items=items, started_at=self._now()))
            return [("workflow.pushed", {"checklist": checklist.id, "depth": len(stack), "actor": actor})]

        return await self._edit(session_id, "add_checklist_to_session", push)

    async def check_item(self, session_id: str, item: str, actor: str) -> StackView:
        """Tick `item` of the checklist the top frame waits on (ticking twice changes nothing).

        Raises: InvalidInput (no checklist waits, unknown item), SessionNotFound."""

        async def tick(session: Session, stack: list[Frame]) -> list[_Event]:
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

        async def skip(session: Session, stack: list[Frame]) -> list[_Event]:
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

        async def go_back(session: Session, stack: list[Frame]) -> list[_Event]:
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

        async def leave(session: Session, stack: list[Frame]) -> list[_Event]:
            if len(stack) < 2:
                raise InvalidInput(
                    f"workflow_break leaves a nested frame; session {session_id} is at depth {len(stack)}"
                )
            child = stack[-1]
            await self._abandon_step(session, child, StepStatus.CANCELLED, f"workflow_break by {actor}")
            stack.pop()
            parent = stack[-1]
            if child.parent_step is not None and parent.step == child.parent_step:
                await self._close_run(parent.run_id, StepStatus.SKIPPED, f"left by workflow_break ({actor})")
                parent.status, parent.outcome = FrameStatus.done, {"status": StepStatus.SKIPPED.value, "output": ""}
            return [("workflow.break", {"actor": actor, "left": child.label})]

        return await self._edit(session_id, "workflow_break", leave)

    async def restart(self, session_id: str, actor: str) -> StackView:
        """Run the top frame again from its first step, with its results cleared."""

        async def from_the_top(session: Session, stack: list[Frame]) -> list[_Event]:
            top = self._top(stack, session_id)
            await self._abandon_step(session, top, StepStatus.CANCELLED, f"workflow_restart by {actor}")
            parent = stack[-2] if len(stack) > 1 else None
            top.results = child_results(parent, top.context_mode) if parent else {}
            top.own, top.trail, top.history, top.iterations, top.checked = [], [], [], 0, []
            top.step, top.status = None, FrameStatus.pending
            return [("workflow.restart", {"actor": actor, "frame": top.label})]

        return await self._edit(session_id, "workflow_restart", from_the_top)

    async def _edit(
        self, session_id: str, what: str, change: Callable[[Session, list[Frame]], Awaitable[list[_Event]]]
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

    # -- approvals --------------------------------------------------------------------------------------------

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
            current = await uow.sessions.get(session.id, lock=True)
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

    # -- driving ----------------------------------------------------------------------------------------------

    def kick(self, session_id: str) -> None:
        """Drive the session in the background (coalesced: one waiting driver per session is enough)."""
        if session_id in self._queued:
            return
        self._queued.add(session_id)
        task = asyncio.create_task(self.drive(session_id, queued=True))
        tasks = self._tasks.setdefault(session_id, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def wait(self, session_id: str) -> None:
        """Until the session's driver has nothing left to do in this process (its agents ended, its retry
        delays passed): it ended, or it waits for a person."""
        while True:
            tasks = list(self._tasks.get(session_id, ()))
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
                continue
            if self._launcher is not None:
                await self._launcher.wait(session_id)
            if not self._tasks.get(session_id):
                return

    async def drive(self, session_id: str, *, queued: bool = False) -> None:
        """Move the session's stack on until it must wait, or the session leaves executing."""
        async with self._lock(session_id):
            if queued:
                self._queued.discard(session_id)
            await self._drive_locked(session_id)

    async def _drive_locked(self, session_id: str) -> None:
        self._written[session_id] = None  # each drive starts from what the database holds
        try:
            for _ in range(100_000):  # every pass moves a frame or returns; this only bounds a bug
                try:
                    if not await self._step_once(session_id):
                        return
                except ConcurrentModification:
                    self._written[session_id] = None
                    continue  # another process moved the session: read it again
                except (InvalidTransition, ConflictError):
                    return
        finally:
            del self._written[session_id]

    async def agents_ended(self, session_id: str) -> None:
        """AgentService calls this when an agent of a workflow session ended."""
        self.kick(session_id)

    async def recover(self) -> list[str]:
        """At start: drive every executing session that has a stack (after AgentService.recover)."""
        sessions = await self._sessions.list_sessions(states={SessionState.EXECUTING})
        report = []
        for session in sessions:
            if session.workflow_stack:
                self.kick(session.id)
                report.append(
                    f"session {session.id}: workflow resumed at {breadcrumb(load_stack(session.workflow_stack))}"
                )
        return report

    # -- the session effect ---------------------------------------------------------------------------------

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        session = result.session
        if session.state in _CLOSE_ON:
            await self._close_open_runs(session, cmd)
        if session.state == SessionState.EXECUTING and session.workflow_stack:
            # never take the engine's lock here (the driver holds it while it fires): only queue a driver
            self.kick(session.id)
        return NOTHING

    # -- one step of the driver -----------------------------------------------------------------------------

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

    async def _start(
        self, session: Session, stack: list[Frame], top: Frame, step: Step, steps, carry: _Carry | None = None
    ) -> bool:
        """Start the top frame's pending step. `carry` (the routing that led here) is accepted only for agent
        steps, whose claim it joins; the other kinds are started by the driver's next pass."""
        assert carry is None or step.type in _AGENT_STEPS
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
            source = step.items or self.checklist(step.checklist or "").items
            top.items = [{"id": i.id, "text": i.text, "required": i.required} for i in source]
            top.checked = []
            event = ("workflow.waiting", {"step": step.id, "checklist": [i["id"] for i in top.items]})
            await self._open_run(session, stack, top, step, StepStatus.WAITING, FrameStatus.waiting, event=event)
            return True
        if step.type in (StepType.workflow, StepType.group):
            return await self._push_child(session, stack, top, step)
        return await self._launch(session, stack, top, step, carry)

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
        return await self._goto(session, stack, top, target, carry=_Carry(runs=[replace(run, ended_at=now)]))

    async def _launch(
        self, session: Session, stack: list[Frame], top: Frame, step: Step, carry: _Carry | None = None
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
            earlier = (carry or _Carry()).then(_Carry(runs=[refused]))
            return await self._finish_step(session, stack, StepStatus.FAILED, str(exc), earlier)
        return True

    async def _collect(self, session: Session, stack: list[Frame], top: Frame, step: Step, steps) -> bool:
        """A running agent step: when its agents all ended, its outcome; else wait (False)."""
        if step.type not in _AGENT_STEPS:  # a child frame ran for it and is gone: count the step done
            return await self._finish_step(session, stack, StepStatus.SUCCEEDED, "")
        closed, run = await self._closed_run(top)
        if closed:  # its agents were stopped when the session left executing; a retry brought it back
            return await self._interrupted(session, stack, top, step, steps, run)
        if not top.agents:  # a running step that names no agents: not written since a claim and its agents
            note = "its agents never started; launched again"  # share one transaction (an older release's
            never = _Carry(finish=[(top.run_id, StepStatus.CANCELLED, "", note)])  # stack): launch them now
            top.status, top.run_id = FrameStatus.pending, None
            return await self._launch(session, stack, top, step, never)
        async with self._uow(write=False) as uow:
            mine = await uow.agents.many(top.agents)
        if any(a.status in _LIVE for a in mine):
            return False
        status, output = _agents_outcome(step, mine)
        return await self._finish_step(session, stack, status, output)

    async def _closed_run(self, top: Frame) -> tuple[bool, StepRun | None]:
        """Whether the top frame's current run is closed (or missing) although the frame still runs or waits on
        it, i.e. the session left executing meanwhile (`_close_open_runs`); and the run."""
        if top.run_id is None:
            return True, None
        async with self._uow(write=False) as uow:
            run = await uow.step_runs.get(top.run_id)
        return run.status not in OPEN_STEP_STATUSES, run

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
        if step.type in _AGENT_STEPS:
            live = [a.id for a in await self._agents(top) if a.status in _LIVE]
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

    async def _retry(self, session: Session, stack: list[Frame], top: Frame) -> bool:
        due = datetime.fromisoformat(top.retry_at) if top.retry_at else self._clock.now()
        remaining = (due - self._clock.now()).total_seconds()
        if remaining > 0:
            self._after_delay(session.id, remaining)
            return False
        top.status, top.attempt, top.retry_at, top.outcome = FrameStatus.pending, top.attempt + 1, None, None
        top.iterations -= 1 if top.iterations else 0  # a retry is the same step run, counted once
        await self._save(session, stack)
        return True

    async def _route(
        self, session: Session, stack: list[Frame], top: Frame, step: Step, steps, carry: _Carry | None = None
    ) -> bool:
        outcome = top.outcome or {"status": StepStatus.FAILED.value, "output": ""}
        status, output = StepStatus(outcome["status"]), str(outcome.get("output", ""))
        if status is StepStatus.FAILED and top.attempt <= step.max_retries and step.type is not StepType.approval:
            delay = retry_delay_ms(step, top.attempt) / 1000
            top.status, top.retry_at = FrameStatus.retry, (self._clock.now() + timedelta(seconds=delay)).isoformat()
            retry = {"step": step.id, "attempt": top.attempt + 1, "delay_s": delay}
            await self._save(session, stack, carry=carry, events=[("workflow.retry", retry)])
            return True
        record(top, step.id, status, output, top.attempt)
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

    async def _goto(self, session: Session, stack: list[Frame], top: Frame, target: str, carry: _Carry | None) -> bool:
        """Move the top frame to `target` (or end it). An agent step is started at once, so the routing that
        led to it joins its claim: one commit instead of two."""
        if target == END:
            top.outcome = {"status": StepStatus.SUCCEEDED.value, "output": ""}
            await self._pop(session, stack, StepStatus.SUCCEEDED, "", carry=carry)
            return True
        enter(top, target)
        following = self._find(top, target)
        if following is not None and following.type in _AGENT_STEPS:
            return await self._start(session, stack, top, following, (), carry)
        await self._save(session, stack, carry=carry)
        return True

    async def _push_child(self, session: Session, stack: list[Frame], top: Frame, step: Step) -> bool:
        if len(stack) >= MAX_DEPTH:
            await self._fail(session, stack, f"step '{step.id}': the stack is {MAX_DEPTH} frames deep (the limit)")
            return False
        if step.type is StepType.workflow:
            child = self._workflow_frame(self.workflow(step.workflow or ""), parent=top, parent_step=step.id)
            if top.variables.get("instructions"):  # the operator's, for the work this step redoes
                child.variables["instructions"] = top.variables["instructions"]
            if step.input and step.input in top.results:
                child.variables["input"] = str(top.results[step.input].get("output", ""))
        else:
            mode = step.context_mode or ContextMode.isolated
            child = Frame(
                FrameKind.group, step.id, workflow=top.workflow, context_mode=mode, summarize=step.summarize,
                parent_step=step.id, results=child_results(top, mode), variables=dict(top.variables),
                max_iterations=top.max_iterations, started_at=self._now(), deadline=top.deadline,
            )  # fmt: skip
        event = ("workflow.pushed", {"frame": child.label, "by_step": step.id, "depth": len(stack) + 1})
        await self._open_run(
            session, stack, top, step, StepStatus.RUNNING, FrameStatus.running, event=event, push=child
        )
        return True

    async def _pop(
        self, session: Session, stack: list[Frame], status: StepStatus, output: str, carry: _Carry | None = None
    ) -> None:
        """The top frame ended: hand its outcome to the step below that pushed it (if any), then drop it."""
        child = stack.pop()
        events = [("workflow.popped", {"frame": child.label, "status": status.value, "depth": len(stack)})]
        finish = []
        if stack and child.parent_step is not None and stack[-1].step == child.parent_step:
            parent = stack[-1]
            merge_back(parent, child)
            if child.kind is FrameKind.group and child.summarize:
                output = summary(child, self._steps(child))
            elif status is StepStatus.SUCCEEDED:
                output = _last_output(child)
            parent.status, parent.outcome = FrameStatus.done, {"status": status.value, "output": output[-OUTPUT_LIMIT:]}
            finish.append((parent.run_id, status, output, output if status is StepStatus.FAILED else None))
        await self._save(session, stack, finish=finish, events=events, carry=carry)

    def _outcome(self, top: Frame, status: StepStatus, output: str) -> _Carry:
        """Record the outcome of the top frame's current step in the frame; its run row and event ride along
        with whatever routing writes next (one transaction)."""
        error = output if status is StepStatus.FAILED else None
        top.status, top.outcome = FrameStatus.done, {"status": status.value, "output": output[-OUTPUT_LIMIT:]}
        event = {"step": top.step, "frame": top.label, "attempt": top.attempt, "status": status.value}
        return _Carry([(top.run_id, status, output, error)], [("workflow.step", event)])

    async def _finish_step(
        self, session: Session, stack: list[Frame], status: StepStatus, output: str, earlier: _Carry | None = None
    ) -> bool:
        """The top frame's current step ended with `status`: record it and route it (after `earlier`'s writes),
        in one transaction."""
        top = stack[-1]
        carry = (earlier or _Carry()).then(self._outcome(top, status, output))
        step = self._find(top, top.step or "")
        if step is None:  # the file changed under the running step: routing fails the session with why
            await self._save(session, stack, carry=carry)
            return True
        return await self._route(session, stack, top, step, self._steps(top), carry)

    async def _complete(self, session: Session) -> None:
        cmd = FireTrigger(session.id, Trigger.WORK_COMPLETE.value, SYSTEM_ACTOR, reason="workflow finished",
                          expected_version=session.version)  # fmt: skip
        try:
            result = await self._sessions.fire(cmd)
        except (InvalidTransition, ConcurrentModification):
            return
        approval = await self._last_gate(session.id)
        if approval is not None and self._decisions is not None:  # outside the driver's lock: a task of its own
            self._spawn(session.id, self._decide_verification(result.session, *approval))

    async def _last_gate(self, session_id: str) -> tuple[Decision, str] | None:
        """The operator's approval that ended the workflow, with its step: the session's last decision approved
        a workflow approval step, and no agent ran after that step (conditions, checklists and frames that ran
        no agents may follow). None otherwise: the work changed after the last approval, so it is verified."""
        async with self._uow(write=False) as uow:
            decisions = await uow.decisions.of_session(session_id, limit=5)
            runs = await uow.step_runs.of_session(session_id, limit=200)
        applied = [d for d in decisions if d.outcome == "applied"]
        last = applied[-1] if applied else None
        if last is None or last.decision.value != "approve" or last.to_state != SessionState.EXECUTING.value:
            return None
        approved = [i for i, r in enumerate(runs) if r.status is StepStatus.APPROVED]
        if not approved or any(r.agent_ids for r in runs[approved[-1] + 1 :]):
            return None
        return last, runs[approved[-1]].step_id

    async def _decide_verification(self, session: Session, approval: Decision, step_id: str) -> None:
        """Apply `approval` (given at the workflow's last approval step) as the verification decision, by the
        same operator, through DecisionService: its guards apply (a refusal is logged as blocked and the session
        stays verifying) and the decision is recorded like any other."""
        from taskgate.application.decisions import Decide  # decisions.py imports this module

        assert self._decisions is not None
        why = f"approved at the workflow's last approval step '{step_id}'" + (
            f": {approval.reason}" if approval.reason else ""
        )
        cmd = Decide(session.id, approval.operator_id, "approve", reason=why[:2000], expected_version=session.version)
        with suppress(TaskgateError):
            await self._decisions.decide(cmd)

    async def _fail(self, session: Session, stack: list[Frame], reason: str, carry: _Carry | None = None) -> None:
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

    # -- persistence ------------------------------------------------------------------------------------------

    async def _save(
        self,
        session: Session,
        stack: list[Frame],
        *,
        runs: Sequence[StepRun] = (),
        finish: Sequence[tuple[int | None, StepStatus, str, str | None]] = (),
        events: Sequence[_Event] = (),
        claim: tuple[Frame, StepRun] | None = None,
        carry: _Carry | None = None,
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
        events: Sequence[_Event] = (),
        claim: tuple[Frame, StepRun] | None = None,
        carry: _Carry | None = None,
    ) -> Session:
        """`_save`'s writes inside `uow` (the caller commits)."""
        if carry is not None:
            runs, finish, events = [*carry.runs, *runs], [*carry.finish, *finish], [*carry.events, *events]
        current = await uow.sessions.get(session.id, lock=True)
        if current.version != session.version:
            raise ConcurrentModification(session.id, session.version, current.version)
        now = self._clock.now()
        for run in runs:
            await uow.step_runs.add(run)
        for run_id, status, output, error in finish:
            await self._finish_run(uow, run_id, status, output, error, now)
        if claim is not None:
            claim[0].run_id = await uow.step_runs.add(claim[1])
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
        event: _Event | None = None,
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
            await uow.step_runs.finish(run_id, status, now, output[-OUTPUT_LIMIT:], error)

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

    # -- helpers ----------------------------------------------------------------------------------------------

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    async def _editable(self, session_id: str, what: str) -> tuple[Session, list[Frame]]:
        session = await self._sessions.get(session_id)
        if session.state not in PUSHABLE_STATES:
            allowed = ", ".join(sorted(s.value for s in PUSHABLE_STATES))
            raise InvalidTransition(session_id, session.state.value, what, [f"(states: {allowed})"])
        return session, load_stack(session.workflow_stack)

    @staticmethod
    def _top(stack: list[Frame], session_id: str) -> Frame:
        if not stack:
            raise InvalidInput(f"session {session_id} runs no workflow (its stack is empty)")
        return stack[-1]

    def _kick_if_executing(self, session: Session) -> None:
        if session.state == SessionState.EXECUTING:
            self.kick(session.id)

    def _after_delay(self, session_id: str, seconds: float) -> None:
        async def later() -> None:
            await self._clock.sleep(seconds)
            self.kick(session_id)

        self._spawn(session_id, later())

    def _spawn(self, session_id: str, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` as a task of the session's (`wait` waits for it)."""
        task = asyncio.create_task(work)
        tasks = self._tasks.setdefault(session_id, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _workflow_frame(self, workflow: Workflow, *, parent: Frame | None, parent_step: str | None) -> Frame:
        now = self._clock.now()
        deadline = (now + timedelta(seconds=workflow.max_duration_s)).isoformat() if workflow.max_duration_s else None
        variables = dict(parent.variables) if parent else {}
        variables.pop("instructions", None)
        variables.update(workflow.variables)
        return Frame(FrameKind.workflow, workflow.id, workflow=workflow.id, parent_step=parent_step,
                     variables=variables, max_iterations=workflow.max_iterations, started_at=now.isoformat(),
                     deadline=deadline)  # fmt: skip

    def _steps(self, frame: Frame) -> tuple[Step, ...]:
        workflow = self.workflow(frame.workflow or frame.name)
        if frame.kind is FrameKind.workflow:
            return workflow.steps
        group = find_group(workflow.steps, frame.name)
        if group is None:
            raise WorkflowNotFound(f"{workflow.id}/{frame.name} (the group is gone from the file)")
        return group.steps

    def _find(self, frame: Frame, step_id: str) -> Step | None:
        try:
            return find_step(self._steps(frame), step_id)
        except TaskgateError:
            return None

    def _past_deadline(self, frame: Frame) -> str | None:
        if frame.deadline and self._clock.now() > datetime.fromisoformat(frame.deadline):
            return f"{frame.label} ran past its max_duration (deadline {frame.deadline})"
        return None

    def _now(self) -> str:
        return self._clock.now().isoformat()

    async def _context(self, session: Session, top: Frame) -> dict[str, Any]:
        async with self._uow(write=False) as uow:
            task = await uow.tasks.get(session.task_id, with_blockers=False)
        facts = {"id": task.id, "title": task.title, "description": task.description, "priority": task.priority,
                 "labels": list(getattr(task, "labels", ()) or ())}  # fmt: skip
        return frame_context(top, facts, {"id": session.id, "state": session.state.value})

    async def _agent_specs(self, session: Session, top: Frame, step: Step) -> list[tuple[str, str]]:
        """(agent type, prompt) per agent of the step, the prompts' variables resolved."""
        pairs = (
            [(step.agent or "", step.prompt)]
            if step.type is StepType.agent
            else [(a.agent, a.prompt or step.prompt) for a in step.agents]
        )
        async with self._uow(write=False) as uow:
            task = await uow.tasks.get(session.task_id, with_blockers=False)
            root = self._roots.get(session.project_id)
            if root is None:  # a project's root never changes once registered: read it once per process
                root = self._roots[session.project_id] = (await uow.projects.get(session.project_id)).root_path
        builtins = {"project-root": root, "session_id": session.id,
                    "session-folder": session.state_data.get("session_folder", "")}  # fmt: skip
        variables = {**top.variables, "task.id": task.id, "task.title": task.title,
                     "task.description": task.description, "task.priority": str(task.priority)}  # fmt: skip
        given = step.input and top.results.get(step.input)
        if given:
            variables["input"] = str(given.get("output", ""))
        variables.setdefault("input", "")
        variables.setdefault("instructions", "")
        out = []
        for agent, prompt in pairs:
            text = resolve(prompt or "", builtins, variables)
            if given and "{{input}}" not in (prompt or ""):
                text += f"\n\nOutput of step '{step.input}':\n{variables['input']}"
            if variables["instructions"]:
                text += f"\n\nThe operator's instructions:\n{variables['instructions']}"
            out.append((agent, text))
        return out


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


def _agents_outcome(step: Step, agents: list[Agent]) -> tuple[StepStatus, str]:
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


def _last_output(frame: Frame) -> str:
    for step_id in reversed(frame.own):
        out = frame.results.get(step_id, {}).get("output")
        if out:
            return str(out)
    return ""


def _frame_name(frame: Frame) -> str:
    if frame.kind is FrameKind.group:
        return f"{frame.workflow}/{frame.name}"
    if frame.kind is FrameKind.checklist:
        return f"checklist:{frame.name}"
    return frame.name


def stack_view_json(view: StackView) -> dict[str, Any]:
    """The view as plain JSON (CLI --json, MCP models)."""
    waiting = None
    if view.waiting is not None:
        w = view.waiting
        waiting = {"kind": w.kind, "step": w.step_id, "message": w.message, "items": list(w.items),
                   "missing": list(w.missing)}  # fmt: skip
    return {"session_id": view.session_id, "state": view.state, "depth": view.depth, "breadcrumb": view.breadcrumb,
            "frames": list(view.frames), "waiting": waiting}  # fmt: skip
