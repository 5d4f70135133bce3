"""The DeliveryRepository contract: the in-memory fake, SQLite and PostgreSQL agree, row for row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


async def events(services, *kinds: str) -> None:
    async with services.uow(write=True) as uow:
        for i, kind in enumerate(kinds):
            await uow.events.append(kind, T0 + timedelta(seconds=i), {"i": i}, f"s-{i}")
        await uow.commit()


async def test_enqueue_adds_pending_rows_once_and_the_cursor_follows(services):
    await events(services, "a", "b", "c")
    async with services.uow(write=True) as uow:
        d = uow.deliveries
        assert (await d.committed_high_water(), await d.cursor("ci")) == (3, 0)
        assert [e.kind for e in await d.events_after(0, 3, 10)] == ["a", "b", "c"]
        assert [e.id for e in await d.events_after(1, 2, 10)] == [2]
        assert await d.enqueue("ci", [1, 2], T0) == 2
        assert await d.enqueue("ci", [2, 3], T0) == 1  # 2 is there already
        assert await d.enqueue("other", [], T0) == 0
        assert (await d.cursor("ci"), await d.cursor("other")) == (3, 0)
        await uow.commit()
    async with services.uow(write=False) as uow:
        rows = await uow.deliveries.list("ci")
    assert [(r.event_id, r.status, r.attempts, r.next_attempt_at) for r in rows] == [
        (i, "pending", 0, T0) for i in (1, 2, 3)
    ]


async def test_a_skip_marker_moves_the_cursor_and_is_never_a_delivery(services):
    await events(services, "a", "b", "c", "d")
    async with services.uow(write=True) as uow:
        d = uow.deliveries
        await d.enqueue("ci", [1], T0)
        await d.move_cursor("ci", 2)
        await d.move_cursor("ci", 4)  # replaces the older marker
        assert await d.cursor("ci") == 4
        assert [r.event_id for r in await d.list()] == [1]
        assert await d.counts() == {("ci", "pending"): 1}
        assert (await d.head("ci")).event_id == 1
        await uow.commit()


async def test_a_start_marker_moves_the_cursor_once_outlives_skip_markers_and_is_never_a_delivery(services):
    await events(services, "a", "b", "c", "d")
    async with services.uow(write=True) as uow:
        d = uow.deliveries
        assert await d.start("ci") is None
        await d.mark_start("ci", 2)
        await d.mark_start("ci", 2)  # a second dispatcher's insert does nothing
        assert (await d.start("ci"), await d.cursor("ci"), await d.cursor("other")) == (2, 2, 0)
        await d.enqueue("ci", [3], T0)
        await d.move_cursor("ci", 4)  # removes the skip markers only
        assert (await d.start("ci"), await d.cursor("ci")) == (2, 4)
        assert [r.event_id for r in await d.list()] == [3]
        assert await d.counts() == {("ci", "pending"): 1}
        assert (await d.head("ci")).event_id == 3
        await uow.commit()


async def test_head_claim_and_outcomes_are_compare_and_set_on_attempts(services):
    await events(services, "a", "b")
    lease = T0 + timedelta(seconds=35)
    async with services.uow(write=True) as uow:
        d = uow.deliveries
        await d.enqueue("ci", [1, 2], T0)
        head = await d.head("ci")
        assert (head.event_id, head.attempts, head.event.kind, head.event.payload, head.event.session_id) == (
            1,
            0,
            "a",
            {"i": 0},
            "s-0",
        )
        assert head.event.at == T0
        assert not await d.claim(head.id, 0, T0 - timedelta(seconds=1), lease)  # not due yet
        assert await d.claim(head.id, 0, T0, lease)
        assert not await d.claim(head.id, 0, T0, lease)  # claimed: attempts moved on
        assert not await d.claim(head.id, 1, T0, lease)  # and the lease holds
        assert not await d.mark_retry(head.id, 0, "stale", T0)
        assert await d.mark_retry(head.id, 1, "HTTP 500", T0 + timedelta(seconds=2))
        assert await d.claim(head.id, 1, T0 + timedelta(seconds=2), lease)
        assert await d.mark_failed(head.id, 2, "HTTP 500 again")
        assert not await d.mark_delivered(head.id, T0)  # failed is final

        second = await d.head("ci")
        assert second.event_id == 2
        assert await d.claim(second.id, 0, T0, lease)
        assert await d.mark_delivered(second.id, T0 + timedelta(seconds=3))
        assert await d.head("ci") is None
        assert await d.counts() == {("ci", "failed"): 1, ("ci", "delivered"): 1}
        await uow.commit()

    async with services.uow(write=False) as uow:
        failed, delivered = await uow.deliveries.list("ci")
        assert await uow.deliveries.list(status="delivered") == [delivered]
    assert (failed.status, failed.attempts, failed.last_error, failed.next_attempt_at) == (
        "failed",
        2,
        "HTTP 500 again",
        None,
    )
    assert (delivered.status, delivered.delivered_at, delivered.last_error) == (
        "delivered",
        T0 + timedelta(seconds=3),
        None,
    )
