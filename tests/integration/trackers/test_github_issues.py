"""GitHubIssuesTracker against the GitHub stand-in (tests/support/github_api): the ready rule against a reference
computed here from the stand-in's own state, holds, conditional polls, claims and their races, write-back,
retries and errors, and the cost of polling 1,000 issues."""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from githubkit import GitHub

from taskgate.domain.entities import Project, TaskStatus
from taskgate.domain.errors import ClaimRefused, InvalidInput, TaskNotFound, TrackerError
from taskgate.infrastructure.trackers.github_issues import GitHubIssuesTracker
from tests.support.github_api import GitHubStandIn
from tests.support.github_api.issues import Issues

BOT, TOKEN = "taskgate-bot", "ghp_secret_value_123"
ISSUES = "/repos/acme/shop/issues"


@pytest.fixture
def gh(tmp_path: Path) -> Iterator[GitHubStandIn]:
    bare = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    with GitHubStandIn(bare, token=TOKEN, login=BOT) as standin:
        yield standin


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(1, "shop", "SHOP", str(tmp_path), created_at=datetime.now(UTC))


def tracker(gh: GitHubStandIn, **options) -> GitHubIssuesTracker:
    return GitHubIssuesTracker(gh.url, "acme/shop", options.pop("token", TOKEN), "GITHUB_TOKEN", **options)


def reference_ready(gh: GitHubStandIn, numbers: list[int], label: str, me: str) -> list[str]:
    """The ready rule, written from the docs: open; labelled; every blocker closed; every sub-issue closed;
    assignees only `me`; by (smallest P-label else 2, number)."""
    state = {n: gh.issue(n) for n in numbers}
    ready = []
    for n, issue in state.items():
        children = [c for c in state.values() if c["parent"] == n]
        if (
            issue["state"] == "open"
            and label in issue["labels"]
            and all(state[b]["state"] == "closed" for b in issue["blocked_by"])
            and all(c["state"] == "closed" for c in children)
            and set(issue["assignees"]) <= {me}
        ):
            prio = min([int(name[1]) for name in issue["labels"] if name in ("P0", "P1", "P2", "P3", "P4")] or [2])
            ready.append((prio, n))
    return [f"gh-{n}" for _, n in sorted(ready)]


def thirty(gh: GitHubStandIn) -> list[int]:
    """30 issues: priorities, a few unlabelled or closed, blockers open and closed, sub-issues, assignees."""
    rng = random.Random(7)
    numbers: list[int] = []
    for i in range(30):
        labels = ["taskgate"] if i % 7 != 3 else ["other"]
        if i % 3 == 0:
            labels.append(f"P{rng.randrange(5)}")
        if i == 11:
            labels += ["P3", "P1"]  # the smallest wins
        blocked_by = rng.sample(numbers, k=min(len(numbers), rng.choice([0, 0, 1, 2]))) if numbers else []
        parent = numbers[rng.randrange(len(numbers))] if numbers and i % 5 == 4 else None
        assignees = {0: [], 1: [], 2: [], 3: [BOT], 4: ["bob"]}[i % 5] if i % 2 else []
        numbers.append(gh.add_issue(f"issue {i}", f"body {i}", labels, assignees, blocked_by, parent))
    for n in numbers[::4]:
        gh.close_issue(n)
    return numbers


async def test_ready_follows_the_rule_and_list_names_why_the_others_wait(gh: GitHubStandIn, project) -> None:
    numbers = thirty(gh)
    t = tracker(gh)
    expected = reference_ready(gh, numbers, "taskgate", BOT)
    ready = await t.ready(project)
    assert [i.id for i in ready] == expected and 3 <= len(expected) < 20
    assert all(i.hold is None and i.status == "open" and not i.closed for i in ready)
    listed = {i.id: i for i in await t.list(project)}
    open_labelled = [n for n in numbers if gh.issue(n)["state"] == "open" and "taskgate" in gh.issue(n)["labels"]]
    assert sorted(listed) == sorted(f"gh-{n}" for n in open_labelled)
    for n in open_labelled:
        issue, found = gh.issue(n), listed[f"gh-{n}"]
        open_blockers = [b for b in issue["blocked_by"] if gh.issue(b)["state"] == "open"]
        open_children = [c for c in numbers if gh.issue(c)["parent"] == n and gh.issue(c)["state"] == "open"]
        others = [a for a in issue["assignees"] if a != BOT]
        assert (found.hold is None) == (not open_blockers and not open_children and not others), found
        for b in open_blockers:
            assert f"gh-{b} (open)" in found.hold and (f"gh-{b}", "blocks") in found.dependencies
        if open_children:
            assert f"has {len(open_children)} open sub-issue" in found.hold
        if others:
            assert "assigned to bob" in found.hold and found.assignees == ("bob",)
        assert found.description == issue["body"] and found.url.endswith(f"/acme/shop/issues/{n}")
    assert listed[f"gh-{numbers[11]}"].priority == 1
    assert t.describe() == "github acme/shop, label taskgate"


