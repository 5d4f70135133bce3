"""JSON builders for GitHub's REST and webhook shapes (every field githubkit's models require, plausible values)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

HTML = "http://github.test"  # GitHub's web host, for html_url fields (never requested)


def iso(moment: datetime | None) -> str | None:
    """GitHub's timestamp format: UTC, seconds, a trailing Z."""
    return None if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stable_id(text: str) -> int:
    """A stable positive id for a name (users, apps), like GitHub's database ids."""
    return zlib.crc32(text.encode()) % 90_000_000 + 1_000_000


def node_id(kind: str, number: int) -> str:
    """A GraphQL global id in GitHub's new style (prefix_ + opaque)."""
    return f"{kind}_kwDO{number:08d}"


@dataclass(frozen=True)
class Site:
    """Where the stand-in lives: the API root and the repository it serves."""

    api: str
    owner: str
    name: str
    default_branch: str
    created: datetime

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"

    @property
    def repo_api(self) -> str:
        return f"{self.api}/repos/{self.full_name}"

    @property
    def repo_html(self) -> str:
        return f"{HTML}/{self.full_name}"

    @property
    def repo_id(self) -> int:
        return stable_id(self.full_name)


def user(site: Site, login: str, kind: str = "User") -> dict[str, Any]:
    """A SimpleUser."""
    url = f"{site.api}/users/{login}"
    uid = stable_id(login)
    return {
        "login": login,
        "id": uid,
        "node_id": node_id("U", uid),
        "avatar_url": f"https://avatars.githubusercontent.com/u/{uid}?v=4",
        "gravatar_id": "",
        "url": url,
        "html_url": f"{HTML}/{login}",
        "followers_url": f"{url}/followers",
        "following_url": f"{url}/following{{/other_user}}",
        "gists_url": f"{url}/gists{{/gist_id}}",
        "starred_url": f"{url}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{url}/subscriptions",
        "organizations_url": f"{url}/orgs",
        "repos_url": f"{url}/repos",
        "events_url": f"{url}/events{{/privacy}}",
        "received_events_url": f"{url}/received_events",
        "type": kind,
        "user_view_type": "public",
        "site_admin": False,
    }


def _repo_urls(site: Site) -> dict[str, str]:
    """The repository's hypermedia URLs (URI templates as GitHub writes them)."""
    api = site.repo_api
    templated = {
        "archive_url": "{archive_format}{/ref}",
        "assignees_url": "assignees{/user}",
        "blobs_url": "git/blobs{/sha}",
        "branches_url": "branches{/branch}",
        "collaborators_url": "collaborators{/collaborator}",
        "comments_url": "comments{/number}",
        "commits_url": "commits{/sha}",
        "compare_url": "compare/{base}...{head}",
        "contents_url": "contents/{+path}",
        "contributors_url": "contributors",
        "deployments_url": "deployments",
        "downloads_url": "downloads",
        "events_url": "events",
        "forks_url": "forks",
        "git_commits_url": "git/commits{/sha}",
        "git_refs_url": "git/refs{/sha}",
        "git_tags_url": "git/tags{/sha}",
        "hooks_url": "hooks",
        "issue_comment_url": "issues/comments{/number}",
        "issue_events_url": "issues/events{/number}",
        "issues_url": "issues{/number}",
        "keys_url": "keys{/key_id}",
        "labels_url": "labels{/name}",
        "languages_url": "languages",
        "merges_url": "merges",
        "milestones_url": "milestones{/number}",
        "notifications_url": "notifications{?since,all,participating}",
        "pulls_url": "pulls{/number}",
        "releases_url": "releases{/id}",
        "stargazers_url": "stargazers",
        "statuses_url": "statuses/{sha}",
        "subscribers_url": "subscribers",
        "subscription_url": "subscription",
        "tags_url": "tags",
        "teams_url": "teams",
        "trees_url": "git/trees{/sha}",
    }
    return {key: f"{api}/{path}" for key, path in templated.items()}


def repository(site: Site, pushed: datetime) -> dict[str, Any]:
    """A full repository (FullRepository; also a valid Repository and RepositoryWebhooks)."""
    return {
        "id": site.repo_id,
        "node_id": node_id("R", site.repo_id),
        "name": site.name,
        "full_name": site.full_name,
        "private": True,
        "owner": user(site, site.owner, "Organization"),
        "html_url": site.repo_html,
        "description": None,
        "fork": False,
        "url": site.repo_api,
        **_repo_urls(site),
        "git_url": f"git://github.test/{site.full_name}.git",
        "ssh_url": f"git@github.test:{site.full_name}.git",
        "clone_url": f"{site.repo_html}.git",
        "svn_url": site.repo_html,
        "mirror_url": None,
        "homepage": None,
        "language": "Python",
        "forks_count": 0,
        "forks": 0,
        "stargazers_count": 0,
        "watchers_count": 0,
        "watchers": 0,
        "size": 1,
        "default_branch": site.default_branch,
        "open_issues_count": 0,
        "open_issues": 0,
        "is_template": False,
        "topics": [],
        "has_issues": True,
        "has_projects": True,
        "has_wiki": False,
        "has_pages": False,
        "has_downloads": True,
        "has_discussions": False,
        "archived": False,
        "disabled": False,
        "visibility": "private",
        "pushed_at": iso(pushed),
        "created_at": iso(site.created),
        "updated_at": iso(pushed),
        "permissions": {"admin": False, "maintain": False, "push": True, "triage": True, "pull": True},
        "allow_rebase_merge": True,
        "allow_squash_merge": True,
        "allow_merge_commit": True,
        "allow_auto_merge": False,
        "delete_branch_on_merge": False,
        "allow_forking": False,
        "web_commit_signoff_required": False,
        "subscribers_count": 1,
        "network_count": 0,
        "license": None,
    }


def app(site: Site, slug: str) -> dict[str, Any]:
    """A GitHub App (Integration), the author of check runs."""
    aid = stable_id(f"app:{slug}")
    return {
        "id": aid,
        "slug": slug,
        "node_id": node_id("A", aid),
        "client_id": f"Iv1.{aid:016x}",
        "owner": user(site, "github", "Organization"),
        "name": slug.replace("-", " ").title(),
        "description": "",
        "external_url": f"{HTML}/features/actions",
        "html_url": f"{HTML}/apps/{slug}",
        "created_at": iso(site.created),
        "updated_at": iso(site.created),
        "permissions": {"checks": "write", "contents": "write", "metadata": "read", "pull_requests": "write"},
        "events": ["check_run", "check_suite", "pull_request", "push"],
    }


def link(href: str) -> dict[str, str]:
    """A HAL-style link object."""
    return {"href": href}
