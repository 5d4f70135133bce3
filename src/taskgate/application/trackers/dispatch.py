"""Dispatch: taskgate starts sessions by itself on ready tasks that a workflow's trigger takes.

Off unless the operator turns it on (`[dispatch] auto_start = true`). When on, every sweep of the sweeper
(`taskgate serve` every `[sweeper] interval_s`, or once by `taskgate sweep`) ends with `Dispatcher.dispatch_once`,
after the tracker chores, so a live tracker's ready list (Beads' `bd ready`) is fresh:

1. sessions dispatch created earlier that wait for a slot (state `ready`, with the `dispatched` mark) are tried
   first, oldest first: a dry run of `start` (nothing written) and, when it would pass, the start;
2. then every project's ready tasks (open, no active session, blockers completed, plan not closed; with Beads, bd
   ready's list), most urgent first: the task's labels and the catalogue's triggers choose the workflow
   (domain/workflows/triggers.py: a `label:` trigger beats `task_ready`), and a session is started for the task, as the
   dispatch operator, with that workflow as its root frame (what `session start TASK --workflow W` does). A task
   whose session was cancelled is ready again but left to people: someone stopped that work on purpose.

WIP. A start a guard refuses (wip_limit, operator_capacity) is not an error: the session stays `ready` with its
mark and its workflow on its stack, one `dispatch.waiting` event says why (with the session's one blocked row),
and later sweeps only dry-run it until a slot frees: no row, no event per sweep. While a session waits, no new
session is created in its plan (it is first in line), nor anywhere when the refusal was not the plan's WIP limit
(the operator's capacity is full): a full plan holds one waiting session, not one per ready task.

Audit. The session's `create` and `start` rows name the actor `operator:<dispatch operator>` and the reason
`dispatch: trigger task_ready (workflow feature-development)`; `dispatch.started` and `dispatch.waiting` events
name the task, the workflow and the trigger (docs/events.md).

Races: two `taskgate serve` processes on one database (or `taskgate sweep` beside one) dispatch the same ready
task at once. Nothing here claims tasks; the session start's own uniqueness does. `create_session` locks the
task's row and refuses a second active session (the one_active_session_per_task policy, backed by the partial
unique index `uq_sessions_active_task`), and `start` is a transition from `ready` under the session's row lock,
so whatever the interleaving one session is created for the task and one `start` applies; every other caller
gets SessionAlreadyActive, InvalidTransition or ConcurrentModification and reports the task as taken. A loser
may meet the winner's session half-way (it then carries it on, as `session start` would): the workflow push is
idempotent (a stack that has a root keeps it), and the one `dispatch.waiting` event is written under the session's
row lock together with a `waiting_since` mark it checks first, so it is written once whoever got there. WIP is
counted by the start itself under the plan's row lock, so racing dispatchers never overfill a plan.
tests/integration/trackers/test_dispatch.py runs racing dispatchers on SQLite and PostgreSQL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.commands import FireTrigger, StartTask
from taskgate.application.sessions.engine import SessionService
from taskgate.application.trackers.builtin import TrackerService
from taskgate.application.trackers.dispatch_load import DISPATCHED, current_load
from taskgate.application.workflows.engine import WorkflowEngine
from taskgate.domain.dispatching import (
    DispatchCaps,
    Load,
    RetryVerdict,
    refusal,
    retry_verdict,
)
from taskgate.domain.entities import Project, Session, Task
from taskgate.domain.errors import (
    ClaimRefused,
    ConcurrentModification,
    ConflictError,
    Forbidden,
    InvalidInput,
    InvalidTransition,
    PolicyViolation,
    SessionAlreadyActive,
    SessionNotFound,
    TaskgateError,
)
from taskgate.domain.policies.violations import Violation
from taskgate.domain.states import SessionState, Trigger
from taskgate.domain.workflows.definitions import Workflow, agent_types_used
from taskgate.domain.workflows.triggers import Route, TriggerRoutes
from taskgate.domain.workflows.visibility import Viewer

STARTED_EVENT = "dispatch.started"
WAITING_EVENT = "dispatch.waiting"
_TAKEN = (SessionAlreadyActive, InvalidTransition, ConcurrentModification, SessionNotFound)
_PLAN_SCOPED = frozenset({"wip_limit"})  # refusals that hold back only the plan's other tasks
_log = logging.getLogger("taskgate.dispatch")


@dataclass(frozen=True, slots=True)
class DispatchOptions:
    """`[dispatch]`: who the sessions are started as, for which projects (names; empty: every project), within which
    bounds (domain/dispatching.py), and whether it only says what it would do (`dry_run`, the shadow mode)."""

    operator_id: str
    projects: tuple[str, ...] = ()
    caps: DispatchCaps = field(default_factory=DispatchCaps)
    dry_run: bool = False
    # after the start, plan_complete too: the workflow is the plan, and its agents run at once (serve's loop); off,
    # the session waits in planning for a person (`session execute`), e.g. under `taskgate sweep`, which exits
    execute: bool = False

    @property
    def actor(self) -> str:
        return f"operator:{self.operator_id}"


@dataclass(frozen=True, slots=True)
class DispatchAction:
    """What one dispatch did with a task. `outcome`: started (ready → planning, the workflow on its stack) |
    waiting (a guard refused the start: the session waits in ready for a slot) | held (a cap, the review queue or
    the retry back-off keeps it back: nothing is written) | would_start (the dry run) | skipped (taken meanwhile,
    cancelled by a person, or its trigger is contested) | error."""

    task_id: str
    outcome: str
    workflow: str | None = None
    trigger: str | None = None
    session_id: str | None = None
    detail: str = ""

    def line(self) -> str:
        """One line for `taskgate sweep` and the service log."""
        what = f" with workflow {self.workflow} (trigger {self.trigger})" if self.workflow else ""
        session = f" session {self.session_id}" if self.session_id else ""
        tail = f": {self.detail}" if self.detail else ""
        return f"{self.task_id} {self.outcome}{what}{session}{tail}"


class _Hold:
    """Where this pass stops creating sessions: the plans with a waiting session; everywhere once a refusal was
    not a plan's WIP limit (say the dispatch operator's capacity is full)."""

    def __init__(self) -> None:
        self.plans: set[int | None] = set()
        self.everywhere = False

    def add(self, plan_id: int | None, violations: Sequence[Violation]) -> None:
        if {v.policy for v in violations} <= _PLAN_SCOPED:
            self.plans.add(plan_id)
        else:
            self.everywhere = True

    def holds(self, plan_id: int | None) -> bool:
        return self.everywhere or plan_id in self.plans


class Dispatcher:
    """Starts sessions on ready tasks that a workflow's trigger takes (see the module docstring)."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        sessions: SessionService,
        tracker: TrackerService,
        workflows: WorkflowEngine,
        routes: Callable[[], TriggerRoutes],
        clock: Clock,
        options: DispatchOptions,
    ) -> None:
        self._uow, self._sessions, self._tracker, self._workflows = uow, sessions, tracker, workflows
        self._routes, self._clock, self.options = routes, clock, options

    async def dispatch_once(self, polled: Collection[int] = ()) -> list[DispatchAction]:
        """One pass: the waiting sessions first, then the ready tasks, within the caps. A task that fails is reported
        and the pass goes on. `polled`: projects whose tracker was polled just now (their mirror is read, not the
        tracker again). Raises: TrackerError when a live tracker's ready list cannot be read."""
        projects, actions = await self._projects()
        hold, load, failures = _Hold(), *await self._load(projects)
        if not self.options.dry_run:  # the dry run creates nothing, so it has no sessions of its own waiting
            for session in await self._marked(projects):
                action = await self._carry_on(session, hold, load)
                if action is not None:
                    actions.append(action)
        routes = self._routes()
        if not routes:
            return actions
        for project in projects:
            given_up = await self._cancelled_tasks(project)
            for task in await self._ready(project, polled):
                action = await self._consider(task, routes, hold, load, failures, given_up)
                if action is not None:
                    actions.append(action)
        return actions

    async def _ready(self, project: Project, polled: Collection[int]) -> list[Task]:
        if project.id in polled:  # mirrored moments ago: the tracker's holds are on the rows
            async with self._uow(write=False) as uow:
                return await uow.tasks.ready(project.id)
        return await self._tracker.ready_tasks(project.id)

    async def _consider(
        self, task: Task, routes: TriggerRoutes, hold: _Hold, load: Load, failures: dict, given_up: set[str]
    ) -> DispatchAction | None:
        """One ready task: the reason it is not started (a person cancelled it, its plan has a session waiting, the
        retry back-off, a cap), else its start (or, in the dry run, what would start)."""
        if task.id in given_up:
            return DispatchAction(task.id, "skipped", detail="a person cancelled its session: left to people")
        if hold.holds(task.plan_id):
            return DispatchAction(task.id, "held", detail="a session of its plan waits for a slot first")
        route = routes.route(task.labels)
        if isinstance(route, str):
            return DispatchAction(task.id, "skipped", detail=route)
        if route is None:
            return None
        action = _Action(task.id, route.workflow, route.trigger)
        count, last = failures.get(task.id, (0, None))
        verdict = retry_verdict(self.options.caps, count, last, self._clock.now())
        if verdict.gave_up or verdict.until is not None:
            return action("held", detail=verdict.why())
        try:
            agents = agent_types_used(self._workflows.workflow(route.workflow).steps)
        except TaskgateError as exc:
            return action("error", detail=str(exc))
        why = refusal(self.options.caps, load, task.project_id, task.labels, agents)
        if why is not None:
            return action("held", detail=why)
        if self.options.dry_run:
            load.add(task.project_id, task.labels, agents)
            return action("would_start", detail=f"dry run: nothing was written ({_retry_note(verdict)})")
        done = await self._safely(task, route, hold)
        if done.outcome == "started":
            load.add(task.project_id, task.labels, agents)
        return done

    async def _load(self, projects: list[Project]) -> tuple[Load, dict[str, tuple[int, Any]]]:
        """What runs now and each task's failed dispatched attempts (application/trackers/dispatch_load.py)."""
        async with self._uow(write=False) as uow:
            return await current_load(uow, {p.id for p in projects}, self._agents_of)

    def _agents_of(self, mark: dict | None) -> list[str]:
        if not mark or not mark.get("workflow"):
            return []
        try:
            return agent_types_used(self._workflows.workflow(mark["workflow"]).steps)
        except TaskgateError:
            return []

    async def _projects(self) -> tuple[list[Project], list[DispatchAction]]:
        every = [p for p in await self._tracker.list_projects() if p.archived_at is None]
        wanted = self.options.projects
        if not wanted:
            return every, []
        known = {p.name for p in every}
        errors = [DispatchAction("-", "error", detail=f"[dispatch] projects names no active project: {name}")
                  for name in wanted if name not in known]  # fmt: skip
        return [p for p in every if p.name in wanted], errors

    async def _cancelled_tasks(self, project: Project) -> set[str]:
        """Tasks with a cancelled session: ready again, but someone stopped that work, so dispatch leaves them to
        people (`session start`) instead of starting them again at the next sweep."""
        async with self._uow(write=False) as uow:
            return {s.task_id for s in await uow.sessions.list(project_id=project.id, states={SessionState.CANCELLED})}

    async def _marked(self, projects: list[Project]) -> list[Session]:
        """Sessions dispatch created that are still in ready (waiting for a slot) or planning (to check their
        workflow is on their stack), oldest first."""
        ids = {p.id for p in projects}
        async with self._uow(write=False) as uow:
            found = await uow.sessions.list(states={SessionState.READY, SessionState.PLANNING})
        marked = [s for s in found if s.project_id in ids and isinstance(s.state_data.get(DISPATCHED), dict)]
        return sorted(marked, key=lambda s: (s.created_at, s.id))

    async def _safely(self, task: Task, route: Route, hold: _Hold) -> DispatchAction:
        try:
            return await self._start(task, route, hold)
        except TaskgateError as exc:
            return DispatchAction(task.id, "error", route.workflow, route.trigger, detail=str(exc))

    async def _start(self, task: Task, route: Route, hold: _Hold) -> DispatchAction:
        """Start a session for `task` running `route.workflow`; a guard's refusal leaves it waiting in ready."""
        action = _Action(task.id, route.workflow, route.trigger)
        try:  # a workflow gone since the routes were read: error; one the dispatch operator may not run: skipped
            workflow = self._workflows.chosen(route.workflow, Viewer.operator(self.options.operator_id))
        except Forbidden as exc:
            return action("skipped", detail=f"{exc} (the dispatch operator runs it)")
        assert workflow is not None
        mark = {"workflow": route.workflow, "trigger": route.trigger, "operator": self.options.operator_id}
        actor, reason = self.options.actor, _reason(route.workflow, route.trigger)
        try:
            started = await self._sessions.start_task(
                StartTask(task.id, actor, self.options.operator_id, reason, {DISPATCHED: mark})
            )
        except PolicyViolation as exc:
            if exc.session_id is None:  # the creation itself was refused (the task changed since it was listed)
                return action("skipped", detail=str(exc))
            session = await self._sessions.get(exc.session_id)
            if not isinstance(session.state_data.get(DISPATCHED), dict):  # a person's session, refused: theirs
                return action("skipped", session.id, "taken meanwhile by another caller")
            await self._push(session.id, workflow)
            hold.add(task.plan_id, exc.violations)
            await self._tell_waiting(session.id, exc.violations)
            return action("waiting", session.id, _describe(exc.violations))
        except _TAKEN as exc:
            return action("skipped", detail=f"taken meanwhile: {exc}")
        except ClaimRefused as exc:  # the tracker gave the issue to someone else: the session is not ours to keep
            return await self._give_up(task.id, action, exc)
        await self._push(started.session.id, workflow)
        await self._event(STARTED_EVENT, started.session.id, _payload(task.id, mark))
        await self._execute(started.session.id, mark)
        return action("started", started.session.id)

    async def _execute(self, session_id: str, mark: dict[str, Any]) -> None:
        """planning → executing when dispatch runs the work (`execute`): the workflow engine then launches its
        agents. A session a racer or a person moved on meanwhile is left as it is."""
        if not self.options.execute:
            return
        reason = f"{_reason(mark.get('workflow'), mark.get('trigger'))}: its workflow runs"
        try:
            await self._sessions.fire(FireTrigger(session_id, Trigger.PLAN_COMPLETE.value, self.options.actor, reason))
        except (*_TAKEN, PolicyViolation) as exc:
            _log.info("dispatch: session %s not executed: %s", session_id, exc)

    async def _carry_on(self, session: Session, hold: _Hold, load: Load) -> DispatchAction | None:
        """A session dispatch created: its workflow on its stack (a crash may have come between the start and the
        push); in ready, started as soon as the caps allow and a dry run of `start` passes."""
        mark: dict[str, Any] = session.state_data[DISPATCHED]
        action = _Action(session.task_id, mark.get("workflow"), mark.get("trigger"))
        try:
            if not session.workflow_stack and mark.get("workflow"):
                await self._push(session.id, self._workflows.workflow(mark["workflow"]))
            if session.state == SessionState.PLANNING:  # a crash came between the start and plan_complete
                await self._execute(session.id, mark)
                return None
            if session.state != SessionState.READY:
                return None
            async with self._uow(write=False) as uow:
                labels = (await uow.tasks.get(session.task_id, with_blockers=False)).labels
            agents = self._agents_of(mark)
            why = refusal(self.options.caps, load, session.project_id, labels, agents)
            if why is not None:
                hold.plans.add(session.plan_id)
                return action("waiting", session.id, why)
            check = await self._sessions.check(session.id, Trigger.START.value, actor=self.options.actor,
                                               run_tests=False)  # fmt: skip
            if not check.allowed:
                hold.add(session.plan_id, check.verdict.blocking())
                if not mark.get("waiting_since"):  # a racer saw it refused but did not say so
                    await self._tell_waiting(session.id, check.verdict.blocking())
                return action("waiting", session.id, _describe(check.verdict.blocking()))
            reason = _reason(mark.get("workflow"), mark.get("trigger"))
            await self._sessions.fire(FireTrigger(session.id, Trigger.START.value, self.options.actor, reason))
            load.add(session.project_id, labels, agents)
        except PolicyViolation as exc:  # the slot went between the dry run and the start
            hold.add(session.plan_id, exc.violations)
            return action("waiting", session.id, _describe(exc.violations))
        except _TAKEN as exc:
            return action("skipped", session.id, f"moved meanwhile: {exc}")
        except ClaimRefused as exc:
            return await self._give_up(session.task_id, action, exc, session.id)
        except TaskgateError as exc:
            return action("error", session.id, str(exc))
        await self._event(STARTED_EVENT, session.id, _payload(session.task_id, mark))
        await self._execute(session.id, mark)
        return action("started", session.id)

    async def _give_up(self, task_id: str, action: _Action, exc: ClaimRefused, session_id: str | None = None):
        """The tracker refused the claim (another orchestrator has the issue): cancel the session dispatch made,
        so it neither waits nor retries the claim at every sweep."""
        if session_id is None:
            async with self._uow(write=False) as uow:
                active = await uow.sessions.active_for_task(task_id)
            session_id = active[0] if active else None
        if session_id is not None:
            reason = f"dispatch: the tracker refused the claim ({exc}); the session is given up"
            try:
                await self._sessions.fire(FireTrigger(session_id, Trigger.CANCEL.value, self.options.actor, reason))
            except TaskgateError as cancel:
                return action("error", session_id, f"{exc}; cancelling the session failed: {cancel}")
        return action("skipped", session_id, str(exc))

    async def _push(self, session_id: str, workflow: Workflow) -> None:
        """The workflow as the session's root frame, unless it has one: a racer pushing it first is no error."""
        try:
            await self._workflows.attach(session_id, workflow, self.options.actor)
        except (InvalidInput, ConflictError):  # a racing dispatcher pushed it meanwhile (already on the stack)
            session = await self._sessions.get(session_id)
            if not session.workflow_stack:
                raise

    async def _tell_waiting(self, session_id: str, violations: Sequence[Violation]) -> None:
        """One `dispatch.waiting` event per session, however many dispatchers see it wait: written with the mark's
        `waiting_since` under the session's row lock, after checking the mark (a note, not a transition: the
        session's version stays)."""
        async with self._uow(write=True) as uow:
            session = await self._sessions.fence(uow, session_id, "the dispatch.waiting event")
            mark = dict(session.state_data.get(DISPATCHED) or {})
            if mark.get("waiting_since"):
                return
            now = self._clock.now()
            mark["waiting_since"] = now.isoformat()
            noted = replace(session, state_data={**session.state_data, DISPATCHED: mark})
            await uow.sessions.update(noted, expected_version=session.version)
            payload = {**_payload(session.task_id, mark), "violations": [v.describe() for v in violations]}
            await uow.events.append(WAITING_EVENT, now, payload, session_id)
            await uow.commit()
        _log.info("%s: session %s %s", WAITING_EVENT, session_id, payload)

    async def _event(self, kind: str, session_id: str, payload: dict[str, Any]) -> None:
        async with self._uow(write=True) as uow:
            await uow.events.append(kind, self._clock.now(), payload, session_id)
            await uow.commit()
        _log.info("%s: session %s %s", kind, session_id, payload)


class _Action:
    """Builds the DispatchActions of one task."""

    def __init__(self, task_id: str, workflow: str | None, trigger: str | None) -> None:
        self.task_id, self.workflow, self.trigger = task_id, workflow, trigger

    def __call__(self, outcome: str, session_id: str | None = None, detail: str = "") -> DispatchAction:
        return DispatchAction(self.task_id, outcome, self.workflow, self.trigger, session_id, detail)


def _retry_note(verdict: RetryVerdict) -> str:
    return f"a retry after {verdict.failures} failed attempt(s)" if verdict.failures else "a first attempt"


def _reason(workflow: str | None, trigger: str | None) -> str:
    return f"dispatch: trigger {trigger} (workflow {workflow})"


def _payload(task_id: str, mark: dict[str, Any]) -> dict[str, Any]:
    return {"task": task_id, "workflow": mark.get("workflow"), "trigger": mark.get("trigger"),
            "operator": mark.get("operator")}  # fmt: skip


def _describe(violations: Sequence[Violation]) -> str:
    return "; ".join(v.describe() for v in violations) or "refused"
