"""How a session is born and carried on: `create_session`, the operator's `start_task` (its session reused or created,
initialised, then started, with the losers of a concurrent start told who won), and `resume` after a crash
(docs/failure-model.md)."""

from __future__ import annotations

from taskgate.application.ports import UnitOfWork
from taskgate.application.sessions import crashpoints
from taskgate.application.sessions.commands import (
    START_REQUESTED,
    SYSTEM_ACTOR,
    CreateSession,
    FireResult,
    FireTrigger,
    StartTask,
    parse_trigger,
)
from taskgate.application.sessions.effects import Aftermath
from taskgate.application.sessions.records import _record
from taskgate.domain.entities import (
    Outcome,
    Session,
)
from taskgate.domain.errors import (
    InvalidTransition,
    PolicyViolation,
    ProjectArchived,
    SessionAlreadyActive,
)
from taskgate.domain.policies.facts import (
    GuardFacts,
)
from taskgate.domain.session_fsm import TransitionSpec, find_transition
from taskgate.domain.states import SessionState, Trigger


class SessionStarts:
    """How sessions are born and carried on: create, the operator's start of a task (created → initialized → ready →
    started, each step idempotent), and resume after a crash."""

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
            raise _active_refusal(cmd.task_id, existing)
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
        return _active_refusal(task_id, session)


def _active_refusal(task_id: str, session: Session) -> SessionAlreadyActive:
    return SessionAlreadyActive(f"task {task_id} already has session {session.id} in state '{session.state.value}'")


def _constant(facts: GuardFacts):
    async def load(needs: frozenset[str] = frozenset()) -> GuardFacts:
        return facts

    return load
