"""Dispatch (application/trackers/dispatch.py): sessions started by taskgate itself on ready tasks that a workflow's
trigger takes, within WIP, audited, and exactly once when several dispatchers race on one database.

The functional tests run on the in-memory fakes, SQLite and PostgreSQL (`services`), with real git worktrees; the
race runs several independently wired dispatchers (their own engine, pool and locks, as separate service processes
would have) on one SQLite file and one PostgreSQL database."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sessions.ports import TransitionQuery
from taskgate.application.sweeper import Sweeper
from taskgate.application.trackers.builtin import AddTask
from taskgate.application.trackers.dispatch import DISPATCHED, Dispatcher, DispatchOptions
from taskgate.application.workflows.library import WorkflowService
from taskgate.domain.entities import Outcome
from taskgate.domain.states import SessionState
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.system import SystemClock
from taskgate.infrastructure.workflow_files import WorkflowFiles
from tests.builders import ACTOR, OPERATOR
from tests.conftest import Services, wire
from tests.workflow_support import AGENT_TYPES, rig, write_workflows

pytestmark = pytest.mark.timeout(180)

READY_FLOW = """
id: ready-flow
description: any ready task
triggers: [manual, task_ready]
steps:
  - id: work
    type: agent
    agent: ok
    prompt: "do {{task.title}}"
"""

BUG_FLOW = """
id: bug-flow
description: ready tasks labelled bug
triggers: ["label:bug"]
steps:
  - id: fix
    type: agent
    agent: ok
    prompt: "fix {{task.title}}"
