"""Operator decisions (project_decide): effects, compensations, permissions, idempotency under concurrency."""

from __future__ import annotations

import asyncio
import sys
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from taskgate.application.operators.decisions import Decide, DecisionService
from taskgate.application.operators.roster import AddOperator
from taskgate.application.sessions.commands import FireTrigger
from taskgate.bootstrap import Settings, policy_book
from taskgate.domain.entities import Session
from taskgate.domain.errors import (
    ConcurrentModification,
    ConflictError,
    Forbidden,
    InvalidInput,
    InvalidTransition,
    PolicyViolation,
)
from taskgate.domain.states import SessionState
from taskgate.infrastructure.system import SystemClock
from tests.builders import ACTOR, OPERATOR, fire, seed, start
from tests.conftest import Services, wire


async def verifying(services: Services, git_repo: Path, tasks: int = 1) -> list[Session]:
    seeded = await seed(services, git_repo, tasks=tasks)
    return [await fire(services, await start(services, t), "plan_complete", "work_complete") for t in seeded.tasks]


async def decisions_of(services: Services, session_id: str):
    async with services.uow(write=False) as uow:
        return await uow.decisions.of_session(session_id)


async def events_of(services: Services, session_id: str, kind: str):
    async with services.uow(write=False) as uow:
        return [e for e in await uow.events.list(session_id, limit=1000) if e["kind"] == kind]


async def test_approve_moves_to_awaiting_merge_and_records_the_decision_with_the_transition(services, git_repo):
    [session] = await verifying(services, git_repo)
    result = await services.decisions.decide(Decide(session.id, OPERATOR, "approve", reason="looks good"))
    assert result.session.state == SessionState.AWAITING_MERGE and not result.replayed
    [decision] = await decisions_of(services, session.id)
    assert (decision.decision.value, decision.outcome, decision.to_state) == ("approve", "applied", "awaiting_merge")
    assert decision.session_version == session.version and decision.reason == "looks good"
    last = (await services.sessions.history(session.id, limit=1))[0]
    assert (last.trigger, last.actor, last.reason) == ("approve", ACTOR, "looks good")
    assert len(await events_of(services, session.id, "decision.recorded")) == 1


async def test_the_same_decision_again_returns_the_first_result_and_writes_nothing(services, git_repo):
    [session] = await verifying(services, git_repo)
    first = await services.decisions.decide(Decide(session.id, OPERATOR, "approve"))
    before = await services.snapshot()
    again = await services.decisions.decide(Decide(session.id, OPERATOR, "approve"))
    assert again.replayed and again.decision.id == first.decision.id and again.session.version == first.session.version
    assert await services.snapshot() == before


async def test_a_different_decision_on_a_decided_verification_is_refused_naming_the_first(services, git_repo):
    [session] = await verifying(services, git_repo)
    await services.decisions.decide(Decide(session.id, OPERATOR, "approve"))
    before = await services.snapshot()
    with pytest.raises(ConflictError, match="already decided: approve by alice"):
        await services.decisions.decide(Decide(session.id, OPERATOR, "reject"))
    assert await services.snapshot() == before


async def test_request_changes_sends_the_session_back_with_instructions_then_a_new_verification(services, git_repo):
    [session] = await verifying(services, git_repo)
    result = await services.decisions.decide(
        Decide(session.id, OPERATOR, "request_changes", reason="missing tests", instructions="add unit tests for X")
    )
    assert result.session.state == SessionState.EXECUTING
    assert result.session.state_data["instructions"] == "add unit tests for X"
    assert result.session.state_data["instructions_by"] == OPERATOR
    again = await fire(services, result.session, "work_complete")
    approved = await services.decisions.decide(Decide(again.id, OPERATOR, "approve"))  # a new verification
    assert approved.session.state == SessionState.AWAITING_MERGE and not approved.replayed
    assert [d.decision.value for d in await decisions_of(services, session.id)] == ["request_changes", "approve"]


async def test_reject_with_manual_review_stays_failed_until_an_operator_retries(services, git_repo):
    [session] = await verifying(services, git_repo)
    result = await services.decisions.decide(Decide(session.id, OPERATOR, "reject", reason="wrong approach"))
    assert result.session.state == SessionState.FAILED and result.session.compensation_plan == "manual_review"
    retried = await fire(services, result.session, "retry")
    assert retried.state == SessionState.EXECUTING


