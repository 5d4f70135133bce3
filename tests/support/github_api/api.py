"""The REST endpoints: routing, auth, injected failures, rate limits, ETags and Link pagination."""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from tests.support.github_api.forge import Forge, Refused, invalid
from tests.support.github_api.issues import Issues
from tests.support.github_api.server import Reply, Request
from tests.support.github_api.shapes import node_id

DOCS = "https://docs.github.com/rest"
LIMIT = 5000
# what GitHub sends on an authenticated GET; a private http cache may answer repeats for 60 s without asking
CACHE_CONTROL = "private, max-age=60, s-maxage=60"

Route = tuple[str, re.Pattern[str], Callable[..., Reply]]


def _error(status: int, message: str, **extra: Any) -> Reply:
    return Reply(status, {"message": message, **extra, "documentation_url": DOCS})


class Api:
    """Answers one request the way api.github.com does."""

    def __init__(self, forge: Forge, token: str, base_url: Callable[[], str], login: str = "taskgate-bot") -> None:
        self.forge = forge
        self.token = token
        self.login = login  # the token's user
        self.issues = Issues(forge, self._page, lambda: self.login)
        self.cache_control = CACHE_CONTROL
        self.calls: list[tuple[str, str, int]] = []
        self._base_url = base_url
        self._lock = threading.Lock()  # guards calls, failures and the rate-limit counter
        self._failures: list[list[Any]] = []  # [remaining, status, path prefix]
        self._used = 0
        self._reset = int(time.time()) + 3600
        repo = re.escape(f"/repos/{forge.site.full_name}")
        self._routes: list[Route] = [
            ("GET", re.compile(repo), self.get_repo),
            ("GET", re.compile(rf"{repo}/pulls"), self.list_pulls),
            ("POST", re.compile(rf"{repo}/pulls"), self.create_pull),
            ("GET", re.compile(rf"{repo}/pulls/(\d+)"), self.get_pull),
            ("PATCH", re.compile(rf"{repo}/pulls/(\d+)"), self.update_pull),
            ("PUT", re.compile(rf"{repo}/pulls/(\d+)/merge"), self.merge_pull),
            ("GET", re.compile(rf"{repo}/pulls/(\d+)/reviews"), self.list_reviews),
            ("GET", re.compile(rf"{repo}/pulls/(\d+)/comments"), self.list_comments),
            ("GET", re.compile(rf"{repo}/commits/(.+)/check-runs"), self.list_checks),
            ("GET", re.compile(rf"{repo}/check-runs/(\d+)"), self.get_check),
            ("GET", re.compile(rf"{repo}/actions/jobs/(\d+)/logs"), self.job_logs),
            ("POST", re.compile(r"/graphql"), self.graphql),
        ]
        self._routes += [(method, re.compile(path), handler) for method, path, handler in self.issues.routes(repo)]

    # -- plumbing ----------------------------------------------------------------------------------------

    def handle(self, req: Request) -> Reply:
        """Answer and record one request (a bug in the stand-in is a 500 with its traceback on stderr)."""
        try:
            reply = self._answer(req)
        except Exception:
            traceback.print_exc()
            reply = _error(500, "Server Error")
        for name, value in self._rate_headers().items():
            reply.headers.setdefault(name, value)  # a rate-limited answer keeps its own (remaining: 0)
        reply.headers.setdefault("X-GitHub-Request-Id", f"{time.monotonic_ns():X}")
        reply.headers["X-GitHub-Api-Version-Selected"] = req.headers.get("x-github-api-version", "2022-11-28")
        with self._lock:
            self.calls.append((req.method, req.path, reply.status))
        return reply

    def fail_next(self, count: int, status: int, path_prefix: str) -> None:
        """The next `count` requests under `path_prefix` answer `status`."""
        with self._lock:
            self._failures.append([count, status, path_prefix])

    def _answer(self, req: Request) -> Reply:
        if req.path.startswith("/_logs/"):
            return self._log_file(req.path)  # a pre-signed download URL: no token, like GitHub's blob storage
        if not self._authorized(req):
            return _error(401, "Bad credentials")
        injected = self._injected(req.path)
        if injected is not None:
            return injected
        if req.path == "/rate_limit":
            return Reply(200, self._rate_limit_body())  # free, as on GitHub
        if self._used >= LIMIT:
            return self._rate_limited(403)
        try:
            with self.forge.lock:
                self.forge.refresh_heads()
                reply = self._route(req)
        except Refused as refused:
            reply = Reply(refused.status, refused.body)
        return self._conditional(req, reply)

    def _authorized(self, req: Request) -> bool:
        scheme, _, credential = req.headers.get("authorization", "").partition(" ")
        return scheme.lower() in ("bearer", "token") and credential.strip() == self.token

    def _injected(self, path: str) -> Reply | None:
        with self._lock:
            for failure in self._failures:
                if failure[0] > 0 and path.startswith(failure[2]):
                    failure[0] -= 1
                    status = failure[1]
                    break
            else:
                return None
        return self._rate_limited(status) if status in (403, 429) else Reply(status, {"message": "Server Error"})

    def _rate_limited(self, status: int) -> Reply:
        reply = _error(
            status,
            "API rate limit exceeded for user ID 1000001. If you reach out to GitHub Support for help, please include"
            " the request ID.",
            documentation_url="https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
        )
        reply.headers = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time()) + 1)}
        if status == 429:
            reply.headers["retry-after"] = "1"
        return reply

    def _rate_headers(self) -> dict[str, str]:
        with self._lock:
            used = self._used
        return {
            "x-ratelimit-limit": str(LIMIT),
            "x-ratelimit-remaining": str(max(0, LIMIT - used)),
            "x-ratelimit-reset": str(self._reset),
            "x-ratelimit-used": str(used),
            "x-ratelimit-resource": "core",
        }

    def _rate_limit_body(self) -> dict[str, Any]:
        core = {"limit": LIMIT, "used": self._used, "remaining": max(0, LIMIT - self._used), "reset": self._reset}
        search = {"limit": 30, "used": 0, "remaining": 30, "reset": int(time.time()) + 60}
        graphql = {"limit": LIMIT, "used": 0, "remaining": LIMIT, "reset": self._reset}
        return {"resources": {"core": core, "search": search, "graphql": graphql}, "rate": core}

    def _route(self, req: Request) -> Reply:
        for method, pattern, handler in self._routes:
            match = pattern.fullmatch(req.path)
            if match and method == req.method:
                return handler(req, *match.groups())
        return _error(404, "Not Found")  # GitHub answers 404 for unknown paths, methods and other repositories

    def _conditional(self, req: Request, reply: Reply) -> Reply:
        # ETag on every JSON GET; a matching If-None-Match is a 304 that costs no rate limit, as on GitHub
        if req.method == "GET" and reply.status == 200 and isinstance(reply.body, (dict, list)):
            etag = f'W/"{hashlib.sha256(reply.encoded()).hexdigest()[:40]}"'
            reply.headers.update({"ETag": etag, "Cache-Control": self.cache_control, "Vary": "Accept, Authorization"})
            wanted = [t.strip().removeprefix("W/") for t in req.headers.get("if-none-match", "").split(",")]
            if etag.removeprefix("W/") in wanted:
                return Reply(304, None, reply.headers)
        with self._lock:
            self._used += 1
        return reply

    def _json(self, req: Request) -> dict[str, Any]:
        try:
            data = json.loads(req.body or b"{}")
        except ValueError:
            raise Refused(400, "Problems parsing JSON") from None
        if not isinstance(data, dict):
            raise Refused(400, "Problems parsing JSON")
        return data

    def _page(self, req: Request, items: list[Any]) -> tuple[list[Any], dict[str, str]]:
        """One page of `items` and GitHub's Link header (first/prev/next/last)."""
        per_page = min(max(int(req.query.get("per_page", 30)), 1), 100)
        page = max(int(req.query.get("page", 1)), 1)
        last = max(1, math.ceil(len(items) / per_page))
        rels = {"prev": page - 1, "next": page + 1, "last": last, "first": 1}
        keep = {"prev", "first"} if page > 1 else set()
        keep |= {"next", "last"} if page < last else set()
        order = [rel for rel in ("prev", "next", "last", "first") if rel in keep]
        links = [f'<{self._page_url(req, rels[rel])}>; rel="{rel}"' for rel in order]
        return items[(page - 1) * per_page : page * per_page], ({"Link": ", ".join(links)} if links else {})

    def _page_url(self, req: Request, page: int) -> str:
        return f"{self._base_url()}{req.path}?{urlencode({**req.query, 'page': page})}"

    def _log_file(self, path: str) -> Reply:
        match = re.fullmatch(r"/_logs/(\d+)\.txt", path)
        check = self.forge.checks.get(int(match.group(1))) if match else None
        if check is None:
            return Reply(404, "Not Found", content_type="text/plain")
        return Reply(200, check.log, content_type="text/plain; charset=utf-8")

    # -- endpoints ---------------------------------------------------------------------------------------

    def get_repo(self, req: Request) -> Reply:
        """GET /repos/{owner}/{repo}."""
        return Reply(200, self.forge.repository())

    def list_pulls(self, req: Request) -> Reply:
        """GET /repos/{owner}/{repo}/pulls (newest first, as GitHub sorts by default)."""
        state = req.query.get("state", "open")
        head = req.query.get("head", "")
        base = req.query.get("base")
        pulls = [
            p
            for p in sorted(self.forge.pulls.values(), key=lambda p: -p.number)
            if state in ("all", p.state)
            and head in ("", f"{self.forge.site.owner}:{p.head_ref}")
            and base in (None, p.base_ref)
        ]
        page, headers = self._page(req, pulls)
        repo = self.forge.repository()
        return Reply(200, [self.forge.pull_simple_json(p, repo) for p in page], headers)

    def create_pull(self, req: Request) -> Reply:
        """POST /repos/{owner}/{repo}/pulls."""
        data = self._json(req)
        missing = [f for f in ("title", "head", "base") if not data.get(f)]
        if missing:
            raise invalid(*missing, code="missing_field")
        pull = self.forge.open_pull(
            data["title"], data["head"], data["base"], data.get("body"), bool(data.get("draft")), self._login()
        )
        body = self.forge.pull_json(pull)
        return Reply(201, body, {"Location": body["url"]})

    def get_pull(self, req: Request, number: str) -> Reply:
        """GET /repos/{owner}/{repo}/pulls/{number}."""
        return Reply(200, self.forge.pull_json(self.forge.pull(int(number))))

    def update_pull(self, req: Request, number: str) -> Reply:
        """PATCH /repos/{owner}/{repo}/pulls/{number}: title, body, state, base."""
        data, pull = self._json(req), self.forge.pull(int(number))
        if data.get("state") not in (None, "open", "closed"):
            raise invalid("state")
        if data.get("base") and self.forge.repo.head(data["base"]) is None:
            raise invalid("base")
        for name in ("title", "body"):
            if name in data:
                setattr(pull, name, data[name])
        pull.base_ref = data.get("base") or pull.base_ref
        if data.get("state") == "closed":
            self.forge.close(pull, self._login())
        elif data.get("state") == "open" and pull.state == "closed":
            self.forge.reopen(pull, self._login())
        return Reply(200, self.forge.pull_json(pull))

    def merge_pull(self, req: Request, number: str) -> Reply:
        """PUT /repos/{owner}/{repo}/pulls/{number}/merge: really merges in the bare repo."""
        data, pull = self._json(req), self.forge.pull(int(number))
        sha = self.forge.merge(
            pull,
            data.get("merge_method") or "merge",
            self._login(),
            data.get("sha"),
            commit_title=data.get("commit_title"),
            commit_message=data.get("commit_message"),
        )
        return Reply(200, {"sha": sha, "merged": True, "message": "Pull Request successfully merged"})

    def list_reviews(self, req: Request, number: str) -> Reply:
        """GET /repos/{owner}/{repo}/pulls/{number}/reviews (oldest first)."""
        pull = self.forge.pull(int(number))
        page, headers = self._page(req, [r for r in self.forge.reviews if r.number == pull.number])
        return Reply(200, [self.forge.review_json(r) for r in page], headers)

    def list_comments(self, req: Request, number: str) -> Reply:
        """GET /repos/{owner}/{repo}/pulls/{number}/comments (oldest first)."""
        pull = self.forge.pull(int(number))
        page, headers = self._page(req, [c for c in self.forge.comments if c.number == pull.number])
        return Reply(200, [self.forge.comment_json(c) for c in page], headers)

    def list_checks(self, req: Request, ref: str) -> Reply:
        """GET /repos/{owner}/{repo}/commits/{ref}/check-runs (ref: a sha or a branch)."""
        sha = self.forge.repo.resolve(ref)
        if sha is None:
            raise Refused(422, f"No commit found for SHA: {ref}")
        checks = [c for c in self.forge.checks.values() if c.sha == sha]
        page, headers = self._page(req, checks)
        runs = [self.forge.check_json(c) for c in page]
        return Reply(200, {"total_count": len(checks), "check_runs": runs}, headers)

    def get_check(self, req: Request, check_id: str) -> Reply:
        """GET /repos/{owner}/{repo}/check-runs/{id}."""
        check = self.forge.checks.get(int(check_id))
        if check is None:
            raise Refused(404, "Not Found")
        return Reply(200, self.forge.check_json(check))

    def job_logs(self, req: Request, job_id: str) -> Reply:
        """GET /repos/{owner}/{repo}/actions/jobs/{id}/logs: a 302 to the log file, as GitHub Actions does."""
        if int(job_id) not in self.forge.checks:
            raise Refused(404, "Not Found")
        return Reply(302, None, {"Location": f"{self._base_url()}/_logs/{job_id}.txt"})

    def graphql(self, req: Request) -> Reply:
        """POST /graphql: the one mutation taskgate uses, markPullRequestReadyForReview (REST cannot un-draft)."""
        data = self._json(req)
        query, variables = str(data.get("query", "")), data.get("variables") or {}
        if "markPullRequestReadyForReview" not in query:
            return Reply(200, {"errors": [{"message": "the stand-in answers markPullRequestReadyForReview only"}]})
        node = str(variables.get("id", ""))
        pull = next((p for p in self.forge.pulls.values() if node_id("PR", p.id) == node), None)
        if pull is None:
            message = f"Could not resolve to a node with the global id of '{node}'"
            return Reply(200, {"data": None, "errors": [{"type": "NOT_FOUND", "message": message}]})
        pull.draft = False
        ready = {"pullRequest": {"id": node, "isDraft": False, "number": pull.number}}
        return Reply(200, {"data": {"markPullRequestReadyForReview": ready}})

    def _login(self) -> str:
        # the token belongs to one account (GitHubStandIn's `login`)
        return self.login
