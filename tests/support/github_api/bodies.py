"""JSON builders for pull requests, check runs, reviews and review comments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.support.github_api.git import DiffStat
from tests.support.github_api.records import CheckRecord, CommentRecord, PullRecord, ReviewRecord
from tests.support.github_api.shapes import Site, app, iso, link, node_id, user


@dataclass(frozen=True)
class PullView:
    """A pull request as read right now: its record plus what git says about it."""

    pull: PullRecord
    head_sha: str
    base_sha: str
    mergeable: bool | None
    mergeable_state: str
    stat: DiffStat
    comments: int
    review_comments: int


def _branch(site: Site, ref: str, sha: str, repo: dict[str, Any]) -> dict[str, Any]:
    return {"label": f"{site.owner}:{ref}", "ref": ref, "sha": sha, "user": repo["owner"], "repo": repo}


def pull_simple(site: Site, view: PullView, repo: dict[str, Any]) -> dict[str, Any]:
    """A pull request as the list endpoint gives it (PullRequestSimple)."""
    pull = view.pull
    api = f"{site.repo_api}/pulls/{pull.number}"
    html = f"{site.repo_html}/pull/{pull.number}"
    issue = f"{site.repo_api}/issues/{pull.number}"
    statuses = f"{site.repo_api}/statuses/{view.head_sha}"
    return {
        "url": api,
        "id": pull.id,
        "node_id": node_id("PR", pull.id),
        "html_url": html,
        "diff_url": f"{html}.diff",
        "patch_url": f"{html}.patch",
        "issue_url": issue,
        "commits_url": f"{api}/commits",
        "review_comments_url": f"{api}/comments",
        "review_comment_url": f"{site.repo_api}/pulls/comments{{/number}}",
        "comments_url": f"{issue}/comments",
        "statuses_url": statuses,
        "number": pull.number,
        "state": pull.state,
        "locked": False,
        "title": pull.title,
        "user": user(site, pull.user),
        "body": pull.body,
        "labels": [],
        "milestone": None,
        "active_lock_reason": None,
        "created_at": iso(pull.created_at),
        "updated_at": iso(pull.updated_at),
        "closed_at": iso(pull.closed_at),
        "merged_at": iso(pull.merged_at),
        "merge_commit_sha": pull.merge_commit_sha,
        "assignee": None,
        "assignees": [],
        "requested_reviewers": [],
        "requested_teams": [],
        "head": _branch(site, pull.head_ref, view.head_sha, repo),
        "base": _branch(site, pull.base_ref, view.base_sha, repo),
        "_links": {
            "self": link(api),
            "html": link(html),
            "issue": link(issue),
            "comments": link(f"{issue}/comments"),
            "review_comments": link(f"{api}/comments"),
            "review_comment": link(f"{site.repo_api}/pulls/comments{{/number}}"),
            "commits": link(f"{api}/commits"),
            "statuses": link(statuses),
        },
        "author_association": "MEMBER",
        "auto_merge": None,
        "draft": pull.draft,
    }


def pull_full(site: Site, view: PullView, repo: dict[str, Any]) -> dict[str, Any]:
    """A pull request as the single-pull endpoint and webhooks give it (PullRequest)."""
    pull = view.pull
    return {
        **pull_simple(site, view, repo),
        "merged": pull.merged_at is not None,
        "mergeable": view.mergeable,
        "rebaseable": view.mergeable,
        "mergeable_state": view.mergeable_state,
        "merged_by": user(site, pull.merged_by) if pull.merged_by else None,
        "comments": view.comments,
        "review_comments": view.review_comments,
        "maintainer_can_modify": False,
        "commits": view.stat.commits,
        "additions": view.stat.additions,
        "deletions": view.stat.deletions,
        "changed_files": view.stat.changed_files,
    }


def pull_minimal(site: Site, view: PullView) -> dict[str, Any]:
    """A pull request as check runs name it (PullRequestMinimal)."""
    pull = view.pull
    repo = {"id": site.repo_id, "url": site.repo_api, "name": site.name}
    return {
        "id": pull.id,
        "number": pull.number,
        "url": f"{site.repo_api}/pulls/{pull.number}",
        "head": {"ref": pull.head_ref, "sha": view.head_sha, "repo": repo},
        "base": {"ref": pull.base_ref, "sha": view.base_sha, "repo": repo},
    }


def check_run(site: Site, check: CheckRecord, pulls: list[dict[str, Any]]) -> dict[str, Any]:
    """A check run (CheckRun) on `check.sha`, naming the open pull requests whose head it is."""
    html = f"{site.repo_html}/actions/runs/{check.suite_id}/job/{check.id}"
    return {
        "id": check.id,
        "head_sha": check.sha,
        "node_id": node_id("CR", check.id),
        "external_id": f"ext-{check.id}",
        "url": f"{site.repo_api}/check-runs/{check.id}",
        "html_url": html,
        "details_url": html,
        "status": check.status,
        "conclusion": check.conclusion,
        "started_at": iso(check.started_at),
        "completed_at": iso(check.completed_at),
        "output": {
            "title": None if check.conclusion is None else f"{check.name}: {check.conclusion}",
            "summary": None,
            "text": None,
            "annotations_count": 0,
            "annotations_url": f"{site.repo_api}/check-runs/{check.id}/annotations",
        },
        "name": check.name,
        "check_suite": {"id": check.suite_id},
        "app": app(site, check.app),
        "pull_requests": pulls,
    }


def review(site: Site, rec: ReviewRecord) -> dict[str, Any]:
    """A pull request review (PullRequestReview)."""
    pull_api = f"{site.repo_api}/pulls/{rec.number}"
    html = f"{site.repo_html}/pull/{rec.number}#pullrequestreview-{rec.id}"
    return {
        "id": rec.id,
        "node_id": node_id("PRR", rec.id),
        "user": user(site, rec.user),
        "body": rec.body,
        "state": rec.state,
        "html_url": html,
        "pull_request_url": pull_api,
        "_links": {"html": link(html), "pull_request": link(pull_api)},
        "submitted_at": iso(rec.submitted_at),
        "commit_id": rec.commit_id,
        "author_association": "MEMBER",
    }


def review_comment(site: Site, rec: CommentRecord) -> dict[str, Any]:
    """A review comment on a line (PullRequestReviewComment)."""
    pull_api = f"{site.repo_api}/pulls/{rec.number}"
    api = f"{site.repo_api}/pulls/comments/{rec.id}"
    html = f"{site.repo_html}/pull/{rec.number}#discussion_r{rec.id}"
    # `position` counts lines below the hunk header; the stand-in's hunks start at the file's first change
    position = max(1, len(rec.diff_hunk.splitlines()) - 1)
    return {
        "url": api,
        "pull_request_review_id": rec.review_id,
        "id": rec.id,
        "node_id": node_id("PRRC", rec.id),
        "diff_hunk": rec.diff_hunk,
        "path": rec.path,
        "position": position,
        "original_position": position,
        "commit_id": rec.commit_id,
        "original_commit_id": rec.commit_id,
        "in_reply_to_id": None,
        "user": user(site, rec.user),
        "body": rec.body,
        "created_at": iso(rec.created_at),
        "updated_at": iso(rec.created_at),
        "html_url": html,
        "pull_request_url": pull_api,
        "author_association": "MEMBER",
        "_links": {"self": link(api), "html": link(html), "pull_request": link(pull_api)},
        "start_line": None,
        "original_start_line": None,
        "start_side": None,
        "line": rec.line,
        "original_line": rec.line,
        "side": rec.side,
        "subject_type": "line",
        "reactions": _no_reactions(api),
    }


def _no_reactions(url: str) -> dict[str, Any]:
    counts = dict.fromkeys(["+1", "-1", "laugh", "confused", "heart", "hooray", "eyes", "rocket"], 0)
    return {"url": f"{url}/reactions", "total_count": 0, **counts}
