"""Quota errors of the model API (pure): an agent that ended failing on a rate limit, a usage limit or a quota (HTTP
429) waits and is launched again, a bounded number of times, instead of failing its session.

Each preset names the lines that say so in its CLI's output (`quota_patterns`, next to its `stall_patterns`):

- Claude Code (stream-json): its `system`/`api_retry` events carry `"error_status": 429` or `"error":
  "rate_limit"`, and a run that gives up ends with a `result` whose text says `429`, "rate limit" or "usage limit";
- Codex (`exec --json`): `error` and `turn.failed` events whose message says 429, "rate limit", "usage limit" or
  "quota";
- aider: litellm's `RateLimitError` lines.

Only the end of a failed run's log is read (`QUOTA_TAIL_LINES`), so an agent writing about rate limits in its
work is not taken for one that hit them, and a run that ended well is never retried.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from taskgate.domain.entities import Agent, AgentStatus

QUOTA_TAIL_LINES = 40
QUOTA_EVENT = "agent.quota_wait"
QUOTA_RETRIED = "quota: retried "  # the error of an agent superseded by its relaunch (not a failure)


def superseded(agent: Agent) -> bool:
    """Whether the agent's run ended on a quota error and was launched again (its relaunch counts instead)."""
    return agent.status == AgentStatus.CANCELLED and (agent.error or "").startswith(QUOTA_RETRIED)


def quota_error(patterns: Sequence[str], log: str, *, tail: int = QUOTA_TAIL_LINES) -> str | None:
    """The last line of `log`'s end that matches one of `patterns`, or None. A line over 300 characters (a JSON event)
    is cut to the 300 around what matched."""
    if not patterns:
        return None
    compiled = [re.compile(p) for p in patterns]
    for line in reversed(log.splitlines()[-tail:]):
        line = line.strip()
        found = next((m for p in compiled if (m := p.search(line))), None)
        if found is not None:
            start = max(0, min(found.start() - 100, len(line) - 300))
            return line[start : start + 300]
    return None


def backoff_s(base_s: float, attempt: int, cap_s: float = 900.0) -> float:
    """How long to wait before the `attempt`-th relaunch (1-based): `base_s` doubled each time, at most `cap_s`."""
    return min(base_s * 2 ** (attempt - 1), cap_s)
