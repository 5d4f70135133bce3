"""Contract: the GitHub stand-in's issue endpoints (tests/support/github_api/issues.py) answer in GitHub's shapes.

Every endpoint taskgate's GitHub Issues tracker uses is driven with the real githubkit client; its `parsed_data`
must be githubkit's model and the raw JSON must validate against it. Pagination, ETags and 304s, the shared
number sequence with pull requests, and the test controls are checked too.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from githubkit import GitHub
from githubkit.exception import RequestFailed
from githubkit_schemas.latest import models

from tests.support.github_api import GitHubStandIn

OWNER, REPO = "acme", "shop"


def git(*args: str, cwd: Path | None = None) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def gh(tmp_path: Path) -> Iterator[GitHubStandIn]:
    """The stand-in over a bare repo with `main` and a `feature` branch one commit ahead."""
    bare, clone = tmp_path / "remote.git", tmp_path / "clone"
    git("init", "-q", "--bare", "-b", "main", str(bare))
    git("init", "-q", "-b", "main", str(clone))
    (clone / "a.txt").write_text("a\n")
    git("add", "a.txt", cwd=clone)
    git("commit", "-q", "-m", "initial", cwd=clone)
    git("checkout", "-q", "-b", "feature", cwd=clone)
    (clone / "b.txt").write_text("b\n")
    git("add", "b.txt", cwd=clone)
    git("commit", "-q", "-m", "feature", cwd=clone)
    git("push", "-q", str(bare), "main", "feature", cwd=clone)
    with GitHubStandIn(bare, login="octo-bot") as standin:
        yield standin


def client(gh: GitHubStandIn, **options) -> GitHub:
    return GitHub("ghp_test", base_url=gh.url, **{"auto_retry": False, "http_cache": False, **options})


async def test_an_issue_parses_as_githubkits_issue_with_both_summaries(gh: GitHubStandIn) -> None:
    blocker = gh.add_issue("blocker", labels=["taskgate"])
    parent = gh.add_issue("parent", body="the epic", labels=["taskgate", "P1"], assignees=["bob"], blocked_by=[blocker])
    done = gh.add_issue("child one", parent=parent)
    gh.add_issue("child two", parent=parent)
    gh.close_issue(done)
    g = client(gh)
    resp = await g.rest.issues.async_get(OWNER, REPO, parent)
    issue = resp.parsed_data
    models.Issue.model_validate(resp.json())
    assert isinstance(issue, models.Issue)
    assert (issue.number, issue.title, issue.body, issue.state) == (parent, "parent", "the epic", "open")
    assert [label.name for label in issue.labels] == ["taskgate", "P1"]
    assert [user.login for user in issue.assignees] == ["bob"]
    assert issue.issue_dependencies_summary.model_dump() == {
        "blocked_by": 1, "blocking": 0, "total_blocked_by": 1, "total_blocking": 0
    }  # fmt: skip
    assert (issue.sub_issues_summary.total, issue.sub_issues_summary.completed) == (2, 1)
    assert issue.html_url.endswith(f"/acme/shop/issues/{parent}") and not issue.pull_request
    gh.close_issue(blocker)
    again = (await g.rest.issues.async_get(OWNER, REPO, parent)).parsed_data
    assert (again.issue_dependencies_summary.blocked_by, again.issue_dependencies_summary.total_blocked_by) == (0, 1)
    child = (await g.rest.issues.async_get(OWNER, REPO, done)).parsed_data
    assert (child.state, child.state_reason, child.closed_by.login) == ("closed", "completed", "bob")
    assert child.parent_issue_url.endswith(f"/issues/{parent}")


async def test_the_list_filters_by_state_labels_and_assignee_and_shows_pull_requests(gh: GitHubStandIn) -> None:
    g = client(gh)
    one = gh.add_issue("one", labels=["taskgate", "bug"])
    two = gh.add_issue("two", labels=["taskgate"], assignees=["bob"])
    three = gh.add_issue("three", labels=["other"])
    pull = (await g.rest.pulls.async_create(OWNER, REPO, title="f", head="feature", base="main")).parsed_data
    assert pull.number == three + 1  # one number sequence for issues and pull requests
    gh.close_issue(one)

    async def numbers(**query) -> list[int]:
        resp = await g.rest.issues.async_list_for_repo(OWNER, REPO, **query)
        for item in resp.json():
            models.Issue.model_validate(item)
        return [issue.number for issue in resp.parsed_data]

    assert await numbers() == [pull.number, three, two]  # open, newest first, the pull request included
    assert await numbers(state="all", labels="taskgate") == [two, one]
    assert await numbers(state="closed") == [one]
    assert await numbers(labels="taskgate,bug", state="all") == [one]
    assert await numbers(assignee="bob") == [two]
    assert await numbers(assignee="none") == [pull.number, three]
    listed = (await g.rest.issues.async_list_for_repo(OWNER, REPO)).parsed_data
    assert [bool(i.pull_request) for i in listed] == [True, False, False]
    assert listed[0].pull_request.html_url.endswith(f"/pull/{pull.number}")


async def test_pages_carry_githubs_link_header(gh: GitHubStandIn) -> None:
    for i in range(250):
        gh.add_issue(f"issue {i}", labels=["taskgate"])
    g = client(gh)
    first = await g.rest.issues.async_list_for_repo(OWNER, REPO, labels="taskgate", per_page=100, page=1)
    last = await g.rest.issues.async_list_for_repo(OWNER, REPO, labels="taskgate", per_page=100, page=3)
    links = httpx.Response(200, headers={"link": first.headers["link"]}).links
    assert links["next"]["url"].endswith("page=2") and links["last"]["url"].endswith("page=3")
    assert "labels=taskgate" in links["next"]["url"] and "per_page=100" in links["next"]["url"]
    assert len(first.parsed_data) == 100 and len(last.parsed_data) == 50
    assert 'rel="next"' not in last.headers["link"] and 'rel="prev"' in last.headers["link"]


async def test_patch_edits_closes_reopens_and_replaces_labels_and_assignees(gh: GitHubStandIn) -> None:
    g = client(gh)
    n = gh.add_issue("old", labels=["a"], assignees=["bob"])
    resp = await g.rest.issues.async_update(OWNER, REPO, n, title="new", body="text", labels=["b", "c"],
                                            assignees=["carol"])  # fmt: skip
    updated = resp.parsed_data
    assert (updated.title, updated.body, [label.name for label in updated.labels]) == ("new", "text", ["b", "c"])
    assert [user.login for user in updated.assignees] == ["carol"]
    closed = (await g.rest.issues.async_update(OWNER, REPO, n, state="closed", state_reason="not_planned")).parsed_data
    assert (closed.state, closed.state_reason, closed.closed_by.login) == ("closed", "not_planned", "octo-bot")
    reopened = (await g.rest.issues.async_update(OWNER, REPO, n, state="open")).parsed_data
    assert (reopened.state, reopened.state_reason, reopened.closed_at) == ("open", "reopened", None)
    auth = {"Authorization": "Bearer ghp_test"}
    bad = httpx.patch(f"{gh.url}/repos/acme/shop/issues/{n}", json={"state": "done"}, headers=auth)
    assert bad.status_code == 422 and bad.json()["message"] == "Validation Failed"
    with pytest.raises(RequestFailed) as missing:
        await g.rest.issues.async_get(OWNER, REPO, 999)
    assert missing.value.response.status_code == 404


async def test_assignees_are_added_and_removed_and_a_raced_claim_lands_first(gh: GitHubStandIn) -> None:
    g = client(gh)
    n = gh.add_issue("work")
    added = await g.rest.issues.async_add_assignees(OWNER, REPO, n, assignees=["octo-bot"])
    assert added.status_code == 201 and [u.login for u in added.parsed_data.assignees] == ["octo-bot"]
    gh.race_next_claim(n, "rival")
    raced = (await g.rest.issues.async_add_assignees(OWNER, REPO, n, assignees=["octo-bot"])).parsed_data
    assert [u.login for u in raced.assignees] == ["octo-bot", "rival"]
    removed = (await g.rest.issues.async_remove_assignees(OWNER, REPO, n, assignees=["octo-bot"])).parsed_data
    assert isinstance(removed, models.Issue) and [u.login for u in removed.assignees] == ["rival"]
    assert gh.issue(n)["assignees"] == ["rival"]


async def test_labels_are_added_created_on_the_fly_and_removed(gh: GitHubStandIn) -> None:
    g = client(gh)
    n = gh.add_issue("work", labels=["taskgate"])
    resp = await g.rest.issues.async_add_labels(OWNER, REPO, n, labels=["taskgate:in-progress"])
    for item in resp.json():
        models.Label.model_validate(item)
    assert [label.name for label in resp.parsed_data] == ["taskgate", "taskgate:in-progress"]
    left = (await g.rest.issues.async_remove_label(OWNER, REPO, n, "taskgate")).parsed_data
    assert [label.name for label in left] == ["taskgate:in-progress"]
    with pytest.raises(RequestFailed) as gone:
        await g.rest.issues.async_remove_label(OWNER, REPO, n, "taskgate")
    assert gone.value.response.status_code == 404
    assert gone.value.response.json()["message"] == "Label does not exist"
    gh.set_labels(n, ["x", "y"])
    gh.assign(n, "carol")
    issue = (await g.rest.issues.async_get(OWNER, REPO, n)).parsed_data
    assert [label.name for label in issue.labels] == ["x", "y"] and [u.login for u in issue.assignees] == ["carol"]
    assert gh.issue(n)["labels"] == ["x", "y"] and gh.issue(n)["assignees"] == ["carol"]


async def test_comments_are_created_and_listed(gh: GitHubStandIn) -> None:
    g = client(gh)
    n = gh.add_issue("work")
    created = await g.rest.issues.async_create_comment(OWNER, REPO, n, body="blocked on the schema")
    models.IssueComment.model_validate(created.json())
    assert created.status_code == 201 and created.parsed_data.user.login == "octo-bot"
    listed = (await g.rest.issues.async_list_comments(OWNER, REPO, n)).parsed_data
    assert [c.body for c in listed] == ["blocked on the schema"]
    assert (await g.rest.issues.async_get(OWNER, REPO, n)).parsed_data.comments == 1
    assert gh.issue(n)["comments"] == ["blocked on the schema"]


async def test_dependencies_and_sub_issues_list_issues(gh: GitHubStandIn) -> None:
    g = client(gh)
    a, b = gh.add_issue("a"), gh.add_issue("b")
    n = gh.add_issue("blocked", blocked_by=[a, b])
    child = gh.add_issue("child", parent=n)
    gh.close_issue(a)
    blockers = await g.rest.issues.async_list_dependencies_blocked_by(OWNER, REPO, n)
    for item in blockers.json():
        models.Issue.model_validate(item)
    assert [(i.number, i.state) for i in blockers.parsed_data] == [(a, "closed"), (b, "open")]
    subs = (await g.rest.issues.async_list_sub_issues(OWNER, REPO, n)).parsed_data
    assert [i.number for i in subs] == [child]


async def test_the_user_endpoint_names_the_tokens_login(gh: GitHubStandIn) -> None:
    g = client(gh)
    resp = await g.rest.users.async_get_authenticated()
    assert isinstance(resp.parsed_data, models.PublicUser | models.PrivateUser)
    assert resp.parsed_data.login == "octo-bot"


async def test_an_unchanged_issue_list_answers_304_and_a_change_200(gh: GitHubStandIn) -> None:
    n = gh.add_issue("work", labels=["taskgate"])
    async with client(gh, http_cache=True) as g:
        await g.rest.issues.async_list_for_repo(OWNER, REPO, labels="taskgate")
        await g.rest.issues.async_list_for_repo(OWNER, REPO, labels="taskgate")
        await g.rest.issues.async_get(OWNER, REPO, n)
        await g.rest.issues.async_get(OWNER, REPO, n)
        gh.edit_issue(n, title="renamed")
        listed = (await g.rest.issues.async_list_for_repo(OWNER, REPO, labels="taskgate")).parsed_data
        one = (await g.rest.issues.async_get(OWNER, REPO, n)).parsed_data
    assert listed[0].title == one.title == "renamed"
    assert [s for m, p, s in gh.calls if p == "/repos/acme/shop/issues"] == [200, 304, 200]
    assert [s for m, p, s in gh.calls if p == f"/repos/acme/shop/issues/{n}"] == [200, 304, 200]


@pytest.mark.parametrize("status", [500, 403, 429])
async def test_injected_failures_reach_the_issue_endpoints(gh: GitHubStandIn, status: int) -> None:
    g = client(gh)
    gh.fail_next(1, status, "/repos/acme/shop/issues")
    with pytest.raises(RequestFailed) as failed:
        await g.rest.issues.async_list_for_repo(OWNER, REPO)
    assert failed.value.response.status_code == status
    if status == 429:
        assert failed.value.response.headers["retry-after"] == "1"
    assert (await g.rest.issues.async_list_for_repo(OWNER, REPO)).status_code == 200
