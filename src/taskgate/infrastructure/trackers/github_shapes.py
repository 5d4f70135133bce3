"""GitHub issue JSON (githubkit's `Issue` model) read as taskgate's TrackerIssue: ids, labels, priority, holds."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from taskgate.application.trackers.ports import TrackerIssue

DEFAULT_PRIORITY = 2
_ID_RE = re.compile(r"gh-([1-9][0-9]{0,9})")


def issue_id(number: int) -> str:
    """Issue #12 is `gh-12`."""
    return f"gh-{number}"


def number_of(issue_id_: str) -> int | None:
    """`gh-12` → 12; anything else → None."""
    match = _ID_RE.fullmatch(issue_id_.strip()) if isinstance(issue_id_, str) else None
    return int(match.group(1)) if match else None


def label_names(issue: Any) -> tuple[str, ...]:
    """The issue's label names (GitHub gives label objects, or plain strings in some payloads)."""
    names = (label if isinstance(label, str) else getattr(label, "name", None) for label in issue.labels or ())
    return tuple(name for name in names if isinstance(name, str) and name)


def logins(issue: Any) -> tuple[str, ...]:
    """The issue's assignees' logins."""
    return tuple(str(user.login) for user in (issue.assignees or ()) if user is not None)


def priority(labels: Sequence[str], priority_labels: Mapping[str, int]) -> int:
    """The smallest priority among the issue's priority labels; 2 without any."""
    found = [priority_labels[name] for name in labels if name in priority_labels]
    return min(found) if found else DEFAULT_PRIORITY


def open_blockers(issue: Any) -> int | None:
    """Open issues blocking this one, from `issue_dependencies_summary.blocked_by`; None when GitHub did not say."""
    summary = getattr(issue, "issue_dependencies_summary", None)
    count = getattr(summary, "blocked_by", None)
    return count if isinstance(count, int) else None


def open_sub_issues(issue: Any) -> int:
    """Sub-issues not completed yet, from `sub_issues_summary` (0 when GitHub did not say)."""
    summary = getattr(issue, "sub_issues_summary", None)
    total, completed = getattr(summary, "total", None), getattr(summary, "completed", None)
    return max(0, total - completed) if isinstance(total, int) and isinstance(completed, int) else 0


def hold(blockers_open: Sequence[str], sub_issues_open: int, others: Sequence[str]) -> str | None:
    """Why the ready rule keeps the issue out of ready ("; " between reasons), or None."""
    reasons = []
    if blockers_open:
        reasons.append("blocked by " + ", ".join(f"{b} (open)" for b in blockers_open))
    if sub_issues_open:
        reasons.append(f"has {sub_issues_open} open sub-issue{'s' if sub_issues_open != 1 else ''}")
    if others:
        reasons.append("assigned to " + ", ".join(others))
    return "; ".join(reasons) or None


def tracker_issue(
    issue: Any, priority_labels: Mapping[str, int], *, dependencies: tuple[tuple[str, str], ...] = (),
    hold_: str | None = None,
) -> TrackerIssue:  # fmt: skip
    """The TrackerIssue of a githubkit `Issue`."""
    labels = label_names(issue)
    closed = str(issue.state) == "closed"
    return TrackerIssue(
        id=issue_id(int(issue.number)),
        title=str(issue.title),
        description=issue.body if isinstance(issue.body, str) else "",
        status="closed" if closed else "open",
        priority=priority(labels, priority_labels),
        labels=labels,
        dependencies=dependencies,
        assignees=logins(issue),
        url=str(issue.html_url),
        hold=hold_,
        closed=closed,
    )
