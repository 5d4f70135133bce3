"""What the stand-in remembers about the forge: pull requests, check runs, reviews and review comments."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass
class PullRecord:
    """One pull request. The head sha is read live from the bare repo while it is open."""

    number: int
    id: int
    title: str
    body: str | None
    head_ref: str
    base_ref: str
    draft: bool
    user: str
    created_at: datetime
    updated_at: datetime
    seen_head: str  # the head sha last seen: a change on a read is a `synchronize`
    state: str = "open"
    closed_at: datetime | None = None
    merged_at: datetime | None = None
    merged_by: str | None = None
    merge_commit_sha: str | None = None
    closed_head: str | None = None  # the head sha frozen when the pull request closed
    closed_base: str | None = None


@dataclass
class CheckRecord:
    """One check run (its id doubles as the GitHub Actions job id, for logs)."""

    id: int
    sha: str
    name: str
    status: str
    conclusion: str | None
    log: str
    app: str
    suite_id: int
    started_at: datetime
    completed_at: datetime | None


@dataclass
class ReviewRecord:
    """One submitted review."""

    id: int
    number: int
    user: str
    state: str
    body: str
    commit_id: str
    submitted_at: datetime


@dataclass
class CommentRecord:
    """One review comment on a line of a file at a commit."""

    id: int
    number: int
    review_id: int | None
    user: str
    path: str
    line: int
    body: str
    commit_id: str
    diff_hunk: str
    created_at: datetime
    side: str = "RIGHT"
