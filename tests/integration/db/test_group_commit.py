"""Group commit on SQLite (infrastructure/db/commit_group.py): concurrent write units of work share one COMMIT,
each in its own savepoint, and none is acknowledged before the shared COMMIT is durable.

- members' work is all there after the shared commit, in fewer COMMITs than members;
- a member that fails (first or later) takes only its own work with it;
- a COMMIT that fails acknowledges no member of its group;
- a queued writer cancelled before its turn does not strand the group;
- real transitions share commits and every session's log still accounts for every version;
- a process SIGKILLed just before a group's COMMIT loses the whole group (none of it acknowledged), just after
  it keeps the whole group, and at random moments never loses an acknowledged transition nor leaves half of one.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from taskgate.application.sessions.commands import FireTrigger, StartTask
from taskgate.application.sessions.reads import replay
from taskgate.application.trackers.builtin import AddTask
from taskgate.domain.entities import Outcome
from taskgate.domain.errors import StorageError
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from tests.conftest import Services, wire

pytestmark = pytest.mark.timeout(180)

WORKER = Path(__file__).with_name("_group_commit_worker.py")
NOW = "2026-11-25T00:00:00+00:00"


@pytest.fixture
async def db(sqlite_template: Path, tmp_path: Path):
    target = tmp_path / "taskgate.db"
    shutil.copy(sqlite_template, target)
    database = Database(f"sqlite:///{target}")
    yield database
    await database.dispose()


async def write_event(db: Database, name: str, *, fail: bool = False, yields: int = 1) -> str:
    """One write unit of work appending event `name`; yields to the loop mid-way so that writers queue."""
    from datetime import UTC, datetime

    async with SqlAlchemyUnitOfWork(db, write=True) as uow:
        await uow.events.append(name, datetime.now(UTC), {"by": "test"}, None)
        for _ in range(yields):
            await asyncio.sleep(0)
        if fail:
            raise RuntimeError(f"{name} fails after writing")
        await uow.commit()
    return name


async def event_names(db: Database) -> set[str]:
    """The events as a new reader (another connection) sees them: only what was committed."""
    async with db.connect() as conn:
        await conn.begin()
        rows = (await conn.execute(text("SELECT kind FROM events"))).all()
    return {r[0] for r in rows}


async def test_concurrent_writers_share_commits_and_every_one_is_durable(db: Database) -> None:
    names = [f"w{i}" for i in range(40)]
    done = await asyncio.gather(*(write_event(db, n) for n in names))
    assert done == names
    assert set(names) <= await event_names(db)
    assert db.groups is not None
    assert db.groups.acknowledged == 40
    assert db.groups.commits < 40 / 2, f"{db.groups.commits} COMMITs for 40 queued writers: no grouping"


async def test_a_failing_member_takes_only_its_own_work_with_it(db: Database) -> None:
    failing = {"w0", "w5", "w9"}  # the first member (no savepoint), one in the middle, the last
    names = [f"w{i}" for i in range(10)]
    results = await asyncio.gather(*(write_event(db, n, fail=n in failing) for n in names), return_exceptions=True)
    for name, result in zip(names, results, strict=True):
        if name in failing:
            assert isinstance(result, RuntimeError) and name in str(result)
        else:
            assert result == name
    stored = await event_names(db)
    assert stored >= set(names) - failing
    assert not stored & failing


async def test_a_commit_that_fails_acknowledges_no_member_of_its_group(db: Database) -> None:
    """A deferred foreign key is checked at COMMIT: one member's bad row makes the shared COMMIT fail."""

    async def bad_row() -> str:
        async with SqlAlchemyUnitOfWork(db, write=True) as uow:
            conn = uow.events._conn  # raw SQL: no repository writes a dangling row
            await conn.exec_driver_sql("PRAGMA defer_foreign_keys = ON")
            await conn.exec_driver_sql(
                "INSERT INTO transition_log (session_id, trigger, from_state, to_state, outcome, actor, "
                "guard_results, session_version, at) VALUES ('no-such-session', 'start', 'ready', 'planning', "
                f"'applied', 'test', '[]', 2, '{NOW}')"
            )
            await asyncio.sleep(0)
            await uow.commit()
        return "bad"

    names = [f"w{i}" for i in range(8)]
    calls = [write_event(db, n) for n in names[:4]] + [bad_row()] + [write_event(db, n) for n in names[4:]]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, StorageError) and "FOREIGN KEY" in str(r) for r in results), results
    assert not (await event_names(db)) & set(names)
    assert await write_event(db, "after") == "after"  # the handle is usable again
    assert "after" in await event_names(db)


async def test_a_queued_writer_cancelled_before_its_turn_does_not_strand_the_group(db: Database) -> None:
    assert db.groups is not None
    first = await db.groups.join()
    from datetime import UTC, datetime

    await first.conn.exec_driver_sql(
        "INSERT INTO events (kind, at, payload) VALUES ('held', ?, '{}')", (datetime.now(UTC).isoformat(),)
    )
    queued = asyncio.create_task(write_event(db, "never"))
    await asyncio.sleep(0)  # `queued` now waits for the turn
    asyncio.get_running_loop().call_soon(queued.cancel)  # runs before `queued` can take the turn handed to it
    await asyncio.wait_for(db.groups.commit(first), timeout=5)  # hands the group on, then waits for its COMMIT
    with pytest.raises(asyncio.CancelledError):
        await queued
    names = await event_names(db)
    assert "held" in names and "never" not in names


