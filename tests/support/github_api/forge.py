"""The forge's state and rules: pull requests over a real bare repo, checks, reviews, merges, webhook events."""

from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support.github_api import bodies
from tests.support.github_api.git import BareRepo
from tests.support.github_api.hooks import Deliverer
from tests.support.github_api.records import CheckRecord, CommentRecord, PullRecord, ReviewRecord
from tests.support.github_api.shapes import Site, repository, user

FAILED = {"failure", "timed_out", "cancelled", "action_required", "startup_failure"}


class Refused(Exception):
    """GitHub answers an error: `status` and `body` are what it sends."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"message": message, **extra, "documentation_url": "https://docs.github.com/rest"}


def now() -> datetime:
    """Now, to the second (GitHub's timestamps have no fractions)."""
    return datetime.now(UTC).replace(microsecond=0)


class Forge:
    """Everything the stand-in knows, behind one lock (git runs under it too, so merges are atomic)."""

    def __init__(self, bare: Path, site: Site, deliverer: Deliverer, hooks_on: Any) -> None:
        self.repo = BareRepo(bare)
        self.site = site
        self.lock = threading.RLock()
        self.pulls: dict[int, PullRecord] = {}
        self.checks: dict[int, CheckRecord] = {}
        self.reviews: list[ReviewRecord] = []
        self.comments: list[CommentRecord] = []
        self._ids = itertools.count(1_000_001)  # one sequence for every object, like GitHub's large ids
        self._numbers = itertools.count(1)
        self._suites: dict[str, int] = {}
        self._deliverer = deliverer
        self._hooks_on = hooks_on  # () -> bool: deliveries are configured
        self._branches: dict[str, str] = {}
        self.pushed_at = site.created  # when the stand-in last saw a branch move (keeps the repo's ETag stable)

    def next_number(self) -> int:
        """The next issue or pull request number (one sequence for both, as on GitHub)."""
        return next(self._numbers)

    def next_id(self) -> int:
        """The next database id."""
        return next(self._ids)

    # -- reading -----------------------------------------------------------------------------------------

    def repository(self) -> dict[str, Any]:
        """The repository JSON."""
        return repository(self.site, self.pushed_at)

    def pull(self, number: int) -> PullRecord:
        """The pull request, or a 404."""
        pull = self.pulls.get(number)
        if pull is None:
            raise Refused(404, "Not Found")
        return pull

    def view(self, pull: PullRecord) -> bodies.PullView:
        """The pull request as git says it is right now."""
        if pull.state == "open":
            head = self.repo.head(pull.head_ref) or pull.seen_head
            base = self.repo.head(pull.base_ref) or ""
        else:
            head, base = pull.closed_head or pull.seen_head, pull.closed_base or ""
        mergeable = None if pull.state != "open" else self.repo.merge_tree(base, head) is not None
        return bodies.PullView(
            pull=pull,
            head_sha=head,
            base_sha=base,
            mergeable=mergeable,
            mergeable_state=self._mergeable_state(pull, head, mergeable),
            stat=self.repo.diff_stat(base, head),
            comments=0,
            review_comments=sum(1 for c in self.comments if c.number == pull.number),
        )

    def _mergeable_state(self, pull: PullRecord, head: str, mergeable: bool | None) -> str:
        # GitHub's precedence: a conflict first, then drafts, requested changes, failing or pending checks
        if pull.state != "open":
            return "unknown"
        if not mergeable:
            return "dirty"
        if pull.draft:
            return "draft"
        latest: dict[str, str] = {}
        for rev in self.reviews:
            if rev.number == pull.number and rev.state != "COMMENTED":
                latest[rev.user] = rev.state
        if "CHANGES_REQUESTED" in latest.values():
            return "blocked"
        checks = [c for c in self.checks.values() if c.sha == head]
        if any(c.conclusion in FAILED or c.status != "completed" for c in checks):
            return "unstable"
        return "clean"

    def pull_json(self, pull: PullRecord) -> dict[str, Any]:
        """The full pull request JSON."""
        return bodies.pull_full(self.site, self.view(pull), self.repository())

    def pull_simple_json(self, pull: PullRecord, repo: dict[str, Any]) -> dict[str, Any]:
        """The pull request as lists give it."""
        return bodies.pull_simple(self.site, self.view(pull), repo)

    def review_json(self, rec: ReviewRecord) -> dict[str, Any]:
        """A review's JSON."""
        return bodies.review(self.site, rec)

    def comment_json(self, rec: CommentRecord) -> dict[str, Any]:
        """A review comment's JSON."""
        return bodies.review_comment(self.site, rec)

    def check_json(self, check: CheckRecord) -> dict[str, Any]:
        """A check run, naming the open pull requests whose head is its commit."""
        views = [self.view(p) for p in self.pulls.values() if p.state == "open"]
        minimal = [bodies.pull_minimal(self.site, v) for v in views if v.head_sha == check.sha]
        return bodies.check_run(self.site, check, minimal)

    def refresh_heads(self) -> None:
        """Notice pushes to open pull requests' heads (GitHub's `synchronize`), as GitHub does on a push."""
        branches = self.repo.branches()
        if branches != self._branches:
            self._branches, self.pushed_at = branches, now()
        for pull in self.pulls.values():
            current = branches.get(pull.head_ref)
            if pull.state == "open" and current and current != pull.seen_head:
                before, pull.seen_head, pull.updated_at = pull.seen_head, current, now()
                self.pull_event("synchronize", pull, pull.user, before=before, after=current)

    # -- writing -----------------------------------------------------------------------------------------

    def open_pull(self, title: str, head: str, base: str, body: str | None, draft: bool, login: str) -> PullRecord:
        """A new pull request, validated as GitHub does (422s)."""
        if ":" in head:
            owner, head = head.split(":", 1)
            if owner != self.site.owner:
                raise invalid("head")
        base_sha, head_sha = self.repo.head(base), self.repo.head(head)
        if base_sha is None:
            raise invalid("base")
        if head_sha is None:
            raise invalid("head")
        if any(p.state == "open" and p.head_ref == head and p.base_ref == base for p in self.pulls.values()):
            raise _custom(f"A pull request already exists for {self.site.owner}:{head}.")
        if self.repo.is_ancestor(head_sha, base_sha):
            raise _custom(f"No commits between {base} and {head}")
        moment = now()
        pull = PullRecord(
            number=next(self._numbers),
            id=next(self._ids),
            title=title,
            body=body,
            head_ref=head,
            base_ref=base,
            draft=draft,
            user=login,
            created_at=moment,
            updated_at=moment,
            seen_head=head_sha,
        )
        self.pulls[pull.number] = pull
        self.pull_event("opened", pull, login)
        return pull

    def merge(self, pull: PullRecord, method: str, login: str, sha: str | None = None, **message: str | None) -> str:
        """Really merge the head into the base branch; the new base sha. 405 / 409 as GitHub refuses."""
        if pull.state != "open":
            raise Refused(405, "Pull Request is not mergeable")
        view = self.view(pull)
        if sha and sha != view.head_sha:
            raise Refused(409, "Head branch was modified. Review and try the merge again.")
        tree = self.repo.merge_tree(view.base_sha, view.head_sha)
        if tree is None:
            raise Refused(405, "Pull Request is not mergeable")
        merged = self.repo.commit(tree, *self._merge_commit(pull, view, method, **message))
        self.repo.move_branch(pull.base_ref, merged, view.base_sha)
        moment = now()
        pull.state, pull.closed_at, pull.merged_at, pull.updated_at = "closed", moment, moment, moment
        pull.merged_by, pull.merge_commit_sha = login, merged
        pull.closed_head, pull.closed_base = view.head_sha, view.base_sha
        self.pull_event("closed", pull, login)
        return merged

    def _merge_commit(
        self,
        pull: PullRecord,
        view: bodies.PullView,
        method: str,
        commit_title: str | None = None,
        commit_message: str | None = None,
    ) -> tuple[list[str], str]:
        # merge: a two-parent commit titled as GitHub titles it. squash and rebase: one commit on the base
        # (the stand-in does a rebase as a squash: git 2.39's merge-tree cannot replay commits one by one)
        if method == "merge":
            title = commit_title or f"Merge pull request #{pull.number} from {self.site.owner}/{pull.head_ref}"
            return [view.base_sha, view.head_sha], f"{title}\n\n{commit_message or pull.title}"
        if method in ("squash", "rebase"):
            title = commit_title or f"{pull.title} (#{pull.number})"
            body = commit_message if commit_message is not None else self.repo.commit_message(view.head_sha)
            return [view.base_sha], f"{title}\n\n{body}"
        raise Refused(422, "Validation Failed", errors=[{"resource": "PullRequest", "field": "merge_method"}])

    def close(self, pull: PullRecord, login: str) -> None:
        """Close without merging (head and base shas frozen as they are now)."""
        if pull.state == "closed":
            return
        view = self.view(pull)
        pull.state, pull.closed_at, pull.updated_at = "closed", now(), now()
        pull.closed_head, pull.closed_base = view.head_sha, view.base_sha
        self.pull_event("closed", pull, login)

    def reopen(self, pull: PullRecord, login: str) -> None:
        """Reopen a closed, unmerged pull request."""
        if pull.merged_at is not None:
            raise _custom("Cannot reopen a merged pull request")
        pull.state, pull.closed_at, pull.updated_at = "open", None, now()
        pull.closed_head = pull.closed_base = None
        self.pull_event("reopened", pull, login)

    def set_check(self, sha: str, name: str, status: str, conclusion: str | None, log: str, app: str) -> int:
        """Create or update the check run `name` on `sha`; `created`/`completed` events as GitHub sends them."""
        resolved = self.repo.resolve(sha) or sha
        existing = next((c for c in self.checks.values() if c.sha == resolved and c.name == name), None)
        completed_at = now() if status == "completed" else None
        conclusion = conclusion if status == "completed" else None
        if existing is None:
            suite = self._suites.setdefault(resolved, next(self._ids))
            existing = CheckRecord(next(self._ids), resolved, name, status, conclusion, log, app, suite, now(), None)
            self.checks[existing.id] = existing
            self.check_event("created", existing)
        was_completed = existing.status == "completed" and existing.completed_at is not None
        existing.status, existing.conclusion, existing.log, existing.app = status, conclusion, log, app
        existing.completed_at = completed_at or existing.completed_at
        if status == "completed" and not was_completed:
            self.check_event("completed", existing)
        return existing.id

    def review(self, pull: PullRecord, state: str, body: str, comments: list[dict], login: str) -> int:
        """A submitted review, with its line comments on the current head."""
        if state not in ("APPROVED", "CHANGES_REQUESTED", "COMMENTED"):
            raise ValueError(f"review state {state!r}")
        view = self.view(pull)
        rec = ReviewRecord(next(self._ids), pull.number, login, state, body, view.head_sha, now())
        self.reviews.append(rec)
        self._hook("pull_request_review", "submitted", pull, login, review=self._hook_review(rec))
        for spec in comments:
            hunk = self.repo.diff_hunk(view.base_sha, view.head_sha, spec["path"])
            comment = CommentRecord(
                id=next(self._ids),
                number=pull.number,
                review_id=rec.id,
                user=login,
                path=spec["path"],
                line=spec["line"],
                body=spec["body"],
                commit_id=rec.commit_id,
                diff_hunk=hunk,
                created_at=now(),
                side=spec.get("side", "RIGHT"),
            )
            self.comments.append(comment)
            payload = bodies.review_comment(self.site, comment)
            self._hook("pull_request_review_comment", "created", pull, login, comment=payload)
        return rec.id

    # -- webhook events ----------------------------------------------------------------------------------

    def pull_event(self, action: str, pull: PullRecord, login: str, **extra: Any) -> None:
        """A `pull_request` delivery (the payload is built now, like GitHub's snapshot)."""
        self._hook("pull_request", action, pull, login, number=pull.number, **extra)

    def check_event(self, action: str, check: CheckRecord) -> None:
        """A `check_run` delivery, sent by the check's app."""
        if self._hooks_on():
            payload = {"action": action, "check_run": self.check_json(check), "repository": self.repository()}
            self._deliverer.enqueue("check_run", {**payload, "sender": user(self.site, f"{check.app}[bot]", "Bot")})

    def _hook_review(self, rec: ReviewRecord) -> dict[str, Any]:
        # webhooks spell review states in lower case ("approved"); the REST API in upper case
        return {**bodies.review(self.site, rec), "state": rec.state.lower()}

    def _hook(self, event: str, action: str, pull: PullRecord, login: str, **extra: Any) -> None:
        if self._hooks_on():
            self._deliverer.enqueue(event, {"action": action, **extra, **self._common(pull, login)})

    def _common(self, pull: PullRecord, login: str) -> dict[str, Any]:
        return {"pull_request": self.pull_json(pull), "repository": self.repository(), "sender": user(self.site, login)}


def invalid(*fields: str, code: str = "invalid") -> Refused:
    """GitHub's 422 for invalid (or missing) pull request fields."""
    errors = [{"resource": "PullRequest", "field": field, "code": code} for field in fields]
    return Refused(422, "Validation Failed", errors=errors)


def _custom(message: str) -> Refused:
    return Refused(422, "Validation Failed", errors=[{"resource": "PullRequest", "code": "custom", "message": message}])
