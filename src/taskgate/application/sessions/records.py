"""What a transition writes, in its one transaction: the session advanced and its log row (applied, or blocked with the
guard results), the decision it carries, an event, and the task's and plan's status that follow the session's
(docs/architecture.md)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from taskgate.application.ports import UnitOfWork
from taskgate.application.sessions.commands import (
    FireResult,
    FireTrigger,
)
from taskgate.domain.entities import (
    Decision,
    Outcome,
    Plan,
    PlanStatus,
    Session,
    TransitionRecord,
    task_status_for,
)
from taskgate.domain.errors import (
    InvalidInput,
)
from taskgate.domain.policies.facts import (
    Verdict,
)
from taskgate.domain.session_fsm import TransitionSpec, prior_state_after
from taskgate.domain.states import TERMINAL_STATES, WIP_STATES, SessionState

_log = logging.getLogger("taskgate.policies")


class SessionRecords:
    """What an applied or refused transition writes: the session, its log row, the decision it carries, and the task and
    plan that follow it."""

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
        payload = {"trigger": row.trigger.value, "violations": [v.describe() for v in verdict.blocking()]}
        # the event first: a unit may hold it and send it with the log row, one statement (PostgreSQL: pg_writes.py)
        await uow.events.append("session.blocked", record.at, payload, session.id)
        await uow.transitions.append(record)
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
        moved = {"trigger": row.trigger.value, "from": session.state.value, "to": new_state.value}
        if verdict.bypassed:  # an operator overrode policies: say which violations were let through
            moved["bypassed"] = [v.describe() for v in verdict.bypassed]
        await uow.events.append("session.transition", now, moved, session.id)
        # the log row last: its seq is the one result waited for, so the writes before it (the session, task, plan,
        # event) can go with it as one statement (PostgreSQL: pg_writes.py)
        record = _record(updated, row, session.state, Outcome.APPLIED, cmd.actor, cmd.reason, verdict, at=now)
        record = replace(record, seq=await uow.transitions.append(record))
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


_CHANGEABLE = frozenset({"branch_name", "worktree_path", "state_data", "compensation_plan"})


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
