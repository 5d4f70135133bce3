"""Operator decisions on a verification: approve, request changes, reject (with a compensation).

A *verification* is a session in `verifying` at one version. Each operator decides a verification at most
once; the decision row is written in the same transaction as the transition it causes, so a decision is
recorded if and only if it took effect (or, for an approval that `review_approval` needs more of, is
counted as pending).

Idempotency and races. Decisions of one operator run one at a time: an in-process lock per operator, and
inside the transition the operator's row is locked (`SELECT … FOR UPDATE` on PostgreSQL; SQLite serialises
every write). Before deciding, the operator's earlier decision on the same verification is looked up: the
same decision again returns the first result and writes nothing; a different one is refused naming the
first. Across processes two callers can both read the verification undecided; the one that writes second
fails (the session's version moved on under it, or the unique index on (session, version, operator) refuses
its row), rolls back, and looks at what settled the verification it read: the same decision of the same
operator is returned as a replay of the winner's; another decision is refused as above.

Effects: approve → awaiting_merge (guards require_tests, review_approval); request_changes → executing with
the instructions stored for the agents (`state_data.instructions`); reject → failed, then the compensation:
auto_revert (reset and discard the worktree → rolled_back → completed), manual_review (stays failed until
an operator fires `retry` or `cancel`), approve_and_merge (the review is bypassed: approved with every
blocking policy overridden and merged, audited as `decision.review_bypassed`).
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

from taskgate.application.operators.roster import authorize_in
from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.application.sessions import crashpoints
from taskgate.application.sessions.commands import MERGE_REQUESTED, FireResult, FireTrigger
from taskgate.application.sessions.engine import SessionService
from taskgate.application.workflows.engine import WorkflowEngine
from taskgate.domain.access import Capability, Principal, authorize_operator
from taskgate.domain.bounds import VERSIONS
from taskgate.domain.entities import (
    Compensation,
    Decision,
    DecisionKind,
    Operator,
    Session,
    TransitionRecord,
)
from taskgate.domain.errors import (
    AlreadyExists,
    ConcurrentModification,
    ConflictError,
    Forbidden,
    InvalidInput,
    InvalidTransition,
    PolicyViolation,
)
from taskgate.domain.session_fsm import allowed_triggers
from taskgate.domain.states import SessionState

MAX_TEXT = 5000
REVIEW_POLICY = "review_approval"
ALL_POLICIES = "*"


@dataclass(frozen=True, slots=True)
class Decide:
    """One operator's decision. `override_policies` needs the override permission and a reason."""

    session_id: str
    operator_id: str
    decision: str
    reason: str | None = None
    instructions: str | None = None
    override_policies: tuple[str, ...] = ()
    compensation: str | None = None
    # The session version the operator decided on (as session_status / project_sessions_ready showed it). With
    # it, a resent decision is recognised even after the session moved on to its next gate (a workflow's next
    # approval step, or verifying): it returns the first result instead of deciding the new gate.
    expected_version: int | None = None

    def __post_init__(self) -> None:
        """Raises: InvalidInput for a version out of its range (domain/bounds.py), before any I/O."""
        VERSIONS.check("expected_version", self.expected_version)


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """What a decision did. `replayed`: the same decision was sent before; this is its result, nothing new
    was written. `pending`: the approval was counted but review_approval wants more approvers."""

    decision: Decision
    session: Session
    replayed: bool = False
    pending: bool = False
    follow_ups: tuple[TransitionRecord, ...] = ()
    warnings: tuple[str, ...] = ()
    bypassed: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> str:
        d = self.decision
        if self.pending:
            what = f"approval by {d.operator_id} counted; review_approval needs more approvers"
        else:
            what = f"{d.decision.value} by {d.operator_id}: session is {self.session.state.value}"
        extra = " (the same decision was sent before: first result returned, nothing written)" if self.replayed else ""
        bypass = f"; overrode {', '.join(sorted({v['policy'] for v in self.bypassed}))}" if self.bypassed else ""
        return f"{what}{bypass}{extra}"


