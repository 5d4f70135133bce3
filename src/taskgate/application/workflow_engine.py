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
import logging
import weakref
from collections.abc import Callable, Coroutine, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from taskgate.application.effects import NOTHING, Aftermath, NoEffects
from taskgate.application.outputs import OutputService
from taskgate.application.ports import (
    Clock,
    ProjectFiles,
    StepClaim,
    UnitOfWork,
    UnitOfWorkFactory,
    WorkspaceContext,
)
from taskgate.application.sessions import FireResult, FireTrigger, SessionService
from taskgate.application.workflow_edits import StackEdits
from taskgate.application.workflow_prompts import PromptFacts, step_prompts
from taskgate.application.workflow_records import Carry
from taskgate.application.workflow_views import StackView, Waiting
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
    Forbidden,
    InvalidInput,
    InvalidTransition,
    TaskgateError,
)
from taskgate.domain.expressions import ExpressionError, parse_condition
from taskgate.domain.states import SessionState, Trigger
from taskgate.domain.variables import VariableError
from taskgate.domain.workflow_run import (
    MAX_DEPTH,
    OUTPUT_LIMIT,
    Frame,
    FrameKind,
    FrameStatus,
    LoopLimits,
    add_usage,
    breadcrumb,
    changed_files,
    child_results,
    condition_target,
    enter,
    find_group,
    find_step,
    fingerprint,
    frame_context,
    iteration_problem,
    last_output,
    load_stack,
    merge_back,
    nested_result,
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

_log = logging.getLogger(__name__)
SYSTEM_ACTOR = "system"
_CLOSE_ON = frozenset({SessionState.FAILED, SessionState.CANCELLED, SessionState.TIMED_OUT, SessionState.ABANDONED})
_AGENT_STEPS = frozenset({StepType.agent, StepType.parallel})
_LIVE = frozenset({AgentStatus.QUEUED, AgentStatus.RUNNING})


@dataclass(frozen=True, slots=True)
class WorkflowOptions:
    """`[workflows]` settings: the workflow a new session runs (None: none, agents run as configured) and
    the loop guard."""

    default_workflow: str | None = None
    limits: LoopLimits = field(default_factory=LoopLimits)


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


class WorktreeChanges(Protocol):
    """What the engine needs of WorkspaceService: a session's changes against its base."""

    async def review(self, session_id: str) -> WorkspaceContext: ...


class VerificationDecider(Protocol):
    """What the engine needs of DecisionService: to take an operator's approval as the verification decision."""

    async def decide(self, cmd: Any) -> Any: ...


class WorkflowEngine(StackEdits, NoEffects):
    """Runs workflow stacks; also a session effect (it drives a session that enters executing)."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        sessions: SessionService,
        catalogue: Callable[[], Catalogue],
        clock: Clock,
        options: WorkflowOptions | None = None,
        launcher: StepLauncher | None = None,
        files: ProjectFiles | None = None,
    ) -> None:
        self._uow, self._sessions, self._load_catalogue, self._clock = uow, sessions, catalogue, clock
        self._options = options or WorkflowOptions()
        self._launcher = launcher
        self._files = files  # `load:` files and `{config_source}:key` configs of the project
        self._outputs: OutputService | None = None  # `{session-folder}`, and the manifest's inputs
        self._workspaces: WorktreeChanges | None = None  # files changed by nested frames
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

    def use_workspaces(self, workspaces: WorktreeChanges) -> None:
        """Attach the worktrees, to tell which files a nested workflow or group changed (`files_changed`)."""
        self._workspaces = workspaces

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

    def use_outputs(self, outputs: OutputService) -> None:
        """Attach the session folders: `{session-folder}` in prompts, and the manifest's record of their inputs."""
        self._outputs = outputs

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
        """A valid workflow by id. Raises: WorkflowNotFound (naming the ones there are), InvalidInput (its file has
        problems: the first one is named)."""
        found = self.catalogue().workflows.get(name) or self.catalogue(refresh=True).workflows.get(name)
        if found is None:
            catalogue = self.catalogue()
            if name in catalogue.invalid:
                raise InvalidInput(f"workflow {name} has problems: {catalogue.invalid[name]} (`taskgate workflow "
                                   "validate` lists them all)")  # fmt: skip
            raise WorkflowNotFound(f"{name} (known: {', '.join(sorted(catalogue.workflows)) or 'none'})")
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

    # -- approvals --------------------------------------------------------------------------------------------

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
            try:
                await self._drive_locked(session_id)
            except Exception:  # a driver runs as a background task: an unexpected error must not vanish with it
                _log.exception("the workflow driver of session %s stopped on an unexpected error", session_id)
                raise

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
        """At start: drive every executing session with a stack that this node holds (after AgentService.recover)."""
        sessions = await self._sessions.list_sessions(states={SessionState.EXECUTING})
        report = []
        for session in sessions:
            if session.workflow_stack and self._sessions.holds(session):
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
        self, session: Session, stack: list[Frame], top: Frame, step: Step, steps, carry: Carry | None = None
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

    async def _collect(self, session: Session, stack: list[Frame], top: Frame, step: Step, steps) -> bool:
        """A running agent step: when its agents all ended, its outcome; else wait (False)."""
        if step.type not in _AGENT_STEPS:  # a child frame ran for it and is gone: count the step done
            return await self._finish_step(session, stack, StepStatus.SUCCEEDED, "")
        closed, run = await self._closed_run(top)
        if closed:  # its agents were stopped when the session left executing; a retry brought it back
            return await self._interrupted(session, stack, top, step, steps, run)
        if not top.agents:  # a running step that names no agents: not written since a claim and its agents
            note = "its agents never started; launched again"  # share one transaction (an older release's
            never = Carry(finish=[(top.run_id, StepStatus.CANCELLED, "", note)])  # stack): launch them now
            top.status, top.run_id = FrameStatus.pending, None
            return await self._launch(session, stack, top, step, never)
        async with self._uow(write=False) as uow:
            mine = await uow.agents.many(top.agents)
        if any(a.status in _LIVE for a in mine):
            return False
        for agent in mine:  # what the agent CLIs reported of their runs, summed per frame (nested results carry it)
            top.usage = add_usage(top.usage, agent.report)
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
        self, session: Session, stack: list[Frame], top: Frame, step: Step, steps, carry: Carry | None = None
    ) -> bool:
        outcome = top.outcome or {"status": StepStatus.FAILED.value, "output": ""}
        status, output = StepStatus(outcome["status"]), str(outcome.get("output", ""))
        if status is StepStatus.FAILED and top.attempt <= step.max_retries and step.type is not StepType.approval:
            delay = retry_delay_ms(step, top.attempt) / 1000
            top.status, top.retry_at = FrameStatus.retry, (self._clock.now() + timedelta(seconds=delay)).isoformat()
            retry = {"step": step.id, "attempt": top.attempt + 1, "delay_s": delay}
            await self._save(session, stack, carry=carry, events=[("workflow.retry", retry)])
            return True
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

    async def _goto(self, session: Session, stack: list[Frame], top: Frame, target: str, carry: Carry | None) -> bool:
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
        child.baseline = await self._changes(session)  # to tell which files the nested frame changed
        event = ("workflow.pushed", {"frame": child.label, "by_step": step.id, "depth": len(stack) + 1})
        await self._open_run(
            session, stack, top, step, StepStatus.RUNNING, FrameStatus.running, event=event, push=child
        )
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
        parent.outcome = {"status": status.value, "output": output[-OUTPUT_LIMIT:],
                          "nested": nested_result(child, steps, status, files)}  # fmt: skip
        return output

    def _outcome(self, top: Frame, status: StepStatus, output: str) -> Carry:
        """Record the outcome of the top frame's current step in the frame; its run row and event ride along
        with whatever routing writes next (one transaction)."""
        error = output if status is StepStatus.FAILED else None
        top.status, top.outcome = FrameStatus.done, {"status": status.value, "output": output[-OUTPUT_LIMIT:]}
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

    # -- persistence ------------------------------------------------------------------------------------------

    # -- helpers ----------------------------------------------------------------------------------------------

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

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
        """(agent type, prompt) per agent of the step (workflow_prompts.py); what they were given is recorded in
        the session's manifest as its inputs."""
        async with self._uow(write=False) as uow:
            task = await uow.tasks.get(session.task_id, with_blockers=False)
            root = self._roots.get(session.project_id)
            if root is None:  # a project's root never changes once registered: read it once per process
                root = self._roots[session.project_id] = (await uow.projects.get(session.project_id)).root_path
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


def _frame_key(frame: Frame) -> str:
    return f"{frame.workflow}/{frame.name}" if frame.kind is FrameKind.group else frame.name
