"""The built-in policies of issue 5 as pure rules over a facts snapshot, and the policy framework around them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from taskgate.domain.entities import Operator, Plan, PlanStatus, Project, Session, Task, TaskStatus
from taskgate.domain.errors import InvalidInput
from taskgate.domain.policies.book import BUILTIN, build_policy
from taskgate.domain.policies.facts import GuardFacts, SlowFacts, TestRun, Verdict, WorkspaceFacts
from taskgate.domain.policies.rules import (
    BranchNaming,
    CleanWorktree,
    CommitMessageFormat,
    OperatorCapacity,
    RequireTests,
    ReviewApproval,
    TrackerInSync,
    WipLimit,
)
from taskgate.domain.policies.violations import Severity
from taskgate.domain.session_fsm import find_transition
from taskgate.domain.states import SessionState, Trigger

NOW = datetime(2026, 1, 1, tzinfo=UTC)
START = find_transition(SessionState.READY, Trigger.START, None)
APPROVE = find_transition(SessionState.VERIFYING, Trigger.APPROVE, None)
MERGE = find_transition(SessionState.AWAITING_MERGE, Trigger.MERGE, None)
HEAD = "a" * 40
COMMAND = ("pytest", "-q")


def session(branch: str | None = "feature/P-1/abcdef12") -> Session:
    return Session("s-1", "P-1", 1, 1, "alice", SessionState.VERIFYING, 7, NOW, NOW, branch_name=branch)


def facts(transition=APPROVE, **changes) -> GuardFacts:
    base = GuardFacts(
        transition=transition,
        task=Task("P-1", 1, 1, "t", "", 2, TaskStatus.PENDING_REVIEW, NOW),
        plan=Plan(1, 1, "Phase 1", PlanStatus.IN_PROGRESS, NOW),
        project=Project(1, "shop", "P", "/tmp/p", NOW),
        session=session(),
    )
    return replace(base, **changes)


def workspace(**changes) -> WorkspaceFacts:
    return replace(WorkspaceFacts("feature/P-1/abcdef12", HEAD, commits=((HEAD, "feat: add it"),)), **changes)


def ran(exit_code: int | None = 0, *, timed_out: bool = False, output: str = "ok", head: str = HEAD) -> SlowFacts:
    run = TestRun("s-1", 7, COMMAND, exit_code, timed_out, 1500, output, head, NOW)
    return SlowFacts(workspace(), COMMAND, 30.0, run, False)


def test_operator_capacity_refuses_an_operator_at_their_maximum_on_start():
    policy = OperatorCapacity()
    bob = Operator("bob", "Bob", None, [], [], 2, NOW)
    assert policy.applies_to(START) and not policy.applies_to(APPROVE)
    assert policy.check(facts(START, operator=bob, operator_sessions_in_wip=1)) == []
    [violation] = policy.check(facts(START, operator=bob, operator_sessions_in_wip=2))
    assert "bob already has 2 of 2" in violation.message and violation.suggestion
    assert policy.check(facts(START, operator=None, operator_sessions_in_wip=99)) == []  # no operator: nothing to cap


def test_require_tests_passes_on_exit_zero_at_the_head():
    assert RequireTests().check(facts(slow=ran(0))) == []


def test_require_tests_quotes_the_last_lines_of_a_failing_run():
    output = "\n".join(f"line {i}" for i in range(50)) + "\nFAILED test_x.py::test_it\n"
    [violation] = RequireTests(message_lines=3).check(facts(slow=ran(1, output=output)))
    assert "exited with 1" in violation.message and HEAD[:12] in violation.message
    assert violation.message.endswith("output: line 48 | line 49 | FAILED test_x.py::test_it")
    assert "line 47" not in violation.message and "\n" not in violation.message
    assert violation.severity == Severity.ERROR and "fix the failing tests" in violation.suggestion


def test_require_tests_reports_a_timeout_and_a_run_on_another_head():
    [timeout] = RequireTests().check(facts(slow=ran(None, timed_out=True)))
    assert "timed out after 30 s" in timeout.message and "test_timeout_s" in timeout.suggestion
    [stale] = RequireTests().check(facts(slow=ran(0, head="b" * 40)))
    assert "not on the current head" in stale.message


def test_require_tests_without_a_command_is_an_info_note_and_without_a_run_an_error():
    [note] = RequireTests().check(facts())
    assert note.severity == Severity.INFO and "[projects.shop]" in note.suggestion
    no_run = SlowFacts(None, COMMAND, 30.0, None, None, "the session has no worktree")
    [missing] = RequireTests().check(facts(slow=no_run))
    assert missing.severity == Severity.ERROR and "no worktree" in missing.message


def test_review_approval_counts_distinct_approvers_against_the_minimum():
    policy = ReviewApproval(min_approvals=2)
    [short] = policy.check(facts(approvals=("alice", "alice")))
    assert short.message == "1 of 2 required approvals (alice)"
    assert policy.check(facts(approvals=("alice", "bob"))) == []
    assert "0 of 2" in policy.check(facts())[0].message


def test_clean_worktree_lists_modified_untracked_and_conflicted_files():
    policy = CleanWorktree()
    assert policy.applies_to(APPROVE) and policy.applies_to(MERGE)
    assert policy.check(facts(slow=SlowFacts(workspace()))) == []
    dirty = workspace(dirty=("a.py",), untracked=tuple(f"n{i}" for i in range(12)))
    [violation] = policy.check(facts(slow=SlowFacts(dirty)))
    assert "modified a.py; untracked n0" in violation.message and "and 2 more" in violation.message
    assert policy.check(facts()) == []  # no worktree (an engine without git): nothing to inspect


def test_branch_naming_matches_the_whole_branch_name():
    policy = BranchNaming(pattern=r"feature/[A-Z]+-\d+/[0-9a-f]{8}")
    assert policy.check(facts()) == []
    [violation] = policy.check(facts(session=session("wip/P-1")))
    assert "branch 'wip/P-1' does not match" in violation.message
    assert policy.check(facts(session=session(None))) == []  # no branch yet


def test_commit_message_format_names_the_subjects_that_are_not_conventional():
    policy = CommitMessageFormat()
    ok = workspace(commits=(("1" * 40, "feat(api): add it"), ("2" * 40, "fix!: drop it"), ("3" * 40, "Merge main")))
    assert policy.check(facts(slow=SlowFacts(ok))) == []
    bad = workspace(commits=(("4" * 40, "wip"), ("5" * 40, "feat: fine"), ("6" * 40, "Fixed stuff")))
    [violation] = policy.check(facts(slow=SlowFacts(bad)))
    assert "2 commit subject(s)" in violation.message and "44444444 'wip'" in violation.message
    assert "Fixed stuff" in violation.message and "feat: fine" not in violation.message
    strict = CommitMessageFormat(allow_merge_commits=False)
    assert strict.check(facts(slow=SlowFacts(workspace(commits=(("7" * 40, "Merge main"),)))))


def test_tracker_in_sync_blocks_a_merge_while_the_tracker_is_behind():
    policy = TrackerInSync()
    assert policy.triggers == {Trigger.MERGE} and policy.check(facts()) == []
    owed = ("write-back #3 of bd-1 → in_progress failed after 6 attempt(s): cannot claim",)
    [violation] = policy.check(facts(tracker_owed=owed))
    assert "the tracker is behind: write-back #3 of bd-1" in violation.message
    assert "tracker retry" in violation.suggestion


def test_policies_carry_triggers_and_settings():
    assert WipLimit(limit=5).settings == {"limit": 5} and Trigger.START in WipLimit().triggers
    assert ReviewApproval().settings == {"min_approvals": 1} and ReviewApproval().triggers == {Trigger.APPROVE}
    assert RequireTests().settings == {"reuse": True, "message_lines": 20}
    assert set(BUILTIN) == {
        "wip_limit",
        "plan_open",
        "task_unblocked",
        "operator_capacity",
        "require_tests",
        "review_approval",
        "clean_worktree",
        "branch_naming",
        "commit_message_format",
        "tracker_in_sync",
    }


def test_build_policy_applies_severity_priority_triggers_and_settings():
    policy = build_policy(
        "review_approval", {"severity": "warning", "priority": 1, "triggers": ["approve", "merge"], "min_approvals": 3}
    )
    assert (policy.severity, policy.priority, policy.min_approvals) == (Severity.WARNING, 1, 3)
    assert policy.applies_to(MERGE)
    assert policy.check(facts())[0].severity == Severity.WARNING


@pytest.mark.parametrize(
    ("name", "options", "named"),
    [
        ("review_aproval", {}, "policies.review_aproval: unknown policy"),
        ("review_approval", {"min_aprovals": 2}, "policies.review_approval.min_aprovals: unknown setting"),
        ("review_approval", {"min_approvals": "2"}, "policies.review_approval.min_approvals: must be an int"),
        ("review_approval", {"min_approvals": 0}, "policies.review_approval.min_approvals: must be at least 1"),
        ("clean_worktree", {"severity": "fatal"}, "policies.clean_worktree.severity: must be error, warning or info"),
        ("clean_worktree", {"triggers": ["aprove"]}, "policies.clean_worktree.triggers: unknown trigger"),
        ("branch_naming", {"pattern": "("}, "policies.branch_naming.pattern: invalid regular expression"),
        ("require_tests", {"reuse": 1}, "policies.require_tests.reuse: must be a boolean"),
    ],
)
def test_bad_configuration_is_refused_naming_the_key(name, options, named):
    with pytest.raises(InvalidInput, match=named.replace("(", r"\(").replace(".", r"\.")):
        build_policy(name, options)


def test_an_overridden_policy_is_recorded_as_bypassed_and_does_not_block():
    verdict = Verdict()
    verdict.record(
        CleanWorktree(), CleanWorktree().check(facts(slow=SlowFacts(workspace(dirty=("a",))))), overridden=True
    )
    assert verdict.allowed and verdict.violations == [] and [v.policy for v in verdict.bypassed] == ["clean_worktree"]
    [result] = verdict.results
    assert result.as_dict()["overridden"] is True and result.passed is False
