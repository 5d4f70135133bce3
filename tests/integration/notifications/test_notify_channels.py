"""Notifications end to end: events in a real database (SQLite file, PostgreSQL), the notifier with Apprise, a
real SMTP server (aiosmtpd) and a real HTTP receiver on 127.0.0.1. Apprise sends for real; nothing is mocked."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from taskgate.application.notifications.notifier import Notifier, NotifyOptions
from taskgate.bootstrap import notify_channels
from taskgate.infrastructure.apprise_notify import AppriseSender
from taskgate.infrastructure.settings import NotifySettings, Settings
from taskgate.infrastructure.system import SystemClock
from tests.builders import fire, seed, start
from tests.integration.notifications.conftest import SMTP_PASSWORD, Mailbox, Receiver

CONSOLE = "http://console.test:9999"
TOKEN = "ghp_notifyTestToken0123456789abcdef"
DIFF = "diff --git a/app.py b/app.py\n+password = 'hunter2'"


def _notifier(services, urls: list[str], tmp_path: Path, **options) -> Notifier:
    settings = Settings(data_dir=tmp_path / "data", notify=NotifySettings(channels=urls))
    defaults = {"console_url": CONSOLE, "batch_s": 0.3, "backoff_base_s": 0.2}
    return Notifier(services.uow, SystemClock(), AppriseSender(timeout_s=10), notify_channels(settings),
                    NotifyOptions(**(defaults | options)))  # fmt: skip


async def _until(notifier: Notifier, done, timeout_s: float = 10.0) -> None:
    """Notifier rounds until `done()`; bounded, so a missing message fails instead of hanging."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the message did not arrive"
        await notifier.run_once()
        await asyncio.sleep(0.05)


async def _burst(services, session_id: str, n: int) -> None:
    """Questions and failures whose text holds what must never reach a channel: a token and a diff."""
    async with services.uow(write=True) as uow:
        now = SystemClock().now()
        for i in range(n):
            asked = {"question_id": f"q{i}", "session_id": session_id, "text": f"may I push with {TOKEN}?\n{DIFF}",
                     "kind": "permission", "tool_name": "Bash"}  # fmt: skip
            await uow.events.append("question.asked", now, asked, session_id)
        failed = {"agent": "a1b2c3d4e5f6", "type": "claude", "to": "failed", "error": f"{DIFF}\nGITHUB_TOKEN={TOKEN}"}
        await uow.events.append("agent.status", now, failed, session_id)
        await uow.commit()


@pytest.fixture
async def waiting(sql_services, git_repo):
    """A session of a real project, with the notifier's cursor before it enters verifying."""
    seeded = await seed(sql_services, git_repo, tasks=1)
    return seeded, await start(sql_services, seeded.tasks[0])


async def test_a_burst_is_one_message_per_channel_with_console_links_and_no_secret_or_diff(
    sql_services, waiting, mailbox: Mailbox, receiver: Receiver, tmp_path, monkeypatch
):
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    notifier = _notifier(sql_services, [mailbox.url, receiver.url], tmp_path)
    await notifier.run_once()  # its cursor starts here
    _, session = waiting
    await fire(sql_services, session, "plan_complete", "work_complete")  # a decision waits
    await _burst(sql_services, session.id, 18)  # 20 notices in all
    await _until(notifier, lambda: mailbox.messages and receiver.posts)
    await asyncio.sleep(0.5)
    await notifier.run_once()  # nothing more: the burst was one message

    assert len(mailbox.messages) == 1 and len(receiver.posts) == 1
    for body in mailbox.bodies() + receiver.bodies():
        assert "taskgate: 1 decision waits, 18 questions, 1 agent stalled or failed" in body
        assert f"{CONSOLE}/sessions/{session.id}" in body
        for secret in (TOKEN, SMTP_PASSWORD, "diff --git", "hunter2"):
            assert secret not in body
    assert body.count(f"{CONSOLE}/sessions/{session.id}") == 20
    [status_smtp, status_http] = await notifier.status()
    assert SMTP_PASSWORD not in status_smtp.channel and "****" in status_smtp.channel
    assert (status_smtp.sent, status_http.sent, status_http.pending) == (20, 20, 0)