class DecisionService:
    """The `project_decide` use case."""

    def __init__(
        self, uow: UnitOfWorkFactory, sessions: SessionService, clock: Clock, workflows: WorkflowEngine | None = None
    ) -> None:
        self._uow, self._sessions, self._clock = uow, sessions, clock
        self._workflows = workflows
        self._operator_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def use_workflows(self, workflows: WorkflowEngine) -> None:
        """Answer workflow approval steps through `workflows` (the composition root attaches it)."""
        self._workflows = workflows

    async def decide(self, cmd: Decide, *, principal: Principal | None = None) -> DecisionResult:
        """Record and apply one decision (on a verification, or on the workflow approval step a session
        waits on).

        `principal` (the MCP caller, whose operator is `cmd.operator_id`) is authorised for decide inside the
        decision's first read transaction, with the same refusals as `OperatorService.authorize`, instead of in
        a transaction of its own before it. Raises: InvalidInput, SessionNotFound, OperatorNotFound, Forbidden,
        InvalidTransition (not waiting for a decision), ConflictError (a different decision already taken),
        PolicyViolation (guards refused; logged as blocked, nothing else written)."""
        if principal is not None and principal.operator_id != cmd.operator_id:
            raise Forbidden(f"operator {principal.operator_id} cannot decide as {cmd.operator_id}")
        try:
            kind, compensation = _validated(cmd)
        except InvalidInput:
            if principal is not None:  # a caller who may not decide at all hears that first, as from any tool
                async with self._uow(write=False) as uow:
                    await authorize_in(uow, principal, Capability.DECIDE)
            raise
        lock = self._operator_locks.get(cmd.operator_id)
        if lock is None:
            lock = self._operator_locks[cmd.operator_id] = asyncio.Lock()
        async with lock:
            # Who decides, on what, and what they decided before: one read transaction. On SQLite it is one
            # snapshot; on PostgreSQL (READ COMMITTED) each statement sees what was committed before it, as the
            # separate transactions did.
            async with self._uow(write=False) as uow:
                operator, session = await self._load(uow, cmd, principal)
                _authorize(operator, kind, compensation, cmd)
                if cmd.expected_version is not None and cmd.expected_version != session.version:
                    replay = await self._decided_in(uow, session.id, cmd.operator_id, kind, cmd.expected_version)
                    if replay is None:
                        raise ConflictError(f"session {session.id} is at version {session.version}, not "
                                            f"{cmd.expected_version}: it moved on; read it again")  # fmt: skip
                    return replay
                step = self._workflows.approval_step(session) if self._workflows is not None else None
                earlier = await self._earlier(uow, session, cmd.operator_id, kind, waiting=step is not None)
            if earlier is not None:
                return earlier
            # a reject with a compensation rejects the session even where the step routes rejects elsewhere
            if step is not None and (kind != DecisionKind.REJECT or (step.on_reject and cmd.compensation is None)):
                return await self._answer_step(session, operator, kind, cmd)
            decision = Decision(
                session_id=session.id,
                operator_id=operator.id,
                decision=kind,
                session_version=session.version,
                at=self._clock.now(),
                reason=cmd.reason,
                instructions=cmd.instructions,
                compensation=compensation,
            )
            try:
                return await self._apply(session, decision, cmd)
            except AlreadyExists as exc:  # the unique index: this operator's row was written meanwhile
                return await self._settled(session, cmd.operator_id, kind, exc)
            except _Overtaken as exc:  # the version check: the session moved on meanwhile
                return await self._settled(session, cmd.operator_id, kind, exc.cause)

    async def approve_verification(self, session_id: str, operator_id: str, reason: str, version: int) -> None:
        """The workflow engine's port (VerificationDecider): an operator's approval at a workflow's last approval
        step, taken as their decision on the verification at `version`. Raises: as `decide`."""
        await self.decide(Decide(session_id, operator_id, "approve", reason=reason, expected_version=version))

    async def fire(
        self, session_id: str, trigger: str, operator_id: str, *, reason: str | None = None,
        expected_version: int | None = None,
    ) -> FireResult:  # fmt: skip
        """A decision trigger (approve, request_changes, reject) fired as a plain trigger (MCP `session_fire`, CLI
        `session fire`): taken as the operator's decision, so it is recorded, a resend replays it, and a reject
        gets its compensation, exactly as `decide` would. Returns the decision's transition (the latest one, for a
        replay or an answer to a workflow approval step), with a warning when an approval is pending.

        Raises: as `decide`."""
        result = await self.decide(Decide(session_id, operator_id, trigger, reason=reason,
                                          expected_version=expected_version))  # fmt: skip
        async with self._uow(write=False) as uow:
            rows = await uow.transitions.history(session_id, limit=50)
        version = result.decision.session_version + (0 if result.pending else 1)
        own = [r for r in rows if r.trigger == trigger and r.session_version == version] or rows[-1:]
        notes = ["approval counted; review_approval needs more approvers"] if result.pending else []
        if result.replayed:
            notes.append("the same decision was taken before: its result, nothing new written")
        return FireResult(result.session, own[-1], result.follow_ups, (*result.warnings, *notes))

    # -- internals ---------------------------------------------------------------------------------------------

    async def _settled(
        self, session: Session, operator_id: str, kind: DecisionKind, lost: ConflictError | InvalidTransition
    ) -> DecisionResult:
        """This decision lost the race to write the verification `session` was read at (another process wrote
        first): the winner's result when it is the same decision by the same operator.

        Raises: ConflictError when a different decision (or another operator's) settled it; `lost` (the
        error the write met) when no decision did, i.e. the session moved on for another reason."""
        async with self._uow(write=False) as uow:
            replay = await self._decided_in(uow, session.id, operator_id, kind, session.version)
        if replay is None:
            raise lost
        return replay

    @staticmethod
    async def _decided_in(
        uow: UnitOfWork, session_id: str, operator_id: str, kind: DecisionKind, version: int
    ) -> DecisionResult | None:
        """The operator's decision taken on the session at `version` (a resent decision, or the one that won a
        race), as a replay showing the session as it is now; None when no decision settled that version.

        Raises: ConflictError when the operator decided differently there, or another operator's decision
        settled it."""
        taken = await uow.decisions.for_verification(session_id, version)
        session = await uow.sessions.get(session_id)  # after the decisions: never older than they are
        mine = [d for d in taken if d.operator_id == operator_id]
        first = mine[0] if mine else next((d for d in taken if d.outcome == "applied"), None)
        if first is None:
            return None
        if first.decision != kind or first.operator_id != operator_id:
            raise ConflictError(
                f"session {session.id} was already decided at version {version}: {first.decision.value} by "
                f"{first.operator_id}; a different decision is refused"
            )
        return DecisionResult(first, session, replayed=True, pending=first.outcome == "pending")

    async def _answer_step(self, session: Session, operator: Operator, kind: DecisionKind, cmd: Decide):
        """A workflow approval step: its decision row and the stack move in one transaction (the engine's).

        Idempotent like verifications: the waiting step is identified by the session's version, which every
        stack change bumps; the same decision again finds the first one (the session moved on) via `_earlier`."""
        assert self._workflows is not None
        if cmd.override_policies or cmd.compensation:
            raise InvalidInput("an approval step takes approve, request_changes or reject, without overrides")
        decision = Decision(session.id, operator.id, kind, session.version, self._clock.now(), reason=cmd.reason,
                            instructions=cmd.instructions)  # fmt: skip
        try:
            updated = await self._workflows.answer(session, decision)
        except ConflictError as exc:  # the session moved on since it was read (another process answered first?)
            return await self._settled(session, cmd.operator_id, kind, exc)
        async with self._uow(write=False) as uow:
            taken = await uow.decisions.for_verification(session.id, session.version)
        stored = next(d for d in taken if d.operator_id == operator.id)
        return DecisionResult(stored, updated)

    @staticmethod
    async def _load(uow: UnitOfWork, cmd: Decide, principal: Principal | None) -> tuple[Operator, Session]:
        """The deciding operator (read afresh: a permission taken away is refused at once) and the session.
        With a principal, its refusals come first and read as every tool's (Forbidden, "not registered")."""
        if principal is not None:
            operator = await authorize_in(uow, principal, Capability.DECIDE)
            if operator is None:  # only agents get None for DECIDE, and they are refused above it
                raise Forbidden("only a registered operator decides")
        else:
            operator = await uow.operators.get(cmd.operator_id)
        return operator, await uow.sessions.get(cmd.session_id)

    async def _earlier(
        self, uow: UnitOfWork, session: Session, operator_id: str, kind: DecisionKind, *, waiting: bool = False
    ) -> DecisionResult | None:
        """The operator's earlier decision on the current (or just decided) verification, if any. `waiting`:
        the session waits on a workflow approval step, which is decided like a verification (at its version).

        A decision belongs to one round: outside verifying, the session's last applied decision is the one a
        resend replays only while nothing but that decision's own consequences (a compensation, the merge and
        its clean-up, a suspension) has happened since; a retry, new work or a new verification starts a new
        round, which takes a new decision.

        Raises: ConflictError when it differs from `kind`; InvalidTransition when `kind` cannot be decided now.
        """
        if session.state == SessionState.VERIFYING or waiting:
            taken = await uow.decisions.for_verification(session.id, session.version)
            mine = [d for d in taken if d.operator_id == operator_id]
        else:
            mine = await self._this_rounds(uow, session)
        # read after the decisions: a replay shows the session as that decision left it (or later), never
        # the verifying row another process decided between our two reads
        current = await uow.sessions.get(session.id) if mine else session
        if not mine:
            allowed = allowed_triggers(session.state, session.prior_state)
            if session.state != SessionState.VERIFYING and not waiting and kind.value not in allowed:
                decidable = [d.value for d in DecisionKind if d.value in allowed]
                since = await SessionService.since(uow, session)  # e.g. "was cancelled (cancel by …)"
                raise InvalidTransition(session.id, session.state.value, kind.value, decidable, since=since)
            return None
        first = mine[0]
        if first.decision != kind or first.operator_id != operator_id:
            again = (
                "; to decide again, fire reverify (back to verifying)"
                if session.state == SessionState.AWAITING_MERGE
                else ""
            )
            raise ConflictError(
                f"session {session.id} was already decided: {first.decision.value} by {first.operator_id} at "
                f"{first.at.isoformat()} ({first.outcome}); a different decision is refused{again}"
            )
        return DecisionResult(first, current, replayed=True, pending=first.outcome == "pending")

    @staticmethod
    async def _this_rounds(uow, session: Session) -> list[Decision]:
        """The session's last applied decision, if the round it decided is still the current one."""
        applied = [d for d in await uow.decisions.of_session(session.id, limit=20) if d.outcome == "applied"]
        if not applied or applied[-1].session_version >= session.version:
            return []
        last = applied[-1]
        since = [r for r in await uow.transitions.history(session.id, limit=50) if r.outcome.value == "applied"]
        own = [r for r in since if r.session_version == last.session_version + 1 and r.trigger == last.decision]
        # an answer to a workflow approval step has no transition of its own: its round lasts until the next one
        after = last.session_version + (1 if own else 0)
        later = [r for r in since if r.session_version > after]
        return [last] if all(r.trigger in _SAME_ROUND for r in later) else []

    async def _apply(self, session: Session, decision: Decision, cmd: Decide) -> DecisionResult:
        if decision.decision == DecisionKind.APPROVE:
            return await self._approve(session, decision, cmd, frozenset(cmd.override_policies))
        if decision.decision == DecisionKind.REQUEST_CHANGES:
            changes = {"state_data": {"instructions": cmd.instructions, "instructions_by": decision.operator_id,
                                      "instructions_at": decision.at.isoformat()}}  # fmt: skip
            result = await self._fire(session, "request_changes", decision, changes=changes)
            stored = await self._stored(decision)
            return DecisionResult(stored, result.session, follow_ups=result.follow_ups, warnings=result.warnings)
        if decision.compensation == Compensation.APPROVE_AND_MERGE:
            return await self._approve_and_merge(session, decision, cmd)
        return await self._reject(session, decision)

    async def _approve(
        self,
        session: Session,
        decision: Decision,
        cmd: Decide,
        overrides: frozenset[str],
        changes: dict[str, Any] | None = None,
    ) -> DecisionResult:
        try:
            result = await self._fire(session, "approve", decision, overrides=overrides, changes=changes)
        except PolicyViolation as exc:
            if {v.policy for v in exc.violations} != {REVIEW_POLICY}:
                raise
            return await self._count_approval(session, decision)
        bypassed = _bypassed(result.record)
        stored = await self._stored(decision)
        return DecisionResult(stored, result.session, follow_ups=result.follow_ups, warnings=result.warnings,
                              bypassed=bypassed)  # fmt: skip

    async def _count_approval(self, session: Session, decision: Decision) -> DecisionResult:
        """An approval that review_approval does not find enough yet: stored as pending, the session waits."""
        pending = replace(decision, outcome="pending", to_state=session.state.value)
        async with self._uow(write=True) as uow:
            await self._sessions.fence(uow, session.id, f"the pending approval of {decision.operator_id}")
            await uow.operators.lock(decision.operator_id)
            pending = replace(pending, id=await uow.decisions.add(pending))
            payload = {"operator": decision.operator_id, "decision": "approve", "outcome": "pending"}
            await uow.events.append("decision.recorded", pending.at, payload, session.id)
            await uow.commit()
        return DecisionResult(pending, session, pending=True)

    async def _reject(self, session: Session, decision: Decision) -> DecisionResult:
        compensation = decision.compensation or Compensation.MANUAL_REVIEW
        changes = {"compensation_plan": compensation.value}
        result = await self._fire(session, "reject", replace(decision, compensation=compensation), changes=changes)
        follow_ups, warnings = result.follow_ups, result.warnings
        if compensation == Compensation.AUTO_REVERT:  # a crash here: resumed at restart (failed + auto_revert)
            crashpoints.reached("decide.reject")
            reverted = await self._sessions.fire(
                FireTrigger(session.id, "compensate", _actor(decision), reason="auto_revert chosen at reject")
            )
            follow_ups = (*follow_ups, reverted.record, *reverted.follow_ups)
            warnings = (*warnings, *reverted.warnings)
            result = reverted
        await self._event("decision.compensation", session.id, {"compensation": compensation.value,
                                                                 "state": result.session.state.value})  # fmt: skip
        stored = await self._stored(decision)
        return DecisionResult(stored, result.session, follow_ups=follow_ups, warnings=warnings)

    async def _approve_and_merge(self, session: Session, decision: Decision, cmd: Decide) -> DecisionResult:
        """The operator rejects the review but takes the work anyway: approve past every guard, then merge."""
        # the merge is owed from the approval on: recorded with it, so a crash before the merge is resumed
        request = {"by": _actor(decision), "at": decision.at.isoformat(), "why": "approve_and_merge"}
        changes = {"state_data": {MERGE_REQUESTED: request}}
        approved = await self._approve(session, decision, cmd, frozenset({ALL_POLICIES}), changes)
        merged = await self._sessions.fire(
            FireTrigger(session.id, "merge", _actor(decision), reason="approve_and_merge: review bypassed")
        )
        payload = {"operator": decision.operator_id, "reason": decision.reason, "bypassed": approved.bypassed}
        await self._event("decision.review_bypassed", session.id, payload)
        return replace(
            approved, session=merged.session, follow_ups=(*approved.follow_ups, merged.record, *merged.follow_ups)
        )

    async def _fire(
        self,
        session: Session,
        trigger: str,
        decision: Decision,
        *,
        changes: dict[str, Any] | None = None,
        overrides: frozenset[str] = frozenset(),
    ) -> FireResult:
        if overrides:
            decision = replace(decision, override_policies={"policies": sorted(overrides), "reason": decision.reason})
        cmd = FireTrigger(
            session.id,
            trigger,
            _actor(decision),
            reason=decision.reason,
            expected_version=session.version,
            changes=changes,
            decision=decision,
            overrides=overrides,
        )
        try:
            return await self._sessions.fire(cmd)
        except (ConcurrentModification, InvalidTransition) as exc:
            # the decision's own transition found the session moved on since `_earlier` read it decidable:
            # another process decided it first (a replay, see `_settled`), or cancelled it (its refusal says so)
            raise _Overtaken(exc) from exc

    async def _stored(self, decision: Decision) -> Decision:
        """The decision as the transition stored it (with its id, time and the state it led to)."""
        async with self._uow(write=False) as uow:
            taken = await uow.decisions.for_verification(decision.session_id, decision.session_version)
        return next(d for d in taken if d.operator_id == decision.operator_id)

    async def _event(self, kind: str, session_id: str, payload: dict[str, Any]) -> None:
        async with self._uow(write=True) as uow:
            await self._sessions.fence(uow, session_id, f"the {kind} event")
            await uow.events.append(kind, self._clock.now(), payload, session_id)
            await uow.commit()


