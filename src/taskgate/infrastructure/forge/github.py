"""GitHub as the forge, through githubkit (async, typed, generated from GitHub's OpenAPI description).

What githubkit brings that a hand-written client would have to: the models (a response that does not parse is an
error here, not a KeyError later), the retries (a rate limit waits for its reset, a 5xx is retried with growing
pauses: `github_calls.RETRY`), and an HTTP cache that makes repeated GETs conditional (`If-None-Match` with the ETag; an
unchanged pull request, its checks and reviews cost 304s, which GitHub does not count against the rate limit).

The token is read from its environment variable when the client is built and lives only in this object; messages
name the variable, never the value.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from githubkit.exception import GitHubException, RequestFailed

from taskgate.domain.errors import ForgeError, ForgeHeadMoved
from taskgate.domain.forge import CheckRun, LineComment, Observation, PullRequest, Review, log_tail
from taskgate.infrastructure.github_calls import RETRY, PooledGitHub, failure, github_message

_PAGE = 100
_READY = "mutation($id: ID!) { markPullRequestReadyForReview(input: {pullRequestId: $id}) { pullRequest { isDraft } } }"


class GitHubForge:
    """One GitHub repository (`owner/name`) at `api_url` (api.github.com, an Enterprise server, or a stand-in)."""

    kind = "github"

    def __init__(self, api_url: str, repository: str, token: str, token_env: str, *, timeout_s: float = 30.0) -> None:
        self.repository, self.api_url, self._token_env = repository, api_url.rstrip("/"), token_env
        self._owner, self._name = repository.split("/", 1)
        self.calls = 0
        hooks = {"request": [self._count]}
        self._gh = PooledGitHub(
            token, base_url=self.api_url, auto_retry=RETRY, http_cache=True, timeout=timeout_s,
            async_event_hooks=hooks, user_agent="taskgate",
        )  # fmt: skip

    async def _count(self, _request: Any) -> None:
        self.calls += 1

    # -- ForgeApi ----------------------------------------------------------------------------------------------

    async def check(self) -> str:
        repo = await self._call("read the repository", self._gh.rest.repos.async_get, self._owner, self._name)
        return str(repo.default_branch)

    async def find_pull(self, branch: str) -> PullRequest | None:
        pulls = await self._call(
            f"list pull requests of {branch}", self._gh.rest.pulls.async_list, self._owner, self._name,
            head=f"{self._owner}:{branch}", state="all", per_page=_PAGE,
        )  # fmt: skip
        mine = sorted((p for p in pulls if p.head.ref == branch), key=lambda p: (p.state == "open", p.number))
        return _pull(mine[-1]) if mine else None

    async def open_pull(self, branch: str, base: str, title: str, body: str, *, draft: bool = False) -> PullRequest:
        pull = await self._call(
            f"open a pull request of {branch} into {base}", self._gh.rest.pulls.async_create, self._owner, self._name,
            title=title, head=branch, base=base, body=body, draft=draft,
        )  # fmt: skip
        return _pull(pull)

    async def mark_ready(self, number: int) -> None:
        """A draft pull request marked ready for review: GraphQL's mutation (the REST API cannot)."""
        pull = await self._call(f"read PR #{number}", self._gh.rest.pulls.async_get, self._owner, self._name, number)
        if not pull.draft:
            return
        try:
            await self._gh.async_graphql(_READY, {"id": pull.node_id})
        except GitHubException as exc:
            raise ForgeError(self._failed(f"mark PR #{number} ready for review", exc)) from None

    async def update_pull(self, number: int, *, body: str | None = None, reopen: bool = False) -> PullRequest:
        changes: dict[str, Any] = {}
        if body is not None:
            changes["body"] = body
        if reopen:
            changes["state"] = "open"
        pull = await self._call(f"update PR #{number}", self._gh.rest.pulls.async_update, self._owner, self._name,
                                number, **changes)  # fmt: skip
        return _pull(pull)

    async def observe(self, number: int) -> Observation:
        try:
            resp = await self._gh.rest.pulls.async_get(self._owner, self._name, number)
        except (RequestFailed, GitHubException) as exc:
            raise ForgeError(self._failed(f"read PR #{number}", exc)) from None
        # the model of API version 2026-03-10 has no merge_commit_sha: read from the JSON it was parsed from
        pull = replace(_pull(resp.parsed_data), merge_commit=resp.json().get("merge_commit_sha") or None)
        checks = await self._pages(f"read the checks of {pull.head[:12]}", self._checks_page, pull.head)
        reviews = await self._pages(f"read the reviews of PR #{number}", self._reviews_page, number)
        comments = await self._pages(f"read the review comments of PR #{number}", self._comments_page, number)
        return Observation(pull, tuple(_check(c) for c in checks), tuple(_review(r) for r in reviews),
                           tuple(_comment(c) for c in comments))  # fmt: skip

    async def log_tail(self, check: CheckRun, lines: int) -> str:
        """The job's log for a GitHub Actions check (its check run id is the job id), else the check's own text."""
        try:
            resp = await self._gh.rest.actions.async_download_job_logs_for_workflow_run(
                self._owner, self._name, check.id
            )
            return log_tail(resp.content.decode(errors="replace"), lines)
        except (RequestFailed, GitHubException):
            pass  # not an Actions job (another CI app), or its logs expired: the check's own output then
        try:
            run = await self._call(f"read check {check.name}", self._gh.rest.checks.async_get, self._owner, self._name,
                                   check.id)  # fmt: skip
        except ForgeError:
            return ""
        output = run.output
        return log_tail("\n".join(x for x in (output.title, output.summary, output.text) if x), lines)

    async def merge(self, number: int, head: str, method: str, title: str) -> str:
        try:
            resp = await self._gh.rest.pulls.async_merge(
                self._owner, self._name, number, sha=head, merge_method=method, commit_title=title
            )
        except RequestFailed as exc:
            said = github_message(exc)
            if exc.response.status_code == 409:
                raise ForgeHeadMoved(f"PR #{number}'s head is no longer {head[:12]}: not merged ({said})") from None
            raise ForgeError(f"merge PR #{number}: {exc.response.status_code} {said}") from None
        except GitHubException as exc:
            raise ForgeError(f"merge PR #{number}: {type(exc).__name__}: the forge did not answer") from None
        return str(resp.parsed_data.sha)

    # -- internals ---------------------------------------------------------------------------------------------

    async def _checks_page(self, head: str, page: int) -> list[Any]:
        resp = await self._gh.rest.checks.async_list_for_ref(self._owner, self._name, head, per_page=_PAGE, page=page)
        return list(resp.parsed_data.check_runs)

    async def _reviews_page(self, number: int, page: int) -> list[Any]:
        resp = await self._gh.rest.pulls.async_list_reviews(self._owner, self._name, number, per_page=_PAGE, page=page)
        return list(resp.parsed_data)

    async def _comments_page(self, number: int, page: int) -> list[Any]:
        resp = await self._gh.rest.pulls.async_list_review_comments(
            self._owner, self._name, number, per_page=_PAGE, page=page
        )
        return list(resp.parsed_data)

    async def _pages(self, what: str, page_of: Callable[[Any, int], Awaitable[list[Any]]], key: Any) -> list[Any]:
        """Every page of a list (GitHub's `page`/`per_page`: a short page is the last)."""
        found: list[Any] = []
        for page in range(1, 1000):
            try:
                items = await page_of(key, page)
            except (RequestFailed, GitHubException) as exc:
                raise ForgeError(self._failed(what, exc)) from None
            found += items
            if len(items) < _PAGE:
                return found
        return found

    async def _call(self, what: str, method: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        try:
            return (await method(*args, **kwargs)).parsed_data
        except (RequestFailed, GitHubException) as exc:
            raise ForgeError(self._failed(what, exc)) from None

    def _failed(self, what: str, exc: Exception) -> str:
        """What went wrong, in words that say what to check; never the token."""
        return failure(what, exc, repository=self.repository, api_url=self.api_url, token_env=self._token_env)


def _login(user: Any) -> str | None:
    return str(user.login) if user else None


def _pull(p: Any) -> PullRequest:
    return PullRequest(
        number=int(p.number), url=str(p.html_url), state=str(p.state), head=str(p.head.sha),
        head_branch=str(p.head.ref),
        base_branch=str(p.base.ref), merged=bool(getattr(p, "merged", False) or getattr(p, "merged_at", None)),
        merged_by=_login(getattr(p, "merged_by", None)), merge_commit=getattr(p, "merge_commit_sha", None) or None,
        mergeable=getattr(p, "mergeable", None), draft=bool(getattr(p, "draft", False) or False),
    )  # fmt: skip


def _check(c: Any) -> CheckRun:
    summary = (c.output.summary or "") if c.output else ""
    return CheckRun(int(c.id), str(c.name), str(c.status), c.conclusion, str(c.details_url or ""), summary)


def _review(r: Any) -> Review:
    return Review(int(r.id), _login(r.user) or "?", str(r.state), str(r.body or ""), str(r.commit_id or ""))


def _comment(c: Any) -> LineComment:
    line = c.line if c.line is not None else getattr(c, "original_line", None)
    return LineComment(int(c.id), _login(c.user) or "?", str(c.path), line, str(c.body or ""), str(c.commit_id))
