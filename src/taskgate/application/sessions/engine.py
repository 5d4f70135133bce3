"""Session use cases: create a session, fire triggers on it, and read its history back.

A fire is one straight line (`_fire_with_effects`): outside any transaction, only when the trigger needs
them, the session read once, the slow facts (git, tests) gathered once, a dry run of the guards and the
effect's outside work; then one transaction (`_transact`); then the effects after it.

How races are prevented. Every write runs in a write unit of work, which the adapters serialise:
SQLite takes the database write lock up front (`BEGIN IMMEDIATE`, with an in-process FIFO turn so
coroutines queue instead of busy-polling, and queued writers sharing one COMMIT); PostgreSQL locks rows
with `SELECT … FOR UPDATE`. `_transact` locks the session row first, then the operator's row (decisions,
starts), then (only for transitions that enter the WIP window or complete a task) the plan row, always in
that order (`_lock_for`; on PostgreSQL one statement takes all three, in that order), so concurrent `start`s of one
plan count WIP one at a time and cannot deadlock. The guard facts are read after the locks, in a statement of its own.
`create_session` locks the task row, and a partial unique index on `sessions(task_id) WHERE state NOT IN
(completed, cancelled)` backs up "one active session per task".
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from taskgate.application.ports import Clock, IdGenerator, UnitOfWork, UnitOfWorkFactory
from taskgate.application.sessions.affinity import fence, held_here, refuse_unless_held
from taskgate.application.sessions.commands import (
    EffectRefused,
    FireResult,
    FireTrigger,
    parse_trigger,
)
from taskgate.application.sessions.effects import NoEffects, SessionEffects
from taskgate.application.sessions.guarding import SessionGuarding
from taskgate.application.sessions.guards import GuardEvaluator
from taskgate.application.sessions.machine import SessionMachine
from taskgate.application.sessions.ports import TransitionLocks
from taskgate.application.sessions.reads import SessionReads
from taskgate.application.sessions.records import SessionRecords, _with_changes
from taskgate.application.sessions.starts import SessionStarts
from taskgate.domain.entities import (
    GuardResult,
    Outcome,
    Session,
    how_it_got_there,
)
from taskgate.domain.errors import (
    ConcurrentModification,
    InvalidInput,
    InvalidTransition,
    OperatorNotFound,
    PolicyViolation,
    TaskgateError,
)
from taskgate.domain.policies.facts import (
    SLOW_NEEDS,
    SlowFacts,
    Verdict,
)
from taskgate.domain.policies.violations import Violation
from taskgate.domain.session_fsm import TRANSITIONS, TransitionSpec, allowed_triggers, find_transition
from taskgate.domain.states import SessionState, Trigger


def _needs_plan_lock(row: TransitionSpec) -> bool:
    return row.enters_wip or row.dest == SessionState.COMPLETED


# Triggers some row of which locks the plan: their fire locks it with the session, before the row is known (a lock
# a row turns out not to need is only held until the commit; the order of the locks is the same either way)
_MAY_LOCK_PLAN = frozenset(row.trigger for row in TRANSITIONS if _needs_plan_lock(row))


class SessionService(SessionRecords, SessionGuarding, SessionStarts, SessionReads):
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
            locks = await self._lock_for(uow, trigger, cmd)
            session = locks.session
            await refuse_unless_held(uow, session, self.node_id)
            row = await self._row(uow, session, trigger, cmd.expected_version)
            if not locks.operator_found:
                raise OperatorNotFound(cmd.decision.operator_id if cmd.decision else session.operator_id)
            plan = locks.plan if _needs_plan_lock(row) else None
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
    async def _lock_for(uow: UnitOfWork, trigger: Trigger, cmd: FireTrigger) -> TransitionLocks:
        """The row locks a transition takes, always in this order (session, operator, plan), so that two
        transactions never wait on each other in a cycle; on PostgreSQL one statement takes them all.

        The operator's row: a decision's operator (one decision at a time per operator, across processes too), or
        for a `start` the session's own operator (operator_capacity counts the operator's sessions in progress
        across plans: starts of one operator queue on its row, after the session's, before the plan's). The plan's
        row when the trigger may enter the WIP window or complete a task."""
        return await uow.sessions.lock_for_transition(
            cmd.session_id,
            cmd.decision.operator_id if cmd.decision is not None else None,
            session_operator=cmd.decision is None and trigger == Trigger.START,
            plan=trigger in _MAY_LOCK_PLAN,
        )

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
