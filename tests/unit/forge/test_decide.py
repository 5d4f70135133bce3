"""The forge loop's rules: each look at a pull request decided into one step (domain/forge.py)."""

from __future__ import annotations

import hashlib
import hmac

from hypothesis import given
from hypothesis import strategies as st

from taskgate.domain.forge import (
    CheckRun,
    Limits,
    LineComment,
    Observation,
    PrStatus,
    PullRequest,
    Review,
    Rounds,
    StepKind,
    ci_instructions,
    decide,
    log_tail,
    review_instructions,
    signature_valid,
)

HEAD, OTHER = "a" * 40, "b" * 40


def _pull(**fields) -> PullRequest:
    base = {"number": 12, "url": "http://github.test/acme/shop/pull/12", "state": "open", "head": HEAD,
            "head_branch": "taskgate/x", "base_branch": "main", "mergeable": True}  # fmt: skip
    return PullRequest(**{**base, **fields})


def _check(name: str, conclusion: str | None = "success", status: str = "completed", id: int = 1) -> CheckRun:
    return CheckRun(id, name, status, conclusion)


def _decide(seen: Observation, state="awaiting_merge", pushed=HEAD, approved=HEAD, rounds=Rounds(), **limits):
    return decide(seen, state=state, pushed=pushed, approved=approved, rounds=rounds, limits=Limits(**limits))


def test_green_on_the_approved_head_merges_and_on_another_head_asks_the_operator():
    seen = Observation(_pull(), (_check("lint"), _check("test", id=2)))
    assert _decide(seen).kind == StepKind.MERGE
    step = _decide(seen, approved=OTHER)
    assert (step.kind, step.status) == (StepKind.ASK_OPERATOR, PrStatus.CHECKS_GREEN)
    assert "the operator approves the merge" in step.reason
    assert _decide(seen, auto_merge=False).kind == StepKind.WAIT


def test_a_failed_check_sends_the_agents_back_until_the_rounds_are_spent():
    seen = Observation(_pull(), (_check("lint", "failure"), _check("test", id=2)))
    step = _decide(seen)
    assert (step.kind, step.reason) == (StepKind.CI_FAILED, "CI failed (lint): sent back, round 1 of 3")
    assert [c.name for c in step.failed_checks] == ["lint"]
    spent = _decide(seen, rounds=Rounds(ci=3))
    assert spent.kind == StepKind.ASK_OPERATOR and "max_ci_rounds 3" in spent.reason


def test_pending_checks_and_too_few_checks_wait():
    assert _decide(Observation(_pull(), (_check("lint", None, "in_progress"),))).kind == StepKind.WAIT
    assert _decide(Observation(_pull(), ())).status == PrStatus.CHECKS_PENDING  # min_checks 1: CI has not reported
    assert _decide(Observation(_pull(), ()), min_checks=0).kind == StepKind.MERGE  # a repository without CI
    assert _decide(Observation(_pull(mergeable=None), (_check("lint"),))).kind == StepKind.WAIT  # not computed yet


def test_a_rerun_check_replaces_its_earlier_run():
    seen = Observation(_pull(), (_check("lint", "failure", id=1), _check("lint", "success", id=5)))
    assert _decide(seen).kind == StepKind.MERGE


def test_changes_requested_on_the_head_go_to_the_agents_with_file_and_line():
    reviews = (Review(1, "alice", "CHANGES_REQUESTED", "Please rename it.", HEAD),)
    comments = (LineComment(9, "alice", "app.py", 3, "call it total", HEAD),
                LineComment(8, "bob", "old.py", 1, "answered already", OTHER))  # fmt: skip
    seen = Observation(_pull(), (_check("lint"),), reviews, comments)
    for state in ("awaiting_merge", "verifying"):
        step = _decide(seen, state=state)
        assert step.kind == StepKind.REVIEW_CHANGES and "review by alice" in step.reason
        assert (
            "alice: Please rename it." in step.instructions and "- app.py:3 (alice): call it total" in step.instructions
        )
        assert "old.py" not in step.instructions


def test_a_review_of_an_older_head_or_a_later_approval_asks_nothing():
    old = (Review(1, "alice", "CHANGES_REQUESTED", "x", OTHER),)
    assert _decide(Observation(_pull(), (_check("lint"),), old)).kind == StepKind.MERGE
    again = (Review(1, "alice", "CHANGES_REQUESTED", "x", HEAD), Review(2, "alice", "APPROVED", "ok", HEAD))
    assert _decide(Observation(_pull(), (_check("lint"),), again)).kind == StepKind.MERGE


