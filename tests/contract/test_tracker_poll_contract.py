"""TrackerPollRepository: the SQL adapters (SQLite, PostgreSQL) and the in-memory fake answer alike."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from taskgate.application.trackers.ports import TrackerPoll
from tests.builders import seed

T0 = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)


async def test_a_poll_per_project_is_saved_replaced_and_read_back_with_its_report(services, git_repo: Path):
    project = (await seed(services, git_repo, tasks=0)).project
    report = {"ready": ["gh-1", "gh-2"], "held": {"gh-3": "blocked by gh-5 (open)"}, "claimed": [], "lost": {},
              "dispatch": [{"task": "gh-1", "outcome": "would_start", "detail": "dry run"}]}  # fmt: skip
    first = TrackerPoll(project.id, "github", "github acme/shop, label taskgate", T0, None, 12, 10, 0.25, report)
    async with services.uow(write=True) as uow:
        await uow.tracker_polls.save(first)
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert await uow.tracker_polls.list() == [first]

    failed = replace(first, polled_at=T0 + timedelta(seconds=30), error="GitHub answered 500", calls=4, report={})
    async with services.uow(write=True) as uow:
        await uow.tracker_polls.save(failed)  # the project's row is replaced, not added to
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert await uow.tracker_polls.list() == [failed]

    async with services.uow(write=True) as uow:  # not committed: rolled back
        await uow.tracker_polls.save(replace(failed, error=None))
    async with services.uow(write=False) as uow:
        assert [p.error for p in await uow.tracker_polls.list()] == ["GitHub answered 500"]