async def test_reject_with_auto_revert_discards_the_work_and_completes(services, git_repo):
    [session] = await verifying(services, git_repo)
    result = await services.decisions.decide(
        Decide(session.id, OPERATOR, "reject", reason="not needed", compensation="auto_revert")
    )
    assert result.session.state == SessionState.COMPLETED
    assert [r.trigger for r in result.follow_ups][-2:] == ["compensate", "cleanup_done"]
    assert not Path(session.worktree_path).exists()
    [event] = await events_of(services, session.id, "decision.compensation")
    assert event["payload"]["compensation"] == "auto_revert"


async def test_approve_and_merge_bypasses_the_review_with_an_audit_record(services, git_repo):
    [session] = await verifying(services, git_repo)
    result = await services.decisions.decide(
        Decide(session.id, OPERATOR, "reject", reason="ship it anyway", compensation="approve_and_merge")
    )
    assert result.session.state == SessionState.COMPLETED
    [event] = await events_of(services, session.id, "decision.review_bypassed")
    assert event["payload"]["operator"] == OPERATOR and event["payload"]["reason"] == "ship it anyway"
    [decision] = await decisions_of(services, session.id)
    assert decision.compensation.value == "approve_and_merge" and decision.override_policies["policies"] == ["*"]


async def test_permissions_decide_who_may_decide_and_override(services, git_repo):
    [session] = await verifying(services, git_repo)
    await services.operators.add(AddOperator("dev", ["developer"]))
    await services.operators.add(AddOperator("rev", ["reviewer"]))
    before = await services.snapshot()
    with pytest.raises(Forbidden, match="needs the 'approve' permission"):
        await services.decisions.decide(Decide(session.id, "dev", "approve"))
    with pytest.raises(Forbidden, match="needs the 'override' permission"):
        await services.decisions.decide(
            Decide(session.id, "rev", "approve", "hotfix", override_policies=("wip_limit",))
        )
    with pytest.raises(InvalidInput, match="needs a reason"):
        await services.decisions.decide(Decide(session.id, OPERATOR, "approve", override_policies=("wip_limit",)))
    assert await services.snapshot() == before
    assert (await services.decisions.decide(Decide(session.id, "rev", "approve"))).session.state.value == (
        "awaiting_merge"
    )


@pytest.mark.parametrize(
    ("decide", "message"),
    [
        (Decide("x", OPERATOR, "ship"), "unknown decision 'ship'"),
        (Decide("x", OPERATOR, "approve", instructions="do X"), "instructions go with request_changes only"),
        (Decide("x", OPERATOR, "approve", compensation="auto_revert"), "a compensation goes with reject only"),
        (Decide("x", OPERATOR, "reject", "r", compensation="undo"), "unknown compensation 'undo'"),
        (Decide("x", OPERATOR, "reject", "r", override_policies=("a",)), "override_policies goes with approve only"),
    ],
)
async def test_bad_decisions_are_refused_by_name_and_write_nothing(services, git_repo, decide, message):
    [session] = await verifying(services, git_repo)
    before = await services.snapshot()
    with pytest.raises(InvalidInput, match=message):
        await services.decisions.decide(replace(decide, session_id=session.id))
    assert await services.snapshot() == before


