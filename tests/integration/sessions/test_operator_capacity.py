"""operator_capacity under concurrency: starts of one operator across plans never exceed its capacity."""

from __future__ import annotations

import asyncio

from taskgate.application.sessions.commands import StartTask
from taskgate.application.trackers.builtin import AddTask
from taskgate.bootstrap import Settings, policy_book
from taskgate.domain.errors import PolicyViolation
from taskgate.domain.states import SessionState
from tests.builders import ACTOR, OPERATOR
from tests.conftest import wire


async def test_twenty_concurrent_starts_by_one_operator_across_two_plans_respect_its_capacity(sql_services, git_repo):
    book = policy_book(Settings(policies={"wip_limit": {"limit": 100}}))
    services = wire(sql_services.backend, sql_services.database, sql_services.url, policies=book)
    project = await services.tracker.init_project(str(git_repo))
    await services.tracker.ensure_operator(OPERATOR)
    await services.operators.grant(OPERATOR, max_active_sessions=3)
    plans = [await services.tracker.add_plan(project.id, f"Phase {i}") for i in (1, 2)]
    tasks = [await services.tracker.add_task(AddTask(project.id, f"t{i}", plan_id=plans[i % 2].id)) for i in range(20)]

    results = await asyncio.gather(
        *(services.sessions.start_task(StartTask(t.id, ACTOR, OPERATOR)) for t in tasks), return_exceptions=True
    )

    started = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(started) == 3 and len(refused) == 17
    assert all(isinstance(r, PolicyViolation) and "operator_capacity" in str(r) for r in refused), refused
    sessions = await services.sessions.list_sessions(project.id)
    assert sum(s.state == SessionState.PLANNING for s in sessions) == 3
