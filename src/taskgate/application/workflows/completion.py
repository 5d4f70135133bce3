"""The end of a session's workflow: `work_complete` once the stack is empty, and an operator's approval at the
workflow's last approval step taken as the verification decision (so nobody is asked twice)."""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from taskgate.application.ports import UnitOfWorkFactory
from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.workflows.ports import SYSTEM_ACTOR, VerificationDecider
from taskgate.domain.entities import Decision, Session, StepStatus
from taskgate.domain.errors import ConcurrentModification, InvalidTransition, TaskgateError
from taskgate.domain.states import SessionState, Trigger


class Completion:
    """What follows an emptied stack (a mixin of WorkflowEngine)."""

    _uow: UnitOfWorkFactory
    _sessions: Any  # SessionService
    _decisions: VerificationDecider | None

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
        assert self._decisions is not None
        why = f"approved at the workflow's last approval step '{step_id}'" + (
            f": {approval.reason}" if approval.reason else ""
        )
        with suppress(TaskgateError):
            await self._decisions.approve_verification(session.id, approval.operator_id, why[:2000], session.version)