async def seed_planning_sessions(svc: Services, repo: Path, count: int) -> list[str]:
    """`count` sessions in `planning`, each of its own task and plan (so no WIP limit is near)."""
    project = await svc.tracker.init_project(str(repo))
    ids = []
    for i in range(count):
        plan = await svc.tracker.add_plan(project.id, f"plan {i}")
        task = await svc.tracker.add_task(AddTask(project.id, f"task {i}", plan_id=plan.id))
        ids.append((await svc.sessions.start_task(StartTask(task.id, "alice"))).session.id)
    return ids


async def check_logs(db: Database, session_ids: list[str]) -> dict[str, int]:
    """Every session's applied rows carry versions 1..version and replay to its state, and each applied
    transition has its event: nothing is half there. Returns each session's version."""
    svc = wire("sqlite", db, None)
    versions = {}
    for sid in session_ids:
        session = await svc.sessions.get(sid)
        rows = await svc.sessions.history(sid, limit=10_000)
        applied = sorted((r for r in rows if r.outcome == Outcome.APPLIED), key=lambda r: r.seq or 0)
        assert [r.session_version for r in applied] == list(range(1, session.version + 1)), sid
        assert replay(applied) == session.state
        async with db.connect() as conn:
            await conn.begin()
            moved = (
                await conn.execute(
                    text("SELECT count(*) FROM events WHERE session_id = :s AND kind = 'session.transition'"),
                    {"s": sid},
                )
            ).scalar_one()
        assert moved == len(applied) - 1, f"{sid}: {len(applied)} applied rows, {moved} transition events"
        versions[sid] = session.version
    return versions


async def test_two_hundred_concurrent_transitions_share_commits_and_lose_no_update(
    db: Database, git_repo: Path
) -> None:
    svc = wire("sqlite", db, None, wip_limit=1000)
    ids = await seed_planning_sessions(svc, git_repo, 50)
    assert db.groups is not None
    commits_before, acked_before = db.groups.commits, db.groups.acknowledged
    triggers = ["suspend", "resume", "suspend", "resume"]

    async def walk(sid: str) -> None:
        for trigger in triggers:
            await svc.sessions.fire(FireTrigger(sid, trigger, "alice"))

    await asyncio.gather(*(walk(s) for s in ids))
    acked = db.groups.acknowledged - acked_before
    commits = db.groups.commits - commits_before
    assert acked == 200
    assert commits < acked / 2, f"{commits} COMMITs for {acked} concurrent transitions"
    versions = await check_logs(db, ids)
    assert set(versions.values()) == {4 + 4}  # create, initialize, context_discovered, start + the 4 fired


# -- crashes ----------------------------------------------------------------------------------------------------


def run_worker(url: str, session_ids: list[str], crash: str, kill_after_s: float | None) -> list[str]:
    """Start the worker, let it run (until it kills itself, or kill it after `kill_after_s`), return its lines."""
    spec = {"url": url, "sessions": session_ids, "crash": crash}
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
    if kill_after_s is not None:
        time.sleep(kill_after_s)
        proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"worker exited {proc.returncode}: {err[-2000:]}"
    return out.splitlines()


def acknowledged(lines: list[str]) -> dict[str, int]:
    """The highest acknowledged version of each session."""
    acks: dict[str, int] = {}
    for line in lines:
        if line.startswith("ack "):
            _, sid, version = line.split()
            acks[sid] = max(acks.get(sid, 0), int(version))
    return acks


async def max_seq(db: Database) -> int:
    async with db.connect() as conn:
        await conn.begin()
        return (await conn.execute(text("SELECT max(seq) FROM transition_log"))).scalar_one()


@pytest.mark.parametrize("crash", ["before_commit", "after_commit", "random"])
async def test_a_kill_at_a_group_boundary_loses_no_acknowledged_transition_and_leaves_none_half_there(
    sqlite_template: Path, tmp_path: Path, git_repo: Path, crash: str
) -> None:
    path = tmp_path / "crash.db"
    shutil.copy(sqlite_template, path)
    url = f"sqlite:///{path}"
    db = Database(url)
    try:
        ids = await seed_planning_sessions(wire("sqlite", db, None, wip_limit=1000), git_repo, 30)
    finally:
        await db.dispose()
    rounds = 3 if crash == "random" else 1
    for round_ in range(rounds):
        kill_after = random.Random(round_).uniform(0.3, 1.2) if crash == "random" else None
        lines = await asyncio.to_thread(run_worker, url, ids, crash, kill_after)
        acks = acknowledged(lines)
        assert acks, f"nothing was acknowledged before the kill: {lines[:5]}"
        db = Database(url)  # a restart: a new handle on the file the killed process left
        try:
            versions = await check_logs(db, ids)
            for sid, version in acks.items():
                assert versions[sid] >= version, f"acknowledged version {version} of {sid} is lost"
            seq = await max_seq(db)
            if crash == "before_commit":
                doomed = int(next(line for line in lines if line.startswith("doomed ")).split()[1])
                assert seq < doomed, "rows of the group killed before its COMMIT are in the database"
            elif crash == "after_commit":
                committed = int(next(line for line in lines if line.startswith("committed ")).split()[1])
                assert seq == committed, "the group committed just before the kill is not all there"
                ahead = [sid for sid in ids if versions[sid] > acks.get(sid, 4)]  # 4: the seeded version
                assert len(ahead) >= 3, "the group committed before the kill (3+ members, none acknowledged) is missing"
        finally:
            await db.dispose()
