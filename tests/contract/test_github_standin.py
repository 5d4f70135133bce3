"""Contract: the GitHub stand-in (tests/support/github_api) answers in GitHub's shapes, as githubkit parses them.

Every endpoint is driven with the real githubkit client and its `parsed_data` must validate against githubkit's
pydantic models; behaviour (status codes, merges landing in the bare repo, pagination, ETags, rate limits,
webhook signatures and payloads) is checked against what GitHub does.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from githubkit import GitHub, webhooks
from githubkit.exception import RateLimitExceeded, RequestFailed
from githubkit_schemas.latest import models

from tests.support.github_api import GitHubStandIn

OWNER, REPO = "acme", "shop"


def git(*args: str, cwd: Path | None = None) -> str:
    """Run git with a throwaway identity; its stdout."""
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def commit_file(clone: Path, name: str, text: str, message: str) -> str:
    """Write `name` in the clone and commit it; the new sha."""
    (clone / name).write_text(text)
    git("add", name, cwd=clone)
    git("commit", "-q", "-m", message, cwd=clone)
    return git("rev-parse", "HEAD", cwd=clone)


@pytest.fixture
def remote(tmp_path: Path) -> tuple[Path, Path]:
    """A bare repo with `main`, `feature` (app.py line 3 changed, a new file) and `clash` (line 3 otherwise)."""
    bare, clone = tmp_path / "remote.git", tmp_path / "clone"
    git("init", "-q", "--bare", "-b", "main", str(bare))
    git("init", "-q", "-b", "main", str(clone))
    commit_file(clone, "app.py", "".join(f"line {i}\n" for i in range(1, 6)), "initial")
    git("checkout", "-q", "-b", "feature", cwd=clone)
    commit_file(clone, "app.py", "line 1\nline 2\nfeature three\nline 4\nline 5\n", "feature: line three")
    commit_file(clone, "notes.md", "notes\n", "feature: notes")
    git("checkout", "-q", "-b", "clash", "main", cwd=clone)
    commit_file(clone, "app.py", "line 1\nline 2\nclash three\nline 4\nline 5\n", "clash: line three")
    git("checkout", "-q", "-b", "same", "main", cwd=clone)  # no commits beyond main
    git("remote", "add", "origin", str(bare), cwd=clone)
    git("push", "-q", "origin", "main", "feature", "clash", "same", cwd=clone)
    return bare, clone


@pytest.fixture
def gh(remote: tuple[Path, Path]) -> Iterator[GitHubStandIn]:
    """The stand-in, serving the bare repo."""
    with GitHubStandIn(remote[0]) as standin:
        yield standin


def client(gh: GitHubStandIn, **options) -> GitHub:
    """githubkit pointed at the stand-in (no retries, no http cache unless asked)."""
    return GitHub("ghp_test", base_url=gh.url, **{"auto_retry": False, "http_cache": False, **options})


def rev(bare: Path, ref: str) -> str:
    """The sha `ref` names in the bare repo."""
    return git("--git-dir", str(bare), "rev-parse", ref)


async def open_feature(g: GitHub, head: str = "feature") -> models.PullRequest:
    """A pull request of `head` into main."""
    resp = await g.rest.pulls.async_create(OWNER, REPO, title=f"Add {head}", head=head, base="main", body="why")
    assert resp.status_code == 201
    return resp.parsed_data


async def test_repository_parses_and_other_repositories_are_not_found(gh: GitHubStandIn) -> None:
    g = client(gh)
    repo = (await g.rest.repos.async_get(OWNER, REPO)).parsed_data
    assert isinstance(repo, models.FullRepository)
    assert (repo.full_name, repo.default_branch, repo.owner.login) == ("acme/shop", "main", "acme")
    with pytest.raises(RequestFailed) as missing:
        await g.rest.repos.async_get(OWNER, "elsewhere")
    assert missing.value.response.status_code == 404
    assert missing.value.response.json()["message"] == "Not Found"


async def test_creating_a_pull_request_answers_201_then_422s_like_github(gh: GitHubStandIn, remote) -> None:
    g = client(gh)
    pull = await open_feature(g)
    assert isinstance(pull, models.PullRequest)
    assert (pull.number, pull.state, pull.head.ref, pull.base.ref) == (1, "open", "feature", "main")
    assert pull.head.sha == rev(remote[0], "feature") and pull.base.sha == rev(remote[0], "main")
    assert pull.html_url == "http://github.test/acme/shop/pull/1"
    assert (pull.commits, pull.changed_files) == (2, 2)
    for head, message in [
        ("feature", "A pull request already exists for acme:feature."),
        ("acme:feature", "A pull request already exists for acme:feature."),
        ("same", "No commits between main and same"),
    ]:
        with pytest.raises(RequestFailed) as refused:
            await g.rest.pulls.async_create(OWNER, REPO, title="again", head=head, base="main")
        body = refused.value.response.json()
        assert (refused.value.response.status_code, body["message"]) == (422, "Validation Failed")
        assert body["errors"][0]["message"] == message
    with pytest.raises(RequestFailed) as no_branch:
        await g.rest.pulls.async_create(OWNER, REPO, title="x", head="nope", base="main")
    assert no_branch.value.response.status_code == 422
    assert no_branch.value.response.json()["errors"][0]["field"] == "head"


async def test_pull_requests_read_heads_live_and_list_with_link_pagination(gh: GitHubStandIn, remote) -> None:
    g = client(gh)
    await open_feature(g)
    await open_feature(g, "clash")
    clone = remote[1]
    git("checkout", "-q", "feature", cwd=clone)
    pushed = commit_file(clone, "more.txt", "more\n", "feature: more")
    git("push", "-q", "origin", "feature", cwd=clone)
    pull = (await g.rest.pulls.async_get(OWNER, REPO, 1)).parsed_data
    assert isinstance(pull, models.PullRequest)
    assert (pull.head.sha, pull.mergeable, pull.mergeable_state, pull.merged) == (pushed, True, "clean", False)
    listed = await g.rest.pulls.async_list(OWNER, REPO, state="open", per_page=1)
    assert all(isinstance(p, models.PullRequestSimple) for p in listed.parsed_data)
    assert [p.number for p in listed.parsed_data] == [2]  # newest first
    assert 'rel="next"' in listed.headers["link"] and 'rel="last"' in listed.headers["link"]
    walked = [p.number async for p in g.rest.paginate(g.rest.pulls.async_list, owner=OWNER, repo=REPO, per_page=1)]
    assert walked == [2, 1]
    only = (await g.rest.pulls.async_list(OWNER, REPO, head="acme:clash")).parsed_data
    assert [p.head.ref for p in only] == ["clash"]
    with pytest.raises(RequestFailed) as missing:
        await g.rest.pulls.async_get(OWNER, REPO, 99)
    assert missing.value.response.status_code == 404
    patched = await g.rest.pulls.async_update(OWNER, REPO, 2, title="Renamed", state="closed")
    assert (patched.parsed_data.title, patched.parsed_data.state, patched.parsed_data.merged) == (
        "Renamed",
        "closed",
        False,
    )


async def test_merging_really_lands_in_the_bare_repo(gh: GitHubStandIn, remote) -> None:
    g = client(gh)
    bare = remote[0]
    pull = await open_feature(g)
    before = rev(bare, "main")
    with pytest.raises(RequestFailed) as stale:
        await g.rest.pulls.async_merge(OWNER, REPO, 1, sha=before, merge_method="merge")
    assert stale.value.response.status_code == 409
    assert stale.value.response.json()["message"] == "Head branch was modified. Review and try the merge again."
    merged = await g.rest.pulls.async_merge(OWNER, REPO, 1, sha=pull.head.sha, merge_method="merge")
    result = merged.parsed_data
    assert isinstance(result, models.PullRequestMergeResult)
    assert (result.merged, result.message) == (True, "Pull Request successfully merged")
    assert rev(bare, "main") == result.sha != before
    assert git("--git-dir", str(bare), "rev-list", "--parents", "-n1", "main").split()[1:] == [before, pull.head.sha]
    after = await g.rest.pulls.async_get(OWNER, REPO, 1)
    assert (after.parsed_data.state, after.parsed_data.merged, after.parsed_data.merged_by.login) == (
        "closed",
        True,
        "taskgate-bot",
    )
    # githubkit's PullRequest (API 2026-03-10) has no merge_commit_sha: GitHub's JSON still carries it
    assert after.json()["merge_commit_sha"] == result.sha
    with pytest.raises(RequestFailed) as again:
        await g.rest.pulls.async_merge(OWNER, REPO, 1)
    assert (again.value.response.status_code, again.value.response.json()["message"]) == (
        405,
        "Pull Request is not mergeable",
    )


async def test_squash_makes_one_commit_and_conflicts_answer_405(gh: GitHubStandIn, remote) -> None:
    g = client(gh)
    bare = remote[0]
    await open_feature(g)
    await open_feature(g, "clash")
    before = rev(bare, "main")
    squashed = gh.merge_by_human(1, method="squash")
    assert git("--git-dir", str(bare), "rev-list", "--parents", "-n1", "main").split() == [squashed, before]
    assert gh.pull(1)["merged_by"]["login"] == "bob"
    clash = (await g.rest.pulls.async_get(OWNER, REPO, 2)).parsed_data
    assert (clash.mergeable, clash.mergeable_state) == (False, "dirty")
    with pytest.raises(RequestFailed) as conflict:
        await g.rest.pulls.async_merge(OWNER, REPO, 2, merge_method="squash")
    assert conflict.value.response.status_code == 405
    assert rev(bare, "main") == squashed


async def test_check_runs_parse_page_and_serve_their_logs(gh: GitHubStandIn, remote) -> None:
    g = client(gh)
    head = (await open_feature(g)).head.sha
    ids = [gh.set_check(head, f"job {i}", log=f"log of job {i}\n") for i in range(5)]
    assert gh.set_check(head, "job 4", conclusion="failure", log="boom\n") == ids[4]  # same name: updated
    by_branch = (await g.rest.checks.async_list_for_ref(OWNER, REPO, "feature")).parsed_data
    assert isinstance(by_branch, models.ReposOwnerRepoCommitsRefCheckRunsGetResponse200)
    assert by_branch.total_count == 5 and all(isinstance(c, models.CheckRun) for c in by_branch.check_runs)
    assert by_branch.check_runs[0].pull_requests[0].number == 1
    walked = [
        c.id
        async for c in g.rest.paginate(
            g.rest.checks.async_list_for_ref,
            map_func=lambda r: r.parsed_data.check_runs,
            owner=OWNER,
            repo=REPO,
            ref=head,
            per_page=2,
        )
    ]
    assert walked == ids
    failed = (await g.rest.checks.async_get(OWNER, REPO, ids[4])).parsed_data
    assert (failed.status, failed.conclusion, failed.app.slug) == ("completed", "failure", "github-actions")
    logs = await g.rest.actions.async_download_job_logs_for_workflow_run(OWNER, REPO, ids[4])
    assert (logs.status_code, logs.text) == (200, "boom\n")  # githubkit followed the 302
    assert ("GET", f"/repos/acme/shop/actions/jobs/{ids[4]}/logs", 302) in gh.calls
    assert gh.pull(1)["mergeable_state"] == "unstable"


async def test_reviews_and_review_comments_parse(gh: GitHubStandIn) -> None:
    g = client(gh)
    head = (await open_feature(g)).head.sha
    gh.review(1, "COMMENTED", "looks fine")
    gh.review(1, "CHANGES_REQUESTED", "fix it", comments=[{"path": "app.py", "line": 3, "body": "rename"}])
    reviews = (await g.rest.pulls.async_list_reviews(OWNER, REPO, 1)).parsed_data
    assert all(isinstance(r, models.PullRequestReview) for r in reviews)
    assert [(r.state, r.user.login, r.commit_id) for r in reviews] == [
        ("COMMENTED", "alice", head),
        ("CHANGES_REQUESTED", "alice", head),
    ]
    comments = (await g.rest.pulls.async_list_review_comments(OWNER, REPO, 1)).parsed_data
    assert all(isinstance(c, models.PullRequestReviewComment) for c in comments)
    assert [(c.path, c.line, c.body, c.pull_request_review_id) for c in comments] == [
        ("app.py", 3, "rename", reviews[1].id)
    ]
    assert comments[0].diff_hunk.startswith("@@") and "+feature three" in comments[0].diff_hunk
    assert gh.pull(1)["mergeable_state"] == "blocked"
    gh.review(1, "APPROVED", user="alice")
    assert gh.pull(1)["mergeable_state"] == "clean"


async def test_etags_answer_304_to_if_none_match(gh: GitHubStandIn) -> None:
    auth = {"Authorization": "Bearer ghp_test"}
    with httpx.Client(base_url=gh.url, headers=auth) as http:
        first = http.get("/repos/acme/shop")
        etag = first.headers["etag"]
        again = http.get("/repos/acme/shop", headers={"If-None-Match": etag})
        changed = http.get("/repos/acme/shop/pulls", headers={"If-None-Match": etag})
    assert (first.status_code, again.status_code, again.content, changed.status_code) == (200, 304, b"", 200)
    assert again.headers["etag"] == etag and "x-ratelimit-remaining" in again.headers
    assert gh.calls[:2] == [("GET", "/repos/acme/shop", 200), ("GET", "/repos/acme/shop", 304)]
    assert int(again.headers["x-ratelimit-used"]) == 1  # the 304 cost nothing


async def test_githubkit_http_cache_revalidates_every_repeat_with_if_none_match(gh: GitHubStandIn) -> None:
    # githubkit sends `Cache-Control: no-cache` on every request, so its hishel cache never answers from its
    # store unasked (despite GitHub's `max-age=60`): each repeat is conditional, a 304 is served from the store
    async with client(gh, http_cache=True) as g:
        first = await g.rest.pulls.async_get(OWNER, REPO, (await open_feature(g)).number)
        second = await g.rest.pulls.async_get(OWNER, REPO, 1)
        assert second.status_code == 200 and second.parsed_data == first.parsed_data
        gh.set_check(first.parsed_data.head.sha, "tests", conclusion="failure")
        third = await g.rest.pulls.async_get(OWNER, REPO, 1)
        assert (first.parsed_data.mergeable_state, third.parsed_data.mergeable_state) == ("clean", "unstable")
    assert [s for m, p, s in gh.calls if p == "/repos/acme/shop/pulls/1"] == [200, 304, 200]


async def test_bad_tokens_answer_401(gh: GitHubStandIn) -> None:
    g = GitHub("ghp_wrong", base_url=gh.url, auto_retry=False, http_cache=False)
    with pytest.raises(RequestFailed) as refused:
        await g.rest.repos.async_get(OWNER, REPO)
    assert refused.value.response.status_code == 401
    assert refused.value.response.json() == {
        "message": "Bad credentials",
        "documentation_url": "https://docs.github.com/rest",
    }
    assert httpx.get(f"{gh.url}/repos/acme/shop").status_code == 401


@pytest.mark.parametrize("status", [403, 429])
async def test_rate_limits_raise_rate_limit_exceeded(gh: GitHubStandIn, status: int) -> None:
    g = client(gh)
    gh.fail_next(1, status, "/repos/acme/shop")
    with pytest.raises(RateLimitExceeded) as limited:
        await g.rest.repos.async_get(OWNER, REPO)
    assert limited.value.response.status_code == status
    assert limited.value.retry_after.total_seconds() <= 1
    limits = (await g.rest.rate_limit.async_get()).parsed_data
    assert isinstance(limits, models.RateLimitOverview) and limits.resources.core.limit == 5000


@pytest.mark.parametrize("status", [429, 403, 500])
async def test_githubkit_auto_retry_gets_through_rate_limits_and_server_errors(gh: GitHubStandIn, status: int) -> None:
    # one failure per test: githubkit counts retries across its rules (a rate limit is retried only as the
    # first retry, the second server-error retry waits 4 s)
    g = GitHub("ghp_test", base_url=gh.url, http_cache=False)  # githubkit's default retries
    gh.fail_next(1, status, "/repos/acme/shop")
    started = time.monotonic()
    repo = (await g.rest.repos.async_get(OWNER, REPO)).parsed_data
    assert repo.name == "shop" and time.monotonic() - started < 5
    assert [s for _, _, s in gh.calls] == [status, 200]


async def test_concurrent_requests_are_served_together(gh: GitHubStandIn) -> None:
    g = client(gh)
    await open_feature(g)
    pulls = await asyncio.gather(*(g.rest.pulls.async_get(OWNER, REPO, 1) for _ in range(20)))
    assert {p.parsed_data.head.sha for p in pulls} == {pulls[0].parsed_data.head.sha}
    assert gh.calls_to("GET", "/repos/acme/shop/pulls/1") == 20


async def test_unknown_endpoints_and_bad_json(gh: GitHubStandIn) -> None:
    auth = {"Authorization": "token ghp_test"}
    with httpx.Client(base_url=gh.url, headers=auth) as http:
        unknown = http.get("/repos/acme/shop/nothing-here")
        bad = http.post("/repos/acme/shop/pulls", content=b"{not json")
        gh.fail_next(1, 500, "/repos/acme/shop/pulls")
        failed = http.get("/repos/acme/shop/pulls")
    assert (unknown.status_code, unknown.json()["message"]) == (404, "Not Found")
    assert (bad.status_code, bad.json()["message"]) == (400, "Problems parsing JSON")
    assert (failed.status_code, failed.json()) == (500, {"message": "Server Error"})


class _Receiver:
    """A webhook receiver that records raw bodies and headers and answers `status`."""

    def __init__(self, status: int = 200) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append((dict(self.headers.items()), body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_webhooks_are_signed_and_parse_as_githubs_events(gh: GitHubStandIn, remote) -> None:
    receiver = _Receiver()
    gh.webhook_url, gh.webhook_secret = receiver.url, "s3cret"
    try:
        g = client(gh)
        await open_feature(g)
        await open_feature(g, "clash")
        git("checkout", "-q", "feature", cwd=remote[1])
        pushed = commit_file(remote[1], "more.txt", "more\n", "more")
        git("push", "-q", "origin", "feature", cwd=remote[1])
        await g.rest.pulls.async_get(OWNER, REPO, 1)  # the read notices the push
        gh.set_check(pushed, "tests", status="in_progress", conclusion=None)
        gh.set_check(pushed, "tests", conclusion="success")
        gh.review(1, "APPROVED", "ok", comments=[{"path": "more.txt", "line": 1, "body": "nice"}])
        gh.merge_by_human(1)
        gh.close(2)
        gh.flush_deliveries()
    finally:
        receiver.close()
    seen = []
    for headers, body in receiver.received:
        assert webhooks.verify("s3cret", body, headers["X-Hub-Signature-256"])
        assert headers["User-Agent"].startswith("GitHub-Hookshot/") and headers["Content-Type"] == "application/json"
        assert uuid.UUID(headers["X-GitHub-Delivery"]).version == 4
        event = webhooks.parse(headers["X-GitHub-Event"], body)  # a shape githubkit rejects fails here
        seen.append((headers["X-GitHub-Event"], event.action))
    assert seen == [
        ("pull_request", "opened"),
        ("pull_request", "opened"),
        ("pull_request", "synchronize"),
        ("check_run", "created"),
        ("check_run", "completed"),
        ("pull_request_review", "submitted"),
        ("pull_request_review_comment", "created"),
        ("pull_request", "closed"),
        ("pull_request", "closed"),
    ]
    closings = [json.loads(b)["pull_request"] for h, b in receiver.received if json.loads(b)["action"] == "closed"]
    assert [(p["number"], p["merged"]) for p in closings] == [(1, True), (2, False)]
    check = json.loads(receiver.received[4][1])["check_run"]
    assert (check["head_sha"], check["pull_requests"][0]["number"]) == (pushed, 1)
    assert [status for _, _, status in gh.deliveries] == [200] * 9


async def test_failing_receivers_are_recorded_not_raised(gh: GitHubStandIn) -> None:
    receiver = _Receiver(status=500)
    gh.webhook_url, gh.webhook_secret = receiver.url, "s3cret"
    try:
        assert gh.deliver("ping", {"zen": "Keep it logically awesome.", "hook_id": 1}) == 500
    finally:
        receiver.close()
    assert gh.deliver("ping", {"zen": "gone"}) == 0  # nobody listening
    assert [(event, status) for event, _, status in gh.deliveries] == [("ping", 500), ("ping", 0)]
