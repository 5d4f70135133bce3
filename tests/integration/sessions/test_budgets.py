"""The budget guard on real databases: a start reserves its expected spend, a refusal writes only its blocked row, and
many concurrent starts never reserve past a cap (SQLite's one writer; PostgreSQL's lock on the project row)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from taskgate.application.sessions.commands import FireTrigger, StartTask
from taskgate.application.trackers.builtin import AddTask
from taskgate.bootstrap import Settings, policy_book
from taskgate.domain.agents.reports import AgentReport
from taskgate.domain.entities import Agent, AgentStatus, Session
from taskgate.domain.errors import PolicyViolation
from taskgate.domain.states import WIP_STATES, SessionState
from tests.builders import ACTOR, OPERATOR
from tests.conftest import wire

pytestmark = pytest.mark.timeout(120)


def budgeted(sql_or_any, budgets: dict, wip: int = 100):
    book = policy_book(Settings(policies={"wip_limit": {"limit": wip}}, budgets=budgets))
    return wire(sql_or_any.backend, sql_or_any.database, sql_or_any.url, policies=book)


async def spend(services, session: Session, usd: float, tokens: int = 1000) -> None:
    """An agent of `session` that ended having reported `usd` and `tokens`."""
    now = datetime.now(UTC)
    report = AgentReport(turns=1, input_tokens=tokens, output_tokens=0, cost_usd=usd).as_dict()
    agent = Agent(f"a-{session.id[:8]}", session.id, "claude", ["claude"], AgentStatus.COMPLETED, 0,
                  started_at=now, completed_at=now, report=report)  # fmt: skip
    async with services.uow(write=True) as uow:
        await uow.agents.add(agent)
        await uow.commit()


async def test_a_start_the_day_budget_cannot_cover_is_refused_and_writes_only_its_blocked_row(services, git_repo):
    services = budgeted(services, {"day": {"usd": 5.0}, "expected": {"usd": 1.0}})
    project = await services.tracker.init_project(str(git_repo))
    await services.tracker.ensure_operator(OPERATOR)
    first, second = [await services.tracker.add_task(AddTask(project.id, f"t{i}")) for i in (1, 2)]
    spender = (await services.sessions.start_task(StartTask(first.id, ACTOR, OPERATOR))).session
    await spend(services, spender, 4.2)  # its agent ended: its reservation is replaced by $4.20 spent
    with pytest.raises(PolicyViolation) as refused:
        await services.sessions.start_task(StartTask(second.id, ACTOR, OPERATOR))
    assert f"budget: project {project.name} day (" in str(refused.value)
    assert "spend $4.20 + expected $1.00 exceeds $5.00" in str(refused.value)
    (waiting,) = [s for s in await services.sessions.list_sessions(project.id) if s.task_id == second.id]
    assert waiting.state == SessionState.READY

    before = await services.snapshot()
    with pytest.raises(PolicyViolation):
        await services.sessions.fire(FireTrigger(waiting.id, "start", ACTOR))
    after = await services.snapshot()
    changed = {name for name in after if after[name] != before[name]}
    if services.backend == "memory":
        assert changed == {"log", "events"}
    else:
        assert changed == {"transition_log", "events"}
        (row,) = [r for r in after["transition_log"] if r not in before["transition_log"]]
        assert "blocked" in row and "start" in row


async def test_a_session_in_progress_holds_its_reservation_until_its_agents_end(services, git_repo):
    services = budgeted(services, {"project": {"tokens": 250}, "expected": {"tokens": 100}})
    project = await services.tracker.init_project(str(git_repo))
    await services.tracker.ensure_operator(OPERATOR)
    tasks = [await services.tracker.add_task(AddTask(project.id, f"t{i}")) for i in range(3)]
    one = (await services.sessions.start_task(StartTask(tasks[0].id, ACTOR, OPERATOR))).session
    await services.sessions.start_task(StartTask(tasks[1].id, ACTOR, OPERATOR))
    with pytest.raises(PolicyViolation, match=r"reserved 200 tokens \+ expected 100 tokens exceeds 250"):
        await services.sessions.start_task(StartTask(tasks[2].id, ACTOR, OPERATOR))
    await spend(services, one, 0.0, tokens=10)  # one's agents ended: 10 spent, its 100 reserved are released
    (third,) = [s for s in await services.sessions.list_sessions(project.id) if s.task_id == tasks[2].id]
    started = await services.sessions.fire(FireTrigger(third.id, "start", ACTOR))
    assert started.session.state == SessionState.PLANNING


async def test_many_concurrent_starts_across_plans_never_reserve_past_the_projects_budget(sql_services, git_repo):
    services = budgeted(sql_services, {"project": {"usd": 3.0}, "expected": {"usd": 1.0}})
    project = await services.tracker.init_project(str(git_repo))
    await services.tracker.ensure_operator(OPERATOR)
    plans = [await services.tracker.add_plan(project.id, f"Phase {i}") for i in (1, 2)]
    tasks = [await services.tracker.add_task(AddTask(project.id, f"t{i}", plan_id=plans[i % 2].id)) for i in range(20)]
    tasks += [await services.tracker.add_task(AddTask(project.id, f"loose {i}")) for i in range(4)]  # no plan lock

    operators = [f"op-{n}" for n in range(len(tasks))]  # one each: starts of one operator queue on its row
    for name in operators:
        await services.tracker.ensure_operator(name)

    results = await asyncio.gather(
        *(services.sessions.start_task(StartTask(t.id, ACTOR, op)) for t, op in zip(tasks, operators, strict=True)),
        return_exceptions=True,
    )

    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(refused) == len(tasks) - 3
    assert all(isinstance(r, PolicyViolation) and "budget: project" in str(r) for r in refused), refused
    sessions = await services.sessions.list_sessions(project.id)
    assert sum(s.state in WIP_STATES for s in sessions) == 3
