"""Dispatch's bounds (issue 41) on the in-memory fakes, SQLite and PostgreSQL: `[dispatch]`'s caps per project,
per label and per agent preset, the review queue's back-pressure, the dry run that writes nothing, and the retries
of a task whose dispatched sessions failed (with a clock the test moves).

The tasks are the built-in tracker's, outside any plan (so no WIP limit): only dispatch's caps hold them back."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.trackers.builtin import AddTask
from taskgate.application.trackers.dispatch import Dispatcher, DispatchOptions
from taskgate.domain.dispatching import DispatchCaps
from taskgate.domain.states import SessionState
from taskgate.infrastructure.db.engine import Database
from tests.builders import ACTOR, OPERATOR, fire, start
from tests.conftest import BACKENDS, Services, open_database, wire
from tests.fakes import FakeClock
from tests.integration.trackers.test_dispatch import FILES
from tests.workflow_support import rig

pytestmark = pytest.mark.timeout(180)
REVERT = {"compensation_plan": "auto_revert"}  # a failed attempt rolled back: the task is ready again


@pytest.fixture(params=BACKENDS)
async def clocked(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Services, FakeClock]]:
    """The `services` of test_dispatch.py, on a clock that moves only when the test says."""
    clock = FakeClock()
    database, url = await open_database(request.param, request, tmp_path)
    yield wire(request.param, database, url, clock=clock), clock
    if isinstance(database, Database):
        await database.dispose()


def dispatcher(services: Services, clock: FakeClock, tmp_path: Path, dry_run: bool = False, **caps) -> Dispatcher:
    """A dispatcher over test_dispatch.py's workflows (both run the agent preset `ok`) within `caps`."""
    r = rig(services, tmp_path, FILES, clock=clock)
    options = DispatchOptions(OPERATOR, caps=DispatchCaps(**caps), dry_run=dry_run)
    return Dispatcher(services.uow, services.sessions, services.tracker, r.engine, r.catalogue.trigger_routes, clock,
                      options)  # fmt: skip


async def free_tasks(services: Services, repo: Path, count: int, labels: dict[int, list[str]] | None = None):
    """A project on `repo` with `count` ready tasks in no plan (`labels`: by index)."""
    project = await services.tracker.init_project(str(repo))
    await services.tracker.ensure_operator(OPERATOR)
    return [
        await services.tracker.add_task(AddTask(project.id, f"free {i}", labels=(labels or {}).get(i, ())))
        for i in range(count)
    ]


async def rows(services: Services) -> dict:
    """Every table's rows (empty ones left out: the in-memory fake makes some of its tables when first read)."""
    return {name: content for name, content in (await services.snapshot()).items() if content not in ([], "{}", "[]")}


def outcomes(actions) -> Counter:
    return Counter(a.outcome for a in actions)


async def test_max_running_starts_that_many_and_holds_the_rest_saying_why(clocked, git_repo, tmp_path) -> None:
    """5 ready tasks, max_running 2: exactly 2 sessions start, 3 tasks are held with the cap's words, and no
    session is created for them."""
    services, clock = clocked
    tasks = await free_tasks(services, git_repo, 5)
    actions = await dispatcher(services, clock, tmp_path, max_running=2).dispatch_once()
    assert [(a.task_id, a.outcome) for a in actions if a.outcome == "started"] == [(t.id, "started") for t in tasks[:2]]
    assert [(a.task_id, a.detail) for a in actions if a.outcome == "held"] == [
        (t.id, "no slot: 2 running in the project (max_running 2)") for t in tasks[2:]
    ]
    assert len(await services.sessions.list_sessions()) == 2


async def test_a_label_cap_bounds_only_the_tasks_with_the_label(clocked, git_repo, tmp_path) -> None:
    """per_label ui = 1: one ui task starts, the other ui tasks are held; unlabelled tasks all start."""
    services, clock = clocked
    tasks = await free_tasks(services, git_repo, 5, {0: ["ui"], 1: ["ui"], 3: ["ui"]})
    actions = await dispatcher(services, clock, tmp_path, per_label={"ui": 1}).dispatch_once()
    by_task = {a.task_id: a for a in actions}
    assert {t.id for t in tasks if by_task[t.id].outcome == "started"} == {tasks[0].id, tasks[2].id, tasks[4].id}
    for held in (tasks[1], tasks[3]):
        assert (by_task[held.id].outcome, by_task[held.id].detail) == (
            "held", "no slot for label ui: 1 running (max_running_per_label 1)")  # fmt: skip


