"""The forge's ports: its API (pull requests, checks, reviews, merge), pushes to its remote, and what taskgate keeps
of each pull request (one row per session) and of each webhook delivery."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from taskgate.domain.entities import Project
from taskgate.domain.forge import CheckRun, Limits, Observation, PullRequest


class ForgeApi(Protocol):
    """One repository on a forge (GitHub first; shaped so GitLab's merge requests fit). Every method raises
    ForgeError naming what the forge said (rate limits and server errors are retried with back-off first)."""

    repository: str  # owner/name
    calls: int  # API requests made (conditional ones answered 304 included): the figures count them

    async def check(self) -> str:
        """The repository's default branch, proving the URL and the token. Raises: ForgeError naming which is wrong."""

    async def find_pull(self, branch: str) -> PullRequest | None:
        """The newest pull request from `branch` (open first), or None: a crash after `open_pull` finds it here."""

    async def open_pull(self, branch: str, base: str, title: str, body: str, *, draft: bool = False) -> PullRequest:
        """Open a pull request of `branch` into `base` (a draft: CI runs, reviewers know it is not asked yet)."""

    async def mark_ready(self, number: int) -> None:
        """Mark a draft pull request ready for review (nothing when it is not a draft)."""

    async def update_pull(self, number: int, *, body: str | None = None, reopen: bool = False) -> PullRequest:
        """Change its description, or reopen it (a closed one the operator approved again)."""

    async def observe(self, number: int) -> Observation:
        """The pull request, the checks on its head, its reviews and line comments (conditional requests: an
        unchanged resource costs a 304)."""

    async def log_tail(self, check: CheckRun, lines: int) -> str:
        """The end of a check's log ("" when the forge keeps none for it)."""

    async def merge(self, number: int, head: str, method: str, title: str) -> str:
        """Merge the pull request if its head is still `head` (compare-and-swap); the merge commit.
        Raises: ForgeHeadMoved (409), ForgeError (not mergeable, 405)."""


@dataclass(frozen=True, slots=True)
class PushResult:
    sha: str  # the commit the remote branch now points at
    created: bool  # the branch did not exist on the remote before
    already: bool  # nothing to push: the remote had exactly this commit (a push a crash cut off after it landed)


class BranchPushes(Protocol):
    """Pushes to the project's forge remote, with the token through a credential helper scoped to that remote."""

    async def push(self, repo_root: str, branch: str, expected: str | None) -> PushResult:
        """Push only `branch`, with a lease on `expected` (None: it must not exist there). Raises: ForgeError."""

    async def fetch(self, repo_root: str, branch: str) -> str:
        """Fetch the remote's `branch` (the base, for a rebase round); its commit."""

    async def delete(self, repo_root: str, branch: str, expected: str) -> bool:
        """Delete the remote branch if it still points at `expected`; False when it moved or is gone."""


@dataclass(frozen=True, slots=True)
class ForgeLink:
    """A project's forge: its API, its pushes and `[forge]`'s options."""

    kind: str
    api: ForgeApi
    pushes: BranchPushes
    limits: Limits
    merge_method: str = "merge"
    log_tail_lines: int = 80
    poll_s: float = 30.0
    delete_branch: bool = True
    console_url: str | None = None
    webhook_secret: str | None = None
    draft: bool = False  # open a draft pull request when the agents' work first reaches verifying


class ForgeDirectory(Protocol):
    """Which forge a project has (`[forge]`, or `[projects.<name>.forge]`)."""

    def for_project(self, project: Project) -> ForgeLink | None:
        """The project's forge, or None: no `[forge]`, the local merge as before."""

    def webhook_secrets(self) -> list[str]:
        """Every configured webhook secret (a delivery is accepted when one of them signed it)."""


@dataclass(slots=True)
class PullRequestRecord:
    """What taskgate keeps of a session's pull request: what it pushed, the forge's last look, what happened."""

    session_id: str
    project_id: int
    branch: str
    base: str
    number: int | None = None
    url: str | None = None
    pushed: str | None = None  # the head taskgate pushed last
    pushed_at: datetime | None = None
    status: str = "pushing"  # domain.forge.PrStatus
    observation: dict[str, Any] | None = None  # the last look (domain.forge.Observation as data); cleared by a push
    observed_at: datetime | None = None
    note: str = ""  # the last thing that happened, for people
    error: str | None = None  # the last push or API error, retried
    poke: bool = False  # a webhook asked for a look before the next poll
    updated_at: datetime | None = None


class PullRequestRepository(Protocol):
    async def get(self, session_id: str) -> PullRequestRecord | None: ...

    async def save(self, record: PullRequestRecord) -> None:
        """Insert or replace the session's row."""

    async def following(self) -> list[PullRequestRecord]:
        """The rows of sessions that are not terminal (the ones the forge loop looks at)."""

    async def store_observation(
        self, session_id: str, pushed_at: datetime | None, observation: dict[str, Any], status: str, at: datetime
    ) -> bool:
        """Store a look begun `at` on the row if taskgate last published at `pushed_at` still (a publish meanwhile
        drops it). False when it was dropped."""

    async def unpoke(self, session_id: str) -> None:
        """Clear the row's poke: done *before* a look, so a webhook arriving during the look pokes it again."""

    async def note(self, session_id: str, note: str, at: datetime) -> None:
        """Set what happened last (shown to people)."""

    async def poke(self, branch: str | None, number: int | None) -> int:
        """Mark the rows of `branch` or PR `number` for a look now; how many."""

    async def record_delivery(self, delivery: str, event: str, outcome: str, at: datetime) -> bool:
        """Record a webhook delivery; False when its id was recorded before (a replay)."""

    async def delivery_counts(self) -> dict[str, int]:
        """Deliveries by outcome (accepted, refused, ignored)."""
