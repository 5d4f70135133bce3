"""The notifier over the in-memory store: where it starts, batching per channel, retries, the lease, routing."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from taskgate.application.nodes.ports import Lease
from taskgate.application.notifications.notifier import Channel, Notifier, NotifyOptions
from tests.fakes import FakeClock, InMemoryDatabase

T0 = datetime(2026, 11, 29, 7, 0, tzinfo=UTC)
VERIFYING = {"trigger": "work_complete", "from": "executing", "to": "verifying"}


@dataclass
class RecordingSender:
    sent: list[tuple[str, str, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # errors to answer with, first to last, before succeeding

    async def send(self, url: str, title: str, body: str) -> str | None:
        if self.failures:
            return self.failures.pop(0)
        self.sent.append((url, title, body))
        return None


@dataclass
class FixedLeases:
    holder: str = "node-a/1"
    lease_s: float = 30.0
    owner: str = "node-a/1"

    async def hold(self, name: str, ttl_s: float) -> Lease:
        return Lease(name, self.owner, self.owner.split("/")[0], T0, T0 + timedelta(seconds=ttl_s))

    async def release(self, name: str) -> None:
        return None


async def _append(db: InMemoryDatabase, kind: str, payload: dict, session_id: str | None = "s-1", n: int = 1) -> None:
    async with db.unit_of_work(write=True) as uow:
        for _ in range(n):
            await uow.events.append(kind, T0, payload, session_id)
        await uow.commit()


def _notifier(db, clock, sender, channels=None, **options) -> Notifier:
    channels = channels or [Channel("json://a", "json://a"), Channel("json://b", "json://b")]
    return Notifier(
        db.unit_of_work, clock, sender, channels, NotifyOptions(console_url="http://c", batch_s=10, **options)
    )


async def test_a_new_notifier_starts_after_the_history_and_a_burst_becomes_one_message_per_channel():
    db, clock, sender = InMemoryDatabase(), FakeClock(T0), RecordingSender()
    await _append(db, "session.transition", VERIFYING, n=3)  # before the notifier first looked: not told
    notifier = _notifier(db, clock, sender)
    assert (await notifier.run_once()).queued == 0
    await _append(db, "session.transition", VERIFYING, n=20)
    assert (await notifier.run_once()).queued == 40  # 20 notices for each of the two channels
    assert sender.sent == []  # the batch window is still open
    clock.advance(seconds=10)
    report = await notifier.run_once()
    assert report.sent == 2 and [url for url, _, _ in sender.sent] == ["json://a", "json://b"]
    assert sender.sent[0][1] == "taskgate: 20 decisions wait" and len(sender.sent[0][2].splitlines()) == 20
    clock.advance(seconds=60)
    assert (await notifier.run_once()).sent == 0  # sent once, not again


async def test_a_failed_send_is_retried_after_its_back_off_and_given_up_after_max_attempts():
    db, clock, sender = InMemoryDatabase(), FakeClock(T0), RecordingSender(failures=["HTTP 503"])
    notifier = _notifier(db, clock, sender, [Channel("json://a", "json://a")], backoff_base_s=5, max_attempts=3)
    await notifier.run_once()
    await _append(db, "agent.stalled", {"agent": "a1", "type": "codex", "why": "quiet"})
    await notifier.run_once()  # queued: its batch window opens
    clock.advance(seconds=10)
    report = await notifier.run_once()
    assert report.retried == 1 and "HTTP 503" in report.lines[0]
    [status] = await notifier.status()
    assert (status.pending, status.last_error) == (1, "HTTP 503") and status.next_attempt_at is not None
    clock.advance(seconds=4)
    assert (await notifier.run_once()).sent == 0  # still backing off
    clock.advance(seconds=1)
    assert (await notifier.run_once()).sent == 1 and "stalled" in sender.sent[0][2]

    sender.failures = ["refused", "refused", "refused", "refused"]
    await _append(db, "agent.stalled", {"agent": "a2", "type": "codex", "why": "quiet"})
    await notifier.run_once()
    for wait in (10, 5):
        clock.advance(seconds=wait)
        await notifier.run_once()
    await _append(db, "agent.stalled", {"agent": "a3", "type": "codex", "why": "quiet"})  # joins the retried batch
    clock.advance(seconds=10)
    report = await notifier.run_once()
    assert (report.failed, report.retried) == (1, 1) and "1 notice(s) given up after 3 attempts" in report.lines[0]
    [status] = await notifier.status()
    assert (status.pending, status.sent, status.failed, status.last_error) == (1, 1, 1, "refused")
    clock.advance(seconds=20)
    await notifier.run_once()  # the late notice's second try fails too ("refused" once more); the next one goes
    clock.advance(seconds=20)
    assert (await notifier.run_once()).sent == 1 and "agent a3 (codex) stalled" in sender.sent[-1][2]


async def test_only_the_holder_of_the_notify_lease_collects_and_sends():
    db, clock, sender = InMemoryDatabase(), FakeClock(T0), RecordingSender()
    leases = FixedLeases(owner="node-b/7")
    notifier = Notifier(db.unit_of_work, clock, sender, [Channel("json://a", "json://a")], NotifyOptions(batch_s=0),
                        leases=leases)  # fmt: skip
    report = await notifier.run_once()
    assert report.turn == "held by node-b/7"
    async with db.unit_of_work(write=False) as uow:
        assert await uow.notifications.cursor() is None  # it did not even start its cursor


async def test_a_restarted_notifier_resumes_at_its_cursor_and_sends_what_was_queued():
    db, clock, sender = InMemoryDatabase(), FakeClock(T0), RecordingSender()
    first = _notifier(db, clock, sender, [Channel("json://a", "json://a")])
    await first.run_once()
    await _append(db, "question.asked", {"question_id": "q1", "text": "?", "kind": "question"})
    await first.run_once()  # queued, not yet due: then the process stops
    await _append(db, "question.asked", {"question_id": "q2", "text": "?", "kind": "question"})
    clock.advance(seconds=10)
    second = _notifier(db, clock, sender, [Channel("json://a", "json://a")])
    await second.run_once()
    [(_, title, body)] = sender.sent
    assert title == "taskgate: 2 questions" and len(body.splitlines()) == 2


async def test_kinds_not_wanted_are_skipped_and_channels_follow_their_projects():
    everywhere = Channel("json://a", "", frozenset({"decision"}), opted_out=frozenset({"secret-project"}))
    shop = Channel("json://shop", "", frozenset({"agent", "decision"}), project="shop")
    assert everywhere.wants("decision", "shop") and everywhere.wants("decision", None)
    assert not everywhere.wants("agent", "shop") and not everywhere.wants("decision", "secret-project")
    assert shop.wants("agent", "shop") and not shop.wants("agent", "other") and not shop.wants("agent", None)
    assert everywhere.key != Channel("json://a", "", project="shop").key  # a channel's rows are its scope's
    assert "json" not in everywhere.key  # the key says nothing of the URL
