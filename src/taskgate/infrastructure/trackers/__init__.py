"""Adapters of the tracker port for external trackers (the built-in one lives in the application layer).

Only Beads is imported here: GitHub Issues (`github_issues`, githubkit) and Linear (`linear`, httpx) are imported by
their module path when a project uses them, so a command that needs neither does not pay for loading them.
"""

from taskgate.infrastructure.trackers.beads import BeadsTracker

__all__ = ["BeadsTracker"]
