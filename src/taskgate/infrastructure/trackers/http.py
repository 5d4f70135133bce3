"""The trackers read over HTTP APIs, built from their `[tracker]` table: GitHub Issues and Linear.

The token is read from the variable `token_env` names when the provider is first needed; an unset variable is an
error that names it (never a value), raised to the command that needed the tracker.
"""

from __future__ import annotations

import os

from taskgate.application.trackers.ports import TrackerProvider
from taskgate.domain.errors import TrackerError
from taskgate.infrastructure.settings import ForgeSettings, TrackerSettings


def http_tracker(cfg: TrackerSettings, forge: ForgeSettings) -> TrackerProvider:
    """The GitHub Issues or Linear provider of `cfg`. Raises: TrackerError (token unset, repository unknown)."""
    if cfg.kind == "github":
        from taskgate.infrastructure.trackers.github_issues import GitHubIssuesTracker

        gh = cfg.github
        repository = gh.repository or forge.repository
        if repository is None:
            raise TrackerError('[tracker] kind = "github" needs [tracker.github] repository (owner/name)')
        return GitHubIssuesTracker(gh.api_url, repository, _token(gh.token_env, "tracker.github"), gh.token_env,
                                   label=gh.label, assignee=gh.assignee, priority_labels=gh.priority_labels,
                                   status_labels=gh.status_labels, write_back=gh.write_back,
                                   timeout_s=gh.timeout_s)  # fmt: skip
    if cfg.kind == "linear":
        from taskgate.infrastructure.trackers.linear import LinearTracker

        lin = cfg.linear
        return LinearTracker(lin.api_url, lin.team, _token(lin.token_env, "tracker.linear"), lin.token_env,
                             states=tuple(lin.states), label=lin.label, assignee=lin.assignee,
                             status_map=lin.status_map, write_back=lin.write_back, timeout_s=lin.timeout_s)  # fmt: skip
    raise TrackerError(f"[tracker] kind {cfg.kind!r} is not read over HTTP")


def _token(variable: str, table: str) -> str:
    token = os.environ.get(variable, "")
    if not token:
        raise TrackerError(f"{variable} is not set: [{table}] token_env names the variable holding the API token")
    return token
