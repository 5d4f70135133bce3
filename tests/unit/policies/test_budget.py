"""The `budget` policy in the policy book: on only when a budget is set, listed with the others, guarding the
transitions into progress."""

from __future__ import annotations

from taskgate.bootstrap import Settings, policy_book, presets_of
from taskgate.domain.session_fsm import TRANSITIONS
from taskgate.domain.states import Trigger


def test_without_budgets_there_is_no_budget_policy():
    assert "budget" not in [e.policy.name for e in policy_book(Settings()).entries()]


def test_with_a_budget_the_policy_is_listed_and_guards_starts_retries_and_resumes_into_progress():
    book = policy_book(Settings(budgets={"day": {"usd": 5}}, agents={"mine": {"preset": "codex"}}))
    (entry,) = [e for e in book.entries() if e.policy.name == "budget"]
    assert entry.enabled and entry.as_dict()["triggers"] == ["resume", "retry", "start"]
    guarded = {t.trigger for t in TRANSITIONS if entry.policy.applies_to(t)}
    assert guarded == {Trigger.START, Trigger.RETRY, Trigger.RESUME}
    assert presets_of(Settings(agents={"mine": {"preset": "codex"}, "own": {"command": ["x"]}})) == {
        "mine": "codex", "own": "custom",
    }  # fmt: skip
