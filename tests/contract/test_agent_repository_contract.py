"""AgentRepository: the SQL adapters (SQLite, PostgreSQL) and the in-memory fake answer alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from taskgate.domain.entities import Agent, AgentStatus
from tests.builders import seed, start

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _agent(agent_id: str, session_id: str, **fields) -> Agent:
    return Agent(id=agent_id, session_id=session_id, agent_type="codex", command=["codex", "exec"], **fields)


async def test_agents_are_stored_found_stale_and_finished_alike(services, git_repo: Path):
    seeded = await seed(services, git_repo, tasks=2)
    one, two = [(await start(services, task)).id for task in seeded.tasks]
    minute = timedelta(minutes=1)
    agents = [
        _agent("a-1", one, status=AgentStatus.RUNNING, started_at=T0 - 60 * minute, heartbeat_at=T0 - 2 * minute),
        _agent("a-2", one, status=AgentStatus.RUNNING, started_at=T0 - 60 * minute, heartbeat_at=T0 - 20 * minute),
        _agent("a-3", two, status=AgentStatus.RUNNING, started_at=T0 - 30 * minute),
        _agent("a-4", two, status=AgentStatus.RUNNING),  # never started: nothing says when it was alive
        _agent("a-5", two, status=AgentStatus.COMPLETED, started_at=T0 - 90 * minute, exit_code=0, run=3),
    ]
    async with services.uow(write=True) as uow:
        for agent in agents:
            await uow.agents.add(agent)
        await uow.commit()

    async with services.uow(write=False) as uow:
        stale = await uow.agents.stale(T0 - 10 * minute)
        assert {a.id for a in stale} == {"a-2", "a-3"} and stale == sorted(stale, key=lambda a: (a.session_id, a.id))
        assert [a.id for a in await uow.agents.stale(T0 - 40 * minute)] == []
        assert await uow.agents.of_session(two) == agents[2:]
        assert await uow.agents.many(["a-5", "nope", "a-1"]) == [agents[4], agents[0]]
        assert await uow.agents.many([]) == []
        assert [await uow.agents.last_run(s) for s in (one, two, "no-such-session")] == [1, 3, 0]

    async with services.uow(write=True) as uow:
        assert await uow.agents.heartbeat("a-2", T0)
        assert not await uow.agents.heartbeat("nope", T0)
        await uow.agents.set_status("a-3", AgentStatus.FAILED, T0)
        await uow.commit()

    async with services.uow(write=False) as uow:
        assert await uow.agents.stale(T0 - 10 * minute) == []
        failed = (await uow.agents.of_session(two))[0]
        assert (failed.status, failed.completed_at) == (AgentStatus.FAILED, T0)
        assert (await uow.agents.of_session(one))[1].heartbeat_at == T0


async def test_the_report_an_agent_cli_gave_is_stored_and_updated_as_json_or_null(services, git_repo: Path):
    seeded = await seed(services, git_repo, tasks=1)
    session = (await start(services, seeded.tasks[0])).id
    report = {"final_message": "Done: [red]x[/red] \u2713", "turns": 4, "input_tokens": 400, "output_tokens": 80,
              "cache_read_tokens": 0, "cost_usd": 0.0032, "is_error": False, "error": None}  # fmt: skip
    async with services.uow(write=True) as uow:
        await uow.agents.add(_agent("r-1", session, status=AgentStatus.RUNNING))
        await uow.agents.add(_agent("r-2", session, status=AgentStatus.COMPLETED, report=report))
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert [a.report for a in await uow.agents.of_session(session)] == [None, report]
    async with services.uow(write=True) as uow:
        first = (await uow.agents.many(["r-1"]))[0]
        first.report, first.status = {**report, "is_error": True, "error": "API Error: 500"}, AgentStatus.FAILED
        await uow.agents.update(first)
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert (await uow.agents.many(["r-1"]))[0].report == {**report, "is_error": True, "error": "API Error: 500"}


async def test_an_agents_end_is_written_once_and_its_signal_once(services, git_repo: Path):
    """Two stoppers of one agent: the first end written wins (`only_unended`), and the first signal recorded stays."""
    seeded = await seed(services, git_repo, tasks=1)
    session = (await start(services, seeded.tasks[0])).id
    running = _agent("s-1", session, status=AgentStatus.RUNNING, pid=4242, pgid=4242, process_start=123456789012)
    async with services.uow(write=True) as uow:
        await uow.agents.add(running)
        await uow.commit()
    async with services.uow(write=True) as uow:
        first = _agent("s-1", session, status=AgentStatus.CANCELLED, pid=4242, pgid=4242, process_start=123456789012)
        second = _agent("s-1", session, status=AgentStatus.FAILED, pid=4242, exit_code=-15, error="lost")
        assert await uow.agents.update(first, only_unended=True)
        assert not await uow.agents.update(second, only_unended=True)
        assert not await uow.agents.heartbeat("s-1", T0)  # ended: its supervisor is told to stop
        assert await uow.agents.record_signal("s-1", "SIGKILL")
        assert not await uow.agents.record_signal("s-1", "SIGTERM")
        await uow.commit()
    async with services.uow(write=False) as uow:
        [stored] = await uow.agents.many(["s-1"])
    assert (stored.status, stored.ended_by, stored.pgid, stored.process_start) == (
        AgentStatus.CANCELLED, "SIGKILL", 4242, 123456789012,
    )  # fmt: skip


async def test_ended_agents_and_every_agent_of_a_project_are_listed_with_their_task(services, git_repo: Path):
    seeded = await seed(services, git_repo, tasks=2)
    one, two = [await start(services, task) for task in seeded.tasks]
    hour = timedelta(hours=1)
    async with services.uow(write=True) as uow:
        await uow.agents.add(_agent("e-1", one.id, status=AgentStatus.COMPLETED, completed_at=T0, report={"turns": 1}))
        await uow.agents.add(_agent("e-2", two.id, status=AgentStatus.FAILED, completed_at=T0 - hour))
        await uow.agents.add(_agent("e-3", two.id, status=AgentStatus.RUNNING))  # not ended: not listed
        await uow.commit()
    async with services.uow(write=False) as uow:
        listed = await uow.agents.ended()
        assert [(a.id, task) for a, task in listed] == [("e-2", two.task_id), ("e-1", one.task_id)]
        assert listed[1][0].report == {"turns": 1}
        assert [a.id for a, _ in await uow.agents.ended(since=T0)] == ["e-1"]
        assert [a.id for a, _ in await uow.agents.ended(project_id=one.project_id)] == ["e-1", "e-2"][::-1]
        assert await uow.agents.ended(project_id=one.project_id + 1000) == []
        assert [(a.id, task) for a, task in await uow.agents.of_project(one.project_id)] == [
            ("e-1", one.task_id), ("e-2", two.task_id), ("e-3", two.task_id),
        ]  # fmt: skip
        assert await uow.agents.of_project(one.project_id + 1000) == []
        assert (await uow.projects.get(one.project_id, lock=False)).id == one.project_id


async def test_the_conversation_an_agent_had_and_the_one_it_continued_are_stored_and_updated(services, git_repo: Path):
    seeded = await seed(services, git_repo, tasks=1)
    session = (await start(services, seeded.tasks[0])).id
    queued = _agent("c-2", session, status=AgentStatus.QUEUED, run=2, resumed_from="thread-1")
    async with services.uow(write=True) as uow:
        await uow.agents.add(queued)
        await uow.commit()
    fresh = _agent("c-2", session, status=AgentStatus.COMPLETED, run=2, conversation_id="thread-2",
                   resume_failed="could not continue conversation thread-1: no rollout found")  # fmt: skip
    async with services.uow(write=True) as uow:
        assert [a.resumed_from for a in await uow.agents.many(["c-2"])] == ["thread-1"]
        assert await uow.agents.update(fresh, only_unended=True)
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert await uow.agents.of_session(session) == [fresh]
