"""aider's usage, read from its plain output (pure): the `output_format` "aider".

aider (0.86, `--no-pretty`) prints one usage line after each model reply:

    Tokens: 2.4k sent, 1.1k cache write, 300 cache hit, 25 received. Cost: $0.0012 message, $0.0034 session.

Counts under 1,000 are exact; larger ones are rounded (`2.4k`, `12k`), so are the sums. Each line is a turn; the
tokens are summed, the cache hits are the cache read, and the cost is the last line's session cost (aider leaves
the cost out for a model it has no price for: then None). A log with no such line reports nothing (None).
"""

from __future__ import annotations

import re
from typing import Any

_LINE = re.compile(r"^Tokens: (?P<tokens>[^\n]*?received)\.(?: Cost: (?P<cost>[^\n]*))?$", re.M)
_COUNT = re.compile(r"(?P<number>\d+(?:\.\d+)?)(?P<k>k?) (?P<what>sent|received|cache write|cache hit)")
_SESSION = re.compile(r"\$(?P<cost>\d+(?:\.\d+)?) session")


def aider_usage(text: str) -> dict[str, Any] | None:
    """The usage aider printed in `text` (the end of its log) as AgentReport fields (turns, input_tokens,
    output_tokens, cache_read_tokens, cost_usd), or None when it printed none."""
    totals = {"sent": 0, "received": 0, "cache hit": 0}
    turns, cost = 0, None
    for line in _LINE.finditer(text):
        turns += 1
        for count in _COUNT.finditer(line.group("tokens")):
            if count.group("what") in totals:
                totals[count.group("what")] += _tokens(count.group("number"), count.group("k"))
        session = _SESSION.search(line.group("cost") or "")
        cost = float(session.group("cost")) if session else cost
    if not turns:
        return None
    return {"turns": turns, "input_tokens": totals["sent"], "output_tokens": totals["received"],
            "cache_read_tokens": totals["cache hit"], "cost_usd": cost}  # fmt: skip


def _tokens(number: str, thousands: str) -> int:
    return round(float(number) * (1000 if thousands else 1))