"""

FILES = {"dev/ready-flow.yaml": READY_FLOW, "dev/bug-flow.yaml": BUG_FLOW}
DISPATCH_ACTOR = f"operator:{OPERATOR}"


def dispatcher(services: Services, tmp_path: Path, routes=None) -> Dispatcher:
    """A dispatcher over the workflows of FILES (its routes: theirs, or `routes`)."""
    r = rig(services, tmp_path, FILES)
    return Dispatcher(services.uow, services.sessions, services.tracker, r.engine, routes or r.catalogue.trigger_routes,
                      SystemClock(), DispatchOptions(OPERATOR))  # fmt: skip


async def seed(services: Services, repo: Path, titles: list[str], labels: dict[str, list[str]] | None = None):
    project = await services.tracker.init_project(str(repo))
    await services.tracker.ensure_operator(OPERATOR)
    plan = await services.tracker.add_plan(project.id, "Phase 1")
    tasks = []
    for title in titles:
        cmd = AddTask(project.id, title, plan_id=plan.id, labels=(labels or {}).get(title, ()))
        tasks.append(await services.tracker.add_task(cmd))
    return project, plan, tasks


async def events(services: Services, kind: str) -> list[dict]:
    async with services.uow(write=False) as uow:
        return await uow.events.list(kind=kind, limit=1000)


async def test_a_sweep_starts_ready_tasks_with_the_workflow_their_trigger_names_as_the_dispatch_operator(
    services, git_repo, tmp_path
):
    project, _, (plain, crash, other) = await seed(services, git_repo, ["plain", "crash", "other"],
                                                   {"crash": ["ui", "bug"]})  # fmt: skip
    after = await services.tracker.add_task(AddTask(project.id, "after plain", blocked_by=[plain.id]))
    sweeper = Sweeper(services.uow, services.sessions, SystemClock(), dispatcher=dispatcher(services, tmp_path))

    report = await sweeper.sweep_once()

    done = {d.task_id: d for d in report.dispatched}
    assert (done[plain.id].outcome, done[plain.id].workflow, done[plain.id].trigger) == ("started", "ready-flow",
                                                                                          "task_ready")  # fmt: skip
    # the more specific trigger wins: label:bug beats task_ready (the label `ui` names no trigger)
    assert (done[crash.id].outcome, done[crash.id].workflow, done[crash.id].trigger) == ("started", "bug-flow",
                                                                                          "label:bug")  # fmt: skip
    assert done[other.id].outcome == "started" and after.id not in done  # a blocked task is not ready: left alone
    assert "dispatch: 3 started" in report.summary()
    for task_id, workflow, trigger in ((plain.id, "ready-flow", "task_ready"), (crash.id, "bug-flow", "label:bug")):
        session = await services.sessions.get(done[task_id].session_id)
        assert session.state == SessionState.PLANNING and session.operator_id == OPERATOR
        assert [f["name"] for f in session.workflow_stack] == [workflow]
        assert session.state_data[DISPATCHED]["workflow"] == workflow
        rows = await services.sessions.history(session.id)
        reason = f"dispatch: trigger {trigger} (workflow {workflow})"
        assert [(r.trigger, r.actor, r.reason) for r in rows if r.trigger in ("create", "start")] == [
            ("create", DISPATCH_ACTOR, reason), ("start", DISPATCH_ACTOR, reason)]  # fmt: skip
    started = await events(services, "dispatch.started")
    assert sorted(e["payload"]["task"] for e in started) == sorted(done)

    again = await sweeper.sweep_once()
    assert again.dispatched == [] and "dispatch" not in again.summary()  # nothing new is ready


def taken_up(actions):
    """The actions that took a task up (started, waiting, errors), not the ones that only say why a task was left."""
    return [a for a in actions if a.outcome != "held" and not (a.outcome == "skipped" and "cancelled" in a.detail)]


async def test_a_full_plan_keeps_one_session_waiting_without_a_row_per_sweep_and_starts_it_when_a_slot_frees(
    services, git_repo, tmp_path
):
    _, _, tasks = await seed(services, git_repo, [f"task {i}" for i in range(5)])  # WIP limit 3 (conftest.wire)
    d = dispatcher(services, tmp_path)

    everything = await d.dispatch_once()
    first = taken_up(everything)
    assert [(a.task_id, a.outcome) for a in first] == [(t.id, "started") for t in tasks[:3]] + [(tasks[3].id,
                                                                                                "waiting")]  # fmt: skip
    assert "wip_limit" in first[-1].detail  # and task 4 was not even created: it waits behind task 3
    assert [(a.task_id, a.outcome, a.detail) for a in everything if a.outcome == "held"] == [
        (tasks[4].id, "held", "a session of its plan waits for a slot first")]  # the report says why  # fmt: skip
    waiting = await services.sessions.get(first[-1].session_id)
    assert waiting.state == SessionState.READY and [f["name"] for f in waiting.workflow_stack] == ["ready-flow"]

    second = taken_up(await d.dispatch_once())
    assert [(a.task_id, a.outcome, a.session_id) for a in second] == [(tasks[3].id, "waiting", waiting.id)]
    blocked = await services.audit.transitions(TransitionQuery(outcome="blocked"))
    assert [r.session_id for r in blocked] == [waiting.id]  # one refused start, not one per sweep
    assert [e["session_id"] for e in await events(services, "dispatch.waiting")] == [waiting.id]

    await services.sessions.fire(FireTrigger(first[0].session_id, "cancel", ACTOR, "make room"))
    third = await d.dispatch_once()  # task 0 is ready again, but its session was cancelled: left to people
    assert [(a.task_id, a.outcome) for a in taken_up(third)] == [(tasks[3].id, "started"), (tasks[4].id, "waiting")]
    assert [(a.task_id, a.detail) for a in third if a.outcome == "skipped"] == [
        (tasks[0].id, "a person cancelled its session: left to people")]  # fmt: skip
    assert tasks[0].id in {t.id for t in await services.tracker.ready_tasks(tasks[0].project_id)}
    assert (await services.sessions.get(waiting.id)).state == SessionState.PLANNING
    start = [r for r in await services.sessions.history(waiting.id) if r.trigger == "start"]
    assert [(r.outcome, r.actor) for r in start] == [(Outcome.BLOCKED, DISPATCH_ACTOR),
                                                     (Outcome.APPLIED, DISPATCH_ACTOR)]  # fmt: skip
    assert len(await events(services, "dispatch.waiting")) == 2  # task 3 once, task 4 once


async def test_a_trigger_two_workflows_declare_starts_nothing_and_other_triggers_still_do(services, git_repo, tmp_path):
    twin = READY_FLOW.replace("id: ready-flow", "id: twin")
    config = write_workflows(tmp_path / "twins", {**FILES, "dev/twin.yaml": twin})
    twins = WorkflowService(WorkflowFiles(config), set(AGENT_TYPES))
    assert [p.message for p in twins.catalogue().problems] == [
        f"trigger 'task_ready' is also declared by workflow '{other}' ({config}/workflows/dev/{other}.yaml)"
        for other in ("twin", "ready-flow")
    ]
    d = dispatcher(services, tmp_path, routes=twins.trigger_routes)
    _, _, (plain, crash) = await seed(services, git_repo, ["plain", "crash"], {"crash": ["bug"]})
    done = {a.task_id: a for a in await d.dispatch_once()}
    assert done[plain.id].outcome == "skipped" and "declared by several workflows (ready-flow, twin)" in (
        done[plain.id].detail)  # fmt: skip
    assert (done[crash.id].outcome, done[crash.id].workflow) == ("started", "bug-flow")


@pytest.mark.parametrize("dispatchers", [4])
async def test_racing_dispatchers_on_one_database_start_each_task_exactly_once_within_wip(
    sql_services, git_repo, tmp_path, dispatchers
):
    """Several service processes dispatching at once: each wired on its own (own pool, locks and engine)."""
    project, _, tasks = await seed(sql_services, git_repo, [f"wip {i}" for i in range(5)])  # WIP limit 3
    free = [await sql_services.tracker.add_task(AddTask(project.id, f"free {i}", labels=["bug"] * (i % 2)))
            for i in range(4)]  # no plan: no WIP limit (the operator's capacity of 10 holds them all)  # fmt: skip
    others = [wire(sql_services.backend, Database(sql_services.url), sql_services.url) for _ in range(dispatchers - 1)]
    racers = [dispatcher(svc, tmp_path / f"d{n}") for n, svc in enumerate([sql_services, *others])]
    try:
        results = await asyncio.gather(*(r.dispatch_once() for r in racers))
    finally:
        for svc in others:
            await svc.database.dispose()

    actions = [a for result in results for a in result]
    assert [a for a in actions if a.outcome == "error"] == []
    sessions = await sql_services.sessions.list_sessions(project_id=project.id)
    per_task = Counter(s.task_id for s in sessions)
    assert max(per_task.values()) == 1  # never two sessions for a task
    states = {s.task_id: s.state for s in sessions}
    assert all(states[t.id] == SessionState.PLANNING for t in free)  # every free task started, once
    assert sum(states.get(t.id) == SessionState.PLANNING for t in tasks) == 3  # the plan filled, not overfilled
    started = [a for a in actions if a.outcome == "started"]
    assert sorted(a.task_id for a in started) == sorted(s.task_id for s in sessions if s.state != SessionState.READY)
    applied = await sql_services.audit.transitions(TransitionQuery(state="planning", outcome="applied"))
    assert Counter(r.session_id for r in applied) == Counter({a.session_id: 1 for a in started})
    assert all(r.actor == DISPATCH_ACTOR for r in applied)
    assert Counter(e["session_id"] for e in await events(sql_services, "dispatch.started")) == Counter(
        {a.session_id: 1 for a in started})  # fmt: skip
    waiting = Counter(e["session_id"] for e in await events(sql_services, "dispatch.waiting"))
    assert waiting == Counter({s.id: 1 for s in sessions if s.state == SessionState.READY})  # told once each
    for session in sessions:  # the workflow its trigger named is its root frame, pushed once
        wanted = "bug-flow" if session.task_id in {t.id for t in free[1::2]} else "ready-flow"
        assert [f["name"] for f in session.workflow_stack] == [wanted], session


async def test_a_workflow_the_dispatch_operator_may_not_run_is_skipped_and_nothing_is_written(
    services, git_repo, tmp_path
):
    private = READY_FLOW.replace("id: ready-flow", "id: ready-flow\nvisible_to: ['operator:bob']")
    r = rig(services, tmp_path, {"dev/ready-flow.yaml": private})
    d = Dispatcher(services.uow, services.sessions, services.tracker, r.engine, r.catalogue.trigger_routes,
                   SystemClock(), DispatchOptions(OPERATOR))  # fmt: skip
    _, _, (task,) = await seed(services, git_repo, ["plain"])
    report = await Sweeper(services.uow, services.sessions, SystemClock(), dispatcher=d).sweep_once()
    (skipped,) = report.dispatched
    assert (skipped.task_id, skipped.outcome) == (task.id, "skipped")
    assert "operator:bob" in skipped.detail and "the dispatch operator runs it" in skipped.detail
    assert await services.sessions.list_sessions() == []