async def test_a_second_poll_with_nothing_changed_costs_only_304s(gh: GitHubStandIn, project) -> None:
    thirty(gh)
    t = tracker(gh)
    first = await t.ready(project)
    calls, not_modified, seen = t.calls, t.not_modified, len(gh.calls)
    assert not_modified == 0
    assert await t.ready(project) == first
    assert t.calls - calls == t.not_modified - not_modified > 0
    assert {status for _, _, status in gh.calls[seen:]} == {304}
    assert len(gh.calls) - seen == t.calls - calls
    gh.edit_issue(int(first[0].id[3:]), title="renamed")
    calls, not_modified, seen = t.calls, t.not_modified, len(gh.calls)
    assert (await t.ready(project))[0].title == "renamed"
    statuses = [status for _, _, status in gh.calls[seen:]]
    assert 200 in statuses and t.not_modified - not_modified == statuses.count(304) == t.calls - calls - 1


async def test_show_reads_one_issue_and_refuses_other_ids(gh: GitHubStandIn, project) -> None:
    a = gh.add_issue("blocker")
    n = gh.add_issue("work", "text", ["taskgate", "P0"], blocked_by=[a])
    t = tracker(gh)
    shown = await t.show(project, f"gh-{n}")
    assert (shown.title, shown.priority, shown.hold, shown.dependencies) == (
        "work", 0, f"blocked by gh-{a} (open)", ((f"gh-{a}", "blocks"),)
    )  # fmt: skip
    gh.close_issue(n)
    closed = await t.show(project, f"gh-{n}")
    assert (closed.closed, closed.status) == (True, "closed")
    for bad in ("12", "gh-0", "GH-1", "gh-999"):
        with pytest.raises(TaskNotFound, match=bad):
            await t.show(project, bad)
    with pytest.raises(InvalidInput, match="tg-1"):
        await t.set_status(project, "tg-1", TaskStatus.IN_PROGRESS)


async def test_a_claim_assigns_us_and_labels_in_progress(gh: GitHubStandIn, project) -> None:
    n = gh.add_issue("work", labels=["taskgate", "P1"])
    t = tracker(gh)
    await t.claim(project, f"gh-{n}", "agent-1")
    assert gh.issue(n)["assignees"] == [BOT]
    assert gh.issue(n)["labels"] == ["taskgate", "P1", "taskgate:in-progress"]
    assert gh.calls_to("GET", "/user") == 1
    await t.claim(project, f"gh-{n}", "agent-1")  # ours already: claiming again is fine
    assert gh.calls_to("GET", "/user") == 1  # read once


async def test_a_claim_lost_to_a_concurrent_claimer_is_refused_and_ours_removed(gh: GitHubStandIn, project) -> None:
    n = gh.add_issue("work", labels=["taskgate"])
    gh.race_next_claim(n, "rival")
    t = tracker(gh, assignee="orchestrator-2")
    with pytest.raises(ClaimRefused, match="claimed concurrently by rival"):
        await t.claim(project, f"gh-{n}", "agent-1")
    assert gh.issue(n)["assignees"] == ["rival"] and gh.issue(n)["labels"] == ["taskgate"]
    assert gh.calls_to("GET", "/user") == 0  # the configured assignee needs no lookup


