"""LinearTracker against the Linear stand-in (GraphQL executed against Linear's schema converted from @linear/sdk).

The ready rule is checked against a reference computation written here from the workspace as the test built it (not
from the stand-in's answers): team ENG, state Todo, label taskgate, not archived, no open blocker, no open sub-issue,
assigned to nobody or to the API key's user.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from taskgate.domain.entities import Project, TaskStatus
from taskgate.domain.errors import ClaimRefused, InvalidInput, TaskNotFound, TrackerError
from taskgate.infrastructure.trackers.linear import LinearTracker
from tests.support.linear_api import LinearStandIn

KEY = "lin_api_s3cr3t_test_key"
PROJECT = Project(1, "shop", "SHOP", "/nonexistent", created_at=None)  # type: ignore[arg-type]
DONE = {"Done", "Canceled"}
PRIORITY = {1: 0, 2: 1, 3: 2, 4: 3, 0: 4}


@pytest.fixture
def linear() -> Iterator[LinearStandIn]:
    with LinearStandIn(key=KEY) as standin:
        yield standin


@pytest.fixture
async def make(linear: LinearStandIn) -> AsyncIterator[Callable[..., LinearTracker]]:
    made: list[LinearTracker] = []

    def build(**options: Any) -> LinearTracker:
        key = options.pop("key", KEY)
        options.setdefault("label", "taskgate")
        tracker = LinearTracker(linear.url, "ENG", key, "LINEAR_API_KEY", **options)
        tracker.retry_delays_s = (0.0, 0.0, 0.0)
        made.append(tracker)
        return tracker

    yield build
    for tracker in made:
        await tracker.aclose()


@dataclass
class Spec:
    number: int
    state: str
    priority: int
    labels: list[str]
    assignee: str | None
    parent: int | None
    blockers: list[int] = field(default_factory=list)
    team: str = "ENG"
    archived: bool = False


def _build(linear: LinearStandIn, bob: str, seed: int = 7, n: int = 30) -> dict[int, Spec]:
    rng = random.Random(seed)
    specs: dict[int, Spec] = {}
    for number in range(1, n + 1):
        spec = Spec(
            number,
            rng.choice(["Todo", "Todo", "Todo", "In Progress", "Done", "Backlog", "Canceled"]),
            rng.randint(0, 4),
            ["taskgate"] * (rng.random() < 0.8) + ["bug"] * (rng.random() < 0.3),
            rng.choice([None, None, None, linear.viewer_id, bob]),
            rng.randint(1, number - 1) if number > 3 and rng.random() < 0.25 else None,
        )
        ident = linear.add_issue(
            "ENG", f"Issue {number}", state=spec.state, priority=spec.priority, labels=spec.labels,
            assignee=spec.assignee, parent=f"ENG-{spec.parent}" if spec.parent else None,
        )  # fmt: skip
        assert ident == f"ENG-{number}"
        specs[number] = spec
    for _ in range(12):
        blocker, blocked = rng.sample(range(1, n + 1), 2)
        linear.block(f"ENG-{blocker}", f"ENG-{blocked}")
        specs[blocked].blockers.append(blocker)
    linear.archive("ENG-30")
    specs[30].archived = True
    linear.add_team("OPS", "Operations")
    linear.add_issue("OPS", "Another team's", labels=["taskgate"])
    return specs


def _reference_ready(specs: dict[int, Spec], me: str) -> list[str]:
    ready = []
    for s in specs.values():
        if s.state != "Todo" or "taskgate" not in s.labels or s.archived:
            continue
        if any(specs[b].state not in DONE for b in s.blockers):
            continue
        if any(c.parent == s.number and c.state not in DONE for c in specs.values()):
            continue
        if s.assignee not in (None, me):
            continue
        ready.append(s)
    return [f"ENG-{s.number}" for s in sorted(ready, key=lambda s: (PRIORITY[s.priority], s.number))]


async def test_ready_equals_the_reference_rule(linear: LinearStandIn, make: Callable[..., LinearTracker]) -> None:
    bob = linear.add_user("Bob", "bob@acme.dev")
    specs = _build(linear, bob)
    tracker = make()
    expected = _reference_ready(specs, linear.viewer_id)
    ready = await tracker.ready(PROJECT)
    assert [i.id for i in ready] == expected
    assert len(expected) >= 3  # the seed makes a workspace where the rule has something to say
    candidates = await tracker.list(PROJECT)
    assert {i.id for i in candidates} == {
        f"ENG-{s.number}" for s in specs.values() if s.state == "Todo" and "taskgate" in s.labels and not s.archived
    }
    assert all(i.hold for i in candidates if i.id not in expected)
    holds = " | ".join(i.hold or "" for i in candidates)
    for reason in ("blocked by", "open sub-issue", "assigned to bob@acme.dev"):  # the seed exercises every reason
        assert reason in holds
    ready_with_done_blocker = [i for i in ready if any(specs[b].state in DONE for b in specs[int(i.id[4:])].blockers)]
    ready_with_done_children = [i for i in ready if any(c.parent == int(i.id[4:]) for c in specs.values())]
    assert ready_with_done_blocker or ready_with_done_children
    assert all(i.priority == PRIORITY[specs[int(i.id[4:])].priority] for i in candidates)


async def test_list_says_why_an_issue_is_held(linear: LinearStandIn, make: Callable[..., LinearTracker]) -> None:
    bob = linear.add_user("Bob", "bob@acme.dev")
    free = linear.add_issue("ENG", "Free", labels=["taskgate"], priority=3)
    blocker = linear.add_issue("ENG", "Blocker", state="In Progress")
    done_blocker = linear.add_issue("ENG", "Done blocker", state="Done")
    blocked = linear.add_issue("ENG", "Blocked", labels=["taskgate"])
    linear.block(blocker, blocked)
    linear.block(done_blocker, free)  # a done blocker holds nothing
    parent = linear.add_issue("ENG", "Parent", labels=["taskgate"])
    for state in ("Todo", "In Progress", "Done"):
        linear.add_issue("ENG", f"Child {state}", state=state, parent=parent)
    bobs = linear.add_issue("ENG", "Bob's", labels=["taskgate"], assignee=bob)
    mine = linear.add_issue("ENG", "Mine", labels=["taskgate"], assignee=linear.viewer_id, priority=1)
    linear.add_issue("ENG", "Unlabelled")
    holds = {i.id: i.hold for i in await make().list(PROJECT)}
    assert holds == {
        free: None,
        blocked: f"blocked by {blocker} (In Progress)",
        parent: "has 2 open sub-issues",
        bobs: "assigned to bob@acme.dev",
        mine: None,
    }
    tracker = make()
    assert [i.id for i in await tracker.ready(PROJECT)] == [mine, free]
    shown = await tracker.show(PROJECT, free)
    assert shown.dependencies == ((done_blocker, "blocks"),) and shown.status == "Todo" and not shown.closed
    assert (await tracker.show(PROJECT, done_blocker)).closed
    assert "in state Done" in ((await tracker.show(PROJECT, done_blocker)).hold or "")


async def test_every_page_is_read_and_counted(linear: LinearStandIn, make: Callable[..., LinearTracker]) -> None:
    n = 230
    for number in range(n):
        linear.add_issue("ENG", f"Issue {number}", labels=["taskgate"], priority=number % 5)
    tracker = make()
    assert len(await tracker.ready(PROJECT)) == n
    assert tracker.calls == 1 + math.ceil(n / 100)  # the viewer once, then the pages
    before = tracker.calls
    assert len(await tracker.list(PROJECT)) == n
    assert tracker.calls - before == math.ceil(n / 100)
    assert tracker.not_modified == 0
    assert tracker.describe() == "linear team ENG, states Todo, label taskgate"


async def test_show_unknown_or_another_teams_issue_is_not_found(
    linear: LinearStandIn, make: Callable[..., LinearTracker]
) -> None:
    linear.add_team("OPS", "Operations")
    other = linear.add_issue("OPS", "Theirs")
    tracker = make()
    for ident in ("ENG-404", other, "not an id"):
        with pytest.raises(TaskNotFound):
            await tracker.show(PROJECT, ident)


async def test_claim_wins(linear: LinearStandIn, make: Callable[..., LinearTracker]) -> None:
    ident = linear.add_issue("ENG", "Take me", labels=["taskgate"])
    await make().claim(PROJECT, ident, "node-1")
    assert linear.issue(ident)["assignee"] == linear.viewer_id
    assert linear.issue(ident)["state"] == "In Progress"


async def test_claim_lost_to_a_concurrent_writer(linear: LinearStandIn, make: Callable[..., LinearTracker]) -> None:
    carol = linear.add_user("Carol", "carol@acme.dev")
    ident = linear.add_issue("ENG", "Contested", labels=["taskgate"])
    linear.race_next_claim(ident, carol)
    with pytest.raises(ClaimRefused, match=r"claimed concurrently by carol@acme\.dev"):
        await make().claim(PROJECT, ident, "node-1")


async def test_claim_refuses_someone_elses_or_a_done_issue(
    linear: LinearStandIn, make: Callable[..., LinearTracker]
) -> None:
    bob = linear.add_user("Bob", "bob@acme.dev")
    bobs = linear.add_issue("ENG", "Bob's", labels=["taskgate"], assignee=bob)
    done = linear.add_issue("ENG", "Done", state="Done")
    tracker = make()
    with pytest.raises(ClaimRefused, match=r"assigned to bob@acme\.dev"):
        await tracker.claim(PROJECT, bobs, "node-1")
    with pytest.raises(ClaimRefused, match="Done"):
        await tracker.claim(PROJECT, done, "node-1")
    assert linear.issue(bobs)["assignee"] == bob and linear.issue(done)["assignee"] is None


async def test_the_configured_assignee_by_email(linear: LinearStandIn, make: Callable[..., LinearTracker]) -> None:
    dana = linear.add_user("Dana", "dana@acme.dev")
    ident = linear.add_issue("ENG", "For Dana", labels=["taskgate"], assignee=dana)
    linear.add_issue("ENG", "The bot's", labels=["taskgate"], assignee=linear.viewer_id)
    tracker = make(assignee="dana@acme.dev")
    assert [i.id for i in await tracker.ready(PROJECT)] == [ident]
    await tracker.claim(PROJECT, ident, "node-1")
    assert linear.issue(ident)["assignee"] == dana


async def test_set_status_moves_comments_and_unassigns_on_open(
    linear: LinearStandIn, make: Callable[..., LinearTracker]
) -> None:
    ident = linear.add_issue("ENG", "Work", labels=["taskgate"])
    tracker = make()
    await tracker.claim(PROJECT, ident, "node-1")
    await tracker.set_status(PROJECT, ident, TaskStatus.PENDING_REVIEW, "review requested")
    assert linear.issue(ident)["state"] == "In Review" and linear.issue(ident)["comments"] == ["review requested"]
    await tracker.set_status(PROJECT, ident, TaskStatus.APPROVED, "approved by alice")  # not mapped: comment only
    assert linear.issue(ident)["state"] == "In Review"
    assert linear.issue(ident)["comments"][-1] == "approved by alice"
    await tracker.set_status(PROJECT, ident, TaskStatus.OPEN, "session stopped")
    assert linear.issue(ident)["state"] == "Todo" and linear.issue(ident)["assignee"] is None
    await tracker.set_status(PROJECT, ident, TaskStatus.COMPLETED)
    assert linear.issue(ident)["state"] == "Done" and len(linear.issue(ident)["comments"]) == 3


async def test_open_leaves_an_issue_someone_else_claimed_alone(
    linear: LinearStandIn, make: Callable[..., LinearTracker]
) -> None:
    carol = linear.add_user("Carol", "carol@acme.dev")
    ident = linear.add_issue("ENG", "Contested", labels=["taskgate"])
    tracker = make()
    linear.race_next_claim(ident, carol)
    with pytest.raises(ClaimRefused):
        await tracker.claim(PROJECT, ident, "node-1")
    await tracker.set_status(PROJECT, ident, TaskStatus.OPEN, "session given up")  # the session's cancel
    issue = linear.issue(ident)
    assert (issue["assignee"], issue["state"], issue["comments"]) == (carol, "In Progress", ["session given up"])


async def test_set_status_does_nothing_without_write_back(
    linear: LinearStandIn, make: Callable[..., LinearTracker]
) -> None:
    ident = linear.add_issue("ENG", "Work", labels=["taskgate"])
    tracker = make(write_back=False)
    before = linear.requests
    await tracker.set_status(PROJECT, ident, TaskStatus.COMPLETED, "done")
    assert linear.requests == before and linear.issue(ident)["state"] == "Todo" and not tracker.writes_back
    with pytest.raises(InvalidInput):
        await tracker.set_status(PROJECT, "nonsense", TaskStatus.COMPLETED)


async def test_an_unknown_state_name_lists_the_teams_states(
    linear: LinearStandIn, make: Callable[..., LinearTracker]
) -> None:
    ident = linear.add_issue("ENG", "Work", labels=["taskgate"])
    tracker = make(status_map={"completed": "Shipped"})
    with pytest.raises(TrackerError, match=r"no workflow state 'Shipped'.*Backlog, Canceled, Done, In Progress"):
        await tracker.set_status(PROJECT, ident, TaskStatus.COMPLETED)


async def test_a_server_error_is_retried(linear: LinearStandIn, make: Callable[..., LinearTracker]) -> None:
    ident = linear.add_issue("ENG", "Work", labels=["taskgate"])
    tracker = make()
    assert LinearTracker.retry_delays_s == (1.0, 4.0, 9.0)
    linear.fail_next(1, status=500)
    assert [i.id for i in await tracker.ready(PROJECT)] == [ident]
    assert tracker.calls == 3  # viewer: 500 then 200; one page
    linear.fail_next(4, status=502)
    with pytest.raises(TrackerError, match=r"list the issues of team ENG: .* answered 502 .*retried 3 times"):
        await tracker.ready(PROJECT)


@pytest.mark.parametrize("status", [400, 429])
async def test_a_rate_limit_is_waited_out(
    linear: LinearStandIn, make: Callable[..., LinearTracker], status: int
) -> None:
    ident = linear.add_issue("ENG", "Work", labels=["taskgate"])
    tracker = make()
    linear.rate_limit_next(2, status=status)
    assert [i.id for i in await tracker.ready(PROJECT)] == [ident]
    assert tracker.calls == 4
    linear.rate_limit_next(4, status=status)
    with pytest.raises(TrackerError, match=r"rate limit for the API key in \$LINEAR_API_KEY is spent"):
        await tracker.list(PROJECT)


async def test_a_bad_key_names_the_variable_not_the_key(
    linear: LinearStandIn, make: Callable[..., LinearTracker]
) -> None:
    linear.add_issue("ENG", "Work", labels=["taskgate"])
    tracker = make(key="lin_api_wrong_secret_value")
    with pytest.raises(TrackerError) as caught:
        await tracker.ready(PROJECT)
    assert "$LINEAR_API_KEY" in str(caught.value)
    assert "lin_api_wrong_secret_value" not in str(caught.value) and KEY not in str(caught.value)
    assert tracker.calls == 1  # an authentication error is not retried


def test_one_tracker_serves_successive_event_loops(linear: LinearStandIn) -> None:
    """A CLI runs one event loop per command: the tracker's HTTP client must not outlive its loop."""
    ident = linear.add_issue("ENG", "Work", labels=["taskgate"])
    tracker = LinearTracker(linear.url, "ENG", KEY, "LINEAR_API_KEY", label="taskgate")
    for _ in range(2):
        assert [i.id for i in asyncio.run(tracker.ready(PROJECT))] == [ident]
