"""What start-up recovery (and an operator's start) does with the states a crash leaves, on every backend.

tests/e2e/test_crash_points.py kills a real server at each named step boundary; these tests build the same states
with the engine's own steps (a transition applied without its effects is what a crash right after its commit
leaves) and check `SessionService.resume` carries them on, once, with a `session.resumed` event.
"""

from __future__ import annotations

from pathlib import Path

from taskgate.application.recovery import owes_work
from taskgate.application.sessions.commands import START_REQUESTED, CreateSession, FireTrigger, StartTask
from taskgate.domain.states import SessionState
from tests.builders import ACTOR, OPERATOR, fire, seed, start
from tests.conftest import wire


async def _created(services, task) -> str:
    """The state a start cut off right after `create` leaves (the CLI or the server killed there)."""
    return (await services.sessions.create_session(CreateSession(task.id, ACTOR, OPERATOR, start_requested=True))).id


async def _resumed_events(services, session_id: str) -> list[list[str]]:
    async with services.uow(write=False) as uow:
        events = await uow.events.list(session_id, limit=100)
    return [e["payload"]["actions"] for e in events if e["kind"] == "session.resumed"]


async def test_a_start_cut_off_after_create_is_carried_on_by_the_operators_next_start(services, git_repo):
    """Before: `session start` refused the task (SessionAlreadyActive) until someone cancelled the stuck session."""
    seeded = await seed(services, git_repo, tasks=1)
    sid = await _created(services, seeded.tasks[0])

    started = await services.sessions.start_task(StartTask(seeded.tasks[0].id, ACTOR, OPERATOR))

    assert (started.session.id, started.session.state) == (sid, SessionState.PLANNING)
    assert Path(started.session.worktree_path).is_dir() and START_REQUESTED not in started.session.state_data
    history = await services.sessions.history(sid)
    assert [(r.trigger, r.actor) for r in history] == [
        ("create", ACTOR), ("initialize", "system"), ("context_discovered", "system"), ("start", ACTOR)
    ]  # fmt: skip
    assert (await _resumed_events(services, sid))[0][0].startswith("initialize (created → initializing → ready")


async def test_restart_carries_a_cut_off_start_to_planning_once(sql_services, git_repo):
    seeded = await seed(sql_services, git_repo, tasks=1)
    sid = await _created(sql_services, seeded.tasks[0])
    restarted = wire(sql_services.backend, sql_services.database, sql_services.url)
    assert owes_work(await restarted.sessions.get(sid))

    done = await restarted.sessions.resume(sid)

    session = await restarted.sessions.get(sid)
    assert session.state == SessionState.PLANNING and not owes_work(session)
    assert done[-1] == "start (ready → planning)" and len(done) == 2, done
    start_row = (await restarted.sessions.history(sid))[-1]
    expected = ("start", "system", f"resumed: start requested by {ACTOR}")
    assert (start_row.trigger, start_row.actor, start_row.reason) == expected
    assert await restarted.sessions.resume(sid) == []  # nothing owed any more: nothing done, nothing written
    assert len(await _resumed_events(restarted, sid)) == 1


async def test_a_resumed_start_that_the_guards_refuse_is_tried_once_and_the_session_stays_ready(services, git_repo):
    seeded = await seed(services, git_repo, tasks=4)
    for task in seeded.tasks[:3]:
        await start(services, task)  # the WIP limit (3) is full
    sid = await _created(services, seeded.tasks[3])

    done = await services.sessions.resume(sid)

    session = await services.sessions.get(sid)
    assert session.state == SessionState.READY and START_REQUESTED not in session.state_data
    assert "start refused (wip_limit" in done[-1], done
    assert not owes_work(session) and await services.sessions.resume(sid) == []
    assert [r.outcome.value for r in await services.sessions.history(sid)][-1] == "blocked"


async def test_a_reject_with_auto_revert_cut_off_before_compensate_is_rolled_back_and_cleaned_up(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await fire(services, await start(services, seeded.tasks[0]), "plan_complete", "work_complete")
    cut = FireTrigger(session.id, "reject", ACTOR, changes={"compensation_plan": "auto_revert"})
    failed = (await services.sessions.transition(cut)).session  # the commit, without what follows it
    assert owes_work(failed) and Path(failed.worktree_path).is_dir()

    done = await services.sessions.resume(session.id)

    after = await services.sessions.get(session.id)
    assert after.state == SessionState.COMPLETED and not Path(failed.worktree_path).exists()
    assert done == ["compensate (failed → rolled_back → completed)"]
    assert [r.trigger for r in await services.sessions.history(session.id)][-2:] == ["compensate", "cleanup_done"]


async def test_states_that_owe_nothing_are_left_alone(services, git_repo):
    seeded = await seed(services, git_repo, tasks=2)
    planning = await start(services, seeded.tasks[0])
    manual = await fire(services, await start(services, seeded.tasks[1]), "plan_complete", "work_complete", "reject")
    before = await services.snapshot()
    for session in (planning, manual):
        assert not owes_work(session)
        assert await services.sessions.resume(session.id) == []
    assert await services.snapshot() == before
