"""One contract, three implementations: the in-memory fakes must behave like the SQLAlchemy adapters.

Each test drives the ports directly (not the use cases), so a fake that drifts from its real twin fails here.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from taskgate.application.sessions.ports import TransitionQuery
from taskgate.domain.entities import Operator, Outcome, PlanStatus, Session, Task, TaskStatus, TransitionRecord
from taskgate.domain.errors import (
    ConcurrentModification,
    PlanNotFound,
    ProjectNotFound,
    SessionAlreadyActive,
    SessionNotFound,
    StorageError,
    TaskNotFound,
)
from taskgate.domain.policies.facts import BlockerFact
from taskgate.domain.states import WIP_STATES, SessionState
from taskgate.infrastructure.db.unit_of_work import REPOSITORIES

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def task(tid: str, project_id: int, plan_id: int | None, *, priority: int = 2, blockers=()) -> Task:
    return Task(tid, project_id, plan_id, f"title {tid}", "", priority, TaskStatus.OPEN, T0, list(blockers))


def session(sid: str, task_id: str, project_id: int, plan_id: int | None, state=SessionState.CREATED) -> Session:
    return Session(
        id=sid,
        task_id=task_id,
        project_id=project_id,
        plan_id=plan_id,
        operator_id=None,
        state=state,
        version=1,
        created_at=T0,
        updated_at=T0,
    )


def record(sid: str, trigger: str, to: str, version: int, at: datetime, outcome=Outcome.APPLIED, actor="system"):
    return TransitionRecord(
        None, sid, trigger, None, to, outcome, actor, None, [{"policy": "p", "passed": True}], version, at
    )


async def seed(uow) -> tuple[int, int]:
    project = await uow.projects.add("demo", "DEMO", "/tmp/demo", T0)
    plan = await uow.plans.add(project.id, "Phase 1", T0)
    return project.id, plan.id


async def test_committed_writes_are_visible_and_uncommitted_ones_vanish(services):
    async with services.uow(write=True) as uow:
        project_id, _ = await seed(uow)
        await uow.commit()
    async with services.uow(write=True) as uow:
        await uow.plans.add(project_id, "never committed", T0)
    async with services.uow(write=False) as uow:
        assert [p.name for p in await uow.plans.list(project_id)] == ["Phase 1"]
        assert (await uow.projects.get(project_id)).key == "DEMO"


async def test_missing_rows_raise_typed_not_found_errors(services):
    async with services.uow(write=False) as uow:
        for call, error in (
            (uow.projects.get(999), ProjectNotFound),
            (uow.plans.get(999), PlanNotFound),
            (uow.tasks.get("X-1"), TaskNotFound),
            (uow.sessions.get("nope"), SessionNotFound),
        ):
            with pytest.raises(error):
                await call
        assert await uow.projects.find(name="nope") is None
        assert await uow.operators.find("nobody") is None


async def test_task_numbers_are_allocated_in_sequence_per_project(services):
    async with services.uow(write=True) as uow:
        project_id, _ = await seed(uow)
        numbers = [await uow.projects.allocate_task_number(project_id) for _ in range(3)]
        await uow.commit()
    assert numbers == [1, 2, 3]


async def test_ready_tasks_exclude_blocked_and_busy_ones_and_sort_by_priority(services):
    async with services.uow(write=True) as uow:
        pid, plan_id = await seed(uow)
        await uow.tasks.add(task("D-1", pid, plan_id, priority=3))
        await uow.tasks.add(task("D-2", pid, plan_id, priority=1))
        await uow.tasks.add(task("D-3", pid, plan_id, priority=0, blockers=["D-1"]))
        await uow.tasks.add(task("D-4", pid, plan_id, priority=0))
        await uow.sessions.add(session("s-4", "D-4", pid, plan_id))
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert [t.id for t in await uow.tasks.ready(pid)] == ["D-2", "D-1"]
        assert await uow.tasks.blockers_of("D-3") == [BlockerFact("D-1", TaskStatus.OPEN)]
        assert (await uow.tasks.get("D-3")).blockers == ["D-1"]
    async with services.uow(write=True) as uow:
        await uow.tasks.set_status("D-1", TaskStatus.COMPLETED)
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert [t.id for t in await uow.tasks.ready(pid)] == ["D-3", "D-2"]
        assert await uow.tasks.count_unfinished(plan_id) == 3


async def test_task_facts_give_the_task_its_project_its_blockers_and_the_plans_wip_count_in_one_call(services):
    async with services.uow(write=True) as uow:
        pid, plan_id = await seed(uow)
        other = await uow.plans.add(pid, "Phase 2", T0)
        await uow.tasks.add(task("D-1", pid, plan_id))
        await uow.tasks.add(task("D-2", pid, plan_id))
        await uow.tasks.add(task("D-3", pid, plan_id, blockers=["D-2", "D-1"]))
        await uow.tasks.add(task("D-4", pid, None))
        await uow.tasks.add(task("D-5", pid, other.id))
        await uow.tasks.set_status("D-1", TaskStatus.COMPLETED)
        await uow.sessions.add(session("s-1", "D-1", pid, plan_id, SessionState.EXECUTING))
        await uow.sessions.add(session("s-2", "D-2", pid, plan_id, SessionState.PLANNING))
        await uow.sessions.add(session("s-5", "D-5", pid, other.id, SessionState.EXECUTING))
        await uow.commit()
    async with services.uow(write=False) as uow:
        facts = await uow.tasks.facts("D-3", plan_id, WIP_STATES)
        assert facts.task == replace(await uow.tasks.get("D-3"), blockers=[])
        assert facts.project == await uow.projects.get(pid)
        assert facts.blockers == (BlockerFact("D-1", TaskStatus.COMPLETED), BlockerFact("D-2", TaskStatus.OPEN))
        assert facts.plan_sessions_in == 2  # s-1 and s-2; s-5 is another plan's
        assert (await uow.tasks.facts("D-3", plan_id, frozenset({SessionState.PLANNING}))).plan_sessions_in == 1
        alone = await uow.tasks.facts("D-4", None, WIP_STATES)  # no plan, no blockers
        assert (alone.task.id, alone.blockers, alone.plan_sessions_in) == ("D-4", (), 0)
        with pytest.raises(TaskNotFound):
            await uow.tasks.facts("D-404", plan_id, WIP_STATES)


async def test_ready_tasks_leave_out_the_tasks_of_a_closed_plan(services):
    async with services.uow(write=True) as uow:
        pid, plan_id = await seed(uow)
        other = await uow.plans.add(pid, "Phase 2", T0)
        await uow.tasks.add(task("D-1", pid, plan_id))
        await uow.tasks.add(task("D-2", pid, other.id))
        await uow.tasks.add(task("D-3", pid, None))
        await uow.plans.set_status(plan_id, PlanStatus.CLOSED)
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert [t.id for t in await uow.tasks.ready(pid)] == ["D-2", "D-3"]  # plan_open would refuse D-1


async def test_a_second_active_session_for_a_task_is_refused_but_a_finished_one_is_not_counted(services):
    async with services.uow(write=True) as uow:
        pid, plan_id = await seed(uow)
        await uow.tasks.add(task("D-1", pid, plan_id))
        await uow.sessions.add(session("s-1", "D-1", pid, plan_id, SessionState.COMPLETED))
        await uow.sessions.add(session("s-2", "D-1", pid, plan_id))
        await uow.commit()
    async with services.uow(write=True) as uow:
        with pytest.raises(SessionAlreadyActive):
            await uow.sessions.add(session("s-3", "D-1", pid, plan_id))
    async with services.uow(write=False) as uow:
        assert await uow.sessions.active_for_task("D-1") == ["s-2"]


async def test_session_updates_check_the_expected_version(services):
    async with services.uow(write=True) as uow:
        pid, plan_id = await seed(uow)
        await uow.tasks.add(task("D-1", pid, plan_id))
        original = session("s-1", "D-1", pid, plan_id)
        await uow.sessions.add(original)
        moved = replace(original, state=SessionState.PLANNING, prior_state=None, version=2, state_data={"k": [1, "ü"]})
        await uow.sessions.update(moved, expected_version=1)
        await uow.commit()
    # A stale update fails its unit of work before the commit: at once, or (PostgreSQL holds the UPDATE to send it
    # with the unit's next write, infrastructure/db/pg_writes.py) at the latest when the unit commits.
    with pytest.raises(ConcurrentModification):
        async with services.uow(write=True) as uow:
            await uow.sessions.update(replace(moved, version=3, state_data={"stale": True}), expected_version=1)
            await uow.events.append("stale.update", moved.updated_at, {}, moved.id)
            await uow.commit()
    async with services.uow(write=False) as uow:
        assert await uow.events.list(moved.id) == []  # nothing of the failed unit was stored
        stored = await uow.sessions.get("s-1", lock=False)
        assert stored == moved
        assert await uow.sessions.count_in_states(plan_id, WIP_STATES) == 1
        assert [s.id for s in await uow.sessions.list(states={SessionState.PLANNING})] == ["s-1"]
        assert await uow.sessions.ids_with_prefix("s-", limit=5) == ["s-1"]


async def test_the_log_appends_in_order_and_answers_history_replay_and_audit_queries(services):
    async with services.uow(write=True) as uow:
        pid, plan_id = await seed(uow)
        await uow.tasks.add(task("D-1", pid, plan_id))
        await uow.sessions.add(session("s-1", "D-1", pid, plan_id))
        steps = [("create", "created", 1), ("initialize", "initializing", 2), ("context_discovered", "ready", 3)]
        seqs = [
            await uow.transitions.append(record("s-1", trig, to, v, T0 + timedelta(minutes=v))) for trig, to, v in steps
        ]
        await uow.transitions.append(
            record("s-1", "start", "ready", 3, T0 + timedelta(minutes=4), Outcome.BLOCKED, actor="operator:alice")
        )
        await uow.events.append("session.created", T0, {"task_id": "D-1"}, "s-1")
        await uow.commit()
    assert seqs == sorted(seqs)
    async with services.uow(write=False) as uow:
        history = await uow.transitions.history("s-1", limit=10)
        assert [r.trigger for r in history] == ["create", "initialize", "context_discovered", "start"]
        assert history[0].at == T0 + timedelta(minutes=1) and history[0].at.tzinfo is not None
        assert history[0].guard_results == [{"policy": "p", "passed": True}]
        assert [r.trigger for r in await uow.transitions.history("s-1", limit=1)] == ["start"]
        until = await uow.transitions.applied_until("s-1", T0 + timedelta(minutes=2))
        assert [r.to_state for r in until] == ["created", "initializing"]
        blocked = await uow.transitions.query(TransitionQuery(outcome="blocked", actor="operator:alice"))
        assert [r.trigger for r in blocked] == ["start"]
        ranged = await uow.transitions.query(
            TransitionQuery(since=T0 + timedelta(minutes=2), until=T0 + timedelta(minutes=3))
        )
        assert [r.session_version for r in ranged] == [2, 3]
        assert [e["kind"] for e in await uow.events.list("s-1")] == ["session.created"]


async def test_operators_round_trip_with_their_roles_and_permissions(services):
    alice = Operator("alice", "Alice", "a@example.invalid", ["admin"], ["read", "approve"], 4, T0)
    async with services.uow(write=True) as uow:
        await uow.operators.add(alice)
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert await uow.operators.get("alice") == alice
        assert await uow.operators.list() == [alice]


async def test_plan_status_and_project_archiving_are_stored(services):
    async with services.uow(write=True) as uow:
        pid, plan_id = await seed(uow)
        await uow.plans.set_status(plan_id, PlanStatus.CLOSED)
        await uow.projects.archive(pid, T0)
        await uow.commit()
    async with services.uow(write=False) as uow:
        assert (await uow.plans.get(plan_id)).status == PlanStatus.CLOSED
        assert (await uow.projects.get(pid)).archived_at == T0
        assert (await uow.projects.find(key="DEMO")).id == pid
        assert (await uow.projects.find(root_path="/tmp/demo")).id == pid


def test_the_log_table_columns_are_in_transition_record_field_order():
    # session_store._records builds records positionally from log rows; this keeps the two orders in step
    from dataclasses import fields

    from taskgate.infrastructure.db.tables import transition_log

    assert [c.name for c in transition_log.columns] == [f.name for f in fields(TransitionRecord)]


async def test_a_committed_unit_of_work_refuses_any_further_use_by_name(services):
    """A SQLite member's connection belongs to the next member once it commits: every implementation refuses
    a read or write through a committed unit of work, and the commit itself stands."""
    async with services.uow(write=True) as uow:
        pid, _plan_id = await seed(uow)
        bound = {name for name in REPOSITORIES if hasattr(uow, name)}
        assert bound == set(REPOSITORIES)  # the list names every repository a unit of work has
        await uow.commit()
        with pytest.raises(StorageError, match=r"uow\.projects\.get used after commit"):
            await uow.projects.get(pid)
    async with services.uow(write=False) as uow:
        assert (await uow.projects.get(pid)).name == "demo"
