"""Spend caps (domain/budgets.py): configuration errors name the key; a start reserves within every cap; spend
reaching a cap or `warn_at` of it is a crossing."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskgate.domain.budgets import (
    Amount,
    BudgetConfig,
    Caps,
    Limit,
    Spent,
    Subject,
    crossings,
    holds_reservation,
    lines,
    parse_budgets,
    parse_config,
    refusals,
)
from taskgate.domain.errors import InvalidInput

TODAY = date(2026, 11, 29)
NOON = datetime(2026, 11, 29, 12, tzinfo=UTC)
SUBJECT = Subject("s-new", "SHOP-9", "SHOP")


def spent(session: str, usd: float, tokens: int = 0, *, task: str = "SHOP-1", at=NOON, kind="claude") -> Spent:
    return Spent(session, task, kind, at, Amount(tokens, usd))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"day": {"usd": -1}}, "budgets.day.usd: must be a positive number, not -1"),
        ({"day": {"usd": 0}}, "budgets.day.usd: must be a positive number, not 0"),
        ({"session": {"tokens": 1.5}}, "budgets.session.tokens: must be a positive whole number"),
        ({"session": {"dollars": 1}}, "budgets.session.dollars: unknown key"),
        ({"weekly": {"usd": 1}}, "budgets.weekly: unknown key"),
        ({"warn_at": 1.5}, "budgets.warn_at: must be a number above 0 and at most 1"),
        ({"per_preset": {"claude": {"month": {}}}}, "budgets.per_preset.claude.month: unknown key"),
        ({"expected": {"usd": -2}}, "budgets.expected.usd: must be a positive number"),
        ({"day": 5}, "budgets.day: must be a table"),
    ],
)
def test_a_bad_budget_is_an_error_naming_its_key(table, message):
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_config(table, "budgets")


def test_a_projects_budget_overrides_the_global_one_key_by_key():
    budgets = parse_budgets(
        {"day": {"usd": 5}, "session": {"tokens": 100}, "per_preset": {"codex": {"day": {"tokens": 9}}}},
        {"SHOP": {"day": {"usd": 50}, "per_preset": {"claude": {"day": {"usd": 1}}}}, "OPS": None},
    )
    shop = budgets.of("SHOP")
    assert shop.caps.day == Limit(usd=50.0) and shop.caps.session == Limit(tokens=100)
    assert set(shop.per_preset) == {"codex", "claude"}
    assert budgets.of("OPS").caps.day == Limit(usd=5.0)


def test_a_project_error_names_the_projects_table():
    with pytest.raises(InvalidInput, match=r"projects\.SHOP\.budgets\.task\.usd"):
        parse_budgets({}, {"SHOP": {"task": {"usd": "lots"}}})


def test_a_start_is_refused_with_the_day_spend_the_expected_spend_and_the_cap():
    config = BudgetConfig(Caps(day=Limit(usd=5.0)), expected=Amount(usd=1.0))
    found = lines(config, SUBJECT, [spent("s-1", 4.2)], [], TODAY)

    (reason,) = refusals(config, found)
    assert reason == "budget: project SHOP day (2026-11-29) spend $4.20 + expected $1.00 exceeds $5.00"


def test_yesterdays_spend_does_not_count_toward_todays_cap():
    config = BudgetConfig(Caps(day=Limit(usd=5.0)), expected=Amount(usd=1.0))
    found = lines(config, SUBJECT, [spent("s-1", 4.5, at=datetime(2026, 11, 28, 23, tzinfo=UTC))], [], TODAY)
    assert refusals(config, found) == []


def test_reservations_of_sessions_in_progress_count_until_their_agents_end():
    config = BudgetConfig(Caps(project=Limit(usd=3.0)), expected=Amount(usd=1.0))
    held = lines(config, SUBJECT, [], [("s-1", "SHOP-1"), ("s-2", "SHOP-2")], TODAY)
    assert refusals(config, held) == []
    full = lines(config, SUBJECT, [], [("s-1", "SHOP-1"), ("s-2", "SHOP-2"), ("s-3", "SHOP-3")], TODAY)
    assert "reserved $3.00" in refusals(config, full)[0]
    assert holds_reservation(True, []) and holds_reservation(True, ["completed", "running"])
    assert not holds_reservation(True, ["completed"]) and not holds_reservation(False, ["running"])


def test_session_and_task_caps_count_only_their_own_spend():
    config = BudgetConfig(Caps(session=Limit(tokens=100), task=Limit(tokens=100)), expected=Amount(tokens=10))
    found = lines(config, SUBJECT, [spent("s-1", 0, 95), spent("s-new", 0, 50, task="SHOP-9")], [], TODAY)
    assert {(line.scope, line.spent) for line in found} == {("session", 50), ("task", 50)}
    assert refusals(config, found) == []


def test_a_presets_cap_counts_only_its_agents_and_refuses_once_spent():
    config = BudgetConfig(per_preset={"codex": Caps(day=Limit(tokens=100))}, expected=Amount(tokens=10))
    agents = [spent("s-1", 0, 500, kind="claude-big"), spent("s-2", 0, 95, kind="my-codex")]
    found = lines(config, SUBJECT, agents, [], TODAY, preset_of={"my-codex": "codex"}.get)
    assert [(line.scope, line.spent) for line in found] == [("codex day", 95)]
    assert refusals(config, found) == []
    over = lines(config, SUBJECT, [*agents, spent("s-3", 0, 5, kind="my-codex")], [], TODAY, {"my-codex": "codex"}.get)
    assert refusals(config, over)


def test_crossings_say_nearly_past_warn_at_and_reached_at_the_cap():
    config = BudgetConfig(Caps(session=Limit(tokens=100, usd=1.0)), warn_at=0.8)
    found = lines(config, SUBJECT, [spent("s-new", 0.5, 85)], [], TODAY)
    (nearly,) = crossings(config, found)
    assert (nearly.kind, nearly.line.unit, nearly.event) == ("nearly", "tokens", "budget.nearly_spent")
    reached = crossings(config, lines(config, SUBJECT, [spent("s-new", 1.0, 10)], [], TODAY))
    assert [(c.kind, c.line.unit) for c in reached] == [("reached", "usd")]
    assert reached[0].payload("s-new") == {"session_id": "s-new", "scope": "session", "key": "s-new",
                                           "spent": 1.0, "limit": 1.0, "unit": "usd"}  # fmt: skip
    assert reached[0].reason() == "budget: session s-new spend $1.00 reached $1.00"


@settings(max_examples=200, deadline=None)
@given(
    cap=st.integers(1, 50),
    expected=st.integers(1, 10),
    runs=st.lists(st.tuples(st.booleans(), st.integers(0, 10)), max_size=40),
)
def test_admitting_only_what_the_reservation_allows_never_exceeds_the_cap(cap, expected, runs):
    """Starts arrive one after another; an admitted session holds its reservation until its agents end, then
    spends at most its expected amount (a bigger spend is the mid-run stop's business). Whatever the order of starts
    and ends, spend + reservations never pass the cap."""
    config = BudgetConfig(Caps(project=Limit(tokens=cap)), expected=Amount(tokens=expected))
    history: list[Spent] = []
    holding: list[tuple[str, str]] = []
    for n, (end_one, used) in enumerate(runs):
        if end_one and holding:
            sid, tid = holding.pop(0)
            history.append(Spent(sid, tid, "claude", NOON, Amount(min(used, expected))))
            continue
        subject = Subject(f"s-{n}", f"T-{n}", "SHOP")
        if not refusals(config, lines(config, subject, history, holding, TODAY)):
            holding.append((subject.session_id, subject.task_id))
        total = sum(s.amount.tokens for s in history) + expected * len(holding)
        assert total <= cap
