"""`GitHubIssuesTracker`: the tracker port over one repository's GitHub Issues (REST, through githubkit).

Issue #12 is the task `gh-12`. **The ready rule**: an issue is ready when it is open; carries `label` (any open
issue when `label` is ""); is not a pull request; is not blocked (GitHub's issue dependencies: the issue's
`issue_dependencies_summary.blocked_by`, the number of its *open* blockers, is 0); has no open sub-issues
(`sub_issues_summary.total == completed`); and is assigned to nobody or only to our login (`assignee`, else the
token's user from `GET /user`). Both summaries come with every issue of the list, so a poll costs one request per
100 issues plus, for each blocked issue, one `GET …/dependencies/blocked_by` to name its open blockers. When a
server leaves `issue_dependencies_summary` out (an older GitHub Enterprise), that endpoint is asked for every issue
instead (a 404 there: the server has no dependencies, nothing is blocked). `ready()` gives the ready issues by
(priority, number); `list()` every open labelled issue with `hold` saying why it is not ready.

Priority is the smallest of `priority_labels` among the issue's labels (2 without one). Every GET is conditional
(githubkit's HTTP cache revalidates with `If-None-Match`): a poll where nothing changed costs only 304s, which
GitHub does not count against the rate limit. `calls` counts every request, `not_modified` the 304s among them.
Rate limits (403/429 with `x-ratelimit-remaining: 0` or `Retry-After`) are waited out and retried up to three
times; 5xx answers are retried after 1, 4 and 9 s. Anything else is a TrackerError that says what was being done
and GitHub's message; a 401 names the token's variable, never the token.

**Claims.** GitHub has no compare-and-swap on issues. `PATCH assignees` replaces the list, so two claimers would
each overwrite the other and both believe they won. `POST …/assignees` *adds*, and GitHub applies adds one after
the other: whichever add lands second finds the first claimer already there. So a claim reads the issue (closed,
or assigned to another login: refused), adds our login, then re-reads: any other assignee means someone raced us,
and we remove ourselves and refuse. Of any set of racers at most one sees itself as the only assignee (possibly
none, when both re-read after both adds; the issue is then simply claimed again on a later poll).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from githubkit.exception import GitHubException, RequestFailed

from taskgate.application.trackers.ports import TrackerIssue
from taskgate.domain.entities import Project, TaskStatus
from taskgate.domain.errors import ClaimRefused, InvalidInput, TaskNotFound, TrackerError
from taskgate.infrastructure.github_calls import RETRY, PooledGitHub, failure
from taskgate.infrastructure.trackers import github_shapes as shapes

PAGE = 100
DEFAULT_PRIORITY_LABELS: Mapping[str, int] = MappingProxyType({"P0": 0, "P1": 1, "P2": 2, "P3": 3, "P4": 4})
DEFAULT_STATUS_LABELS: Mapping[str, str] = MappingProxyType({
    "in_progress": "taskgate:in-progress", "pending_review": "taskgate:in-review",
    "approved": "taskgate:approved", "merged": "taskgate:approved",
})  # fmt: skip
_REPO_RE = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


class GitHubIssuesTracker:
    """One repository's issues (`owner/name` at `api_url`: api.github.com, an Enterprise server or a stand-in)."""

    name = "github"

    def __init__(
        self,
        api_url: str,
        repository: str,
        token: str,
        token_env: str,
        *,
        label: str = "taskgate",
        assignee: str | None = None,
        priority_labels: Mapping[str, int] = DEFAULT_PRIORITY_LABELS,
        status_labels: Mapping[str, str] = DEFAULT_STATUS_LABELS,
        write_back: bool = True,
        timeout_s: float = 30.0,
    ) -> None:
        if not _REPO_RE.fullmatch(repository):
            raise InvalidInput(f"tracker.github.repository must be owner/name, not {repository!r}")
        if timeout_s <= 0:
            raise InvalidInput("tracker.github.timeout_s must be positive")
        self.repository, self.api_url, self._token_env = repository, api_url.rstrip("/"), token_env
        self._owner, self._repo = repository.split("/", 1)
        self._label, self._me = label, assignee
        self._priority_labels = dict(priority_labels)
        unknown = sorted(set(status_labels) - {s.value for s in TaskStatus})
        if unknown:
            raise InvalidInput(f"tracker.github.status_labels: unknown task status {unknown[0]!r}")
        self._status_labels = dict(status_labels)
        self.writes_back = write_back
        self.calls = 0
        self.not_modified = 0
        self._dependencies = True  # False once the server answered 404 to a dependencies request
        hooks = {"request": [self._count], "response": [self._seen]}
        self._gh = PooledGitHub(
            token, base_url=self.api_url, auto_retry=RETRY, http_cache=True, timeout=timeout_s,
            async_event_hooks=hooks, user_agent="taskgate",
        )  # fmt: skip

    def describe(self) -> str:
        return f"github {self.repository}, " + (f"label {self._label}" if self._label else "every open issue")

    async def _count(self, _request: Any) -> None:
        self.calls += 1

    async def _seen(self, response: Any) -> None:
        # below the cache a revalidation is a 304; the cache hands its stored answer up as a 200 marked from the
        # cache and revalidated (a changed resource's new 200 is marked revalidated but not from the cache)
        ext = response.extensions
        if response.status_code == 304 or (ext.get("hishel_from_cache") and ext.get("hishel_revalidated")):
            self.not_modified += 1

    # -- TrackerProvider ---------------------------------------------------------------------------------------

    async def ready(self, project: Project) -> list[TrackerIssue]:
        """The open labelled issues the ready rule admits (see the module's docstring), by priority then number."""
        return [issue for issue in await self.list(project) if issue.hold is None]

    async def list(self, project: Project) -> list[TrackerIssue]:
        """Every open labelled issue (not pull requests) with `hold` filled, by priority then number."""
        found = [await self._tracker_issue(issue) for issue in await self._open_issues()]
        return sorted(found, key=lambda i: (i.priority, shapes.number_of(i.id) or 0))

    async def show(self, project: Project, issue_id: str) -> TrackerIssue:
        """`GET /issues/{n}`. Raises: TaskNotFound (also a pull request's number or an id not `gh-N`)."""
        issue = await self._issue(issue_id)
        if issue.state == "open":
            return await self._tracker_issue(issue)
        closed = shapes.tracker_issue(issue, self._pl)
        return replace(closed, lost=self._lost(closed, []))

    async def claim(self, project: Project, issue_id: str, actor: str) -> None:
        """Add our login to the assignees, then re-read (the module's docstring says why). Raises: ClaimRefused,
        TaskNotFound, TrackerError."""
        me = await self._login()
        issue = await self._issue(issue_id)
        n = int(issue.number)
        if issue.state == "closed":
            raise ClaimRefused(issue_id, "closed")
        others = [login for login in shapes.logins(issue) if login != me]
        if others:
            raise ClaimRefused(issue_id, f"assigned to {', '.join(others)}")
        await self._do(f"assign {issue_id} to {me}", self._gh.rest.issues.async_add_assignees, n, assignees=[me])
        others = [login for login in shapes.logins(await self._issue(issue_id)) if login != me]
        if others:
            await self._do(f"unassign {me} from {issue_id}", self._gh.rest.issues.async_remove_assignees, n,
                           assignees=[me])  # fmt: skip
            raise ClaimRefused(issue_id, f"claimed concurrently by {', '.join(others)}")
        label = self._status_labels.get(TaskStatus.IN_PROGRESS.value)
        if self.writes_back and label:
            await self._set_labels(issue_id, n, shapes.label_names(issue), label)

    async def set_status(self, project: Project, issue_id: str, status: TaskStatus, reason: str = "") -> None:
        """The reason as a comment; our status label for `status` (others of ours removed, no other label
        touched); `completed` closes the issue, `open` releases our claim. A no-op when write-back is off."""
        n = shapes.number_of(issue_id)
        if n is None:
            raise InvalidInput(f"{issue_id!r} is not a GitHub issue id (gh-N)")
        status = TaskStatus(status)
        if not self.writes_back:
            return
        issue = await self._issue(issue_id)
        if reason:
            await self._do(f"comment on {issue_id}", self._gh.rest.issues.async_create_comment, n, body=reason)
        ends_claim = status in (TaskStatus.OPEN, TaskStatus.COMPLETED)  # no status label then: ours all go
        target = None if ends_claim else self._status_labels.get(status.value)
        await self._set_labels(issue_id, n, shapes.label_names(issue), target)
        if status == TaskStatus.COMPLETED and issue.state != "closed":
            await self._do(f"close {issue_id}", self._gh.rest.issues.async_update, n, state="closed",
                           state_reason="completed")  # fmt: skip
        elif status == TaskStatus.OPEN:
            me = await self._login()
            if me in shapes.logins(issue):
                await self._do(f"unassign {me} from {issue_id}", self._gh.rest.issues.async_remove_assignees, n,
                               assignees=[me])  # fmt: skip

    # -- reading -----------------------------------------------------------------------------------------------

    @property
    def _pl(self) -> Mapping[str, int]:
        return self._priority_labels

    async def _open_issues(self) -> list[Any]:
        """Every open issue with the label, all pages (GitHub's Link rel="next" says whether one follows)."""
        what = f"list issues of {self.repository}"
        labels = {"labels": self._label} if self._label else {}
        found: list[Any] = []
        for page in range(1, 10_000):
            resp = await self._call(what, self._gh.rest.issues.async_list_for_repo, self._owner, self._repo,
                                    state="open", per_page=PAGE, page=page, **labels)  # fmt: skip
            found += [issue for issue in resp.parsed_data if not issue.pull_request]
            if 'rel="next"' not in resp.headers.get("link", ""):
                break
        return found

    async def _tracker_issue(self, issue: Any) -> TrackerIssue:
        """The issue with its hold (and, when blocked, its blockers named)."""
        blockers: list[Any] = []
        count = shapes.open_blockers(issue)
        if (count is None and self._dependencies) or count:
            blockers = await self._blockers(int(issue.number))
        open_ = [shapes.issue_id(int(b.number)) for b in blockers if b.state == "open"]
        if count and not open_:  # GitHub counts open blockers it would not list: held all the same
            open_ = [f"{count} issue{'s' if count != 1 else ''}"]
        assigned = shapes.logins(issue)
        others = [login for login in assigned if login != await self._login()] if assigned else []
        deps = tuple((shapes.issue_id(int(b.number)), "blocks") for b in blockers)
        held = shapes.hold(open_, shapes.open_sub_issues(issue), others)
        found = shapes.tracker_issue(issue, self._pl, dependencies=deps, hold_=held)
        return replace(found, lost=self._lost(found, others))

    def _lost(self, issue: TrackerIssue, others: list[str]) -> str | None:
        """Why the issue is no longer taskgate's: closed, its label removed, or assigned to someone else."""
        reasons = ["closed in GitHub"] if issue.closed else []
        if self._label and self._label not in issue.labels:
            reasons.append(f"label {self._label} removed")
        if others:
            reasons.append("assigned to " + ", ".join(others))
        return "; ".join(reasons) or None

    async def _blockers(self, n: int) -> list[Any]:
        found: list[Any] = []
        for page in range(1, 100):
            try:
                resp = await self._gh.rest.issues.async_list_dependencies_blocked_by(
                    self._owner, self._repo, n, per_page=PAGE, page=page
                )
            except RequestFailed as exc:
                if exc.response.status_code == 404:
                    self._dependencies = False  # a server without issue dependencies
                    return []
                raise TrackerError(self._failed(f"read what blocks gh-{n}", exc)) from None
            except GitHubException as exc:
                raise TrackerError(self._failed(f"read what blocks gh-{n}", exc)) from None
            found += resp.parsed_data
            if 'rel="next"' not in resp.headers.get("link", ""):
                return found
        return found

    async def _issue(self, issue_id: str) -> Any:
        """The issue (not a pull request). Raises: TaskNotFound, TrackerError."""
        n = shapes.number_of(issue_id)
        if n is None:
            raise TaskNotFound(issue_id)
        try:
            issue = (await self._gh.rest.issues.async_get(self._owner, self._repo, n)).parsed_data
        except RequestFailed as exc:
            if exc.response.status_code in (404, 410):
                raise TaskNotFound(issue_id) from None
            raise TrackerError(self._failed(f"read {issue_id} of {self.repository}", exc)) from None
        except GitHubException as exc:
            raise TrackerError(self._failed(f"read {issue_id} of {self.repository}", exc)) from None
        if issue.pull_request:
            raise TaskNotFound(issue_id)
        return issue

    async def _login(self) -> str:
        """`assignee`, else the token's user (read once)."""
        if self._me is None:
            user = await self._call("read the token's user", self._gh.rest.users.async_get_authenticated)
            self._me = str(user.parsed_data.login)
        return self._me

    # -- writing -----------------------------------------------------------------------------------------------

    async def _set_labels(self, issue_id: str, n: int, current: tuple[str, ...], target: str | None) -> None:
        """Add `target` (when given and missing) and remove our other status labels; one request per change, so a
        label someone else sets meanwhile is never overwritten."""
        if target and target not in current:
            await self._do(f"label {issue_id} {target}", self._gh.rest.issues.async_add_labels, n, labels=[target])
        for name in sorted(set(self._status_labels.values()) - {target}):
            if name in current:
                try:
                    await self._gh.rest.issues.async_remove_label(self._owner, self._repo, n, name)
                except RequestFailed as exc:
                    if exc.response.status_code != 404:  # already gone
                        raise TrackerError(self._failed(f"remove label {name} of {issue_id}", exc)) from None
                except GitHubException as exc:
                    raise TrackerError(self._failed(f"remove label {name} of {issue_id}", exc)) from None

    async def _do(self, what: str, method: Callable[..., Awaitable[Any]], n: int, **data: Any) -> Any:
        return await self._call(what, method, self._owner, self._repo, n, **data)

    async def _call(self, what: str, method: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except (RequestFailed, GitHubException) as exc:
            raise TrackerError(self._failed(what, exc)) from None

    def _failed(self, what: str, exc: Exception) -> str:
        """What went wrong, in words that say what to check; never the token."""
        return failure(what, exc, repository=self.repository, api_url=self.api_url, token_env=self._token_env)
