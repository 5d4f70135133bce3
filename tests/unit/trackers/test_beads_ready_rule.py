"""`bd ready`'s rule, case by case, as Beads' source has it (docs/trackers.md, "Readiness")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from taskgate.domain.beads import NOT_WORK_TYPES, BeadsGraph, BeadsNode

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
LATER, EARLIER = NOW + timedelta(days=2), NOW - timedelta(days=2)


def node(status: str = "open", *deps: tuple[str, str], **fields) -> BeadsNode:
    return BeadsNode(status, tuple(deps), **fields)


def child_of(parent: str, status: str = "open", *deps: tuple[str, str]) -> BeadsNode:
    return node(status, (parent, "parent-child"), *deps)


# (case, the issues, whether `x` is ready)
CASES = [
    ("open with no dependencies", {"x": node()}, True),
    *[
        (f"status {s}", {"x": node(s)}, False)
        for s in ("in_progress", "blocked", "deferred", "hooked", "pinned", "closed", "tombstone", "review")
    ],
    ("the pinned flag", {"x": node(pinned=True)}, False),
    ("ephemeral (a wisp)", {"x": node(ephemeral=True)}, False),
    *[(f"type {t}", {"x": node(issue_type=t)}, False) for t in sorted(NOT_WORK_TYPES)],
    *[(f"type {t}", {"x": node(issue_type=t)}, True) for t in ("epic", "bug", "feature", "chore", "convoy", "event")],
    ("deferred until later", {"x": node(defer_until=LATER)}, False),
    ("deferred until a time gone by", {"x": node(defer_until=EARLIER)}, True),
    ("its parent deferred until later", {"p": node(defer_until=LATER), "x": child_of("p")}, False),
    ("blocks an open issue", {"b": node(), "x": node("open", ("b", "blocks"))}, False),
    ("blocks a closed issue", {"b": node("closed"), "x": node("open", ("b", "blocks"))}, True),
    *[
        (f"blocks a {s} issue (still active)", {"b": node(s), "x": node("open", ("b", "blocks"))}, False)
        for s in ("in_progress", "blocked", "deferred", "hooked", "review")
    ],
    ("blocks a pinned issue (inactive)", {"b": node("pinned"), "x": node("open", ("b", "blocks"))}, True),
    ("blocks a tombstoned issue", {"b": node("tombstone"), "x": node("open", ("b", "blocks"))}, True),
    ("blocks an issue missing from the set", {"x": node("open", ("gone", "blocks"))}, True),
    ("blocks an external capability", {"x": node("open", ("external:shop:payments", "blocks"))}, True),
    ("conditional-blocks an open issue", {"b": node(), "x": node("open", ("b", "conditional-blocks"))}, False),
    ("conditional-blocks a closed issue", {"b": node("closed"), "x": node("open", ("b", "conditional-blocks"))}, True),
    *[
        (f"{t} to an open issue", {"b": node(), "x": node("open", ("b", t))}, True)
        for t in ("related", "discovered-from", "duplicates", "tracks", "my-own-type")
    ],
    ("an open, unblocked parent", {"p": node(), "x": child_of("p")}, True),
    ("a parent blocked by an open issue", {"b": node(), "p": node("open", ("b", "blocks")), "x": child_of("p")}, False),
    (
        "a parent whose blocker closed",
        {"b": node("closed"), "p": node("open", ("b", "blocks")), "x": child_of("p")},
        True,
    ),
    (
        "a closed parent with an open blocker (not active, so not blocked)",
        {"b": node(), "p": node("closed", ("b", "blocks")), "x": child_of("p")},
        True,
    ),
    ("a parent with status blocked but no blocking dependency", {"p": node("blocked"), "x": child_of("p")}, True),
    (
        "a blocked grandparent (one hop only)",
        {"b": node(), "g": node("open", ("b", "blocks")), "p": child_of("g"), "x": child_of("p")},
        True,
    ),
    (
        "waits for a spawner with an open child",
        {"s": node(), "k": child_of("s"), "x": node("open", ("s", "waits-for"))},
        False,
    ),
    (
        "waits for a spawner whose children all closed",
        {"s": node(), "k": child_of("s", "closed"), "x": node("open", ("s", "waits-for"))},
        True,
    ),
    ("waits for a spawner with no children", {"s": node(), "x": node("open", ("s", "waits-for"))}, True),
    (
        "waits for a spawner whose only open child is pinned",
        {"s": node(), "k": child_of("s", "pinned"), "x": node("open", ("s", "waits-for"))},
        True,
    ),
    (
        "waits (any child) for a spawner with one child closed",
        {
            "s": node(),
            "k1": child_of("s", "closed"),
            "k2": child_of("s"),
            "x": node("open", ("s", "waits-for"), any_gates=frozenset({"s"})),
        },
        True,
    ),
    (
        "waits (any child) for a spawner with no child closed",
        {
            "s": node(),
            "k1": child_of("s"),
            "k2": child_of("s", "in_progress"),
            "x": node("open", ("s", "waits-for"), any_gates=frozenset({"s"})),
        },
        False,
    ),
    (
        "waits (any child) for a spawner with no children",
        {"s": node(), "x": node("open", ("s", "waits-for"), any_gates=frozenset({"s"}))},
        True,
    ),
    ("an open child does not block its parent", {"k": child_of("x"), "x": node()}, True),
    ("a parent blocked by this very issue (a cycle)", {"p": node("open", ("x", "blocks")), "x": child_of("p")}, False),
]


@pytest.mark.parametrize(("issues", "ready"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bd_ready_lists_the_issue_exactly_when_the_rule_says(issues: dict[str, BeadsNode], ready: bool) -> None:
    graph = BeadsGraph(issues)
    assert graph.is_ready("x", NOW) is ready
    assert ("x" in graph.ready(NOW)) is ready


def test_the_stored_blockers_are_the_issue_and_its_active_parents_direct_blockers() -> None:
    graph = BeadsGraph(
        {
            "b": node(),
            "c": node("closed"),
            "s": node(),
            "k": child_of("s"),
            "p": node("open", ("b", "blocks"), ("s", "waits-for")),
            "x": node("open", ("p", "parent-child"), ("c", "conditional-blocks"), ("gone", "blocks"), ("b", "related")),
            "y": node("open", ("s", "waits-for"), any_gates=frozenset({"s"})),
        }
    )
    assert graph.stored_blockers("x") == [("b", "parent-child"), ("c", "conditional-blocks"), ("k", "parent-child")]
    assert graph.stored_blockers("y") == [("k", "waits-for-any")]
    assert graph.stored_blockers("k") == []  # its parent s is not blocked


def test_a_hold_says_why_in_words_an_operator_reads() -> None:
    graph = BeadsGraph({"x": node("hooked"), "y": node(issue_type="molecule"), "z": node(defer_until=LATER)})
    assert graph.hold("x", NOW) == "status hooked in Beads"
    assert graph.hold("y", NOW) == "type molecule is not work for bd ready"
    assert graph.hold("z", NOW).startswith("deferred in Beads until 2026-11-26")
