"""An in-process stand-in for the parts of GitHub's REST API taskgate's forge support uses (see GitHubStandIn)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support.github_api.api import Api
from tests.support.github_api.forge import Forge
from tests.support.github_api.hooks import Deliverer
from tests.support.github_api.server import HttpServer
from tests.support.github_api.shapes import Site

__all__ = ["GitHubStandIn"]


class GitHubStandIn:
    """GitHub's REST API for one repository `owner/name`, backed by the bare repo at `bare`.

    Branch heads are read live from the bare repo with git; merges really land there. Rebase merges are done as
    one linear commit on the base (like a squash). Every JSON GET answers with an ETag and GitHub's
    `Cache-Control: private, max-age=60` (set `cache_control` to change it); webhooks go to `webhook_url` once
    both it and `webhook_secret` are set.
    """

    def __init__(
        self,
        bare: Path,
        owner: str = "acme",
        name: str = "shop",
        token: str = "ghp_test",
        default_branch: str = "main",
        login: str = "taskgate-bot",
    ) -> None:
        self.webhook_secret: str | None = None
        self.webhook_url: str | None = None
        self._server = HttpServer(self._handle)
        self._site = Site("", owner, name, default_branch, datetime.now(UTC).replace(microsecond=0))
        self._hooks = Deliverer(lambda: (self.webhook_url, self.webhook_secret), self._site.repo_id)
        self._forge = Forge(Path(bare), self._site, self._hooks, lambda: bool(self.webhook_url and self.webhook_secret))
        self._api = Api(self._forge, token, lambda: self.url, login)

    # -- lifecycle ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The API root once started (githubkit's base_url)."""
        return self._server.url

    def start(self) -> None:
        """Serve in a background thread."""
        self._server.start()
        # the JSON's URLs name the server, so the site learns its address once bound
        self._forge.site = _with_api(self._site, self.url)

    def stop(self) -> None:
        """Stop serving; queued webhook deliveries are sent first."""
        self._hooks.close()
        self._server.stop()

    def __enter__(self) -> GitHubStandIn:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what tests read ---------------------------------------------------------------------------------

    @property
    def calls(self) -> list[tuple[str, str, int]]:
        """(method, path, status) of every API request, in order (304s included)."""
        return self._api.calls

    def calls_to(self, method: str, path_prefix: str) -> int:
        """How many requests of `method` went to paths under `path_prefix`."""
        return sum(1 for m, p, _ in list(self.calls) if m == method and p.startswith(path_prefix))

    @property
    def deliveries(self) -> list[tuple[str, str, int]]:
        """(event, delivery id, receiver status) of every webhook delivery (status 0: unreachable)."""
        return self._hooks.deliveries

    @property
    def cache_control(self) -> str:
        """The Cache-Control sent with JSON GETs (GitHub's by default)."""
        return self._api.cache_control

    @cache_control.setter
    def cache_control(self, value: str) -> None:
        self._api.cache_control = value

    def pull(self, number: int) -> dict[str, Any]:
        """The pull request's current JSON."""
        with self._forge.lock:
            return self._forge.pull_json(self._forge.pull(number))

    def flush_deliveries(self, timeout: float = 10) -> None:
        """Wait until every automatic webhook delivery so far has been sent."""
        self._hooks.flush(timeout)

    # -- what people and CI do on the forge ------------------------------------------------------------------

    def set_check(
        self,
        sha: str,
        name: str,
        status: str = "completed",
        conclusion: str | None = "success",
        log: str = "",
        app: str = "github-actions",
    ) -> int:
        """Create or update the check run `name` on commit `sha`; its id (also its job id, serving `log`)."""
        with self._forge.lock:
            return self._forge.set_check(sha, name, status, conclusion, log, app)

    def review(self, number: int, state: str, body: str = "", comments: list[dict] = (), user: str = "alice") -> int:
        """Submit a review (APPROVED | CHANGES_REQUESTED | COMMENTED) with line comments on the current head."""
        with self._forge.lock:
            self._forge.refresh_heads()
            return self._forge.review(self._forge.pull(number), state, body, list(comments), user)

    def merge_by_human(self, number: int, user: str = "bob", method: str = "merge") -> str:
        """Merge the pull request in the bare repo as `user` would on the web; the merge commit sha."""
        with self._forge.lock:
            self._forge.refresh_heads()
            return self._forge.merge(self._forge.pull(number), method, user)

    def close(self, number: int, user: str = "bob") -> None:
        """Close the pull request without merging."""
        with self._forge.lock:
            self._forge.close(self._forge.pull(number), user)

    def fail_next(self, count: int, status: int = 500, path_prefix: str = "") -> None:
        """The next `count` API requests under `path_prefix` answer `status` (403/429: a rate limit)."""
        self._api.fail_next(count, status, path_prefix)

    # -- issues (GitHub Issues as the tracker) ----------------------------------------------------------------

    def add_issue(
        self,
        title: str,
        body: str = "",
        labels: Sequence[str] = (),
        assignees: Sequence[str] = (),
        blocked_by: Sequence[int] = (),
        parent: int | None = None,
    ) -> int:
        """Open an issue (by the repository's owner); its number. `blocked_by`: issue dependencies; `parent`: it
        is a sub-issue of that issue."""
        with self._forge.lock:
            return self._api.issues.add(title, body, labels, assignees, blocked_by, parent)

    def close_issue(self, number: int, reason: str = "completed", user: str = "bob") -> None:
        """Close the issue as `user` would on the web."""
        with self._forge.lock:
            self._api.issues.close(self._api.issues.issue(number), user, reason)

    def assign(self, number: int, login: str) -> None:
        """Add `login` to the issue's assignees."""
        with self._forge.lock:
            rec = self._api.issues.issue(number)
            if login not in rec.assignees:
                rec.assignees.append(login)
                rec.touch()

    def set_labels(self, number: int, labels: Sequence[str]) -> None:
        """Replace the issue's labels."""
        with self._forge.lock:
            rec = self._api.issues.issue(number)
            rec.labels = list(dict.fromkeys(labels))
            rec.touch()

    def edit_issue(self, number: int, title: str | None = None, body: str | None = None) -> None:
        """Change the issue's title or body."""
        with self._forge.lock:
            rec = self._api.issues.issue(number)
            rec.title = rec.title if title is None else title
            rec.body = rec.body if body is None else body
            rec.touch()

    def issue(self, number: int) -> dict[str, Any]:
        """The issue's current state: number, title, body, state, state_reason, labels, assignees, comments (their
        bodies), blocked_by, parent."""
        with self._forge.lock:
            return self._api.issues.summary(self._api.issues.issue(number))

    def race_next_claim(self, number: int, login: str) -> None:
        """The next POST …/assignees on the issue first assigns `login` (a concurrent claimer landing first)."""
        with self._forge.lock:
            self._api.issues.races[number] = login

    def deliver(self, event: str, payload: dict) -> int:
        """POST one delivery to `webhook_url` now, signed; the receiver's status."""
        return self._hooks.send(event, payload)

    def _handle(self, request: Any) -> Any:
        return self._api.handle(request)


def _with_api(site: Site, api: str) -> Site:
    return Site(api, site.owner, site.name, site.default_branch, site.created)
