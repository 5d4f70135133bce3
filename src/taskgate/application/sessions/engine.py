"""Session use cases: create a session, fire triggers on it, and read its history back.

A fire is one straight line (`_fire_with_effects`): outside any transaction, only when the trigger needs
them, the session read once, the slow facts (git, tests) gathered once, a dry run of the guards and the
effect's outside work; then one transaction (`_transact`); then the effects after it.

How races are prevented. Every write runs in a write unit of work, which the adapters serialise:
SQLite takes the database write lock up front (`BEGIN IMMEDIATE`, with an in-process FIFO turn so
coroutines queue instead of busy-polling, and queued writers sharing one COMMIT); PostgreSQL locks rows
with `SELECT … FOR UPDATE`. `_transact` locks the session row first, then the operator's row (decisions,
starts), then (only for transitions that enter the WIP window or complete a task) the plan row, always in
that order (`_lock_for`), so concurrent `start`s of one plan count WIP one at a time and cannot deadlock.
`create_session` locks the task row, and a partial unique index on `sessions(task_id) WHERE state NOT IN
(completed, cancelled)` backs up "one active session per task".
"""

from __future__ import annotations

import asyncio
import logging
import re
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, NamedTuple

from taskgate.application.ports import Clock, IdGenerator, UnitOfWork, UnitOfWorkFactory
from taskgate.application.sessions import crashpoints
from taskgate.application.sessions.affinity import fence, held_here, refuse_unless_held
from taskgate.application.sessions.effects import Aftermath, NoEffects, SessionEffects
from taskgate.application.sessions.guards import GuardEvaluator, PolicyCheck
from taskgate.application.sessions.machine import SessionMachine
from taskgate.application.sessions.policy_book import PolicyEntry
from taskgate.domain import writebacks as wb
from taskgate.domain.bounds import IDS, OFFSETS, PAGE_SIZES, ROW_LIMITS, VERSIONS
from taskgate.domain.entities import (
    Decision,
    DecisionKind,
    GuardResult,
    Outcome,
    Plan,
    PlanStatus,
    Session,
    SessionSnapshot,
    TransitionRecord,
    how_it_got_there,
    task_status_for,
)
from taskgate.domain.errors import (
    ConcurrentModification,
    InvalidInput,
    InvalidTransition,
    PolicyViolation,
    ProjectArchived,
    SessionAlreadyActive,
    SessionNotFound,
    TaskgateError,
)
from taskgate.domain.policies.facts import (
    NEEDS_APPROVALS,
    NEEDS_OPERATOR,
    NEEDS_TRACKER,
    NO_SLOW_FACTS,
    SLOW_NEEDS,
    GuardFacts,
    SlowFacts,
    Verdict,
)
from taskgate.domain.policies.violations import Violation
from taskgate.domain.session_fsm import TransitionSpec, allowed_triggers, find_transition, prior_state_after
from taskgate.domain.states import TERMINAL_STATES, WIP_STATES, SessionState, Trigger

SYSTEM_ACTOR = "system"
START_REQUESTED = "start_requested"  # state_data key: who asked for the start a crash may cut off
MERGE_REQUESTED = "merge_requested"  # state_data key: a merge asked for, recorded before git moves anything
_log = logging.getLogger("taskgate.policies")
_FULL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True, slots=True)
class CreateSession:
    task_id: str
    actor: str
    operator_id: str | None = None
    # The caller goes on to `start` the session (start_task): recorded with the session, so a crash before the
    # start is carried on to it at restart (`resume`), and cleared by the start (applied or refused).
    start_requested: bool = False
    reason: str | None = None  # recorded on the `create` row
    note: Mapping[str, Any] | None = None  # state_data keys the session is born with (dispatch's mark)


@dataclass(frozen=True, slots=True)
class FireTrigger:
    session_id: str
    trigger: str
    actor: str
    reason: str | None = None
    expected_version: int | None = None
    # Set by effects, not by callers: session fields to write with the transition (branch_name,
    # worktree_path, state_data keys to merge) and a snapshot to store in the same transaction.
    changes: Mapping[str, Any] | None = None
    snapshot: SessionSnapshot | None = None
    # Set by the decision use case: the operator's decision, stored in the transition's own transaction
    # (so a decision is recorded if and only if it moved the session).
    decision: Decision | None = None
    # Policies whose violations are recorded but do not block (an authorised operator's override).
    overrides: frozenset[str] = frozenset()
    # Set by an entry point: the caller's authorisation, run first in the fire's first unit of work (the read
    # before outside work, else the transaction), so it costs one statement, not a transaction of its own, and
    # refuses before anything is read, done or written. Raises Forbidden.
    authorize: Callable[[UnitOfWork], Awaitable[Any]] | None = None

    def __post_init__(self) -> None:
        """Raises: InvalidInput for a version out of its range (domain/bounds.py), before any I/O."""
        VERSIONS.check("expected_version", self.expected_version)


