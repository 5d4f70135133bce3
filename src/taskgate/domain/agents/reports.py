"""What an agent CLI says about its own run (pure): its final message, turns, tokens, cost, and whether it failed.

Claude Code (`-p --output-format stream-json --verbose`) and Codex (`exec --json`) print one JSON event a line.
`parse_report` reads the end of such a log (taskgate keeps the last 512 KB) into an `AgentReport`; the log is the
agent's, so anything goes: lines that are not JSON objects (stderr, a line cut at the start of the window) are
skipped, fields of the wrong type count as absent, and it never raises.

- "claude-stream-json": the last `{"type":"result",…}` line holds it all (`result`, `num_turns`, `total_cost_usd`,
  `usage`, `is_error`, `subtype`). A run cut off before it (killed at its timeout) has none: its turns are the
  assistant messages seen (one per message id), its tokens their usage, its final message the last assistant text.
- "codex-json": the last `agent_message` item is the final message; `turn.completed` events are the turns, their
  usage summed (`cached_input_tokens` is the cache read); `turn.failed` and `error` events after the last completed
  turn make it an error, with their message.
- "aider": aider's plain output; its usage lines (`Tokens: … sent, … received. Cost: …`) are the turns, tokens and
  cost (`domain/agents/aider.py`).
- "text" (or any other format): None, and None when the log holds no event of the format at all.

The supervisor stores a report for every agent that said something (`transcripts.final_message`): for a plain-text
agent only its `final_message`, its counts zero (`measured()` is False: it reported no usage).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from taskgate.domain.agents.aider import aider_usage

MAX_FINAL_MESSAGE = 100_000  # characters kept of the final message (a plan, a review: whole; the log keeps all)
MAX_ERROR = 2_000


@dataclass(frozen=True, slots=True)
class AgentReport:
    final_message: str = ""
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cost_usd: float | None = None  # None: the CLI does not say (Codex)
    is_error: bool = False
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> AgentReport | None:
        """The report stored with an agent (its `as_dict()`), or None when `data` is not one."""
        if not isinstance(data, dict):
            return None
        return cls(
            final_message=_text(data.get("final_message")), turns=_count(data.get("turns")),
            input_tokens=_count(data.get("input_tokens")), output_tokens=_count(data.get("output_tokens")),
            cache_read_tokens=_count(data.get("cache_read_tokens")), cost_usd=_cost(data.get("cost_usd")),
            is_error=data.get("is_error") is True, error=_text(data.get("error")) or None,
        )  # fmt: skip

    def measured(self) -> bool:
        """Whether the CLI reported any usage (turns, tokens or a cost); a plain-text agent's report has none."""
        return bool(self.turns or self.input_tokens or self.output_tokens or self.cost_usd is not None)

    def usage(self) -> str:
        """`4 turns, 400 in / 80 out tokens, $0.0032` (the cost only when the CLI reported one); "" when the CLI
        reported no usage."""
        if not self.measured():
            return ""
        turns = f"{self.turns} turn{'' if self.turns == 1 else 's'}"
        tokens = f"{self.input_tokens} in / {self.output_tokens} out tokens"
        if self.cache_read_tokens:
            tokens += f" ({self.cache_read_tokens} cached)"
        cost = f", ${self.cost_usd:.4f}" if self.cost_usd is not None else ""
        return f"{turns}, {tokens}{cost}"

    def headline(self, width: int = 100) -> str:
        """The first non-blank line of the final message (or of the error), cut to `width`."""
        source = self.final_message or self.error or ""
        line = next((part.strip() for part in source.splitlines() if part.strip()), "")
        return line if len(line) <= width else line[: width - 1] + "…"


def parse_report(output_format: str, text: str) -> AgentReport | None:
    """The report in an agent's log written in `output_format`; None for "text" or when it holds none."""
    try:
        if output_format == "claude-stream-json":
            return _claude(_events(text))
        if output_format == "codex-json":
            return _codex(_events(text))
        if output_format == "aider":
            usage = aider_usage(text)
            return AgentReport(**usage) if usage else None
    except Exception:  # a log is never worth a crash: report nothing instead
        return None
    return None


def conversation_of(output_format: str, text: str) -> str | None:
    """The id of the CLI's own conversation its log names (what `resume` continues), or None: Claude Code's
    `session_id` (on its `system`/`init` event, each message and its `result`; the last one seen), Codex's
    `thread_id` (its `thread.started` event). Never raises."""
    key = {"claude-stream-json": "session_id", "codex-json": "thread_id"}.get(output_format)
    if key is None:
        return None
    try:
        found = [e.get(key) for e in _events(text) if key == "session_id" or e["type"] == "thread.started"]
    except Exception:
        return None
    ids = [value for value in found if isinstance(value, str) and _CONVERSATION_ID.fullmatch(value)]
    return ids[-1] if ids else None


_CONVERSATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")  # a UUID in practice; never an option or a path


# Output formats whose usage, in a run that continued a conversation, counts the whole conversation's (Codex 0.169's
# `turn.completed` after `exec resume`: its first run's tokens plus this run's), not the run's own
CUMULATIVE_WHEN_RESUMED = frozenset({"codex-json"})


def own_share(report: AgentReport, earlier: list[AgentReport]) -> AgentReport:
    """A resumed run's report with the tokens the conversation's earlier runs reported (each its own share) taken off:
    what this run spent (`CUMULATIVE_WHEN_RESUMED`). Never below 0."""

    def left(name: str) -> int:
        return max(0, getattr(report, name) - sum(getattr(e, name) for e in earlier))

    return replace(report, input_tokens=left("input_tokens"), output_tokens=left("output_tokens"),
                   cache_read_tokens=left("cache_read_tokens"))  # fmt: skip


def _events(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(event, dict) and isinstance(event.get("type"), str):
            events.append(event)
    return events


def _claude(events: list[dict[str, Any]]) -> AgentReport | None:
    result = next((e for e in reversed(events) if e["type"] == "result"), None)
    if result is not None:
        usage = _dict(result.get("usage"))
        failed = result.get("is_error") is True or _text(result.get("subtype")).startswith("error")
        final = _text(result.get("result"))
        error = None
        if failed:
            listed = result.get("errors")
            errors = [_text(e) for e in listed if _text(e)] if isinstance(listed, list) else []
            error = final or "; ".join(errors) or _text(result.get("subtype")) or "the CLI reported an error"
        turns, cost = _count(result.get("num_turns")), _cost(result.get("total_cost_usd"))
        tokens = [usage.get(name) for name in ("input_tokens", "output_tokens", "cache_read_input_tokens")]
        return _report(final, turns, *tokens, cost, failed, error)
    # no result line (the run was cut off): one turn per assistant message, the last text it wrote
    usages: dict[str, dict[str, Any]] = {}
    final, turns = "", 0
    for event in events:
        message = _dict(event.get("message"))
        if event["type"] != "assistant" or not message:
            continue
        key = message.get("id") if isinstance(message.get("id"), str) else f"#{len(usages)}"
        if key not in usages:
            turns += 1
        usages[key] = _dict(message.get("usage"))
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        texts = [_text(b.get("text")) for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
        if any(texts):
            final = "\n".join(t for t in texts if t)
    if not turns:
        return None
    tokens = [sum(_count(u.get(name)) for u in usages.values())
              for name in ("input_tokens", "output_tokens", "cache_read_input_tokens")]  # fmt: skip
    return _report(final, turns, *tokens, None, False, None)


def _codex(events: list[dict[str, Any]]) -> AgentReport | None:
    seen = False
    final, turns, error = "", 0, None
    tokens = {"input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0}
    for event in events:
        kind = event["type"]
        if kind == "item.completed":
            item = _dict(event.get("item"))
            if item.get("type") == "agent_message":
                final = _text(item.get("text"))
        elif kind == "turn.completed":
            turns += 1
            usage = _dict(event.get("usage"))
            for name in tokens:
                tokens[name] += _count(usage.get(name))
            error = None  # a later turn completed: what failed before it did not end the run
        elif kind == "turn.failed":
            turns += 1
            error = _text(_dict(event.get("error")).get("message")) or "the turn failed"
        elif kind == "error":
            error = _text(event.get("message")) or "the CLI reported an error"
        else:
            seen = seen or kind.startswith(("thread.", "turn.", "item."))
            continue
        seen = True
    if not seen:
        return None
    return _report(final, turns, tokens["input_tokens"], tokens["output_tokens"], tokens["cached_input_tokens"],
                   None, error is not None, error)  # fmt: skip


def _report(final: str, turns: int, inputs: Any, outputs: Any, cached: Any, cost: float | None, failed: bool,
            error: str | None) -> AgentReport:  # fmt: skip
    return AgentReport(
        final_message=final[:MAX_FINAL_MESSAGE], turns=turns, input_tokens=_count(inputs),
        output_tokens=_count(outputs), cache_read_tokens=_count(cached), cost_usd=cost, is_error=failed,
        error=error[:MAX_ERROR] if error else None,
    )  # fmt: skip


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _count(value: Any) -> int:
    """A non-negative count; anything else (text, bool, negative, NaN) is 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value > 0 else 0
    return value if isinstance(value, int) and value > 0 else 0


def _cost(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    cost = float(value) if not isinstance(value, int) or abs(value) < 10**15 else None
    return cost if cost is not None and math.isfinite(cost) and cost >= 0 else None
