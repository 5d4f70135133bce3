"""The built-in guards as pure rules over a facts snapshot."""

from datetime import UTC, datetime

from taskgate.domain.entities import Plan, PlanStatus, Project, Task, TaskStatus
from taskgate.domain.policies.book import default_policies
from taskgate.domain.policies.facts import BlockerFact, GuardFacts, Verdict
from taskgate.domain.policies.rules import OneActiveSessionPerTask, PlanOpen, TaskUnblocked, WipLimit
from taskgate.domain.policies.violations import Severity, Violation
from taskgate.domain.session_fsm import find_transition
from taskgate.domain.states import SessionState, Trigger

NOW = datetime(2026, 1, 1, tzinfo=UTC)
START = find_transition(SessionState.READY, Trigger.START, None)
CREATE = find_transition(None, Trigger.CREATE, None)


def facts(transition=START, plan_status=PlanStatus.OPEN, wip=0, blockers=(), others=()) -> GuardFacts:
    return GuardFacts(
        transition=transition,
        task=Task("P-1", 1, 1, "t", "", 2, TaskStatus.OPEN, NOW),
        plan=Plan(1, 1, "Phase 1", plan_status, NOW),
        project=Project(1, "p", "P", "/tmp/p", NOW),
        blockers=tuple(blockers),
        plan_sessions_in_wip=wip,
        other_active_sessions=tuple(others),
    )


def test_wip_limit_allows_below_the_limit_and_refuses_at_it():
    policy = WipLimit(limit=3)
    assert policy.check(facts(wip=2)) == []
    [violation] = policy.check(facts(wip=3))
    assert violation.policy == "wip_limit" and "3 of 3" in violation.message and violation.suggestion


def test_wip_limit_guards_only_transitions_entering_the_wip_window():
    assert WipLimit().applies_to(START)
    assert not WipLimit().applies_to(find_transition(SessionState.PLANNING, Trigger.PLAN_COMPLETE, None))
    assert WipLimit().applies_to(find_transition(SessionState.FAILED, Trigger.RETRY, None))


def test_plan_open_refuses_a_closed_plan():
    assert PlanOpen().check(facts()) == []
    [violation] = PlanOpen().check(facts(plan_status=PlanStatus.CLOSED))
    assert "closed" in violation.message


def test_task_unblocked_names_every_unfinished_blocker():
    done = BlockerFact("P-2", TaskStatus.COMPLETED)
    assert TaskUnblocked().check(facts(blockers=[done])) == []
    [violation] = TaskUnblocked().check(facts(blockers=[done, BlockerFact("P-3", TaskStatus.IN_PROGRESS)]))
    assert "P-3 (in_progress)" in violation.message and "P-2" not in violation.message


def test_one_active_session_per_task_guards_creation_only():
    policy = OneActiveSessionPerTask()
    assert policy.applies_to(CREATE) and not policy.applies_to(START)
    [violation] = policy.check(facts(CREATE, others=["abc"]))
    assert "abc" in violation.message


def test_a_verdict_is_denied_by_any_error_and_not_by_warnings():
    verdict = Verdict()
    verdict.record(PlanOpen(), [Violation("x", "only a warning", Severity.WARNING)])
    assert verdict.allowed and verdict.blocking() == []
    verdict.record(WipLimit(), [Violation("wip_limit", "full")])
    assert not verdict.allowed and [v.policy for v in verdict.blocking()] == ["wip_limit"]
    assert [r.passed for r in verdict.results] == [False, False]


def test_default_policies_come_in_priority_order_with_the_configured_limit():
    policies = default_policies(wip_limit=5)
    assert [p.priority for p in policies] == sorted(p.priority for p in policies)
    assert next(p for p in policies if p.name == "wip_limit").limit == 5