async def test_an_agent_cap_bounds_the_workflows_using_the_preset(clocked, git_repo, tmp_path) -> None:
    """per_agent ok = 3 (the preset both workflows run): 3 start, whichever workflow, and the others are held;
    a second pass counts the 3 running sessions and starts nothing more."""
    services, clock = clocked
    await free_tasks(services, git_repo, 5, {1: ["bug"]})
    d = dispatcher(services, clock, tmp_path, per_agent={"ok": 3})
    first = await d.dispatch_once()
    assert outcomes(first) == Counter(started=3, held=2)
    assert {a.detail for a in first if a.outcome == "held"} == {
        "no slot for agent ok: 3 running (max_running_per_agent 3)"
    }
    assert outcomes(await d.dispatch_once()) == Counter(held=2)
    assert len(await services.sessions.list_sessions()) == 3


async def test_a_full_review_queue_holds_every_task(clocked, git_repo, tmp_path) -> None:
    """max_awaiting_decision = 1 and one session waiting in verifying: nothing starts, every ready task is held
    because the review queue is full."""
    services, clock = clocked
    tasks = await free_tasks(services, git_repo, 4)
    waiting = await fire(services, await start(services, tasks[0]), "plan_complete", "work_complete")
    assert waiting.state == SessionState.VERIFYING
    actions = await dispatcher(services, clock, tmp_path, max_awaiting_decision=1).dispatch_once()
    assert [(a.task_id, a.outcome, a.detail) for a in actions] == [
        (t.id, "held", "review queue full: 1 session(s) wait for a decision (max_awaiting_decision 1)")
        for t in tasks[1:]
    ]
    assert [s.id for s in await services.sessions.list_sessions()] == [waiting.id]


async def test_the_dry_run_says_what_would_start_within_the_caps_and_writes_nothing(
    clocked, git_repo, tmp_path
) -> None:
    """Shadow mode: would_start for as many tasks as the cap allows, held for the rest, and not a row written
    (every table, sessions and events included, is the same before and after)."""
    services, clock = clocked
    tasks = await free_tasks(services, git_repo, 4)
    before = await rows(services)
    actions = await dispatcher(services, clock, tmp_path, dry_run=True, max_running=3).dispatch_once()
    assert [a.outcome for a in actions] == ["would_start"] * 3 + ["held"]
    assert actions[0].detail == "dry run: nothing was written (a first attempt)"
    assert actions[-1].task_id == tasks[-1].id and "max_running 3" in actions[-1].detail
    assert await rows(services) == before
    assert await services.sessions.list_sessions() == []


async def test_a_failed_task_waits_its_back_off_then_is_retried_and_is_left_to_the_operator_at_last(
    clocked, git_repo, tmp_path
) -> None:
    """A dispatched session fails and is rolled back (auto_revert: compensate, then cleanup_done, so the session is
    completed and its task ready again): its task is held ("failed 1 time(s): retried after …") until retry_base_s has
    passed, then started again; the second failure waits twice as long; after max_retries + 1 failures dispatch
    stops and leaves it to the operator."""
    services, clock = clocked
    (task,) = await free_tasks(services, git_repo, 1)
    d = dispatcher(services, clock, tmp_path, max_retries=2, retry_base_s=60)

    async def dispatched_and_failed() -> None:
        (action,) = await d.dispatch_once()
        assert (action.task_id, action.outcome) == (task.id, "started")
        await services.sessions.fire(FireTrigger(action.session_id, "fail", ACTOR, "the agent crashed", changes=REVERT))
        await services.sessions.fire(FireTrigger(action.session_id, "compensate", ACTOR, "revert it"))
        failed = await services.sessions.get(action.session_id)
        assert failed.state == SessionState.COMPLETED  # rolled back and cleaned up: the task is ready again

    await dispatched_and_failed()
    (held,) = await d.dispatch_once()
    assert held.outcome == "held" and held.detail.startswith("failed 1 time(s): retried after ")
    clock.advance(seconds=59)
    assert [a.outcome for a in await d.dispatch_once()] == ["held"]
    clock.advance(seconds=2)
    await dispatched_and_failed()
    (held,) = await d.dispatch_once()
    assert held.outcome == "held" and held.detail.startswith("failed 2 time(s): retried after ")
    clock.advance(seconds=119)  # twice retry_base_s this time
    assert [a.outcome for a in await d.dispatch_once()] == ["held"]
    clock.advance(seconds=2)
    await dispatched_and_failed()

    clock.advance(days=2)  # a long time after: the back-off is over, but the retries are used up
    (given_up,) = await d.dispatch_once()
    assert (given_up.outcome, given_up.detail) == ("held", (
        "failed 3 time(s), more than max_retries allows: dispatch stopped and leaves it to the operator "
        "(look at why, then `taskgate session start` it)"))  # fmt: skip
    sessions = await services.sessions.list_sessions()
    assert [s.state for s in sessions] == [SessionState.COMPLETED] * 3  # three attempts, each rolled back