def test_merged_closed_moved_and_conflicting_pull_requests():
    merged = _decide(Observation(_pull(merged=True, merged_by="bob", state="closed")), state="verifying")
    assert (merged.kind, merged.reason) == (StepKind.FORGE_MERGED, "PR #12 merged on the forge by bob")
    closed = _decide(Observation(_pull(state="closed", closed_by="bob")))
    assert closed.kind == StepKind.ASK_OPERATOR and "closed on the forge without merge by bob" in closed.reason
    moved = _decide(Observation(_pull(head=OTHER), (_check("lint"),)))
    assert (moved.kind, moved.status) == (StepKind.ASK_OPERATOR, PrStatus.HEAD_MOVED)
    conflict = _decide(Observation(_pull(mergeable=False), (_check("lint"),)))
    assert (conflict.kind, conflict.reason) == (StepKind.REBASE, "PR #12 conflicts with main: rebase round 1")
    assert _decide(Observation(_pull(mergeable=False)), rounds=Rounds(rebase=2)).kind == StepKind.ASK_OPERATOR


def test_in_verifying_only_a_merge_on_the_forge_or_a_review_acts():
    for seen in (Observation(_pull(), (_check("lint", "failure"),)), Observation(_pull(mergeable=False)),
                 Observation(_pull(state="closed")), Observation(_pull(), (_check("lint"),))):  # fmt: skip
        assert _decide(seen, state="verifying").kind == StepKind.WAIT


_checks = st.lists(
    st.builds(CheckRun, st.integers(1, 5), st.sampled_from(["lint", "test"]),
              st.sampled_from(["queued", "in_progress", "completed"]),
              st.sampled_from([None, "success", "failure", "neutral", "cancelled", "skipped"])),
    max_size=5, unique_by=lambda c: c.id,  # GitHub's check run ids are unique: a rerun is a new, higher id
)  # fmt: skip
_reviews = st.lists(st.builds(Review, st.integers(1, 9), st.sampled_from(["alice", "bob"]),
                              st.sampled_from(["APPROVED", "CHANGES_REQUESTED", "COMMENTED"]), st.just("r"),
                              st.sampled_from([HEAD, OTHER])), max_size=4)  # fmt: skip


@given(
    checks=_checks, reviews=_reviews, head=st.sampled_from([HEAD, OTHER]),
    mergeable=st.sampled_from([True, False, None]), approved=st.sampled_from([HEAD, OTHER, None]),
    state=st.sampled_from(["awaiting_merge", "verifying"]),
)  # fmt: skip
def test_nothing_is_merged_but_the_approved_pushed_head_with_every_check_passed(
    checks, reviews, head, mergeable, approved, state
):
    seen = Observation(_pull(head=head, mergeable=mergeable), tuple(checks), tuple(reviews))
    step = _decide(seen, state=state, approved=approved)
    if step.kind == StepKind.MERGE:
        latest = {c.name: c for c in sorted(checks, key=lambda c: c.id)}
        assert state == "awaiting_merge" and head == HEAD == approved and mergeable is True
        assert latest and all(c.passed for c in latest.values())
        assert not any(r.state == "CHANGES_REQUESTED" and r.commit == head for r in reviews)
    if state == "verifying":
        assert step.kind in (StepKind.WAIT, StepKind.REVIEW_CHANGES)


def test_ci_instructions_name_the_check_and_carry_its_log_tail():
    log = "\n".join(f"line {i}" for i in range(500)) + "\nE   AssertionError: total is 3"
    text = ci_instructions(_pull(), ((_check("test", "failure"), log_tail(log, 40)),))
    assert "Check 'test' (failure)" in text and text.rstrip().endswith("AssertionError: total is 3\n```")
    assert "line 100\n" not in text and "line 470" in text
    assert review_instructions(_pull(), (), ()).startswith("A review of pull request #12")


def test_a_webhook_signature_is_the_hmac_of_the_raw_body():
    body = b'{"action":"completed"}'
    good = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert signature_valid("s3cret", body, good)
    assert not signature_valid("s3cret", body + b" ", good)
    assert not signature_valid("other", body, good)
    assert not signature_valid("s3cret", body, None) and not signature_valid("s3cret", body, good[7:])
    assert not signature_valid("", body, good)