async def test_a_receiver_failing_once_gets_the_message_on_the_retry_and_status_shows_why(
    sql_services, waiting, receiver: Receiver, tmp_path
):
    notifier = _notifier(sql_services, [receiver.url], tmp_path)
    await notifier.run_once()
    receiver.fail_next = 1
    _, session = waiting
    await fire(sql_services, session, "plan_complete", "work_complete")
    await _until(notifier, lambda: receiver.answered)
    [status] = await notifier.status()
    assert status.pending == 1 and status.last_error and "500" in status.last_error
    assert status.next_attempt_at is not None
    await _until(notifier, lambda: receiver.posts)
    assert receiver.answered == [500, 200]
    assert "awaits your decision" in receiver.bodies()[0]
    [status] = await notifier.status()
    assert (status.pending, status.sent, status.failed) == (0, 1, 0)


async def test_a_restarted_notifier_resumes_at_its_cursor_neither_losing_nor_repeating(
    sql_services, waiting, receiver: Receiver, tmp_path
):
    _, session = waiting
    first = _notifier(sql_services, [receiver.url], tmp_path, batch_s=60)
    await first.run_once()
    await fire(sql_services, session, "plan_complete", "work_complete")
    await first.run_once()  # queued; the process "stops" before the batch is due
    assert receiver.posts == []
    await _burst(sql_services, session.id, 2)  # written while nobody runs

    second = _notifier(sql_services, [receiver.url], tmp_path)  # a new process on the same database
    await _until(second, lambda: receiver.posts)
    third = _notifier(sql_services, [receiver.url], tmp_path)
    await third.run_once()
    await asyncio.sleep(0.4)
    await third.run_once()

    [body] = receiver.bodies()
    assert "1 decision waits, 2 questions, 1 agent stalled or failed" in body
    assert len(receiver.posts) == 1


async def test_notify_test_reaches_each_channel_and_names_the_one_that_fails_masked(
    sql_services, mailbox: Mailbox, receiver: Receiver, tmp_path
):
    broken = f"mailto://{'someone'}:{SMTP_PASSWORD}@localhost:1?smtp=127.0.0.1&from=a@example.com&to=b@example.com"
    notifier = _notifier(sql_services, [mailbox.url, receiver.url, broken], tmp_path)
    results = await notifier.test()
    assert [error for _, error in results[:2]] == [None, None] and results[2][1]
    assert all(SMTP_PASSWORD not in f"{shown} {error}" for shown, error in results)
    assert len(mailbox.messages) == 1 and "test notification" in receiver.bodies()[0]


async def test_the_second_ci_failure_of_a_session_is_told_counted_from_its_real_transitions(
    sql_services, waiting, receiver: Receiver, tmp_path
):
    settings = Settings(data_dir=tmp_path / "data", notify=NotifySettings(channels=[receiver.url], on=["ci"]))
    notifier = Notifier(sql_services.uow, SystemClock(), AppriseSender(timeout_s=10), notify_channels(settings),
                        NotifyOptions(console_url=CONSOLE, batch_s=0, ci_failures=2))  # fmt: skip
    await notifier.run_once()
    _, session = waiting
    session = await fire(sql_services, session, "plan_complete", "work_complete", "update_pr", "ci_failed")
    await notifier.run_once()
    assert receiver.posts == []  # the first failure, and the decision (not wanted here), are not told
    await fire(sql_services, session, "work_complete", "update_pr", "ci_failed")
    await _until(notifier, lambda: receiver.posts)
    [body] = receiver.bodies()
    assert f"CI failed 2 times: {CONSOLE}/sessions/{session.id}" in body


async def test_a_real_question_asked_is_told_with_the_link_that_answers_it_and_without_its_text(
    sql_services, waiting, receiver: Receiver, tmp_path
):
    """The producer is the real one (OperatorQuestions.ask), not an event written by hand."""
    from taskgate.application.operators.questions import OperatorQuestions
    from taskgate.domain.access import Principal

    notifier = _notifier(sql_services, [receiver.url], tmp_path, batch_s=0)
    await notifier.run_once()
    _, session = waiting
    issued = await sql_services.access.create_agent_token(session.id, "agent")
    agent = Principal.agent(issued.token.id, session.id)
    await OperatorQuestions(sql_services.uow, SystemClock()).ask(agent, session.id, f"push with {TOKEN}?")
    await _until(notifier, lambda: receiver.posts)
    [body] = receiver.bodies()
    assert f"{CONSOLE}/sessions/{session.id}" in body
    assert TOKEN not in body  # the question's text is not sent unless include_details
