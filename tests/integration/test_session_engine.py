"""The session engine's behaviour, identical on the in-memory fake, a SQLite file and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from taskgate.application.ports import TransitionQuery
from taskgate.application.sessions import CreateSession, FireTrigger, StartTask
from taskgate.application.tracker import AddTask
from taskgate.domain.entities import PlanStatus, TaskStatus
from taskgate.domain.errors import (
    ConcurrentModification,
    InvalidInput,
    InvalidTransition,
    OperatorNotFound,
    PolicyViolation,
    ProjectArchived,
    SessionAlreadyActive,
    SessionNotFound,
    TaskNotFound,
)
from taskgate.domain.states import SessionState
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