class _Overtaken(Exception):
    """The decision's own fire met ConcurrentModification or InvalidTransition: the session changed after it was
    read (another process decided it first, or cancelled it). Raised only around that fire, so that the failure of
    what a decision fires afterwards (the compensation, the merge of approve_and_merge) is never mistaken for a
    lost race."""

    def __init__(self, cause: ConcurrentModification | InvalidTransition) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _validated(cmd: Decide) -> tuple[DecisionKind, Compensation | None]:
    try:
        kind = DecisionKind(cmd.decision)
    except ValueError:
        raise InvalidInput(
            f"unknown decision '{cmd.decision}'; one of: {', '.join(k.value for k in DecisionKind)}"
        ) from None
    for name, text in (("reason", cmd.reason), ("instructions", cmd.instructions)):
        if text is not None and (len(text) > MAX_TEXT or "\x00" in text):
            raise InvalidInput(f"{name} must be at most {MAX_TEXT} characters without NUL")
    if cmd.instructions and kind != DecisionKind.REQUEST_CHANGES:
        raise InvalidInput("instructions go with request_changes only")
    compensation = None
    if cmd.compensation is not None:
        if kind != DecisionKind.REJECT:
            raise InvalidInput("a compensation goes with reject only")
        try:
            compensation = Compensation(cmd.compensation)
        except ValueError:
            raise InvalidInput(
                f"unknown compensation '{cmd.compensation}'; one of: {', '.join(c.value for c in Compensation)}"
            ) from None
    if (cmd.override_policies or compensation == Compensation.APPROVE_AND_MERGE) and not (cmd.reason or "").strip():
        raise InvalidInput("overriding policies (or approve_and_merge) needs a reason; it is audited")
    if cmd.override_policies and kind != DecisionKind.APPROVE:
        raise InvalidInput("override_policies goes with approve only")
    return kind, compensation


def _authorize(operator: Operator, kind: DecisionKind, compensation: Compensation | None, cmd: Decide) -> None:
    authorize_operator(operator, Capability.DECIDE)
    if cmd.override_policies or compensation == Compensation.APPROVE_AND_MERGE:
        authorize_operator(operator, Capability.OVERRIDE)


# What may follow a decision within its own round: its compensation, the merge of an approval and its clean-up,
# a suspension. Anything else (retry, new work, a new verification) starts a new round.
_SAME_ROUND = frozenset({"compensate", "cleanup_done", "merge", "suspend", "resume"})


def _bypassed(record: TransitionRecord) -> list[dict[str, Any]]:
    return [r for r in record.guard_results if r.get("overridden")]


def _actor(decision: Decision) -> str:
    return f"operator:{decision.operator_id}"