async def test_a_session_not_in_verification_cannot_be_decided(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    with pytest.raises(InvalidTransition, match="'approve' is not allowed"):
        await services.decisions.decide(Decide(session.id, OPERATOR, "approve"))


async def test_one_hundred_identical_concurrent_decisions_write_one_decision(sql_services, git_repo):
    [session] = await verifying(sql_services, git_repo)
    results = await asyncio.gather(
        *(sql_services.decisions.decide(Decide(session.id, OPERATOR, "approve")) for _ in range(100))
    )
    assert len({r.decision.id for r in results}) == 1 and sum(not r.replayed for r in results) == 1
    assert {r.session.state for r in results} == {SessionState.AWAITING_MERGE}
    assert len(await decisions_of(sql_services, session.id)) == 1
    applied = [r for r in await sql_services.sessions.history(session.id) if r.trigger == "approve"]
    assert len(applied) == 1


async def test_two_operators_deciding_differently_at_once_leave_one_decision(sql_services, git_repo):
    [session] = await verifying(sql_services, git_repo)
    await sql_services.operators.add(AddOperator("bob", ["reviewer"]))
    results = await asyncio.gather(
        sql_services.decisions.decide(Decide(session.id, OPERATOR, "approve")),
        sql_services.decisions.decide(Decide(session.id, "bob", "reject", reason="no")),
        return_exceptions=True,
    )
    won = [r for r in results if not isinstance(r, BaseException)]
    lost = [r for r in results if isinstance(r, BaseException)]
    assert len(won) == 1 and len(lost) == 1 and isinstance(lost[0], ConflictError | InvalidTransition), lost
    assert len(await decisions_of(sql_services, session.id)) == 1


class SessionsDecidedFirst:
    """The engine as a second process sees it: its next `fire` waits until `first` (another process's
    decision) committed. That is the window a cross-process race opens between a decision's read of the
    session and its transition, made deterministic."""

    def __init__(self, sessions, first) -> None:
        self._sessions, self._first = sessions, first

    def __getattr__(self, name: str):
        return getattr(self._sessions, name)

    async def fire(self, cmd: FireTrigger):
        first, self._first = self._first, None
        if first is not None:
            await first()
        return await self._sessions.fire(cmd)


def second_process(services: Services, first) -> DecisionService:
    """A DecisionService of its own (its own operator locks, as in another process) on the same database."""
    return DecisionService(services.uow, SessionsDecidedFirst(services.sessions, first), SystemClock())


async def test_an_identical_decision_that_lost_the_race_returns_the_winners_result(services, git_repo):
    [session] = await verifying(services, git_repo)
    won = []

    async def winner() -> None:
        won.append(await services.decisions.decide(Decide(session.id, OPERATOR, "approve")))

    lost = await second_process(services, winner).decide(Decide(session.id, OPERATOR, "approve"))
    assert not won[0].replayed and lost.replayed
    assert lost.decision.id == won[0].decision.id and lost.session.version == won[0].session.version
    assert lost.session.state == SessionState.AWAITING_MERGE
    assert len(await decisions_of(services, session.id)) == 1
    assert [r.trigger for r in await services.sessions.history(session.id)].count("approve") == 1


@pytest.mark.parametrize(("operator", "decision"), [(OPERATOR, "reject"), ("bob", "approve")])
async def test_a_different_decision_that_lost_the_race_is_refused_naming_the_winner(
    services, git_repo, operator, decision
):
    [session] = await verifying(services, git_repo)
    await services.operators.add(AddOperator("bob", ["reviewer"]))
    loser = second_process(services, lambda: services.decisions.decide(Decide(session.id, OPERATOR, "approve")))
    with pytest.raises(ConflictError, match=f"already decided at version {session.version}: approve by alice"):
        await loser.decide(Decide(session.id, operator, decision, reason="no"))
    assert len(await decisions_of(services, session.id)) == 1


async def test_a_decision_overtaken_by_something_else_than_a_decision_still_says_the_session_moved(services, git_repo):
    [session] = await verifying(services, git_repo)
    loser = second_process(services, lambda: fire(services, session, "suspend"))
    with pytest.raises(ConcurrentModification, match=f"not {session.version}"):
        await loser.decide(Decide(session.id, OPERATOR, "approve"))
    assert await decisions_of(services, session.id) == []


class DecidedBeforeTheLookup:
    """A unit-of-work factory whose first look for decisions runs only once `first` (another process's decision)
    committed: the window, inside the decision's one read transaction, between its read of the session and its
    look for an earlier decision. On PostgreSQL (READ COMMITTED) the look sees that decision; on SQLite (and the
    in-memory fake) the read transaction keeps the snapshot it started with, so the decision's own write finds
    the session moved on and replays the winner's from there."""

    def __init__(self, uow, first) -> None:
        self._uow, self._first = uow, first

    def __call__(self, *, write: bool):
        return self._opened(write)

    @asynccontextmanager
    async def _opened(self, write: bool):
        async with self._uow(write=write) as uow:
            lookup = uow.decisions.for_verification

            async def after_first(*args, **kwargs):
                if self._first is not None:
                    first, self._first = self._first, None
                    await first()
                return await lookup(*args, **kwargs)

            uow.decisions.for_verification = after_first
            yield uow


async def test_a_replay_found_after_another_process_decided_shows_the_session_as_decided(services, git_repo):
    [session] = await verifying(services, git_repo)
    winner = lambda: services.decisions.decide(Decide(session.id, OPERATOR, "approve"))  # noqa: E731
    # the second process read the session verifying, the first one decides, then the second looks for an
    # earlier decision (or, where its snapshot does not show it, loses the write) and replays it
    late = DecisionService(DecidedBeforeTheLookup(services.uow, winner), services.sessions, SystemClock())
    replay = await late.decide(Decide(session.id, OPERATOR, "approve"))
    assert replay.replayed and replay.session.state == SessionState.AWAITING_MERGE
    assert replay.session.version == session.version + 1
    assert len(await decisions_of(services, session.id)) == 1


async def test_one_operator_approving_many_sessions_at_once_applies_each_without_deadlock(sql_services, git_repo):
    # decisions lock the session row, then the operator row: always in that order, so no cycle is possible
    sessions = await verifying(sql_services, git_repo, tasks=3)
    results = await asyncio.wait_for(
        asyncio.gather(*(sql_services.decisions.decide(Decide(s.id, OPERATOR, "approve")) for s in sessions)), 60
    )
    assert {r.session.state for r in results} == {SessionState.AWAITING_MERGE}
    merged = await sql_services.sessions.fire(FireTrigger(sessions[0].id, "merge", ACTOR))
    assert merged.session.state == SessionState.COMPLETED


def product_services(services: Services, **projects) -> Services:
    """`services` with the product's policy set and per-project settings (as `taskgate serve` builds them)."""
    book = policy_book(Settings(projects=projects))
    return wire(services.backend, services.database, services.url, policies=book)


async def test_failing_tests_block_approval_until_an_authorised_override_which_is_audited(services, git_repo):
    failing = [sys.executable, "-c", "import sys; print('2 tests failed'); sys.exit(3)"]
    services = product_services(services, repo={"test_command": failing, "test_timeout_s": 30})
    [session] = await verifying(services, git_repo)
    with pytest.raises(PolicyViolation, match="require_tests"):
        await services.decisions.decide(Decide(session.id, OPERATOR, "approve"))
    assert await decisions_of(services, session.id) == []  # a refused decision is not a decision
    assert (await services.sessions.history(session.id, limit=1))[0].outcome.value == "blocked"

    result = await services.decisions.decide(
        Decide(
            session.id,
            OPERATOR,
            "approve",
            reason="flaky suite, verified by hand",
            override_policies=("require_tests",),
        )
    )
    assert result.session.state == SessionState.AWAITING_MERGE
    assert [v["policy"] for v in result.bypassed] == ["require_tests"] and "exited with 3" in result.bypassed[0][
        "message"
    ]
    [decision] = await decisions_of(services, session.id)
    assert decision.override_policies["policies"] == ["require_tests"]
    [event] = await events_of(services, session.id, "decision.override")
    assert event["payload"]["reason"] == "flaky suite, verified by hand"


async def test_review_approval_with_two_reviewers_counts_the_first_as_pending(services, git_repo):
    services = product_services(services, repo={"policies": {"review_approval": {"min_approvals": 2}}})
    [session] = await verifying(services, git_repo)
    await services.operators.add(AddOperator("bob", ["reviewer"]))

    first = await services.decisions.decide(Decide(session.id, OPERATOR, "approve"))
    assert first.pending and first.session.state == SessionState.VERIFYING and first.decision.outcome == "pending"
    again = await services.decisions.decide(Decide(session.id, OPERATOR, "approve"))
    assert again.replayed and again.pending and again.decision.id == first.decision.id
    second = await services.decisions.decide(Decide(session.id, "bob", "approve"))
    assert not second.pending and second.session.state == SessionState.AWAITING_MERGE
    assert sorted(d.operator_id for d in await decisions_of(services, session.id)) == ["alice", "bob"]


async def test_an_approval_whose_branch_a_cancel_removed_meanwhile_is_told_the_session_was_cancelled(
    services, git_repo, monkeypatch
):
    """Issue 36: the approval read the branch after a cancel (from another caller) removed it, and answered
    BranchGone with advice to recover it from the reflog. It is the cancel that the approver lost to."""
    [session] = await verifying(services, git_repo)
    vcs = services.workspaces._vcs
    real = vcs.branch_change
    async with services.uow(write=False) as uow:
        root = (await uow.projects.get(session.project_id)).root_path

    async def cancelled_first(*args, **kwargs):
        monkeypatch.setattr(vcs, "branch_change", real)
        # the other caller's cancel, committed while this approval does its git work (no fire lock: another process)
        await services.sessions.transition(FireTrigger(session.id, "cancel", "operator:bob", reason="not needed"))
        await vcs.remove_worktree(root, session.worktree_path, session.branch_name)
        return await real(*args, **kwargs)

    monkeypatch.setattr(vcs, "branch_change", cancelled_first)
    with pytest.raises(InvalidTransition, match=rf"session {session.id} was cancelled \(cancel by operator:bob at "):
        await services.decisions.decide(Decide(session.id, OPERATOR, "approve"))
    assert await decisions_of(services, session.id) == []
    assert (await services.sessions.get(session.id)).state == SessionState.CANCELLED
