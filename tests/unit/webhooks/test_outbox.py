"""The webhook dispatcher on the in-memory fakes: the retry schedule on a fake clock, filters, ordering, claims."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

import pytest

from taskgate.application.webhooks.outbox import LEASE_MARGIN_S, Backfill, Subscriber, WebhookDispatcher
from taskgate.application.webhooks.ports import OutboxEvent, SendResult
from taskgate.bootstrap import build_outbox
from taskgate.domain.errors import InvalidInput
from taskgate.infrastructure.settings import Settings, WebhookSettings, load_settings
from tests.fakes import FakeClock, InMemoryDatabase


class FakeSender:
    """Records every send; `answer(event, attempt)` decides the outcome (default: 200)."""

    def __init__(self, answer: Callable[[OutboxEvent, int], SendResult] | None = None) -> None:
        self.sent: list[tuple[str, int, int]] = []  # (url, event id, attempt)
        self.answer = answer or (lambda event, attempt: SendResult(200))

    async def send(self, url: str, secret: str, event: OutboxEvent, *, timeout_s: float, attempt: int) -> SendResult:
        self.sent.append((url, event.id, attempt))
        return self.answer(event, attempt)


def hook(name: str = "ci", backfill: Backfill = "all", **options) -> Subscriber:
    """A subscriber that gets the whole log by default: most tests here append their events before its first
    round. The tests of where a new subscriber starts pass backfill="none" (the product's default)."""
    return Subscriber(name=name, url=f"http://{name}.invalid/hook", secret="s3cret", backfill=backfill, **options)


async def append_events(db: InMemoryDatabase, clock: FakeClock, *kinds: str) -> None:
    async with db.unit_of_work(write=True) as uow:
        for kind in kinds:
            await uow.events.append(kind, clock.now(), {"kind": kind}, "sess-1")
        await uow.commit()


async def rows(db: InMemoryDatabase, subscriber: str = "ci"):
    async with db.unit_of_work(write=False) as uow:
        return await uow.deliveries.list(subscriber)


def test_the_backoff_doubles_from_the_base_and_stops_at_the_cap():
    assert hook(backoff_base_s=1, backoff_max_s=10, max_attempts=7).schedule() == [1, 2, 4, 8, 10, 10]
    assert hook(backoff_base_s=0.5, backoff_max_s=300, max_attempts=4).schedule() == [0.5, 1, 2]
    assert hook(max_attempts=1).schedule() == []
    assert hook().backoff(10_000) == timedelta(seconds=300)  # no float overflow for absurd attempt counts


def test_a_subscriber_filter_is_a_list_of_globs():
    sub = hook(events=("session.*", "task.status_set"))
    assert sub.wants("session.blocked") and sub.wants("task.status_set")
    assert not sub.wants("task.added") and not sub.wants("worktree.orphans_pruned")
    assert hook().wants("anything.at.all")


def test_a_subscriber_needs_a_secret_and_sane_limits():
    with pytest.raises(InvalidInput):
        Subscriber(name="x", url="http://x", secret="")
    with pytest.raises(InvalidInput):
        hook(max_attempts=0)


async def test_a_failing_delivery_is_retried_on_the_exponential_schedule_then_given_up():
    db, clock = InMemoryDatabase(), FakeClock()
    sender = FakeSender(lambda event, attempt: SendResult(503, "HTTP 503"))
    dispatcher = WebhookDispatcher(
        db.unit_of_work, clock, sender, [hook(max_attempts=5, backoff_base_s=2, backoff_max_s=10)]
    )
    await append_events(db, clock, "session.created")

    waits = []
    first = clock.current
    report = await dispatcher.run_once()
    assert (report.enqueued, report.retried) == (1, 1)
    for _ in range(4):
        [row] = await rows(db)
        wait = row.next_attempt_at - clock.current
        waits.append(round(wait.total_seconds()))
        clock.advance(seconds=wait.total_seconds() - 0.001)
        assert (await dispatcher.run_once()).sent == 0  # not due a millisecond early
        clock.advance(seconds=0.002)
        await dispatcher.run_once()

    assert waits == [2, 4, 8, 10]
    assert [attempt for _, _, attempt in sender.sent] == [1, 2, 3, 4, 5]
    [row] = await rows(db)
    assert (row.status, row.attempts, row.last_error, row.next_attempt_at) == ("failed", 5, "HTTP 503", None)
    assert clock.current - first >= timedelta(seconds=24)
    clock.advance(hours=1)
    assert (await dispatcher.run_once()).sent == 0  # given up: never sent again


async def test_later_events_wait_for_a_retried_head_and_go_out_in_order_after_it():
    db, clock = InMemoryDatabase(), FakeClock()
    sender = FakeSender(
        lambda event, attempt: SendResult(500, "HTTP 500") if event.id == 1 and attempt < 3 else SendResult(200)
    )
    dispatcher = WebhookDispatcher(db.unit_of_work, clock, sender, [hook(backoff_base_s=1)])
    await append_events(db, clock, "a", "b", "c")

    await dispatcher.run_once()
    assert [e for _, e, _ in sender.sent] == [1]
    clock.advance(seconds=1)
    await dispatcher.run_once()
    clock.advance(seconds=2)
    report = await dispatcher.run_once()

    assert [e for _, e, _ in sender.sent] == [1, 1, 1, 2, 3]
    assert report.delivered == 3
    assert [r.status for r in await rows(db)] == ["delivered"] * 3


async def test_one_failing_subscriber_does_not_hold_back_another():
    db, clock = InMemoryDatabase(), FakeClock()
    sender = FakeSender(lambda event, attempt: SendResult(None, "connection refused"))
    ok_sender = FakeSender()

    class Router:
        async def send(self, url, secret, event, *, timeout_s, attempt):
            target = sender if "down" in url else ok_sender
            return await target.send(url, secret, event, timeout_s=timeout_s, attempt=attempt)

    dispatcher = WebhookDispatcher(db.unit_of_work, clock, Router(), [hook("down"), hook("up")])
    await append_events(db, clock, "a", "b")
    report = await dispatcher.run_once()

    assert [e for _, e, _ in ok_sender.sent] == [1, 2]
    assert [e for _, e, _ in sender.sent] == [1]
    assert (report.delivered, report.retried) == (2, 1)


async def test_events_the_filter_skips_move_the_cursor_without_delivery_rows():
    db, clock = InMemoryDatabase(), FakeClock()
    dispatcher = WebhookDispatcher(db.unit_of_work, clock, FakeSender(), [hook(events=("session.*",))])
    await append_events(db, clock, "session.created", "task.added", "task.added")

    assert await dispatcher.enqueue_new() == 1
    async with db.unit_of_work(write=False) as uow:
        assert await uow.deliveries.cursor("ci") == 3
    assert await dispatcher.enqueue_new() == 0
    assert [r.event_id for r in await rows(db)] == [1]
    assert len(db.store.deliveries) == 2  # the delivery and one skip marker


async def test_enqueue_walks_a_long_backlog_in_batches():
    db, clock = InMemoryDatabase(), FakeClock()
    dispatcher = WebhookDispatcher(db.unit_of_work, clock, FakeSender(), [hook(events=("even",))], batch_size=4)
    await append_events(db, clock, *["even" if i % 2 == 0 else "odd" for i in range(11)])
    assert await dispatcher.enqueue_new() == 6
    assert [r.event_id for r in await rows(db)] == [1, 3, 5, 7, 9, 11]


async def test_two_dispatchers_racing_send_each_event_once():
    db, clock = InMemoryDatabase(), FakeClock()
    sender = FakeSender()

    class Slow:
        async def send(self, *args, **kwargs):
            await asyncio.sleep(0)  # let the other dispatcher run between claim and record
            return await sender.send(*args, **kwargs)

    a = WebhookDispatcher(db.unit_of_work, clock, Slow(), [hook()])
    b = WebhookDispatcher(db.unit_of_work, clock, Slow(), [hook()])
    await append_events(db, clock, *["e"] * 20)
    await asyncio.gather(a.run_once(), b.run_once(), a.run_once(), b.run_once())
    while (await a.run_once()).sent:
        pass

    assert sorted(e for _, e, _ in sender.sent) == list(range(1, 21))
    assert [e for _, e, _ in sender.sent] == list(range(1, 21))  # and in order


async def test_a_claim_left_by_a_crash_is_sent_again_after_its_lease():
    db, clock = InMemoryDatabase(), FakeClock()
    hung = asyncio.Event()

    class Hanging:
        async def send(self, *args, **kwargs):
            hung.set()
            await asyncio.Event().wait()

    await append_events(db, clock, "session.created")
    crashed = WebhookDispatcher(db.unit_of_work, clock, Hanging(), [hook(timeout_s=5)])
    task = asyncio.create_task(crashed.run_once())
    await hung.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    sender = FakeSender()
    restarted = WebhookDispatcher(db.unit_of_work, clock, sender, [hook(timeout_s=5)])
    assert (await restarted.run_once()).sent == 0  # still claimed
    clock.advance(seconds=5 + LEASE_MARGIN_S)
    await restarted.run_once()
    assert sender.sent == [("http://ci.invalid/hook", 1, 2)]  # attempt 2: the crashed one counted
    assert [r.status for r in await rows(db)] == ["delivered"]


async def test_status_counts_deliveries_and_shows_what_holds_the_queue():
    db, clock = InMemoryDatabase(), FakeClock()
    sender = FakeSender(lambda event, attempt: SendResult(200) if event.id == 1 else SendResult(502, "HTTP 502"))
    dispatcher = WebhookDispatcher(db.unit_of_work, clock, sender, [hook(events=("a", "b"))])
    await append_events(db, clock, "a", "b", "a", "zzz")
    await dispatcher.run_once()

    [status] = await dispatcher.status()
    assert (status.pending, status.delivered, status.failed) == (2, 1, 0)
    assert (status.oldest_pending_event_id, status.attempts, status.last_error) == (2, 1, "HTTP 502")
    assert status.next_attempt_at is not None and status.events == ["a", "b"]


async def test_a_new_subscriber_starts_after_the_events_already_in_the_log_and_a_restart_keeps_it_there():
    db, clock = InMemoryDatabase(), FakeClock()
    await append_events(db, clock, "a", "b")
    sender = FakeSender()
    first = WebhookDispatcher(db.unit_of_work, clock, sender, [hook(backfill="none")])
    [before] = await first.status()
    assert (before.started, before.started_after_event_id, before.backfill) == (False, None, "none")

    assert (await first.run_once()).sent == 0
    async with db.unit_of_work(write=False) as uow:
        assert (await uow.deliveries.cursor("ci"), await uow.deliveries.start("ci")) == (2, 2)
    await append_events(db, clock, "c")
    restarted = WebhookDispatcher(db.unit_of_work, clock, sender, [hook(backfill="none")])
    await restarted.run_once()

    assert [e for _, e, _ in sender.sent] == [3]
    [status] = await restarted.status()
    assert (status.started, status.started_after_event_id, status.delivered, status.pending) == (True, 2, 1, 0)
    assert [r.event_id for r in await rows(db)] == [3]  # the marker is no delivery


async def test_backfill_all_sends_the_history_and_a_changed_backfill_moves_no_started_subscriber():
    db, clock = InMemoryDatabase(), FakeClock()
    await append_events(db, clock, "a", "b")
    sender = FakeSender()
    await WebhookDispatcher(db.unit_of_work, clock, sender, [hook("late", "none"), hook("full", "all")]).run_once()
    await append_events(db, clock, "c")

    # The config is edited: each asks for the other's backfill. Both have rows already: nothing moves.
    edited = WebhookDispatcher(db.unit_of_work, clock, sender, [hook("late", "all"), hook("full", "none")])
    await edited.run_once()

    def got(name: str) -> list[int]:
        return [e for url, e, _ in sender.sent if f"//{name}." in url]

    assert (got("late"), got("full")) == ([3], [1, 2, 3])
    late, full = await edited.status()
    assert (late.started_after_event_id, full.started_after_event_id, full.started) == (2, None, True)


async def test_a_subscriber_first_seen_on_an_empty_log_gets_the_first_events():
    """No event to put a start marker on: the dispatcher remembers that the subscriber began at the beginning,
    until the first events come and its rows fix the cursor."""
    db, clock = InMemoryDatabase(), FakeClock()
    sender = FakeSender()
    dispatcher = WebhookDispatcher(db.unit_of_work, clock, sender, [hook(backfill="none")])
    assert (await dispatcher.run_once()).sent == 0
    await append_events(db, clock, "a", "b")

    await dispatcher.run_once()

    assert [e for _, e, _ in sender.sent] == [1, 2]
    async with db.unit_of_work(write=False) as uow:
        assert await uow.deliveries.start("ci") is None
    restarted = WebhookDispatcher(db.unit_of_work, clock, sender, [hook(backfill="none")])
    await append_events(db, clock, "c")
    await restarted.run_once()
    assert [e for _, e, _ in sender.sent] == [1, 2, 3]  # it has rows now: not moved, nothing resent


def test_backfill_is_all_or_none():
    assert Subscriber(name="x", url="http://x", secret="s").backfill == "none"
    with pytest.raises(InvalidInput, match="backfill must be 'none' or 'all', not 'some'"):
        hook(backfill="some")  # type: ignore[arg-type]


def test_webhook_names_must_be_unique():
    with pytest.raises(InvalidInput, match="unique"):
        WebhookDispatcher(InMemoryDatabase().unit_of_work, FakeClock(), FakeSender(), [hook(), hook()])


def test_build_outbox_reads_the_secret_from_the_named_environment_variable(monkeypatch):
    settings = Settings(webhooks=[WebhookSettings(name="ci", url="http://127.0.0.1:1/x", secret_env="HOOK_SECRET")])
    monkeypatch.delenv("HOOK_SECRET", raising=False)
    with pytest.raises(InvalidInput, match="HOOK_SECRET"):
        build_outbox(settings, InMemoryDatabase().unit_of_work, FakeClock())
    monkeypatch.setenv("HOOK_SECRET", "from-env")
    dispatcher = build_outbox(settings, InMemoryDatabase().unit_of_work, FakeClock())
    assert dispatcher is not None and dispatcher.subscribers[0].secret == "from-env"
    assert build_outbox(Settings(), InMemoryDatabase().unit_of_work, FakeClock()) is None


def test_a_webhook_names_exactly_one_secret_source():
    with pytest.raises(ValueError, match="exactly one"):
        WebhookSettings(name="ci", url="http://x")
    with pytest.raises(ValueError, match="exactly one"):
        WebhookSettings(name="ci", url="http://x", secret="a", secret_env="B")
    assert "hunter2" not in repr(WebhookSettings(name="ci", url="http://x", secret="hunter2"))


def test_webhooks_load_from_the_toml_config(tmp_path, monkeypatch):
    config = tmp_path / "config" / "taskgate.toml"
    config.parent.mkdir()
    config.write_text(
        '[[webhooks]]\nname = "ci"\nurl = "https://ci.example.com/hook"\nsecret_env = "CI_HOOK"\n'
        'events = ["session.*"]\nmax_attempts = 3\n\n'
        '[[webhooks]]\nname = "audit"\nurl = "http://127.0.0.1:9000/"\nsecret = "inline"\n'
    )
    monkeypatch.setenv("TASKGATE_CONFIG", str(config))
    settings = load_settings()
    ci, audit = settings.webhooks
    assert (ci.name, ci.events, ci.max_attempts, ci.timeout_s, ci.backoff_max_s) == ("ci", ["session.*"], 3, 5, 300)
    assert (audit.events, audit.resolved_secret()) == (["*"], "inline")

    config.write_text('[[webhooks]]\nname = "ci"\nurl = "ftp://x"\nsecret = "s"\n')
    with pytest.raises(InvalidInput, match="url"):
        load_settings()


def test_backfill_loads_from_the_toml_config_and_a_bad_value_names_the_field(tmp_path, monkeypatch):
    config = tmp_path / "config" / "taskgate.toml"
    config.parent.mkdir()
    hook_toml = '[[webhooks]]\nname = "{name}"\nurl = "http://127.0.0.1:9/"\nsecret = "s"\n'
    config.write_text(hook_toml.format(name="new") + hook_toml.format(name="old") + 'backfill = "all"\n')
    monkeypatch.setenv("TASKGATE_CONFIG", str(config))
    new, old = load_settings().webhooks
    assert (new.backfill, old.backfill) == ("none", "all")
    dispatcher = build_outbox(load_settings(), InMemoryDatabase().unit_of_work, FakeClock())
    assert dispatcher is not None and [s.backfill for s in dispatcher.subscribers] == ["none", "all"]

    config.write_text(hook_toml.format(name="ci") + 'backfill = "since-monday"\n')
    with pytest.raises(InvalidInput) as refused:
        load_settings()
    assert "webhooks.0.backfill" in str(refused.value) and "'none' or 'all'" in str(refused.value)
