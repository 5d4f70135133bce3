"""StepRunRepository: the SQL adapters (SQLite, PostgreSQL) and the in-memory fake answer alike."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from taskgate.domain.entities import StepRun, StepStatus
from taskgate.domain.errors import SessionNotFound, StepRunNotFound
from tests.builders import seed, start

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _run(session_id: str, step_id: str, status: StepStatus = StepStatus.RUNNING, **fields) -> StepRun:
    values = {"depth": 1, "frame": "feature", "attempt": 1, "started_at": T0, **fields}
    return StepRun(session_id=session_id, step_id=step_id, status=status, **values)


async def _two_sessions(services, repo: Path) -> tuple[str, str]:
    seeded = await seed(services, repo, tasks=2)
    one, two = [(await start(services, task)).id for task in seeded.tasks]
    return one, two


async def _add(services, *runs: StepRun) -> list[StepRun]:
    async with services.uow(write=True) as uow:
        stored = [replace(run, id=await uow.step_runs.add(run)) for run in runs]
        await uow.commit()
    return stored


async def test_added_runs_come_back_per_session_oldest_first(services, git_repo: Path):
    one, two = await _two_sessions(services, git_repo)
    stored = await _add(
        services,
        _run(one, "plan", StepStatus.SUCCEEDED, ended_at=T0 + timedelta(minutes=1), output_summary="planned"),
        _run(two, "plan"),
        _run(one, "build", attempt=1, agent_ids=("a-1",)),
        _run(one, "review", StepStatus.WAITING, depth=2, frame="checklist:review"),
    )
    assert len({run.id for run in stored}) == 4

    async with services.uow(write=False) as uow:
        assert [await uow.step_runs.get(run.id) for run in stored] == stored
        assert await uow.step_runs.of_session(one) == [stored[0], stored[2], stored[3]]
        assert await uow.step_runs.of_session(two) == [stored[1]]
        assert await uow.step_runs.of_session("no-such-session") == []


async def test_of_session_keeps_the_newest_runs_up_to_the_limit(services, git_repo: Path):
    one, two = await _two_sessions(services, git_repo)
    stored = await _add(services, *[_run(one, "build", attempt=n) for n in range(1, 6)], _run(two, "build"))

    async with services.uow(write=False) as uow:
        assert [r.attempt for r in await uow.step_runs.of_session(one, limit=3)] == [3, 4, 5]
        assert await uow.step_runs.of_session(one, limit=1) == [stored[4]]
        assert await uow.step_runs.of_session(one, limit=0) == []
        assert await uow.step_runs.of_session(one, limit=50) == stored[:5]


async def test_open_runs_are_those_still_running_or_waiting(services, git_repo: Path):
    one, two = await _two_sessions(services, git_repo)
    statuses = [StepStatus.RUNNING, StepStatus.FAILED, StepStatus.WAITING, StepStatus.SKIPPED, StepStatus.CANCELLED]
    stored = await _add(services, *[_run(one, f"s{n}", status) for n, status in enumerate(statuses)], _run(two, "x"))

    async with services.uow(write=False) as uow:
        assert await uow.step_runs.open_runs(one) == [stored[0], stored[2]]
        assert await uow.step_runs.open_runs(two) == [stored[5]]


async def test_update_overwrites_the_outcome_and_closes_the_run(services, git_repo: Path):
    one, _ = await _two_sessions(services, git_repo)
    [running, other] = await _add(services, _run(one, "build"), _run(one, "test"))
    ended = running.started_at + timedelta(minutes=5)
    finished = replace(
        running,
        status=StepStatus.FAILED,
        ended_at=ended,
        output_summary="2 failed",
        agent_ids=("a-1", "a-2"),
        error="exit code 1",
    )
    async with services.uow(write=True) as uow:
        await uow.step_runs.update(finished)
        await uow.commit()

    async with services.uow(write=False) as uow:
        assert await uow.step_runs.get(running.id) == finished
        assert await uow.step_runs.get(other.id) == other
        assert await uow.step_runs.open_runs(one) == [other]


async def test_finish_closes_an_open_run_once(services, git_repo: Path):
    one, _ = await _two_sessions(services, git_repo)
    [running, waiting, done] = await _add(
        services, _run(one, "build"), _run(one, "gate", StepStatus.WAITING), _run(one, "plan", StepStatus.SUCCEEDED)
    )
    ended = T0 + timedelta(minutes=3)
    async with services.uow(write=True) as uow:
        assert await uow.step_runs.finish(running.id, StepStatus.FAILED, ended, "2 failed", "exit code 1")
        assert await uow.step_runs.finish(waiting.id, StepStatus.APPROVED, ended, "ok", None)
        assert not await uow.step_runs.finish(running.id, StepStatus.SUCCEEDED, ended, "again", None)
        assert not await uow.step_runs.finish(done.id, StepStatus.FAILED, ended, "late", "late")
        for missing in (done.id + 1000, 0, -1, 2**40):
            assert not await uow.step_runs.finish(missing, StepStatus.FAILED, ended, "", None)
        await uow.commit()

    async with services.uow(write=False) as uow:
        failed = replace(running, status=StepStatus.FAILED, ended_at=ended, output_summary="2 failed")
        assert await uow.step_runs.get(running.id) == replace(failed, error="exit code 1")
        assert await uow.step_runs.get(waiting.id) == replace(waiting, status=StepStatus.APPROVED, ended_at=ended,
                                                             output_summary="ok")  # fmt: skip
        assert await uow.step_runs.get(done.id) == done
        assert await uow.step_runs.open_runs(one) == []


async def test_update_leaves_what_identifies_the_run(services, git_repo: Path):
    one, _ = await _two_sessions(services, git_repo)
    [run] = await _add(services, _run(one, "build"))
    moved = replace(run, step_id="elsewhere", depth=3, frame="other", attempt=9, started_at=T0 + timedelta(days=1))
    async with services.uow(write=True) as uow:
        await uow.step_runs.update(replace(moved, status=StepStatus.SUCCEEDED))
        await uow.commit()

    async with services.uow(write=False) as uow:
        assert await uow.step_runs.get(run.id) == replace(run, status=StepStatus.SUCCEEDED)


async def test_unknown_runs_raise_step_run_not_found(services, git_repo: Path):
    one, _ = await _two_sessions(services, git_repo)
    [run] = await _add(services, _run(one, "build"))
    async with services.uow(write=True) as uow:
        for missing in (run.id + 1000, 2**40, None):
            with pytest.raises(StepRunNotFound):
                await uow.step_runs.update(replace(run, id=missing, status=StepStatus.FAILED))
        for missing in (run.id + 1000, 0, -1, 2**40):
            with pytest.raises(StepRunNotFound):
                await uow.step_runs.get(missing)
        await uow.commit()

    async with services.uow(write=False) as uow:
        assert await uow.step_runs.get(run.id) == run


async def test_a_run_of_an_unknown_session_is_refused(services, git_repo: Path):
    await _two_sessions(services, git_repo)
    async with services.uow(write=True) as uow:
        with pytest.raises(SessionNotFound):
            await uow.step_runs.add(_run("no-such-session", "build"))


async def test_an_uncommitted_write_unit_leaves_nothing(services, git_repo: Path):
    one, _ = await _two_sessions(services, git_repo)
    [kept] = await _add(services, _run(one, "plan"))
    async with services.uow(write=True) as uow:
        added = await uow.step_runs.add(_run(one, "build"))
        await uow.step_runs.update(replace(kept, status=StepStatus.SUCCEEDED, ended_at=T0))
        assert [r.id for r in await uow.step_runs.of_session(one)] == [kept.id, added]

    async with services.uow(write=False) as uow:
        assert await uow.step_runs.of_session(one) == [kept]
        with pytest.raises(StepRunNotFound):
            await uow.step_runs.get(added)


async def test_unicode_output_and_agent_ids_round_trip(services, git_repo: Path):
    one, _ = await _two_sessions(services, git_repo)
    summary = "Überprüft ✓ — 測試 通過 🚀\nzweite Zeile\t'quoted' \"double\" \\ backslash"
    [run] = await _add(
        services, _run(one, "review", StepStatus.APPROVED, output_summary=summary, agent_ids=("a-1", "ä-2", "a-3"))
    )

    async with services.uow(write=False) as uow:
        got = await uow.step_runs.get(run.id)
    assert got == run
    assert (got.output_summary, got.agent_ids, got.status) == (summary, ("a-1", "ä-2", "a-3"), StepStatus.APPROVED)
    assert isinstance(got.agent_ids, tuple) and type(got.status) is StepStatus
    assert got.started_at.tzinfo is not None and got.started_at.utcoffset() == timedelta(0)