async def test_a_claim_of_an_issue_someone_else_has_or_that_is_closed_is_refused(gh: GitHubStandIn, project) -> None:
    taken, closed = gh.add_issue("taken", assignees=["bob"]), gh.add_issue("closed")
    gh.close_issue(closed)
    t = tracker(gh)
    with pytest.raises(ClaimRefused, match="assigned to bob"):
        await t.claim(project, f"gh-{taken}", "agent-1")
    with pytest.raises(ClaimRefused, match="closed"):
        await t.claim(project, f"gh-{closed}", "agent-1")
    assert gh.calls_to("POST", f"{ISSUES}/{taken}/assignees") == 0
    assert gh.issue(taken)["assignees"] == ["bob"]


async def test_set_status_moves_our_labels_comments_closes_and_releases(gh: GitHubStandIn, project) -> None:
    n = gh.add_issue("work", labels=["taskgate", "P2", "area:api"])
    t, issue_id = tracker(gh), f"gh-{n}"
    await t.claim(project, issue_id, "agent-1")
    await t.set_status(project, issue_id, TaskStatus.PENDING_REVIEW, "ready for review: PR #9")
    state = gh.issue(n)
    assert state["labels"] == ["taskgate", "P2", "area:api", "taskgate:in-review"]
    assert state["comments"] == ["ready for review: PR #9"] and state["assignees"] == [BOT]
    await t.set_status(project, issue_id, TaskStatus.IN_PROGRESS)  # sent back: no reason, no comment
    assert gh.issue(n)["labels"] == ["taskgate", "P2", "area:api", "taskgate:in-progress"]
    await t.set_status(project, issue_id, TaskStatus.OPEN, "cancelled by the operator")
    state = gh.issue(n)
    assert (state["labels"], state["assignees"], state["state"]) == (["taskgate", "P2", "area:api"], [], "open")
    assert state["comments"][-1] == "cancelled by the operator"
    await t.claim(project, issue_id, "agent-2")
    await t.set_status(project, issue_id, TaskStatus.APPROVED)
    await t.set_status(project, issue_id, TaskStatus.COMPLETED, "merged in abc123")
    state = gh.issue(n)
    assert (state["state"], state["state_reason"]) == ("closed", "completed")
    assert state["labels"] == ["taskgate", "P2", "area:api"] and state["comments"][-1] == "merged in abc123"


async def test_without_write_back_set_status_writes_nothing(gh: GitHubStandIn, project) -> None:
    n = gh.add_issue("work", labels=["taskgate"])
    t = tracker(gh, write_back=False)
    assert not t.writes_back
    with pytest.raises(InvalidInput, match="done"):
        tracker(gh, status_labels={"done": "x"})
    with pytest.raises(InvalidInput, match="owner/name"):
        GitHubIssuesTracker(gh.url, "shop", TOKEN, "GITHUB_TOKEN")
    await t.set_status(project, f"gh-{n}", TaskStatus.COMPLETED, "done")
    assert t.calls == 0 and gh.issue(n)["state"] == "open"


async def test_a_server_error_is_retried(gh: GitHubStandIn, project) -> None:
    n = gh.add_issue("work", labels=["taskgate"])
    gh.fail_next(1, 500, ISSUES)
    t = tracker(gh)
    assert [i.id for i in await t.ready(project)] == [f"gh-{n}"]
    assert [s for _, p, s in gh.calls if p == ISSUES] == [500, 200] and t.calls == 2


@pytest.mark.parametrize("status", [429, 403])
async def test_a_rate_limit_waits_and_retries(gh: GitHubStandIn, project, status: int) -> None:
    # 429 with Retry-After: 1; 403 with x-ratelimit-remaining 0 and a reset a second away
    n = gh.add_issue("work", labels=["taskgate"])
    gh.fail_next(1, status, ISSUES)
    t = tracker(gh)
    started = time.monotonic()
    assert [i.id for i in await t.ready(project)] == [f"gh-{n}"]
    assert time.monotonic() - started >= (0.9 if status == 429 else 0)  # 403: until the reset's whole second
    assert [s for _, p, s in gh.calls if p == ISSUES] == [status, 200]