class EffectRefused(TaskgateError):
    """An effect's `before` refused the transition; `violations` go into the log as a blocked row."""

    def __init__(
        self, error: TaskgateError, violations: list[Violation], changes: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(str(error))
        self.error, self.violations, self.changes = error, violations, changes


_CHANGEABLE = frozenset({"branch_name", "worktree_path", "state_data", "compensation_plan"})


@dataclass(frozen=True, slots=True)
class SessionPage:
    """Which sessions to list (every filter optional) and which page: `limit` from `offset`, newest first."""

    project_id: int | None = None
    plan_id: int | None = None
    states: set[SessionState] | None = None
    operator_id: str | None = None
    limit: int = 100
    offset: int = 0

    def check(self) -> None:
        """Raises: InvalidInput for a limit outside 1..1,000, a negative offset or an id out of range."""
        PAGE_SIZES.check("limit", self.limit)
        OFFSETS.check("offset", self.offset)
        IDS.check("project_id", self.project_id)
        IDS.check("plan_id", self.plan_id)


@dataclass(frozen=True, slots=True)
class StartTask:
    task_id: str
    actor: str
    operator_id: str | None = None
    reason: str | None = None  # recorded on the `create` and `start` rows (dispatch names the trigger)
    note: Mapping[str, Any] | None = None  # state_data keys a new session is born with (see CreateSession)


@dataclass(frozen=True, slots=True)
class FireResult:
    """`record` is the row of the trigger asked for; `session` is the session after it and after every
    automatic follow-up (`follow_ups`, e.g. `cleanup_done` after `merge`). A follow-up that failed leaves the
    session where it was and says why in `warnings`."""

    session: Session
    record: TransitionRecord
    follow_ups: tuple[TransitionRecord, ...] = ()
    warnings: tuple[str, ...] = ()


def parse_trigger(name: str) -> Trigger:
    """The trigger called `name`. Raises: InvalidInput naming the valid triggers."""
    try:
        return Trigger(name)
    except ValueError:
        valid = ", ".join(t.value for t in Trigger if t != Trigger.CREATE)
        raise InvalidInput(f"unknown trigger '{name}'; valid triggers: {valid}") from None


def _needs_plan_lock(row: TransitionSpec) -> bool:
    return row.enters_wip or row.dest == SessionState.COMPLETED


class SessionService:
    """The session engine's write side and its history reads."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        guards: GuardEvaluator,
        clock: Clock,
        ids: IdGenerator,
        machine: SessionMachine | None = None,
        effects: SessionEffects | None = None,
    ) -> None:
        self._uow, self._guards, self._clock, self._ids = uow, guards, clock, ids
        self._machine = machine or SessionMachine()
        self._effects: SessionEffects = effects or NoEffects()
        self._session_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._project_names: dict[int, str] = {}  # for per-project policies; project names never change
        self._write_back_to: tuple[str, ...] = ()  # task sources whose tracker is owed status changes
        self.node_id: str | None = None  # this process's node: it holds the sessions it creates (affinity.py)

    @property
    def effects(self) -> SessionEffects:
        return self._effects

    def use_effects(self, effects: SessionEffects) -> None:
        """Attach the effects (the composition root does this once; effects need the service themselves)."""
        self._effects = effects

    def on_node(self, node_id: str | None) -> None:
        """Record `node_id` on the sessions created from now on, and change only sessions it holds."""
        self.node_id = node_id

    def holds(self, session: Session) -> bool:
        """Whether this process's node may change `session` (application/sessions/affinity.py)."""
        return held_here(session, self.node_id)

    async def fence(self, uow: UnitOfWork, session_id: str, what: str) -> Session:
        """The session, row-locked in `uow`'s transaction, when this node holds it (application/sessions/affinity.py
        `fence`): called first by every write about a session or its agents. Raises: SessionNotFound, WrongNode
        (logged here, naming `what` was not written)."""
        return await fence(uow, session_id, self.node_id, what)

    async def refuse_unless_held(self, session_id: str) -> Session:
        """The session, when this node holds it. Raises: SessionNotFound, WrongNode (naming the holder)."""
        async with self._uow(write=False) as uow:
            session = await uow.sessions.get(session_id)
            await refuse_unless_held(uow, session, self.node_id)
        return session

    def owe_write_backs(self, sources: tuple[str, ...]) -> None:
        """Status changes of tasks from these trackers (`beads`) are owed to them (see
        application/trackers/writebacks.py)."""
        self._write_back_to = sources

    async def create_session(self, cmd: CreateSession) -> Session:
        """Create a session in `created` for a task. Nothing is written when a guard refuses, or an effect (its
        worktree's base branch is missing).

        Raises: TaskNotFound, OperatorNotFound, ProjectArchived, PolicyViolation, SessionAlreadyActive, VcsError.
        """
        row = find_transition(None, Trigger.CREATE, None)
        assert row is not None
        async with self._uow(write=False) as uow:
            task = await uow.tasks.get(cmd.task_id, with_blockers=False)
            project = await uow.projects.get(task.project_id)
        await self._effects.check_new_session(project)  # e.g. no base branch to branch from: nothing written
        async with self._uow(write=True) as uow:
            facts = await self._creation_facts(uow, cmd, row)
            verdict = await self._guards.evaluate(row, _constant(facts), project=facts.project.name)
            if not verdict.allowed:
                raise PolicyViolation(row.trigger.value, verdict.blocking())
            session = self._new_session(cmd, facts)
            await uow.sessions.add(session)
            await uow.transitions.append(_record(session, row, None, Outcome.APPLIED, cmd.actor, cmd.reason, verdict))
            await uow.events.append("session.created", session.created_at, {"task_id": cmd.task_id}, session.id)
            await uow.commit()
        return session

    async def fire(self, cmd: FireTrigger) -> FireResult:
        """Fire one trigger with its effects (see application/sessions/effects.py), then any automatic follow-up.

        The result is that of the last transition applied (e.g. `completed` after `merge` and `cleanup_done`).
        Raises: as `transition`, plus what an effect raises (VcsError, MergeConflict, ...).
        """
        trigger = parse_trigger(cmd.trigger)
        if trigger == Trigger.CREATE:
            raise InvalidInput("'create' is not fired on a session; use create_session")
        if cmd.reason is not None and "\x00" in cmd.reason:  # PostgreSQL's text cannot hold it: refused, by name
            raise InvalidInput("the reason contains a NUL character")
        # One trigger (with its effects and follow-ups) at a time per session in this process: a second merge
        # must not start its git work while the first is between its merge and its `merged` row. Across
        # processes the repository flock, the compare-and-swap on the base ref and the version check refuse
        # the loser instead.
        async with self._lock(cmd.session_id):
            return await self._fire_with_effects(trigger, cmd)

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._session_locks.get(session_id)
        if lock is None:
            lock = self._session_locks[session_id] = asyncio.Lock()
        return lock

    async def resume(self, session_id: str, *, start: bool = True) -> list[str]:
        """Carry the session on from where a crash cut an operation off (docs/failure-model.md), through the
        same effects and follow-ups the interrupted call would have run: a `created` session is initialised,
        the effects' `resume` gives what the current state still owes (a worktree, a recorded agent launch, a
        compensation, a requested merge, a clean-up), and a start the operator asked for is fired. Each is
        idempotent, and a session that owes nothing is left as it is. `start=False` stops at ready (the caller
        fires the start itself). Returns what was done, one line each, also recorded as a `session.resumed`
        event.

        Raises: SessionNotFound, WrongNode, and what the resumed transitions raise (the session stays where it
        got to).
        """
        async with self._lock(session_id):
            done = await self._resume_effects(await self.refuse_unless_held(session_id))
            session = await self.get(session_id)
            if start and session.state == SessionState.READY and session.state_data.get(START_REQUESTED):
                done.append(await self._resume_start(session))
        if done:
            async with self._uow(write=True) as uow:
                await self.fence(uow, session_id, "the session.resumed event")
                await uow.events.append("session.resumed", self._clock.now(), {"actions": done}, session_id)
                await uow.commit()
        return done

    async def _resume_effects(self, session: Session) -> list[str]:
        if session.state == SessionState.CREATED:
            reason = "resumed: the session was created but not initialised"
            aftermath = Aftermath(FireTrigger(session.id, Trigger.INITIALIZE.value, SYSTEM_ACTOR, reason=reason))
        else:
            aftermath = await self._effects.resume(session)
        done = [aftermath.note] if aftermath.note else []
        if aftermath.follow_up is not None:
            trigger = parse_trigger(aftermath.follow_up.trigger)
            result = await self._fire_with_effects(trigger, aftermath.follow_up)
            steps = " → ".join(r.to_state for r in (result.record, *result.follow_ups))
            done.append(f"{trigger.value} ({session.state.value} → {steps})")
        if aftermath.error is not None:
            raise aftermath.error
        return done

    async def _resume_start(self, session: Session) -> str:
        """The operator's start, cut off by a crash: fired now as `system`, naming who asked for it."""
        by = session.state_data[START_REQUESTED]
        cmd = FireTrigger(session.id, Trigger.START.value, SYSTEM_ACTOR, reason=f"resumed: start requested by {by}",
                          changes={"state_data": {START_REQUESTED: None}})  # fmt: skip
        try:
            result = await self._fire_with_effects(Trigger.START, cmd)
        except PolicyViolation as exc:
            await self._forget_start(session.id)
            return f"start refused ({'; '.join(v.describe() for v in exc.violations)}): the session stays ready"
        return f"start (ready → {result.session.state.value})"

    async def _forget_start(self, session_id: str) -> None:
        """A start that was tried (and refused) is no longer owed: a later restart must not try it again."""
        await self.annotate(session_id, {START_REQUESTED: None})

    async def annotate(
        self, session_id: str, data: Mapping[str, Any], event: tuple[str, dict[str, Any]] | None = None
    ) -> None:
        """Merge `data` into the session's state_data (a None value removes the key) under its row lock, with an
        optional event: a note on the session, not a transition, so its version stays and a caller's
        expected_version still holds. Raises: SessionNotFound."""
        async with self._uow(write=True) as uow:
            session = await self.fence(uow, session_id, f"a note on the session ({', '.join(sorted(data))})")
            await uow.sessions.update(_with_changes(session, {"state_data": data}), expected_version=session.version)
            if event is not None:
                await uow.events.append(event[0], self._clock.now(), event[1], session_id)
            await uow.commit()

    async def _fire_with_effects(self, trigger: Trigger, cmd: FireTrigger) -> FireResult:
        """One trigger, in one straight line: (1) outside any transaction, what is slow or has effects, each
        once: the session read (held here, the trigger possible), the slow facts, a dry run of the guards and
        the effect's outside work (a merge); (2) the transaction (`_transact`); (3) the effects after it and
        any automatic follow-up."""
        slow, cmd = await self._outside_work(trigger, cmd)
        result = await self._transact(trigger, cmd, slow)
        aftermath = await self._effects.after(result, cmd)
        if aftermath.warning:
            result = replace(result, warnings=(*result.warnings, aftermath.warning))
        if aftermath.follow_up is not None:  # always the same session: its lock is already ours
            result = await self._follow(result, aftermath.follow_up, fatal=aftermath.error is not None)
        if aftermath.error is not None:
            raise aftermath.error
        return result

    async def _outside_work(self, trigger: Trigger, cmd: FireTrigger) -> tuple[SlowFacts | None, FireTrigger]:
        """Step 1 of a fire; reads nothing for a trigger that has no effect before it and whose policies need
        no slow fact (most triggers). A refusal here writes a blocked row before any outside work is done."""
        wants_before, needs = self._effects.wants_before(trigger), self._guards.may_need(trigger)
        if not wants_before and not needs & SLOW_NEEDS:
            return None, cmd
        prepared = await self._prepare(cmd.session_id, trigger, cmd.expected_version, held=True, by=cmd.authorize)
        cmd = replace(cmd, authorize=None)  # authorised in that read, before any outside work
        if not wants_before:
            return prepared.slow, cmd
        if "guarded" in needs:  # refuse now if the guards would refuse later: before the merge, not after
            verdict = await self._dry_verdict(prepared, cmd)
            if not verdict.allowed:
                await self.log_refusal(replace(cmd, changes=None), verdict.violations, verdict)
                raise PolicyViolation(trigger.value, verdict.blocking(), cmd.session_id)
        try:
            return prepared.slow, await self._effects.before(prepared.session, cmd)
        except EffectRefused as refused:
            await self.log_refusal(replace(cmd, changes=refused.changes), refused.violations)
            raise refused.error from None
        except TaskgateError:
            await self._refuse_if_overtaken(prepared.session, trigger)
            raise

    async def _follow(self, result: FireResult, follow_up: FireTrigger, *, fatal: bool) -> FireResult:
        try:
            nxt = await self._fire_with_effects(parse_trigger(follow_up.trigger), follow_up)
        except TaskgateError as exc:
            if fatal:
                raise
            warning = f"automatic '{follow_up.trigger}' after '{result.record.trigger}' failed: {exc}"
            return replace(result, warnings=(*result.warnings, warning))
        return FireResult(
            nxt.session,
            result.record,
            (*result.follow_ups, nxt.record, *nxt.follow_ups),
            (*result.warnings, *nxt.warnings),
        )

    async def log_refusal(self, cmd: FireTrigger, violations: list[Violation], verdict: Verdict | None = None) -> None:
        """Log a blocked row for a trigger refused before its transaction (by an effect, e.g. a merge conflict,
        or by the guards' dry run: `verdict`); nothing else changes but `cmd.changes` (kept for the operator)."""
        if verdict is None:
            verdict = Verdict(
                results=[GuardResult(v.policy, False, v.severity.value, v.message, v.suggestion) for v in violations],
                violations=list(violations),
            )
        async with self._uow(write=True) as uow:
            session = await self.fence(uow, cmd.session_id, f"the refusal of '{cmd.trigger}'")
            row = await self._row(uow, session, parse_trigger(cmd.trigger), None)
            if cmd.changes:  # e.g. the conflicting files, kept on the session for the operator
                await uow.sessions.update(_with_changes(session, cmd.changes), expected_version=session.version)
            await self._log_blocked(uow, session, row, cmd, verdict)

    async def transition(self, cmd: FireTrigger, *, prepared: SlowFacts | None = None) -> FireResult:
        """Fire one trigger as one transaction, without effects: lock, check version, guard, update, append
        to the log. Slow facts (git state, the test run) are gathered first, outside the transaction, when an
        applicable policy needs them (`prepared` hands in ones gathered already).

        Raises: InvalidInput, SessionNotFound, WrongNode, InvalidTransition, ConcurrentModification,
        PolicyViolation.
        """
        trigger = parse_trigger(cmd.trigger)
        if prepared is None and self._guards.may_need(trigger) & SLOW_NEEDS:
            ready = await self._prepare(cmd.session_id, trigger, cmd.expected_version, held=True, by=cmd.authorize)
            prepared, cmd = ready.slow, replace(cmd, authorize=None)
        return await self._transact(trigger, cmd, prepared)

    async def _transact(self, trigger: Trigger, cmd: FireTrigger, slow: SlowFacts | None) -> FireResult:
        """Step 2 of a fire, one transaction: lock the session, check node and version, select the table row
        once, take the locks it needs, evaluate the guards (their database facts read here, in one
        statement), then apply and log, or log the refusal. A refused guard is logged as a blocked row and
        raised as PolicyViolation; overridden policies' violations are recorded, not blocking."""
        async with self._uow(write=True) as uow:
            if cmd.authorize is not None:
                await cmd.authorize(uow)
            session = await uow.sessions.get(cmd.session_id, lock=True)
            await refuse_unless_held(uow, session, self.node_id)
            row = await self._row(uow, session, trigger, cmd.expected_version)
            plan = await self._lock_for(uow, session, row, cmd)
            verdict = Verdict()
            project = await self._project_name(uow, session.project_id)

            async def guard(spec: TransitionSpec) -> bool:
                nonlocal verdict
                verdict = await self._guards.evaluate(
                    spec,
                    lambda needs: self._fire_facts(uow, session, plan, spec, cmd, needs, slow),
                    project=project,
                    overrides=cmd.overrides,
                )
                return verdict.allowed

            new_state = await self._machine.run(session.state, row, guard)
            if not verdict.allowed:
                await self._log_blocked(uow, session, row, cmd, verdict)
                raise PolicyViolation(row.trigger.value, verdict.blocking(), session.id)
            return await self._apply(uow, session, plan, row, new_state, cmd, verdict)

    @staticmethod
    async def _lock_for(uow: UnitOfWork, session: Session, row: TransitionSpec, cmd: FireTrigger) -> Plan | None:
        """The row locks a transition takes after its session's, always in this order (session, operator,
        plan), so that two transactions never wait on each other in a cycle. Returns the plan when locked."""
        if cmd.decision is not None:  # one decision at a time per operator, across processes too
            await uow.operators.lock(cmd.decision.operator_id)
        elif row.trigger == Trigger.START and session.operator_id is not None:
            # operator_capacity counts the operator's sessions in progress across plans: starts of one
            # operator queue on its row (after the session's, before the plan's)
            await uow.operators.lock(session.operator_id)
        if _needs_plan_lock(row) and session.plan_id is not None:
            return await uow.plans.get(session.plan_id, lock=True)
        return None

    async def start_task(self, cmd: StartTask) -> FireResult:
        """What an operator means by "start this task": reuse its ready session or create one, then `start`.

        A new session runs the automatic `initialize` and `context_discovered` triggers first. If `start`
        is refused (say by the WIP limit) the session stays `ready`, and the PolicyViolation says so.
        Raises: as create_session and fire, and SessionAlreadyActive when the task's session is past ready.
        """
        session = await self._ready_session_for(cmd)
        crashpoints.reached("start.ready")
        clear = {"state_data": {START_REQUESTED: None}}
        try:
            return await self.fire(FireTrigger(session.id, Trigger.START.value, cmd.actor, cmd.reason, changes=clear))
        except PolicyViolation as exc:
            if session.state_data.get(START_REQUESTED):
                await self._forget_start(session.id)
            note = f"session {session.id} stays ready; start it again once the guards allow"
            raise PolicyViolation(exc.trigger, exc.violations, session.id, note) from None
        except InvalidTransition:  # a concurrent caller started this ready session first
            raise await self._already_active(cmd.task_id) from None

    async def resolve_id(self, ref: str) -> str:
        """The full id of the session whose id is or starts with `ref` (at least 4 characters).

        Raises: InvalidInput (too short or ambiguous), SessionNotFound.
        """
        ref = ref.strip().lower()
        if _FULL_ID.fullmatch(ref):
            return ref  # nothing to resolve; whatever reads or fires next raises SessionNotFound if it is unknown
        if len(ref) < 4:
            raise InvalidInput(f"session id '{ref}' is too short; give at least 4 characters")
        async with self._uow(write=False) as uow:
            matches = await uow.sessions.ids_with_prefix(ref, limit=2)
        if not matches:
            raise SessionNotFound(ref)
        if len(matches) > 1 and ref not in matches:
            raise InvalidInput(f"session id prefix '{ref}' is ambiguous ({', '.join(matches)}, ...)")
        return ref if ref in matches else matches[0]

    async def get(self, session_id: str) -> Session:
        """Raises: SessionNotFound."""
        async with self._uow(write=False) as uow:
            return await uow.sessions.get(session_id)

    async def history(self, session_id: str, limit: int = 100) -> list[TransitionRecord]:
        """The newest `limit` log rows of a session (applied and blocked), oldest first.

        Raises: SessionNotFound, InvalidInput when limit is outside 1..100,000.
        """
        ROW_LIMITS.check("limit", limit)
        async with self._uow(write=False) as uow:
            await uow.sessions.get(session_id)
            return await uow.transitions.history(session_id, limit=limit)

    async def state_at(self, session_id: str, at: datetime) -> SessionState:
        """The state the session was in at `at`, rebuilt by replaying its log through the transition table.

        Raises: SessionNotFound; InvalidInput when `at` is naive or before the session existed;
        TaskgateError when the stored log does not replay (tampering or a bug: never silently wrong).
        """
        if at.tzinfo is None:
            raise InvalidInput("timestamp must carry a timezone (e.g. 2026-11-21T10:00:00Z)")
        async with self._uow(write=False) as uow:
            session = await uow.sessions.get(session_id)
            rows = await uow.transitions.applied_until(session_id, at)
        if not rows:
            raise InvalidInput(
                f"session {session_id} did not exist at {at.isoformat()} (created {session.created_at.isoformat()})"
            )
        return replay(rows)

    async def active_sessions(self, project_id: int | None = None, plan_id: int | None = None) -> list[Session]:
        """Sessions that have not reached a terminal state."""
        states = set(SessionState) - TERMINAL_STATES
        async with self._uow(write=False) as uow:
            return await uow.sessions.list(project_id=project_id, plan_id=plan_id, states=states)

    async def page(self, query: SessionPage) -> tuple[list[Session], int]:
        """One page of the sessions matching `query`, newest first, and how many match in all.

        Raises: InvalidInput for a limit outside 1..1,000 or a negative offset.
        """
        query.check()
        async with self._uow(write=False) as uow:
            found = await uow.sessions.list(project_id=query.project_id, plan_id=query.plan_id, states=query.states)
        if query.operator_id is not None:
            found = [s for s in found if s.operator_id == query.operator_id]
        found.reverse()  # the repository lists oldest first
        return found[query.offset : query.offset + query.limit], len(found)

    async def list_sessions(
        self, project_id: int | None = None, states: set[SessionState] | None = None
    ) -> list[Session]:
        async with self._uow(write=False) as uow:
            return await uow.sessions.list(project_id=project_id, states=states)

    # -- internals ---------------------------------------------------------------------------------------------

    async def _row(
        self, uow: UnitOfWork, session: Session, trigger: Trigger, expected_version: int | None
    ) -> TransitionSpec:
        """`_select_row`, whose refusal names what brought the session where it is: a caller who lost a race
        (a cancel that came first, another operator's decision) hears the winner's outcome, not only the state.
        The extra read is on the refusal's path only."""
        try:
            return self._select_row(session, trigger, expected_version)
        except InvalidTransition as exc:
            since = await self.since(uow, session)
            raise InvalidTransition(exc.session_id, exc.state, exc.trigger, exc.allowed, since=since) from None
        except ConcurrentModification:  # the caller's expected_version: stale, and by whose move
            since = await self.since(uow, session)
            raise ConcurrentModification(
                f"session {session.id} {since or 'changed'} and is at version {session.version}, not "
                f"{expected_version} as read; reload and retry"
            ) from None

    async def _refuse_if_overtaken(self, seen: Session, trigger: Trigger) -> None:
        """When the session moved on while this call did its outside work (`seen` is what it read before), raise
        what the concurrent caller did: the git error that work met (a branch a cancel removed meanwhile) is a
        symptom of it, not the cause. Returns when the session is still as `seen`."""
        async with self._uow(write=False) as uow:
            now = await uow.sessions.get(seen.id)
            if now.version != seen.version:
                await self._row(uow, now, trigger, None)  # not possible any more (cancelled): InvalidTransition
                await self._row(uow, now, trigger, seen.version)  # possible, but on what it is now: read it again

    @staticmethod
    async def since(uow: UnitOfWork, session: Session) -> str:
        """How the session got to its state: its last applied transition, described (empty if it has none), for
        a refusal to name (InvalidTransition's `since`)."""
        rows = await uow.transitions.history(session.id, limit=20)
        applied = [r for r in rows if r.outcome == Outcome.APPLIED and r.session_version == session.version]
        return how_it_got_there(applied[-1]) if applied else ""

    def _select_row(self, session: Session, trigger: Trigger, expected_version: int | None) -> TransitionSpec:
        if expected_version is not None and expected_version != session.version:
            raise ConcurrentModification(
                f"session {session.id} is at version {session.version}, not {expected_version}; reload and retry"
            )
        row = find_transition(session.state, trigger, session.prior_state)
        if row is None:
            raise InvalidTransition(
                session.id, session.state.value, trigger.value, allowed_triggers(session.state, session.prior_state)
            )
        return row

    async def _creation_facts(self, uow: UnitOfWork, cmd: CreateSession, row: TransitionSpec) -> GuardFacts:
        task = await uow.tasks.get(cmd.task_id, lock=True, with_blockers=False)  # blockers_of below has them
        project = await uow.projects.get(task.project_id)
        if project.archived_at is not None:
            raise ProjectArchived(project.name)
        if cmd.operator_id is not None:
            await uow.operators.get(cmd.operator_id)
        plan = await uow.plans.get(task.plan_id) if task.plan_id is not None else None
        return GuardFacts(
            transition=row,
            task=task,
            plan=plan,
            project=project,
            blockers=tuple(await uow.tasks.blockers_of(task.id)),
            other_active_sessions=tuple(await uow.sessions.active_for_task(task.id)),
            actor=cmd.actor,
        )

    async def _fire_facts(
        self,
        uow: UnitOfWork,
        session: Session,
        plan: Plan | None,
        row: TransitionSpec,
        cmd: FireTrigger,
        needs: frozenset[str] = frozenset(),
        slow: SlowFacts | None = None,
    ) -> GuardFacts:
        if plan is None and session.plan_id is not None:  # not locked for this trigger: a plain read will do
            plan = await uow.plans.get(session.plan_id)
        # the task, its project, its blockers and the plan's WIP count: one statement
        known = await uow.tasks.facts(session.task_id, plan.id if plan is not None else None, WIP_STATES)
        operator, operator_wip = None, 0
        if NEEDS_OPERATOR in needs and session.operator_id is not None:
            operator = await uow.operators.find(session.operator_id)
            operator_wip = await uow.sessions.count_of_operator(session.operator_id, WIP_STATES)
        owed: tuple[str, ...] = ()
        if NEEDS_TRACKER in needs:
            rows = await uow.writebacks.list(states=wb.OPEN_STATES, task_ids=[session.task_id], limit=5)
            owed = tuple(row.describe() for row in rows)
        approvals: tuple[str, ...] = ()
        if NEEDS_APPROVALS in needs:
            stored = await uow.decisions.approvals(session.id, session.version)
            approvals = tuple(sorted({*stored, *_pending_approver(cmd, row)}))
        return GuardFacts(
            transition=row,
            task=known.task,
            plan=plan,
            project=known.project,
            session=session,
            blockers=known.blockers,
            plan_sessions_in_wip=known.plan_sessions_in,
            actor=cmd.actor,
            operator=operator,
            operator_sessions_in_wip=operator_wip,
            approvals=approvals,
            tracker_owed=owed,
            slow=slow or NO_SLOW_FACTS,
        )

    async def _project_name(self, uow: UnitOfWork, project_id: int) -> str | None:
        """The project's name when some project has policies of its own (else every project shares one set)."""
        if not self._guards.book.per_project:
            return None
        if project_id not in self._project_names:
            self._project_names[project_id] = (await uow.projects.get(project_id)).name
        return self._project_names[project_id]

    async def _prepare(
        self, session_id: str, trigger: Trigger, expected_version: int | None, *, dry_run: bool = False,
        run_tests: bool = True, held: bool = False, by: Callable[[UnitOfWork], Awaitable[Any]] | None = None,
    ) -> _Prepared:  # fmt: skip
        """Read the session and gather the slow facts its policies need, outside any transaction (git, tests).

        Refuses a caller `by` does not authorise, an impossible trigger (and, `held`, a session another node
        holds) first, so no test runs for a transition that cannot happen here.
        """
        async with self._uow(write=False) as uow:
            if by is not None:
                await by(uow)
            session = await uow.sessions.get(session_id)
            if held:
                await refuse_unless_held(uow, session, self.node_id)
            project = await uow.projects.get(session.project_id)
            row = await self._row(uow, session, trigger, expected_version)
        slow = await self._guards.prepare(row, session, project, dry_run=dry_run, run_tests=run_tests)
        return _Prepared(session, row, project.name, slow)

    async def _dry_verdict(self, prepared: _Prepared, cmd: FireTrigger) -> Verdict:
        """Evaluate the policies on a read-only unit of work: nothing is locked or written."""
        async with self._uow(write=False) as uow:
            return await self._guards.evaluate(
                prepared.row,
                lambda needs: self._fire_facts(uow, prepared.session, None, prepared.row, cmd, needs, prepared.slow),
                project=prepared.project,
                overrides=cmd.overrides,
            )

    def policies(self, project: str | None = None) -> list[PolicyEntry]:
        """Every policy configured for `project` (by name; None: the global set), enabled or not, by priority."""
        return self._guards.book.entries(project)

    def test_command(self, project: str | None) -> tuple[str, ...]:
        """require_tests' command for `project` (empty when none is configured)."""
        return self._guards.book.tests(project).test_command

    async def check(
        self,
        session_id: str,
        trigger: str,
        *,
        actor: str = SYSTEM_ACTOR,
        overrides: frozenset[str] = frozenset(),
        run_tests: bool = True,
    ) -> PolicyCheck:
        """Dry run of `trigger` on the session: every applicable policy, evaluated as `actor` would be when
        firing it now (an operator checking `approve` counts their own approval). Writes nothing, not even a
        test run: the test command runs if no stored run of the head can be reused and `run_tests` is on.

        Raises: InvalidInput, SessionNotFound, InvalidTransition (the trigger is not allowed from the state).
        """
        parsed = parse_trigger(trigger)
        if parsed == Trigger.CREATE:
            raise InvalidInput("'create' is not fired on a session; nothing to check")
        prepared = await self._prepare(session_id, parsed, None, dry_run=True, run_tests=run_tests)
        verdict = await self._dry_verdict(prepared, FireTrigger(session_id, parsed.value, actor, overrides=overrides))
        applicable = tuple(p.name for p in self._guards.applicable(prepared.row, prepared.project))
        return PolicyCheck(prepared.session, parsed.value, prepared.row.dest.value, applicable, verdict, prepared.slow)

    def _new_session(self, cmd: CreateSession, facts: GuardFacts) -> Session:
        now = self._clock.now()
        return Session(
            id=self._ids.new_session_id(),
            task_id=facts.task.id,
            project_id=facts.project.id,
            plan_id=facts.task.plan_id,
            operator_id=cmd.operator_id,
            state=SessionState.CREATED,
            state_data={**(cmd.note or {}), **({START_REQUESTED: cmd.actor} if cmd.start_requested else {})},
            version=1,
            created_at=now,
            updated_at=now,
            node_id=self.node_id,
        )

    async def _log_blocked(
        self, uow: UnitOfWork, session: Session, row: TransitionSpec, cmd: FireTrigger, verdict: Verdict
    ) -> None:
        record = _record(
            session,
            row,
            session.state,
            Outcome.BLOCKED,
            cmd.actor,
            cmd.reason,
            verdict,
            at=self._clock.now(),
            to_state=session.state,
        )
        await uow.transitions.append(record)
        payload = {"trigger": row.trigger.value, "violations": [v.describe() for v in verdict.blocking()]}
        await uow.events.append("session.blocked", record.at, payload, session.id)
        await uow.commit()
        _log.info("'%s' blocked on session %s: %s", row.trigger.value, session.id, "; ".join(payload["violations"]))

    async def _apply(
        self,
        uow: UnitOfWork,
        session: Session,
        plan: Plan | None,
        row: TransitionSpec,
        new_state: SessionState,
        cmd: FireTrigger,
        verdict: Verdict,
    ) -> FireResult:
        now = self._clock.now()
        updated = _advance(session, row, new_state, now)
        if cmd.changes:
            updated = _with_changes(updated, cmd.changes)
        await uow.sessions.update(updated, expected_version=session.version)
        if cmd.snapshot is not None:
            await uow.snapshots.add(replace(cmd.snapshot, session_id=session.id, at=now))
        if cmd.decision is not None:
            await self._record_decision(uow, replace(cmd.decision, at=now, outcome="applied", to_state=new_state.value))
        await self._follow_task_and_plan(
            uow, session, updated, plan, f"taskgate session {session.id[:8]}: {row.trigger}"
        )
        if new_state in TERMINAL_STATES and await uow.tokens.revoke_for_session(session.id, now):
            # the session ended: every token scoped to it dies with this commit, and the audit log says so
            await uow.events.append("token.revoked", now, {"why": "session ended"}, session.id)
        record = _record(updated, row, session.state, Outcome.APPLIED, cmd.actor, cmd.reason, verdict, at=now)
        record = replace(record, seq=await uow.transitions.append(record))
        moved = {"trigger": row.trigger.value, "from": session.state.value, "to": new_state.value}
        if verdict.bypassed:  # an operator overrode policies: say which violations were let through
            moved["bypassed"] = [v.describe() for v in verdict.bypassed]
        await uow.events.append("session.transition", now, moved, session.id)
        await uow.commit()
        return FireResult(updated, record)

    @staticmethod
    async def _record_decision(uow: UnitOfWork, decision: Decision) -> None:
        await uow.decisions.add(decision)
        payload = {
            "operator": decision.operator_id,
            "decision": decision.decision.value,
            "reason": decision.reason,
            "compensation": decision.compensation.value if decision.compensation else None,
            "to_state": decision.to_state,
        }
        await uow.events.append("decision.recorded", decision.at, payload, decision.session_id)
        if decision.override_policies:
            await uow.events.append("decision.override", decision.at, decision.override_policies, decision.session_id)

    async def _follow_task_and_plan(
        self, uow: UnitOfWork, before: Session, after: Session, plan: Plan | None, why: str
    ) -> None:
        """Task status follows the session; the plan opens with its first WIP session, closes with its last task.
        A task from an external tracker owes that tracker the new status: a write-back row in this very commit
        (domain/writebacks.py), so no crash between the transition and the tracker call can lose it.

        `plan` is the row locked for this transition whenever the plan may change (see `_needs_plan_lock`).
        """
        status = task_status_for(after.state, before.state)
        # Only this session moves its task, so an unchanged implied status means an unchanged row: skip the write.
        if status is not None and status != task_status_for(before.state, None):
            await uow.tasks.set_status(after.task_id, status)
            if self._write_back_to:
                now = self._clock.now()
                await uow.writebacks.enqueue_for_task(
                    after.task_id, self._write_back_to, status.value, after.id, why, now
                )
        if plan is None:
            return
        if after.state in WIP_STATES and before.state not in WIP_STATES:
            if plan.status == PlanStatus.OPEN:
                await uow.plans.set_status(plan.id, PlanStatus.IN_PROGRESS)
        elif after.state == SessionState.COMPLETED and await uow.tasks.count_unfinished(after.plan_id) == 0:
            await uow.plans.set_status(after.plan_id, PlanStatus.CLOSED)

    async def _ready_session_for(self, cmd: StartTask) -> Session:
        """The task's session, brought to ready: created and prepared here, or one a crash left half-made carried
        on. How concurrent starts of one task are told apart: the task row lock and the partial unique index let
        one `create` through; every later step names the session's current state in its transaction and refuses
        a trigger that state no longer allows. So a caller that finds its step done by another caller (an
        `initialize` or `context_discovered` refused as not allowed) has lost the race to it, and is answered
        with the winner's outcome, SessionAlreadyActive, never the state machine's refusal."""
        async with self._uow(write=False) as uow:
            await uow.tasks.get(cmd.task_id, with_blockers=False)  # raises TaskNotFound before anything else
            active = await uow.sessions.active_for_task(cmd.task_id)
            existing = await uow.sessions.get(active[0]) if active else None
        if existing is None:
            try:
                return await self._create_and_prepare(cmd)
            except (PolicyViolation, SessionAlreadyActive) as exc:
                if isinstance(exc, PolicyViolation) and {v.policy for v in exc.violations} != {
                    "one_active_session_per_task"
                }:
                    raise
                # a concurrent caller created the task's session between our read and our write (seen by the
                # guard, or by the unique index)
                raise await self._already_active(cmd.task_id) from None
        if existing.state in (SessionState.CREATED, SessionState.INITIALIZING):  # a start a crash cut off
            try:
                await self.resume(existing.id, start=False)
            except InvalidTransition:  # another caller carried it on first (it was not cut off, only young)
                raise await self._already_active(cmd.task_id) from None
            existing = await self.get(existing.id)
        if existing.state != SessionState.READY:
            raise _already_active(cmd.task_id, existing)
        return existing

    async def _create_and_prepare(self, cmd: StartTask) -> Session:
        session = await self.create_session(
            CreateSession(cmd.task_id, cmd.actor, cmd.operator_id, start_requested=True, reason=cmd.reason,
                          note=cmd.note)
        )  # fmt: skip
        crashpoints.reached("start.created")
        try:
            session = (await self.fire(FireTrigger(session.id, Trigger.INITIALIZE.value, SYSTEM_ACTOR))).session
            if session.state == SessionState.INITIALIZING:  # no effect moved it on: discover nothing, go on
                cmd_next = FireTrigger(session.id, Trigger.CONTEXT_DISCOVERED.value, SYSTEM_ACTOR)
                session = (await self.fire(cmd_next)).session
        except InvalidTransition:
            # A concurrent start found our young session and carried it on itself (`resume`), so it goes on to
            # start it: that caller is the winner, and this one answers as the loser it now is.
            raise await self._already_active(cmd.task_id) from None
        return session

    async def _already_active(self, task_id: str) -> SessionAlreadyActive:
        """The refusal of a start that lost a race: names the task's session as the winner left it. Read in a
        write unit of work: on SQLite the winner's `create` may share a group commit with the refused one, and a
        plain read would not see it until that COMMIT; the write turn comes after it (nothing is written)."""
        async with self._uow(write=True) as uow:
            active = await uow.sessions.active_for_task(task_id)
            session = await uow.sessions.get(active[0]) if active else None
        if session is None:  # the winner's session ended meanwhile (cancelled): still, this start lost
            return SessionAlreadyActive(f"task {task_id} was started concurrently by another caller; start it again")
        return _already_active(task_id, session)


def _already_active(task_id: str, session: Session) -> SessionAlreadyActive:
    return SessionAlreadyActive(f"task {task_id} already has session {session.id} in state '{session.state.value}'")


def _advance(session: Session, row: TransitionSpec, new_state: SessionState, now: datetime) -> Session:
    return replace(
        session,
        state=new_state,
        prior_state=prior_state_after(row, session.state, session.prior_state),
        version=session.version + 1,
        updated_at=now,
        started_at=session.started_at or (now if new_state == SessionState.PLANNING else None),
        completed_at=now if new_state in TERMINAL_STATES else None,
    )


def _with_changes(session: Session, changes: Mapping[str, Any]) -> Session:
    unknown = set(changes) - _CHANGEABLE
    if unknown:
        raise InvalidInput(f"effects may not change session fields {sorted(unknown)}")
    fields = {k: v for k, v in changes.items() if k != "state_data"}
    if "state_data" in changes:
        merged = {**session.state_data, **changes["state_data"]}
        fields["state_data"] = {k: v for k, v in merged.items() if v is not None}  # None removes a key
    return replace(session, **fields)


def _record(
    session: Session,
    row: TransitionSpec,
    from_state: SessionState | None,
    outcome: Outcome,
    actor: str,
    reason: str | None,
    verdict: Verdict,
    *,
    at: datetime | None = None,
    to_state: SessionState | None = None,
) -> TransitionRecord:
    return TransitionRecord(
        seq=None,
        session_id=session.id,
        trigger=row.trigger.value,
        from_state=from_state.value if from_state else None,
        to_state=(to_state or session.state).value,
        outcome=outcome,
        actor=actor,
        reason=reason,
        guard_results=[r.as_dict() for r in verdict.results],
        session_version=session.version,
        at=at or session.created_at,
    )


class _Prepared(NamedTuple):
    session: Session
    row: TransitionSpec
    project: str
    slow: SlowFacts


def _pending_approver(cmd: FireTrigger, row: TransitionSpec) -> tuple[str, ...]:
    """The operator whose `approve` this is: it counts toward review_approval with the stored approvals."""
    if row.trigger != Trigger.APPROVE:
        return ()
    if cmd.decision is not None:
        return (cmd.decision.operator_id,) if cmd.decision.decision == DecisionKind.APPROVE else ()
    return (cmd.actor.removeprefix("operator:"),) if cmd.actor.startswith("operator:") else ()


def _constant(facts: GuardFacts):
    async def load(needs: frozenset[str] = frozenset()) -> GuardFacts:
        return facts

    return load


def replay(rows: list[TransitionRecord]) -> SessionState:
    """Fold applied log rows through the transition table; the result is the state after the last row.

    Raises: TaskgateError when a row does not follow from the state before it.
    """
    state: SessionState | None = None
    prior: SessionState | None = None
    for rec in rows:
        row = find_transition(state, Trigger(rec.trigger), prior)
        if (
            row is None
            or row.dest.value != rec.to_state
            or (rec.from_state or None) != (state.value if state else None)
        ):
            raise TaskgateError(f"transition log of session {rec.session_id} does not replay at seq {rec.seq}")
        prior = prior_state_after(row, state, prior) if state is not None else None
        state = row.dest
    assert state is not None
    return state
