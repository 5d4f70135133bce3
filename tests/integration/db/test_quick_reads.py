"""The CLI's engine-free reads (infrastructure/quick_reads.py) give what the services give, on the same database.

A SQLite file and a PostgreSQL database written through the real services (sessions in several states,
blockers, an agent, a pull request, open and answered questions) are read both ways, and every record must be
equal; a database the fast path cannot read as it is (another schema, missing) is `Unavailable`, never a wrong
answer.
"""

from __future__ import annotations

import asyncio
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
from tests.conftest import SQL_BACKENDS, make_git_repo, open_database, wire


async def reading(facts: dict, work):
    """`work(reads)` on a fresh snapshot, closed after, run in a thread: the PostgreSQL reader drives an event loop
    of its own (the CLI has none), which cannot run inside the test's."""

    def run():
        reads = QuickReads(facts)
        try:
            return work(reads)
        finally:
            reads.close()

    return await asyncio.to_thread(run)


@pytest.fixture(params=SQL_BACKENDS)
async def written(request: pytest.FixtureRequest, tmp_path: Path, git_repo: Path):
    """Services on a SQLite file or a PostgreSQL database holding a realistic history, and the facts the fast
    path reads it by."""
    database, url = await open_database(request.param, request, tmp_path)
    services = wire(request.param, database, url, wip_limit=10)
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

    def read_everything(reads: QuickReads) -> dict:
        return {
            "here": reads.project(None, str(project.root_path)),
            "by ref": [reads.project(ref, "/") for ref in (str(project.id), project.name, project.key.lower())],
            "active": reads.sessions(project.id, active=True),
            "all": reads.sessions(project.id, active=False),
            "session": reads.session(live.id[:6]),
            "ready": {limit: reads.ready_tasks(project.id, limit) for limit in (None, 1, 2, 100)},
        }

    got = await reading(facts, read_everything)
    assert got["here"] == await services.tracker.resolve_project(None)
    for ref, found in zip((str(project.id), project.name, project.key.lower()), got["by ref"], strict=True):
        assert found == await services.tracker.resolve_project(ref)
    assert got["active"] == await services.sessions.active_sessions(project.id)
    assert got["all"] == await services.sessions.list_sessions(project.id)
    assert len(got["all"]) == 3 and len(got["active"]) == 2
    session, agents, pull, asked = got["session"]
    assert session == await services.sessions.get(live.id)
    async with services.uow(write=False) as uow:
        assert agents == await uow.agents.of_session(live.id) and agents[0].started_at.tzinfo is UTC
        assert pull == await uow.pull_requests.get(live.id) and pull.poke is True
        assert asked == await uow.questions.open([live.id]) and [q.id for q in asked] == ["q-0", "q-2"]
    for limit, ready in got["ready"].items():
        assert ready == await services.tracker.ready_tasks(project.id, limit)
    ready = got["ready"][None]
    assert ready[0].title == "urgent" and all(t.title != "task 5" for t in ready)  # task 5 waits for task 0


def _refused(work) -> type[Exception] | str:
    try:
        work()
    except (InvalidInput, SessionNotFound, Unavailable) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "answered"


async def test_refusals_are_the_services_refusals(written, tmp_path: Path) -> None:
    services, project, _live, facts = written
    refused = await reading(facts, lambda reads: [
        _refused(lambda: reads.session("ab")),
        _refused(lambda: reads.session("ffffffff")),
        _refused(lambda: reads.project("NOPE", "/")),  # the full path words "not found" itself: Unavailable
        _refused(lambda: reads.ready_tasks(project.id, 100_001)),
    ])  # fmt: skip
    assert refused[0].startswith("InvalidInput") and "too short" in refused[0]
    assert refused[1].startswith("SessionNotFound") and refused[2].startswith("Unavailable")
    assert refused[3].startswith("InvalidInput")
    await services.tracker.init_project(str(make_git_repo(tmp_path / "other")))  # a second project: which one?
    # a new snapshot: the one above would not see it
    which = await reading(facts, lambda reads: (_refused(lambda: reads.project(None, "/")),
                                                reads.project(None, project.root_path).id))  # fmt: skip
    assert which[0].startswith("InvalidInput") and "2 projects exist" in which[0]
    assert which[1] == project.id  # unless the folder says
    with pytest.raises(ProjectNotFound):
        await services.tracker.resolve_project("NOPE")


def test_a_sqlite_file_not_at_the_head_or_missing_is_unavailable(tmp_path: Path, sqlite_template: Path) -> None:
    path = tmp_path / "t.db"
    path.write_bytes(sqlite_template.read_bytes())
    facts = {"database_url": f"sqlite:///{path}", "busy_timeout_ms": 100, "live_tracker": False}
    QuickReads(facts).close()  # at the head: readable
    with pytest.raises(Unavailable, match="no database"):
        SqliteReads(tmp_path / "missing.db", 100)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0001'")
    with pytest.raises(Unavailable, match=f"is not {SCHEMA_HEAD}"):
        SqliteReads(path, 100)
    with pytest.raises(Unavailable, match="not a PostgreSQL URL"):
        QuickReads(replace_url(facts, "mysql+aiomysql://x@127.0.0.1/x"))


async def test_a_live_tracker_leaves_ready_tasks_to_the_full_path(written) -> None:
    _services, project, _live, facts = written
    live = {**facts, "live_tracker": True}
    refused = await reading(live, lambda reads: _refused(lambda: reads.ready_tasks(project.id, 10)))
    assert refused.startswith("Unavailable") and "read live" in refused


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
