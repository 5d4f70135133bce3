"""Adapters of the tracker port for external trackers (the built-in one lives in the application layer)."""

from taskgate.infrastructure.trackers.beads import BeadsTracker
from taskgate.infrastructure.trackers.github_issues import GitHubIssuesTracker

__all__ = ["BeadsTracker", "GitHubIssuesTracker"]
