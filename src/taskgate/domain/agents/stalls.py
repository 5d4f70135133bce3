"""When an agent has stalled (pure): no progress for `stall_s`.

Progress is a line of output that is not a retry notice, a heartbeat (the agent touching its heartbeat file) or a
call of taskgate's MCP tools with its token. A CLI that only says it is retrying its connection is not working:
lines matching its type's `stall_patterns` (Codex's `Reconnecting... 2/5` / `waiting for network`, Claude Code's
`"subtype":"api_retry"` events, aider's `Retrying in 0.5 seconds...`) do not count, so a CLI pointed at an
endpoint it cannot reach is found stalled after `stall_s`, not killed at its `timeout_s` an hour later.

Times are seconds of one monotonic clock, given by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from taskgate.domain.errors import InvalidInput

_MAX_PARTIAL = 64 * 1024  # a line longer than this without its end counts as progress as it grows


def compile_patterns(patterns: Sequence[str], where: str) -> tuple[re.Pattern[str], ...]:
    """The patterns as regular expressions. Raises: InvalidInput naming the one that does not compile."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise InvalidInput(f"{where}: {pattern!r} is not a regular expression ({exc})") from None
    return tuple(compiled)


class ProgressWatch:
    """The last moment an agent made progress, fed with its output as it comes and its other signs of life."""

    def __init__(self, stall_s: float, patterns: Sequence[str], now: float) -> None:
        self.stall_s = stall_s
        self._patterns = compile_patterns(patterns, "stall_patterns")
        self.last_progress = now
        self.last_retry: str | None = None  # the last retry notice seen since the last progress
        self._partial = ""

    def output(self, text: str, now: float) -> None:
        """New output (any chunk: lines are put together across chunks); a complete line that is not blank and
        matches no stall pattern is progress."""
        lines = (self._partial + text).replace("\r", "\n").split("\n")
        self._partial = lines.pop()
        if len(self._partial) > _MAX_PARTIAL:
            lines.append(self._partial)
            self._partial = ""
        for line in lines:
            if not line.strip():
                continue
            if any(p.search(line) for p in self._patterns):
                self.last_retry = line.strip()[:300]
            else:
                self.progress(now)

    def progress(self, now: float) -> None:
        """A sign of progress (a heartbeat, a tool call, a line of output)."""
        self.last_progress = max(self.last_progress, now)
        self.last_retry = None

    def stalled(self, now: float) -> bool:
        """Whether `stall_s` passed without progress (never, with `stall_s` 0)."""
        return self.stall_s > 0 and now - self.last_progress >= self.stall_s

    def describe(self, now: float) -> str:
        """Why it is stalled, for the agent's record and the operator: `no progress for 300 s (only retry notices:
        'Reconnecting... 3/5')`."""
        said = f" (only retry notices, the last: {self.last_retry!r})" if self.last_retry else ""
        return f"stalled: no progress for {now - self.last_progress:.0f} s{said}"
