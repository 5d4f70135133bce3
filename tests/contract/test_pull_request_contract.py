"""PullRequestRepository: the SQL adapters (SQLite, PostgreSQL) and the in-memory fake answer alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from taskgate.application.forge.ports import PullRequestRecord
from tests.builders import seed, start

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _record(session_id: str, project_id: int, **fields) -> PullRequestRecord:
    return PullRequestRecord(session_id, project_id, f"taskgate/{session_id[:8]}", "main", updated_at=T0, **fields)


async def test_rows_are_saved_replaced_followed_and_observed_by_compare_and_swap(services, git_repo: Path):
    seeded = await seed(services, git_repo, tasks=2)
    one, two = [await start(services, task) for task in seeded.tasks]
    first = _record(one.id, one.project_id, number=7, url="http://x/pull/7", pushed="a" * 40, pushed_at=T0)
    async with services.uow(write=True) as uow:
        await uow.pull_requests.save(first)
        await uow.pull_requests.save(_record(two.id, two.project_id))
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert await uow.pull_requests.get(one.id) == first
        assert await uow.pull_requests.get("no-such-session") is None
        assert [r.session_id for r in await uow.pull_requests.following()] == sorted([one.id, two.id])

    seen = {"pull": {"number": 7, "head": "a" * 40}, "checks": [{"id": 1, "name": "lint"}]}
    later = T0 + timedelta(seconds=5)
    async with services.uow(write=True) as uow:
        assert await uow.pull_requests.store_observation(one.id, T0, seen, "checks_pending", later)
        assert not await uow.pull_requests.store_observation(one.id, later, seen, "merged", later)  # published since
        assert not await uow.pull_requests.store_observation(two.id, T0, seen, "merged", later)
        assert await uow.pull_requests.store_observation(two.id, None, seen, "checks_green", later)
        await uow.pull_requests.note(one.id, "CI failed (lint): sent back", later)
        await uow.commit()
    async with services.uow(write=False) as uow:
        stored = await uow.pull_requests.get(one.id)
        assert (stored.observation, stored.status, stored.observed_at, stored.note) == (
            seen, "checks_pending", later, "CI failed (lint): sent back")  # fmt: skip
        assert (await uow.pull_requests.get(two.id)).status == "checks_green"


async def test_pokes_find_rows_by_branch_else_number(services, git_repo: Path):
    seeded = await seed(services, git_repo, tasks=2)
    one, two = [await start(services, task) for task in seeded.tasks]
    async with services.uow(write=True) as uow:
        await uow.pull_requests.save(_record(one.id, one.project_id, number=3))
        await uow.pull_requests.save(_record(two.id, two.project_id, number=4))
        await uow.commit()
    async with services.uow(write=True) as uow:
        assert await uow.pull_requests.poke(f"taskgate/{one.id[:8]}", 4) == 1  # the branch wins over the number
        assert await uow.pull_requests.poke(None, 4) == 1
        assert await uow.pull_requests.poke(None, None) == 0
        assert await uow.pull_requests.poke("no-such-branch", None) == 0
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert [(await uow.pull_requests.get(s.id)).poke for s in (one, two)] == [True, True]


async def test_a_delivery_id_is_recorded_once_and_counted_by_outcome(services):
    async with services.uow(write=True) as uow:
        assert await uow.pull_requests.record_delivery("d-1", "check_run", "accepted", T0)
        assert not await uow.pull_requests.record_delivery("d-1", "check_run", "accepted", T0)
        assert await uow.pull_requests.record_delivery("refused-1", "push", "refused", T0)
        assert await uow.pull_requests.record_delivery("replay-1", "check_run", "replay", T0)
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert await uow.pull_requests.delivery_counts() == {"accepted": 1, "refused": 1, "replay": 1}
