"""The CLI's engine-free reads (infrastructure/quick_reads.py) give what the services give, on the same database.

A SQLite file written through the real services (sessions in several states, blockers, an agent, a pull request,
open and answered questions) is read both ways, and every record must be equal; a database the fast path cannot
read as it is (another schema, missing) is `Unavailable`, never a wrong answer.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from taskgate.application.forge.ports import PullRequestRecord
from taskgate.application.trackers.builtin import AddTask
from taskgate.domain.entities import Agent, AgentStatus
from taskgate.domain.errors import InvalidInput, ProjectNotFound, SessionNotFound
from taskgate.domain.questions import Question, QuestionKind, QuestionStatus
from taskgate.infrastructure.db.fast_reads import SqliteReads, Unavailable
from taskgate.infrastructure.db.read_sql import SCHEMA_HEAD
from taskgate.infrastructure.quick_reads import QuickReads
from tests.builders import fire, seed, start
from tests.conftest import make_git_repo, open_database, wire


@pytest.fixture
async def written(request: pytest.FixtureRequest, tmp_path: Path, git_repo: Path):
    """Services on a SQLite file holding a realistic history, and the facts the fast path reads it by."""
    database, url = await open_database("sqlite", request, tmp_path)
    services = wire("sqlite", database, url, wip_limit=10)
    seeded = await seed(services, git_repo, tasks=6, blocked_by_first=True)
    project = seeded.project
    await services.tracker.add_task(AddTask(project.id, "urgent", plan_id=seeded.plan.id, priority=0))
    live = await start(services, seeded.tasks[0])
    await fire(services, live, "plan_complete")
    done = await start(services, seeded.tasks[1])
    await fire(services, done, "cancel")
    await start(services, seeded.tasks[2])
    now = datetime.now(UTC).replace(microsecond=123456)
    async with services.uow(write=True) as uow:
        await uow.agents.add(Agent("a-1", live.id, "coder", ["claude", "-p"], AgentStatus.RUNNING, started_at=now))
        pull = PullRequestRecord(live.id, project.id, "tg/x", "main", 7, "http://f/7",
                                 observation={"checks": "green"}, poke=True, updated_at=now)  # fmt: skip
        await uow.pull_requests.save(pull)
        for n, status in enumerate([QuestionStatus.OPEN, QuestionStatus.ANSWERED, QuestionStatus.OPEN]):
            await uow.questions.add(Question(f"q-{n}", live.id, QuestionKind.QUESTION, f"colour {n}?", "agent:t",
                                             now + timedelta(seconds=n), now + timedelta(hours=1),
                                             choices=("red", "blue"), status=status))  # fmt: skip
        await uow.commit()
    facts = {"database_url": url, "busy_timeout_ms": 5000, "live_tracker": False}
    yield services, project, live, facts
    await database.dispose()


async def test_every_read_gives_what_the_services_give(written) -> None:
    services, project, live, facts = written
    reads = QuickReads(facts)
    try:
        assert reads.project(None, str(project.root_path)) == await services.tracker.resolve_project(None)
        for ref in (str(project.id), project.name, project.key.lower()):
            assert reads.project(ref, "/") == await services.tracker.resolve_project(ref)
        assert reads.sessions(project.id, active=True) == await services.sessions.active_sessions(project.id)
        assert reads.sessions(project.id, active=False) == await services.sessions.list_sessions(project.id)
        assert len(reads.sessions(project.id, active=False)) == 3 and len(reads.sessions(project.id, active=True)) == 2
        session, agents, pull, asked = reads.session(live.id[:6])
        assert session == await services.sessions.get(live.id)
        async with services.uow(write=False) as uow:
            assert agents == await uow.agents.of_session(live.id) and agents[0].started_at.tzinfo is UTC
            assert pull == await uow.pull_requests.get(live.id) and pull.poke is True
            assert asked == await uow.questions.open([live.id]) and [q.id for q in asked] == ["q-0", "q-2"]
        for limit in (None, 1, 2, 100):
            assert reads.ready_tasks(project.id, limit) == await services.tracker.ready_tasks(project.id, limit)
        ready = reads.ready_tasks(project.id, None)
        assert ready[0].title == "urgent" and all(t.title != "task 5" for t in ready)  # task 5 waits for task 0
    finally:
        reads.close()


async def test_refusals_are_the_services_refusals(written, tmp_path: Path) -> None:
    services, project, _live, facts = written
    reads = QuickReads(facts)
    try:
        with pytest.raises(InvalidInput, match="too short"):
            reads.session("ab")
        with pytest.raises(SessionNotFound):
            reads.session("ffffffff")
        with pytest.raises(Unavailable):  # the full path words "not found" itself
            reads.project("NOPE", "/")
        with pytest.raises(InvalidInput):
            reads.ready_tasks(project.id, 100_001)
    finally:
        reads.close()
    await services.tracker.init_project(str(make_git_repo(tmp_path / "other")))  # a second project: which one?
    reads = QuickReads(facts)  # a new snapshot: the one above would not see it
    try:
        with pytest.raises(InvalidInput, match="2 projects exist"):
            reads.project(None, "/")
        assert reads.project(None, project.root_path).id == project.id  # unless the folder says
    finally:
        reads.close()
    with pytest.raises(ProjectNotFound):
        await services.tracker.resolve_project("NOPE")


async def test_a_database_not_at_the_head_or_missing_is_unavailable(written, tmp_path: Path) -> None:
    _services, _project, _live, facts = written
    path = Path(facts["database_url"].removeprefix("sqlite:///"))
    with pytest.raises(Unavailable, match="no database"):
        SqliteReads(tmp_path / "missing.db", 100)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0001'")
    with pytest.raises(Unavailable, match=f"is not {SCHEMA_HEAD}"):
        SqliteReads(path, 100)
    with pytest.raises(Unavailable, match="not the embedded SQLite"):
        QuickReads(replace_url(facts, "postgresql+asyncpg://x@127.0.0.1/x"))


async def test_a_live_tracker_leaves_ready_tasks_to_the_full_path(written) -> None:
    _services, project, _live, facts = written
    reads = QuickReads({**facts, "live_tracker": True})
    try:
        with pytest.raises(Unavailable, match="read live"):
            reads.ready_tasks(project.id, 10)
    finally:
        reads.close()


def replace_url(facts: dict, url: str) -> dict:
    return {**facts, "database_url": url}


def test_reads_see_one_snapshot_while_a_writer_holds_the_database(tmp_path: Path, sqlite_template: Path) -> None:
    """A read command is never blocked by a writer (WAL), and all of its reads see one commit."""
    path = tmp_path / "t.db"
    path.write_bytes(sqlite_template.read_bytes())
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    reads = SqliteReads(path, 100)
    try:
        assert reads.rows("projects") == []
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO projects (name, key, root_path, config, task_seq, created_at) "
                       "VALUES ('p', 'P', '/p', '{}', 0, '2026-11-29 10:00:00.000000')")  # fmt: skip
        assert reads.rows("projects") == []  # the writer holds its lock; the reader answers at once
        writer.execute("COMMIT")
        assert reads.rows("projects") == []  # the same snapshot until the read transaction ends
    finally:
        reads.close()
        writer.close()
    fresh = SqliteReads(path, 100)
    try:
        assert [r["key"] for r in fresh.rows("projects")] == ["P"]
        assert fresh.rows("projects")[0]["created_at"] == datetime(2026, 11, 29, 10, tzinfo=UTC)
    finally:
        fresh.close()
