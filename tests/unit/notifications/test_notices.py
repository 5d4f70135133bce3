"""Which events become notices, and how a batch of them reads (domain/notifications.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from taskgate.domain.notifications import MAX_LINES, Notice, due, notice_for, render

SID = "0f3c2a9e-1111-2222-3333-444455556666"
T0 = datetime(2026, 11, 29, 7, 0, tzinfo=UTC)


def test_a_session_entering_verifying_is_a_decision_linked_to_its_console_page():
    notice = notice_for(7, "session.transition", SID, {"trigger": "work_complete", "to": "verifying"})
    assert notice is not None and notice.kind == "decision"
    assert notice.link == f"/sessions/{SID}" and "0f3c2a9e" in notice.line


def test_other_transitions_and_unknown_kinds_are_not_told():
    assert notice_for(1, "session.transition", SID, {"trigger": "start", "to": "executing"}) is None
    assert notice_for(2, "tracker.claimed", SID, {}) is None
    assert notice_for(3, "agent.status", SID, {"to": "completed", "agent": "a1"}) is None


def test_ci_failures_are_told_from_the_configured_count_on():
    payload = {"trigger": "ci_failed", "from": "awaiting_merge", "to": "executing"}
    assert notice_for(4, "session.transition", SID, payload, ci_failures=1, ci_threshold=2) is None
    second = notice_for(5, "session.transition", SID, payload, ci_failures=2, ci_threshold=2)
    assert second is not None and second.kind == "ci" and "2 times" in second.line
    assert notice_for(6, "session.transition", SID, payload, ci_failures=3, ci_threshold=2) is not None


def test_a_question_keeps_its_text_and_a_failed_agent_its_error_in_details_only():
    asked = {"question_id": "q1", "session_id": SID, "text": "use the key sk-live-123?", "kind": "permission",
             "tool_name": "Bash"}  # fmt: skip
    notice = notice_for(8, "question.asked", SID, asked)
    assert notice is not None and notice.kind == "question" and "permission to use Bash" in notice.line
    assert "sk-live" not in notice.line and notice.details == "use the key sk-live-123?"
    failed = notice_for(9, "agent.status", SID, {"agent": "a1b2c3d4e5", "type": "claude", "to": "failed",
                                                "error": "Traceback: secret"})  # fmt: skip
    assert failed is not None and failed.kind == "agent" and "failed" in failed.line
    assert "secret" not in failed.line and failed.details == "Traceback: secret"
    stalled = notice_for(10, "agent.stalled", SID, {"agent": "a1", "type": "codex", "why": "no output for 600 s"})
    assert stalled is not None and stalled.kind == "agent" and "stalled" in stalled.line


def test_a_budget_nearly_spent_says_its_figures_and_links_to_its_session_or_the_board():
    payload = {"scope": "project", "key": "SHOP", "spent": 9.2, "limit": 10, "unit": "usd"}
    notice = notice_for(11, "budget.nearly_spent", None, payload)
    assert notice is not None and notice.kind == "budget" and notice.link == "/"
    assert "9.2 of 10 usd" in notice.line and "SHOP" in notice.line
    session = notice_for(12, "budget.nearly_spent", None, payload | {"scope": "session", "key": SID})
    assert session is not None and session.link == f"/sessions/{SID}"


def test_a_burst_renders_as_one_message_counting_each_kind_with_a_link_per_line():
    notices = [
        Notice("decision", i, f"session s{i} awaits your decision", f"/sessions/s{i}", f"s{i}") for i in range(20)
    ]
    notices.append(Notice("question", 99, "session s1: an agent asks a question", "/sessions/s1", "s1", "the text"))
    message = render(notices, "http://console.example:8765/")
    assert message.title == "taskgate: 20 decisions wait, 1 question"
    lines = message.body.splitlines()
    assert len(lines) == 21 and lines[0] == "- session s0 awaits your decision: http://console.example:8765/sessions/s0"
    assert "the text" not in message.body
    assert "  the text" in render(notices, "http://c", include_details=True).body


def test_a_huge_burst_lists_the_first_notices_and_counts_the_rest():
    notices = [Notice("agent", i, f"agent {i} failed", "/sessions/s", "s") for i in range(MAX_LINES + 7)]
    body = render(notices, "http://c").body.splitlines()
    assert len(body) == MAX_LINES + 1 and body[-1] == "- and 7 more: http://c/"


def test_a_batch_is_due_once_its_oldest_notice_has_waited_batch_s():
    assert not due(T0, T0 + timedelta(seconds=9.9), 10)
    assert due(T0, T0 + timedelta(seconds=10), 10)
    assert due(T0, T0, 0)


def test_a_notice_survives_its_json_round_trip():
    notice = Notice("ci", 3, "line", "/sessions/x", "x", None)
    assert Notice.from_json(notice.as_json()) == notice
