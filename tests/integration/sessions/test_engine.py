"""The session engine's behaviour, identical on the in-memory fake, a SQLite file and PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from taskgate.application.sessions.commands import CreateSession, FireTrigger, StartTask
from taskgate.application.sessions.effects import NoEffects
from taskgate.application.sessions.ports import TransitionQuery
from taskgate.application.trackers.builtin import AddTask
from taskgate.domain.entities import PlanStatus, TaskStatus
from taskgate.domain.errors import (
    ConcurrentModification,
    Forbidden,
    InvalidInput,
    InvalidTransition,
    OperatorNotFound,
    PolicyViolation,
    ProjectArchived,
    SessionAlreadyActive,
    SessionNotFound,
    TaskNotFound,
)
from taskgate.domain.states import SessionState, Trigger
from tests.builders import ACTOR, HAPPY_PATH, OPERATOR, fire, seed, start


async def test_a_session_walks_the_happy_path_and_its_task_and_plan_follow(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    assert session.state == SessionState.PLANNING and session.version == 4 and session.started_at
    [task] = await services.tracker.list_tasks(seeded.project.id)
    assert task.status == TaskStatus.IN_PROGRESS
    assert (await services.tracker.list_plans(seeded.project.id))[0].status == PlanStatus.IN_PROGRESS

    session = await fire(services, session, *HAPPY_PATH)
    assert session.state == SessionState.COMPLETED and session.version == 9 and session.completed_at
    [task] = await services.tracker.list_tasks(seeded.project.id)
    assert task.status == TaskStatus.COMPLETED
    assert (await services.tracker.list_plans(seeded.project.id))[0].status == PlanStatus.CLOSED


async def test_task_status_follows_each_state_of_its_session(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    expected = {
        "plan_complete": "in_progress",
        "work_complete": "pending_review",
        "approve": "approved",
        "merge": "completed",  # cleanup_done follows merge automatically
    }
    for trigger, status in expected.items():
        session = await fire(services, session, trigger)
        assert (await services.tracker.list_tasks(seeded.project.id))[0].status.value == status, trigger


async def test_a_rejected_session_rolls_back_and_reopens_its_task_for_a_new_session(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await fire(services, await start(services, seeded.tasks[0]), "plan_complete", "work_complete")
    session = await fire(services, session, "reject", "compensate", reason="wrong approach")
    assert session.state == SessionState.COMPLETED
    task = (await services.tracker.list_tasks(seeded.project.id))[0]
    assert task.status == TaskStatus.OPEN
    assert [t.id for t in await services.tracker.ready_tasks(seeded.project.id)] == [task.id]
    assert (await start(services, task)).state == SessionState.PLANNING
    assert (await services.tracker.list_plans(seeded.project.id))[0].status == PlanStatus.IN_PROGRESS


async def test_suspend_remembers_the_prior_state_and_resume_returns_to_it(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await fire(services, await start(services, seeded.tasks[0]), "plan_complete", "work_complete")
    suspended = await fire(services, session, "suspend")
    assert suspended.state == SessionState.SUSPENDED and suspended.prior_state == SessionState.VERIFYING
    resumed = await fire(services, suspended, "resume")
    assert resumed.state == SessionState.VERIFYING and resumed.prior_state is None


async def test_the_wip_limit_refuses_a_fourth_start_and_logs_it_as_blocked(services, git_repo):
    seeded = await seed(services, git_repo, tasks=4)
    for task in seeded.tasks[:3]:
        await start(services, task)
    with pytest.raises(PolicyViolation) as refused:
        await start(services, seeded.tasks[3])
    assert refused.value.violations[0].policy == "wip_limit" and "stays ready" in str(refused.value)
    [blocked] = await services.audit.transitions(TransitionQuery(outcome="blocked"))
    assert blocked.trigger == "start" and blocked.from_state == blocked.to_state == "ready"
    assert blocked.guard_results[0]["policy"] == "wip_limit" and not blocked.guard_results[0]["passed"]
    waiting = await services.sessions.get(blocked.session_id)
    assert waiting.state == SessionState.READY and waiting.version == 3


async def test_a_ready_session_starts_once_a_slot_is_freed(services, git_repo):
    seeded = await seed(services, git_repo, tasks=4)
    started = [await start(services, task) for task in seeded.tasks[:3]]
    first = started[0]
    with pytest.raises(PolicyViolation):
        await start(services, seeded.tasks[3])
    await fire(services, first, "suspend")
    assert (await start(services, seeded.tasks[3])).state == SessionState.PLANNING
    with pytest.raises(PolicyViolation, match="wip_limit"):
        await fire(services, await services.sessions.get(first.id), "resume")


async def test_a_blocked_task_cannot_start_until_its_blocker_completes(services, git_repo):
    seeded = await seed(services, git_repo, tasks=2, blocked_by_first=True)
    blocker, blocked = seeded.tasks
    assert [t.id for t in await services.tracker.ready_tasks(seeded.project.id)] == [blocker.id]
    with pytest.raises(PolicyViolation, match="task_unblocked"):
        await start(services, blocked)
    await fire(services, await start(services, blocker), *HAPPY_PATH)
    assert (await start(services, blocked)).state == SessionState.PLANNING


async def test_one_task_has_one_active_session(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    await start(services, seeded.tasks[0])
    with pytest.raises(SessionAlreadyActive, match="planning"):
        await start(services, seeded.tasks[0])
    with pytest.raises(PolicyViolation, match="one_active_session_per_task"):
        await services.sessions.create_session(CreateSession(seeded.tasks[0].id, ACTOR, OPERATOR))


@pytest.mark.parametrize(
    ("action", "error"),
    [
        ("unknown_task", TaskNotFound),
        ("unknown_session", SessionNotFound),
        ("unknown_trigger", InvalidInput),
        ("trigger_not_allowed", InvalidTransition),
        ("stale_version", ConcurrentModification),
        ("blocked_task", PolicyViolation),
        ("unknown_operator", OperatorNotFound),
        ("archived_project", ProjectArchived),
        ("naive_timestamp", InvalidInput),
        ("before_creation", InvalidInput),
        ("bad_priority", InvalidInput),
        ("unknown_blocker", TaskNotFound),
    ],
)
async def test_bad_input_raises_a_named_error_and_writes_nothing(services, git_repo, tmp_path, action, error):
    seeded = await seed(services, git_repo, tasks=2, blocked_by_first=True)
    session = await start(services, seeded.tasks[0])
    other = tmp_path / "other"
    other.mkdir()
    await services.tracker.ensure_operator("archivist")
    before = await services.snapshot()
    calls = {
        "unknown_task": lambda: services.sessions.start_task(StartTask("NOPE-1", ACTOR, OPERATOR)),
        "unknown_session": lambda: services.sessions.fire(FireTrigger("no-such-session", "start", ACTOR)),
        "unknown_trigger": lambda: services.sessions.fire(FireTrigger(session.id, "explode", ACTOR)),
        "trigger_not_allowed": lambda: services.sessions.fire(FireTrigger(session.id, "merge", ACTOR)),
        "stale_version": lambda: services.sessions.fire(FireTrigger(session.id, "plan_complete", ACTOR, None, 2)),
        "blocked_task": lambda: services.sessions.start_task(StartTask(seeded.tasks[1].id, ACTOR, OPERATOR)),
        "unknown_operator": lambda: services.sessions.create_session(CreateSession(seeded.tasks[1].id, ACTOR, "bob")),
        "archived_project": lambda: services.tracker.archive_project(seeded.project.id),
        "naive_timestamp": lambda: services.sessions.state_at(session.id, datetime(2026, 1, 1)),
        "before_creation": lambda: services.sessions.state_at(session.id, session.created_at - timedelta(days=1)),
        "bad_priority": lambda: services.tracker.add_task(AddTask(seeded.project.id, "x", priority=7)),
        "unknown_blocker": lambda: services.tracker.add_task(AddTask(seeded.project.id, "x", blocked_by=["NOPE-9"])),
    }
    if action == "archived_project":  # archiving is refused while sessions are active: a write refused
        error = InvalidInput
    with pytest.raises(error) as raised:
        await calls[action]()
    assert str(raised.value)
    assert await services.snapshot() == before


async def test_an_archived_project_refuses_new_plans_tasks_and_sessions(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    await services.tracker.archive_project(seeded.project.id)
    before = await services.snapshot()
    with pytest.raises(ProjectArchived):
        await services.tracker.add_plan(seeded.project.id, "Phase 2")
    with pytest.raises(ProjectArchived):
        await services.tracker.add_task(AddTask(seeded.project.id, "late"))
    with pytest.raises(ProjectArchived):
        await start(services, seeded.tasks[0])
    assert await services.snapshot() == before


async def test_history_lists_applied_and_blocked_rows_oldest_first_with_a_limit(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await fire(services, await start(services, seeded.tasks[0]), "plan_complete", "suspend")
    full = await services.sessions.history(session.id)
    assert [r.trigger for r in full] == [
        "create",
        "initialize",
        "context_discovered",
        "start",
        "plan_complete",
        "suspend",
    ]
    assert [r.session_version for r in full] == list(range(1, 7))
    assert [r.trigger for r in await services.sessions.history(session.id, limit=2)] == ["plan_complete", "suspend"]
    with pytest.raises(InvalidInput):
        await services.sessions.history(session.id, limit=0)


async def test_state_at_replays_the_log_and_equals_the_live_state_now(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await fire(services, await start(services, seeded.tasks[0]), "plan_complete", "work_complete", "suspend")
    history = await services.sessions.history(session.id)
    for record in history:
        assert await services.sessions.state_at(session.id, record.at) == SessionState(record.to_state)
    now = datetime.now(UTC) + timedelta(seconds=1)
    assert await services.sessions.state_at(session.id, now) == (await services.sessions.get(session.id)).state


async def test_audit_queries_filter_by_session_actor_state_outcome_and_time(services, git_repo):
    seeded = await seed(services, git_repo, tasks=2)
    one = await start(services, seeded.tasks[0])
    await start(services, seeded.tasks[1])
    await fire(services, one, "plan_complete")
    everything = await services.audit.transitions(TransitionQuery())
    assert len(everything) == 9 and [r.seq for r in everything] == sorted(r.seq for r in everything)
    assert {r.session_id for r in await services.audit.transitions(TransitionQuery(session_id=one.id))} == {one.id}
    assert len(await services.audit.transitions(TransitionQuery(actor="system"))) == 4
    assert [r.trigger for r in await services.audit.transitions(TransitionQuery(state="executing"))] == [
        "plan_complete"
    ]
    middle = everything[4].at
    assert all(r.at >= middle for r in await services.audit.transitions(TransitionQuery(since=middle)))
    assert len(await services.audit.transitions(TransitionQuery(until=middle))) == 5
    assert len(await services.audit.transitions(TransitionQuery(limit=3))) == 3
    for bad in (
        TransitionQuery(state="nirvana"),
        TransitionQuery(outcome="maybe"),
        TransitionQuery(limit=0),
        TransitionQuery(since=datetime(2026, 1, 1)),
    ):
        with pytest.raises(InvalidInput):
            await services.audit.transitions(bad)


async def test_session_ids_resolve_from_a_unique_prefix(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    assert await services.sessions.resolve_id(session.id[:8]) == session.id
    assert await services.sessions.resolve_id(session.id.upper()) == session.id
    with pytest.raises(InvalidInput):
        await services.sessions.resolve_id("ab")
    with pytest.raises(SessionNotFound):
        await services.sessions.resolve_id("zzzzzzzz")


async def test_active_sessions_exclude_completed_and_cancelled(services, git_repo):
    seeded = await seed(services, git_repo, tasks=3)
    a, b, c = [await start(services, t) for t in seeded.tasks]
    await fire(services, a, *HAPPY_PATH)
    await fire(services, b, "cancel")
    assert [s.id for s in await services.sessions.active_sessions(seeded.project.id)] == [c.id]
    assert len(await services.sessions.list_sessions(seeded.project.id)) == 3


# -- a plan closes with its last task; a task added to it reopens it ----------------------------------------------


async def closed_plan(services, git_repo):
    """A plan whose only task went the happy path, so the plan closed by itself."""
    seeded = await seed(services, git_repo, tasks=1)
    await fire(services, await start(services, seeded.tasks[0]), *HAPPY_PATH)
    assert (await services.tracker.list_plans(seeded.project.id))[0].status == PlanStatus.CLOSED
    return seeded


async def plan_events(services) -> list[dict]:
    async with services.uow(write=False) as uow:
        return [e for e in await uow.events.list(None, limit=1000) if e["kind"] == "plan.reopened"]


async def test_a_task_added_to_a_closed_plan_reopens_it_and_is_ready_and_starts(services, git_repo):
    seeded = await closed_plan(services, git_repo)
    added = await services.tracker.add(AddTask(seeded.project.id, "one more", plan_id=seeded.plan.id, actor=ACTOR))
    assert added.reopened is not None and added.reopened.status == PlanStatus.OPEN
    assert added.note() == f"plan {seeded.plan.id} 'Phase 1' was closed and is open again"
    assert (await services.tracker.list_plans(seeded.project.id))[0].status == PlanStatus.OPEN
    [event] = await plan_events(services)
    assert event["payload"]["plan"] == seeded.plan.id and event["payload"]["tasks"] == [added.task.id]
    assert event["payload"]["actor"] == ACTOR
    assert [t.id for t in await services.tracker.ready_tasks(seeded.project.id)] == [added.task.id]
    session = await start(services, added.task)  # plan_open lets it through
    assert session.state == SessionState.PLANNING
    assert (await services.tracker.list_plans(seeded.project.id))[0].status == PlanStatus.IN_PROGRESS
    await fire(services, session, *HAPPY_PATH)  # and the plan closes again with its new last task
    assert (await services.tracker.list_plans(seeded.project.id))[0].status == PlanStatus.CLOSED


async def test_a_task_added_to_an_open_plan_or_to_none_reopens_nothing(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    for plan_id in (seeded.plan.id, None):
        added = await services.tracker.add(AddTask(seeded.project.id, "another", plan_id=plan_id))
        assert added.reopened is None and added.note() == ""
    assert await plan_events(services) == []


async def test_a_closed_plan_stays_closed_when_adding_its_task_fails(services, git_repo):
    seeded = await closed_plan(services, git_repo)
    with pytest.raises(TaskNotFound):
        await services.tracker.add(AddTask(seeded.project.id, "x", plan_id=seeded.plan.id, blocked_by=["NOPE-9"]))
    assert (await services.tracker.list_plans(seeded.project.id))[0].status == PlanStatus.CLOSED
    assert await plan_events(services) == []


async def test_a_task_of_a_closed_plan_is_never_listed_ready(services, git_repo):
    # a database written before tasks reopened their plan can hold one: plan_open would refuse to start it
    seeded = await closed_plan(services, git_repo)
    stranded = await services.tracker.add_task(AddTask(seeded.project.id, "stranded", plan_id=seeded.plan.id))
    async with services.uow(write=True) as uow:
        await uow.plans.set_status(seeded.plan.id, PlanStatus.CLOSED)
        await uow.commit()
    assert stranded.id not in [t.id for t in await services.tracker.ready_tasks(seeded.project.id)]


async def test_a_task_added_while_its_plan_closes_waits_for_the_close_and_reopens_the_plan(sql_services, git_repo):
    """Adding a task locks the plan row, as the completion of the plan's last task does: an addition that
    meets the closing transaction waits for it, then sees the plan closed and reopens it (without the lock it
    would read the plan still open, and leave an open task in a closed plan)."""
    seeded = await seed(sql_services, git_repo, tasks=1)
    closing = sql_services.database.connect()
    async with closing as conn:  # the last task's completion, caught before its commit
        await conn.begin()
        await conn.execute(text("UPDATE tasks SET status = 'completed'"))
        await conn.execute(text(f"UPDATE plans SET status = 'closed' WHERE id = {seeded.plan.id}"))
        adding = asyncio.ensure_future(
            sql_services.tracker.add(AddTask(seeded.project.id, "late", plan_id=seeded.plan.id))
        )
        await asyncio.wait_for(waiting_for_a_lock(sql_services, adding), timeout=10)
        await conn.commit()
    added = await asyncio.wait_for(adding, timeout=30)
    assert added.reopened is not None
    [plan] = await sql_services.tracker.list_plans(seeded.project.id)
    assert plan.status == PlanStatus.OPEN
    assert [t.id for t in await sql_services.tracker.ready_tasks(seeded.project.id)] == [added.task.id]


async def waiting_for_a_lock(services, adding: asyncio.Future) -> None:
    """Until `adding` waits on a lock (PostgreSQL: a lock not granted; SQLite: it retries BEGIN IMMEDIATE
    with backoff, so a few turns of the loop) or ended without waiting."""
    if services.backend == "sqlite":
        for _ in range(5):
            await asyncio.sleep(0)
        return
    async with services.database.connect() as conn:
        while not adding.done():
            waiting = (await conn.execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted"))).scalar_one()
            if waiting:
                return
            await asyncio.sleep(0.01)


class _RecordingBefore(NoEffects):
    """An effect with outside work before `suspend`, recording whether it ran."""

    def __init__(self) -> None:
        self.ran = 0

    def wants_before(self, trigger: Trigger) -> bool:
        return trigger == Trigger.SUSPEND

    async def before(self, session, cmd):
        self.ran += 1
        return cmd


@pytest.mark.parametrize("outside_work", [False, True], ids=["transaction only", "with an effect before"])
async def test_a_fire_authorises_its_caller_once_in_its_first_unit_of_work_and_a_refusal_writes_nothing(
    services, git_repo, outside_work
):
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    effect = _RecordingBefore()
    if outside_work:
        services.sessions.use_effects(effect)
    before = await services.sessions.history(session.id)
    seen: list[object] = []

    async def refuse(uow) -> None:
        seen.append(uow)
        raise Forbidden("operator bob lacks fire")

    with pytest.raises(Forbidden, match="bob"):
        await services.sessions.fire(FireTrigger(session.id, "suspend", "operator:bob", authorize=refuse))
    assert len(seen) == 1 and effect.ran == 0  # refused before the effect's outside work
    assert await services.sessions.history(session.id) == before  # not even a blocked row
    assert (await services.sessions.get(session.id)).version == session.version

    async def allow(uow) -> None:
        seen.append(uow)

    moved = await services.sessions.fire(FireTrigger(session.id, "suspend", "operator:alice", authorize=allow))
    assert moved.session.state == SessionState.SUSPENDED
    assert len(seen) == 2 and effect.ran == (1 if outside_work else 0)  # once per fire, not again in the transaction