async def test_failures_name_what_was_done_and_the_tokens_variable_never_the_token(gh: GitHubStandIn, project):
    gh.add_issue("work", labels=["taskgate"])
    with pytest.raises(TrackerError) as refused:
        await tracker(gh, token="ghp_wrong_token_456").ready(project)
    said = str(refused.value)
    assert said.startswith("list issues of acme/shop: ") and "$GITHUB_TOKEN was refused by" in said
    assert gh.url in said and "Bad credentials" in said and "ghp_wrong" not in said
    with pytest.raises(TrackerError) as missing:
        await GitHubIssuesTracker(gh.url, "acme/other", TOKEN, "GITHUB_TOKEN").ready(project)
    assert (
        str(missing.value) == f"list issues of acme/other: acme/other at {gh.url} not found, "
        "or the token in $GITHUB_TOKEN cannot see it (404)"
    )


async def test_polling_1000_issues_costs_ten_pages_and_the_blocked_ones_then_only_304s(
    gh: GitHubStandIn, project
) -> None:
    numbers: list[int] = []
    for i in range(1000):
        blocked_by = [numbers[i - 1]] if i % 20 == 19 else []
        numbers.append(gh.add_issue(f"issue {i}", labels=["taskgate"], blocked_by=blocked_by))
    for n in numbers[18::40]:
        gh.close_issue(n)  # half of the blockers closed: 25 issues blocked by an open one, 25 not
    gh.add_issue("not ours", labels=["other"], blocked_by=[numbers[0]])
    t = tracker(gh, assignee=BOT)
    ready = await t.ready(project)
    assert len(ready) == 1000 - 25 - 25 and ready == sorted(ready, key=lambda i: int(i.id[3:]))
    cold = t.calls
    assert cold == 10 + 25 and t.not_modified == 0
    assert len([c for c in gh.calls if c[1] == ISSUES]) == 10 and gh.calls_to("GET", "/user") == 0
    assert await t.ready(project) == ready
    assert (t.calls - cold, t.not_modified) == (35, 35)


async def test_with_an_empty_label_every_open_issue_counts_and_pull_requests_never(tmp_path: Path, project) -> None:
    bare, clone = tmp_path / "pr.git", tmp_path / "clone"
    run = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(clone)], check=True)
    for branch in ("main", "feature"):
        if branch == "feature":
            subprocess.run([*run, "checkout", "-q", "-b", "feature"], cwd=clone, check=True)
        (clone / f"{branch}.txt").write_text(branch)
        subprocess.run([*run, "add", "."], cwd=clone, check=True)
        subprocess.run([*run, "commit", "-q", "-m", branch], cwd=clone, check=True)
    subprocess.run([*run, "push", "-q", str(bare), "main", "feature"], cwd=clone, check=True)
    with GitHubStandIn(bare, token=TOKEN) as gh:
        a = gh.add_issue("unlabelled")
        b = gh.add_issue("labelled", labels=["bug"])
        g = GitHub(TOKEN, base_url=gh.url, auto_retry=False)
        pull = (await g.rest.pulls.async_create("acme", "shop", title="f", head="feature", base="main")).parsed_data
        t = tracker(gh, label="")
        assert [i.id for i in await t.ready(project)] == [f"gh-{a}", f"gh-{b}"]
        assert t.describe() == "github acme/shop, every open issue"
        with pytest.raises(TaskNotFound, match=f"gh-{pull.number}"):
            await t.show(project, f"gh-{pull.number}")


async def test_without_the_dependency_summary_each_issue_is_asked_until_a_404(
    gh: GitHubStandIn, project, monkeypatch
) -> None:
    render = Issues.issue_json

    def older_server(self, rec):
        body = render(self, rec)
        del body["issue_dependencies_summary"]
        return body

    monkeypatch.setattr(Issues, "issue_json", older_server)
    a = gh.add_issue("a", labels=["taskgate"])
    b = gh.add_issue("b", labels=["taskgate"], blocked_by=[a])
    c = gh.add_issue("c", labels=["taskgate"])
    t = tracker(gh)
    held = {i.id: i.hold for i in await t.list(project)}
    assert held == {f"gh-{a}": None, f"gh-{b}": f"blocked by gh-{a} (open)", f"gh-{c}": None}
    assert t.calls == 1 + 3  # the page, then every issue's blockers
    gh.fail_next(1, 404, f"{ISSUES}/{c}/dependencies")  # the first asked (newest first): no issue dependencies
    calls = t.calls
    assert [i.id for i in await t.ready(project)] == [f"gh-{a}", f"gh-{b}", f"gh-{c}"]
    assert t.calls - calls == 2  # the page and the 404: no more dependency requests after it
