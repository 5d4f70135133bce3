"""NotificationRepository: the SQL adapters (SQLite, PostgreSQL) and the in-memory fake answer alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from taskgate.domain.notifications import Notice
from tests.builders import seed, start

T0 = datetime(2026, 11, 29, 7, 0, tzinfo=UTC)


def _notice(event_id: int, kind: str = "decision") -> Notice:
    return Notice(kind, event_id, f"line {event_id}", f"/sessions/s{event_id}", f"s{event_id}")


async def test_the_cursor_starts_unset_moves_and_rolls_back_with_its_transaction(services):
    async with services.uow(write=False) as uow:
        assert await uow.notifications.cursor() is None
    async with services.uow(write=True) as uow:
        await uow.notifications.move_cursor(0)
        await uow.commit()
    async with services.uow(write=True) as uow:
        await uow.notifications.move_cursor(41)
        await uow.commit()
    async with services.uow(write=True) as uow:  # not committed: rolled back
        await uow.notifications.move_cursor(99)
    async with services.uow(write=False) as uow:
        assert await uow.notifications.cursor() == 41


async def test_notices_queue_once_per_channel_and_event_and_go_pending_retry_sent_or_failed(services):
    async with services.uow(write=True) as uow:
        assert await uow.notifications.queue("a", [_notice(3), _notice(1)], T0) == 2
        assert await uow.notifications.queue("a", [_notice(1), _notice(2)], T0) == 1  # event 1 is queued already
        assert await uow.notifications.queue("b", [_notice(1)], T0) == 1  # another channel has its own row
        await uow.commit()
    async with services.uow(write=False) as uow:
        pending = await uow.notifications.pending("a")
    assert [q.notice for q in pending] == [_notice(1), _notice(2), _notice(3)]
    assert {(q.status, q.attempts, q.queued_at) for q in pending} == {("pending", 0, T0)}

    ids = [q.id for q in pending]
    async with services.uow(write=True) as uow:
        await uow.notifications.mark_retry(ids[:2], "HTTP 500", T0 + timedelta(seconds=5))
        await uow.notifications.mark_failed(ids[2:], "gave up")
        await uow.commit()
    async with services.uow(write=False) as uow:
        retried = await uow.notifications.pending("a")
        assert [(q.attempts, q.last_error, q.next_attempt_at) for q in retried] == [
            (1, "HTTP 500", T0 + timedelta(seconds=5))
        ] * 2
        # what holds the channel up: a pending row's error first, with its next try
        assert await uow.notifications.last_error("a") == (T0 + timedelta(seconds=5), "HTTP 500")
        assert await uow.notifications.last_error("b") == (None, None)
    async with services.uow(write=True) as uow:
        await uow.notifications.mark_sent(ids[:2], T0 + timedelta(seconds=6))
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert await uow.notifications.pending("a") == []
        assert await uow.notifications.last_error("a") == (None, "gave up")
        assert await uow.notifications.counts() == {("a", "sent"): 2, ("a", "failed"): 1, ("b", "pending"): 1}


async def test_sessions_are_named_by_project_and_their_ci_failures_counted_from_their_events(services, git_repo: Path):
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    ci_failed = {"trigger": "ci_failed", "from": "awaiting_merge", "to": "executing"}
    async with services.uow(write=True) as uow:
        first = await uow.events.high_water()
        for _ in range(3):
            await uow.events.append("session.transition", T0, ci_failed, session.id)
        await uow.events.append("session.transition", T0, {"trigger": "rebase", "to": "executing"}, session.id)
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert await uow.notifications.session_projects([session.id, "no-such-session"]) == {
            session.id: seeded.project.name
        }
        assert await uow.notifications.ci_failures(session.id, first + 2) == 2
        assert await uow.notifications.ci_failures(session.id, first + 4) == 3
        assert await uow.notifications.ci_failures("no-such-session", first + 4) == 0
