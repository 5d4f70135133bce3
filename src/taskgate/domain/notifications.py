"""What the operator is told, and how (docs/notifications.md): which events of the log are worth a notice, the
notice's one line and the console page that answers it, and a batch of notices as one message.

Pure functions over plain data, so the notifier (application/notifications) decides nothing itself. A notice's
line carries ids, states, kinds and figures only: never a question's text, an agent's error or a diff, which
may hold secrets or code. Those go into `details`, which a message shows only when `include_details` is set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

KINDS = ("decision", "question", "agent", "ci", "budget")
"""What a channel may be told about: a decision waits (a session entered verifying), an agent asked a question
or a permission, an agent stalled or failed, CI failed `ci_failures` times, a budget is nearly spent."""

QUESTION_EVENT = "question.asked"
BUDGET_EVENT = "budget.nearly_spent"
TRANSITION_EVENT = "session.transition"
EVENT_KINDS = (TRANSITION_EVENT, QUESTION_EVENT, "agent.status", "agent.stalled", BUDGET_EVENT)
"""The events log kinds the notifier reads; every other kind moves its cursor without a notice."""

_AGENT_ENDS = {"failed": "failed", "lost": "was lost (its node stopped beating)"}


@dataclass(frozen=True, slots=True)
class Notice:
    """One thing to tell: `line` is safe to send anywhere; `details` (agent text, reasons) only when asked for."""

    kind: str
    event_id: int
    line: str
    link: str  # the console path that answers it, e.g. /sessions/<id>
    session_id: str | None = None
    details: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "event_id": self.event_id, "line": self.line, "link": self.link,
                "session_id": self.session_id, "details": self.details}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Notice:
        return cls(data["kind"], int(data["event_id"]), data["line"], data["link"], data.get("session_id"),
                   data.get("details"))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Message:
    title: str
    body: str


def is_ci_failure(kind: str, payload: Mapping[str, Any]) -> bool:
    """A `session.transition` event of the forge follower's `ci_failed` trigger."""
    return kind == TRANSITION_EVENT and payload.get("trigger") == "ci_failed"


def notice_for(
    event_id: int,
    kind: str,
    session_id: str | None,
    payload: Mapping[str, Any],
    *,
    ci_failures: int = 0,
    ci_threshold: int = 2,
) -> Notice | None:
    """The notice an event deserves, or None. `ci_failures`: how many `ci_failed` transitions the session had up to
    and including this event; from the `ci_threshold`-th on, each one is told."""
    session = _short(session_id)
    link = f"/sessions/{session_id}" if session_id else "/"
    if kind == TRANSITION_EVENT:
        if payload.get("to") == "verifying":
            return Notice("decision", event_id, f"session {session} awaits your decision (approve, request "
                          "changes or reject)", link, session_id)  # fmt: skip
        if is_ci_failure(kind, payload) and ci_failures >= ci_threshold:
            return Notice("ci", event_id, f"session {session}: CI failed {ci_failures} times", link, session_id)
        return None
    if kind == QUESTION_EVENT:
        what = "asks permission" + (f" to use {payload['tool_name']}" if payload.get("tool_name") else "")
        what = what if payload.get("kind") == "permission" else "asks a question"
        return Notice("question", event_id, f"session {session}: an agent {what}", link, session_id,
                      _text(payload.get("text")))  # fmt: skip
    if kind == "agent.stalled":
        line = f"session {session}: agent {_short(payload.get('agent'))} ({payload.get('type', '?')}) stalled"
        return Notice("agent", event_id, line, link, session_id, _text(payload.get("why")))
    if kind == "agent.status" and payload.get("to") in _AGENT_ENDS:
        ended = _AGENT_ENDS[str(payload["to"])]
        line = f"session {session}: agent {_short(payload.get('agent'))} ({payload.get('type', '?')}) {ended}"
        return Notice("agent", event_id, line, link, session_id, _text(payload.get("error") or payload.get("reason")))
    if kind == BUDGET_EVENT:
        figures = f"{payload.get('spent')} of {payload.get('limit')} {payload.get('unit', '')}".strip()
        line = f"budget {payload.get('scope', '?')} {payload.get('key', '')}".rstrip() + f" nearly spent: {figures}"
        if session_id is None and payload.get("scope") == "session" and payload.get("key"):
            session_id, link = str(payload["key"]), f"/sessions/{payload['key']}"
        return Notice("budget", event_id, line, link, session_id)  # no session: the board
    return None


def due(oldest: datetime, now: datetime, batch_s: float) -> bool:
    """A channel's pending notices go out once the oldest has waited `batch_s`: a burst becomes one message."""
    return now - oldest >= timedelta(seconds=batch_s)


MAX_LINES = 50  # a message lists this many notices, then says how many more the console shows


def render(notices: Sequence[Notice], console_url: str, *, include_details: bool = False) -> Message:
    """One message for a batch: a title that counts them, then one line each with the link that answers it (the
    first `MAX_LINES`; the rest are counted, with the console's board as their link)."""
    base = console_url.rstrip("/")
    counts = {k: sum(1 for n in notices if n.kind == k) for k in KINDS}
    said = ", ".join(f"{n} {_NAMES[k][n != 1]}" for k, n in counts.items() if n)
    title = f"taskgate: {said}"
    lines = []
    for notice in notices[:MAX_LINES]:
        lines.append(f"- {notice.line}: {base}{notice.link}")
        if include_details and notice.details:
            lines.append(f"  {notice.details}")
    if len(notices) > MAX_LINES:
        lines.append(f"- and {len(notices) - MAX_LINES} more: {base}/")
    return Message(title, "\n".join(lines))


_NAMES = {
    "decision": ("decision waits", "decisions wait"),
    "question": ("question", "questions"),
    "agent": ("agent stalled or failed", "agents stalled or failed"),
    "ci": ("CI failure", "CI failures"),
    "budget": ("budget nearly spent", "budgets nearly spent"),
}


def _short(identifier: object) -> str:
    return str(identifier)[:8] if identifier else "?"


def _text(value: object, limit: int = 500) -> str | None:
    return str(value)[:limit] if value else None
