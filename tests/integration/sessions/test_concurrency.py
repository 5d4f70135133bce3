"""Concurrency: the write serialisation described in `taskgate.application.sessions.engine` holds under real contention.

Every test fires many calls at once (one `asyncio.gather`, or two OS processes sharing the database) and then
checks invariants that hold whatever order the calls were serialised in:

- the WIP limit is never exceeded and every refusal is a logged, typed `PolicyViolation` naming `wip_limit`;
- no update is lost: a session's version is 1 + its applied transitions, the applied log rows in `seq` order
  carry versions 1, 2, 3, ... and chain state to state, and the log replays to the stored state;
- every call either applied exactly once or raised a typed taskgate error;
- a task never gets a second active session.

They run on the in-memory fake (whose unit of work serialises writes like SQLite), a SQLite file and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from taskgate.application.sessions.commands import CreateSession, FireResult, FireTrigger, StartTask
from taskgate.application.sessions.ports import TransitionQuery
from taskgate.application.sessions.reads import replay
from taskgate.application.trackers.builtin import AddTask
from taskgate.domain.entities import Outcome, PlanStatus, Session, TransitionRecord
from taskgate.domain.errors import (
    ConcurrentModification,
    InvalidTransition,
    PolicyViolation,
    SessionAlreadyActive,
)
from taskgate.domain.states import SessionState
from tests.builders import OPERATOR as SEEDED_OPERATOR
from tests.conftest import Services
from tests.workflow_support import planning_with, rig, run_until_idle

pytestmark = pytest.mark.timeout(120)

WIP_LIMIT = 3  # what conftest.wire() configures
ACTOR = "alice"
OPERATOR = "op-1"
WORKER = Path(__file__).with_name("_concurrency_worker.py")
WORKER_TIMEOUT_S = 45.0  # per phase (get ready, run); the whole test stays inside its 120 s timeout


# -- seeding and checks ---------------------------------------------------------------------------------------


async def seed_project(svc: Services, git_repo: Path) -> int:
    project = await svc.tracker.init_project(str(git_repo))
    await svc.tracker.ensure_operator(OPERATOR)
    return project.id


async def seed_plan(svc: Services, project_id: int, name: str, tasks: int) -> tuple[int, list[str]]:
    plan = await svc.tracker.add_plan(project_id, name)
    task_ids = [
        (await svc.tracker.add_task(AddTask(project_id, f"{name} task {i}", plan_id=plan.id))).id for i in range(tasks)
    ]
    return plan.id, task_ids


async def executing_session(svc: Services, task_id: str) -> Session:
    """A session for `task_id` moved to `executing` (create, initialize, context_discovered, start, plan_complete)."""
    started = await svc.sessions.start_task(StartTask(task_id, ACTOR, OPERATOR))
    result = await svc.sessions.fire(FireTrigger(started.session.id, "plan_complete", ACTOR))
    assert result.session.state == SessionState.EXECUTING
    return result.session


async def plan_sessions(svc: Services, project_id: int, plan_id: int) -> list[Session]:
    return [s for s in await svc.sessions.list_sessions(project_id=project_id) if s.plan_id == plan_id]


async def assert_log_matches_session(svc: Services, session_id: str) -> list[TransitionRecord]:
    """No lost update: the session's log, in `seq` order, accounts for every version step and replays to its state.

    Returns the log rows (oldest first).
    """
    session = await svc.sessions.get(session_id)
    rows = await svc.sessions.history(session_id, limit=10_000)
    seqs = [r.seq for r in rows]
    assert all(isinstance(s, int) for s in seqs), seqs
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"history is not in strict seq order: {seqs}"
    applied = [r for r in rows if r.outcome == Outcome.APPLIED]
    # log order == version order, one applied row per version, none missing, none duplicated
    assert [r.session_version for r in applied] == list(range(1, session.version + 1)), (
        f"session {session_id} at version {session.version} has applied rows "
        f"{[(r.seq, r.trigger, r.session_version) for r in applied]}"
    )
    assert applied[0].trigger == "create" and applied[0].from_state is None
    for before, after in itertools.pairwise(applied):
        assert after.from_state == before.to_state, f"log of {session_id} does not chain at seq {after.seq}"
    assert applied[-1].to_state == session.state.value
    assert replay(applied) == session.state
    version = 0
    for row in rows:  # a blocked row records the unchanged version and state it was refused at
        if row.outcome == Outcome.APPLIED:
            version = row.session_version
        else:
            assert row.session_version == version and row.from_state == row.to_state, row
    return rows


def split_outcomes(results: list[Any], *expected: type[BaseException]) -> tuple[list[Any], list[BaseException]]:
    """(successful results, expected errors); fails on anything else, showing what it was."""
    errors = [r for r in results if isinstance(r, BaseException)]
    unexpected = [r for r in errors if not isinstance(r, expected)]
    assert unexpected == [], f"unexpected outcomes: {[repr(e) for e in unexpected]}"
    return [r for r in results if not isinstance(r, BaseException)], errors


def toggle_triggers(pairs: int, seed: int) -> list[str]:
    """`pairs` suspends and `pairs` resumes in a fixed shuffled order."""
    triggers = ["suspend", "resume"] * pairs
    random.Random(seed).shuffle(triggers)
    return triggers


# -- 1. WIP limit under 50 concurrent starts --------------------------------------------------------------------


async def test_fifty_concurrent_starts_on_one_plan_with_wip_limit_3_leave_exactly_three_sessions_planning(
    services: Services, git_repo: Path
) -> None:
    project_id = await seed_project(services, git_repo)
    plan_id, task_ids = await seed_plan(services, project_id, "wip", 50)

    results = await asyncio.gather(
        *(services.sessions.start_task(StartTask(t, ACTOR, OPERATOR)) for t in task_ids), return_exceptions=True
    )

    started, refused = split_outcomes(results, PolicyViolation)
    assert len(started) == WIP_LIMIT and len(refused) == 50 - WIP_LIMIT
    assert all(isinstance(r, FireResult) and r.session.state == SessionState.PLANNING for r in started)
    for exc in refused:
        assert isinstance(exc, PolicyViolation)
        assert exc.trigger == "start" and exc.session_id is not None
        assert [v.policy for v in exc.violations] == ["wip_limit"], exc
        assert "wip_limit" in str(exc) and "stays ready" in str(exc)
        # each refusal was decided on an exact count: never a stale 2, never an overshoot to 4
        assert f"{WIP_LIMIT} of {WIP_LIMIT} sessions in progress" in exc.violations[0].message

    sessions = await plan_sessions(services, project_id, plan_id)
    assert len(sessions) == 50 and len({s.task_id for s in sessions}) == 50
    assert Counter(s.state for s in sessions) == {SessionState.PLANNING: WIP_LIMIT, SessionState.READY: 47}
    winners = {r.session.id for r in started}
    losers = {exc.session_id for exc in refused}
    assert {s.id for s in sessions if s.state == SessionState.PLANNING} == winners
    assert {s.id for s in sessions if s.state == SessionState.READY} == losers
    assert all(s.version == (4 if s.id in winners else 3) for s in sessions)

    blocked = await services.audit.transitions(TransitionQuery(outcome="blocked", limit=10_000))
    assert sorted(r.session_id for r in blocked) == sorted(losers)  # exactly one blocked row per refused start
    for row in blocked:
        assert (row.trigger, row.from_state, row.to_state, row.session_version) == ("start", "ready", "ready", 3)
        assert {"policy": "wip_limit", "passed": False} in [
            {"policy": g["policy"], "passed": g["passed"]} for g in row.guard_results
        ]
    applied_starts = await services.audit.transitions(TransitionQuery(state="planning", outcome="applied"))
    assert sorted(r.session_id for r in applied_starts) == sorted(winners)
    for session in sessions:
        await assert_log_matches_session(services, session.id)
    plan = next(p for p in await services.tracker.list_plans(project_id) if p.id == plan_id)
    assert plan.status == PlanStatus.IN_PROGRESS


# -- 2. many concurrent fires on one session ------------------------------------------------------------------


async def test_twenty_concurrent_suspend_and_resume_fires_on_one_session_lose_no_update(
    services: Services, git_repo: Path
) -> None:
    project_id = await seed_project(services, git_repo)
    _plan_id, (task_id,) = await seed_plan(services, project_id, "toggle", 1)
    session = await executing_session(services, task_id)
    v0 = session.version
    # Whatever the serialisation order, a suspend is valid exactly when the session is executing and a resume
    # exactly when it is suspended; anything else must be a clean InvalidTransition, never a lost write.
    triggers = toggle_triggers(10, seed=2026)

    results = await asyncio.gather(
        *(services.sessions.fire(FireTrigger(session.id, t, ACTOR)) for t in triggers), return_exceptions=True
    )

    applied, invalid = split_outcomes(results, InvalidTransition)
    assert len(applied) + len(invalid) == 20 and applied
    for trigger, outcome in zip(triggers, results, strict=True):
        if isinstance(outcome, InvalidTransition):  # refused only from the state that makes it invalid
            assert outcome.state == ("suspended" if trigger == "suspend" else "executing"), (trigger, outcome)
        else:
            assert outcome.record.trigger == trigger and outcome.record.outcome == Outcome.APPLIED
    # each applied fire took its own version step: none lost, none shared
    assert sorted(r.record.session_version for r in applied) == list(range(v0 + 1, v0 + len(applied) + 1))

    final = await services.sessions.get(session.id)
    assert final.version == v0 + len(applied)
    assert final.state == (SessionState.SUSPENDED if len(applied) % 2 else SessionState.EXECUTING)
    rows = await assert_log_matches_session(services, session.id)
    toggles = [r for r in rows if r.session_version > v0]
    assert len(toggles) == len(applied) and all(r.outcome == Outcome.APPLIED for r in toggles)
    alternating = ["suspend", "resume"] * (len(applied) // 2) + ["suspend"] * (len(applied) % 2)
    assert [r.trigger for r in toggles] == alternating


async def test_twenty_concurrent_fires_carrying_the_same_expected_version_apply_exactly_once(
    services: Services, git_repo: Path
) -> None:
    project_id = await seed_project(services, git_repo)
    _plan_id, (task_id,) = await seed_plan(services, project_id, "optimistic", 1)
    session = await executing_session(services, task_id)
    v0 = session.version

    results = await asyncio.gather(
        *(services.sessions.fire(FireTrigger(session.id, "suspend", ACTOR, expected_version=v0)) for _ in range(20)),
        return_exceptions=True,
    )

    applied, stale = split_outcomes(results, ConcurrentModification)
    assert len(applied) == 1 and len(stale) == 19
    assert applied[0].record.session_version == v0 + 1
    final = await services.sessions.get(session.id)
    assert (final.state, final.version, final.prior_state) == (SessionState.SUSPENDED, v0 + 1, SessionState.EXECUTING)
    rows = await assert_log_matches_session(services, session.id)
    assert [r.trigger for r in rows if r.session_version > v0] == ["suspend"]


# -- 4. one active session per task under concurrent creation ----------------------------------------------------


async def test_twenty_concurrent_create_session_calls_for_one_task_leave_exactly_one_session(
    services: Services, git_repo: Path
) -> None:
    project_id = await seed_project(services, git_repo)
    _plan_id, (task_id,) = await seed_plan(services, project_id, "create", 1)

    results = await asyncio.gather(
        *(services.sessions.create_session(CreateSession(task_id, ACTOR, OPERATOR)) for _ in range(20)),
        return_exceptions=True,
    )

    created, refused = split_outcomes(results, PolicyViolation, SessionAlreadyActive)
    assert len(created) == 1 and len(refused) == 19
    for exc in refused:
        if isinstance(exc, PolicyViolation):
            assert [v.policy for v in exc.violations] == ["one_active_session_per_task"], exc
            assert created[0].id in str(exc)
    sessions = await services.sessions.list_sessions(project_id=project_id)
    assert [(s.id, s.task_id, s.state, s.version) for s in sessions] == [
        (created[0].id, task_id, SessionState.CREATED, 1)
    ]
    log = await services.audit.transitions(TransitionQuery(limit=10_000))
    assert [(r.session_id, r.trigger, r.outcome) for r in log] == [(created[0].id, "create", Outcome.APPLIED)]


async def test_twenty_concurrent_start_task_calls_for_one_task_start_one_session_once(
    services: Services, git_repo: Path
) -> None:
    project_id = await seed_project(services, git_repo)
    _plan_id, (task_id,) = await seed_plan(services, project_id, "same-task", 1)

    results = await asyncio.gather(
        *(services.sessions.start_task(StartTask(task_id, ACTOR, OPERATOR)) for _ in range(20)), return_exceptions=True
    )

    # A loser either saw the session too early (created/initializing) and found its step done by another caller,
    # lost the create race, or found it ready and lost the `start` race: each is told the task is already active,
    # naming the winner's session (issue 36: some were told "trigger 'initialize' is not allowed").
    started, refused = split_outcomes(results, SessionAlreadyActive)
    assert len(started) == 1 and len(refused) == 19
    for exc in refused:
        assert f"task {task_id} already has session {started[0].session.id} in state" in str(exc), exc
    (session,) = await services.sessions.list_sessions(project_id=project_id)
    assert (session.id, session.state, session.version) == (started[0].session.id, SessionState.PLANNING, 4)
    rows = await assert_log_matches_session(services, session.id)
    assert [r.trigger for r in rows] == ["create", "initialize", "context_discovered", "start"]


# -- 3. two OS processes sharing the database ---------------------------------------------------------------------


async def run_workers(specs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Start one worker process per spec, release them together, and return each one's outcomes.

    Every wait is bounded; a worker that overruns is killed and the test fails.
    """
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            json.dumps(spec),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for spec in specs
    ]
    try:

        async def ready(proc: asyncio.subprocess.Process) -> None:
            assert proc.stdout is not None
            line = await proc.stdout.readline()
            if line.strip() != b"ready":
                assert proc.stderr is not None
                err = await proc.stderr.read()
                pytest.fail(f"worker did not get ready: {line!r} {err.decode(errors='replace')[-3000:]}")

        await asyncio.wait_for(asyncio.gather(*(ready(p) for p in procs)), timeout=WORKER_TIMEOUT_S)
        # the starting gun: both workers are connected and waiting; release them together and collect the reports
        outputs = await asyncio.wait_for(
            asyncio.gather(*(p.communicate(b"go\n") for p in procs)), timeout=WORKER_TIMEOUT_S
        )
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    reports = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, f"worker exited {proc.returncode}: {err.decode(errors='replace')[-3000:]}"
        reports.append(json.loads(out.decode().strip().splitlines()[-1])["outcomes"])
    return reports


@pytest.mark.slow
async def test_two_processes_sharing_the_database_respect_the_wip_limit_and_lose_no_update(
    sql_services: Services, git_repo: Path
) -> None:
    svc = sql_services
    assert svc.url is not None
    project_id = await seed_project(svc, git_repo)
    wip_plan, wip_tasks = await seed_plan(svc, project_id, "wip", 50)
    _toggle_plan, toggle_tasks = await seed_plan(svc, project_id, "toggle", 2)
    _create_plan, (create_task,) = await seed_plan(svc, project_id, "create", 1)
    toggled = [await executing_session(svc, t) for t in toggle_tasks]  # 2 in WIP: resume is never WIP-blocked
    v0 = {s.id: s.version for s in toggled}

    specs = []
    for n in range(2):
        toggles = [[s.id, trigger] for i, s in enumerate(toggled) for trigger in toggle_triggers(5, seed=100 * n + i)]
        random.Random(n).shuffle(toggles)
        specs.append(
            {
                "url": svc.url,
                "wip_limit": WIP_LIMIT,
                "actor": f"worker-{n}",
                "operator": OPERATOR,
                "start_tasks": wip_tasks[25 * n : 25 * (n + 1)],
                "toggles": toggles,
                "create_task": create_task,
                "creates": 5,
            }
        )

    reports = await run_workers(specs)

    outcomes = [o for report in reports for o in report]
    assert [o for o in outcomes if o["outcome"] == "unexpected"] == []
    by_kind = {kind: [o for o in outcomes if o["kind"] == kind] for kind in ("start", "toggle", "create")}
    assert {k: len(v) for k, v in by_kind.items()} == {"start": 50, "toggle": 40, "create": 10}

    # starts: exactly WIP_LIMIT won across both processes, every other one refused by wip_limit and logged
    starts = by_kind["start"]
    assert Counter(o["outcome"] for o in starts) == {"applied": WIP_LIMIT, "PolicyViolation": 50 - WIP_LIMIT}
    assert all(o["policies"] == ["wip_limit"] for o in starts if o["outcome"] == "PolicyViolation")
    sessions = await plan_sessions(svc, project_id, wip_plan)
    assert len(sessions) == 50 and len({s.task_id for s in sessions}) == 50
    assert Counter(s.state for s in sessions) == {SessionState.PLANNING: WIP_LIMIT, SessionState.READY: 47}
    winners = {o["session_id"] for o in starts if o["outcome"] == "applied"}
    losers = {o["session_id"] for o in starts if o["outcome"] == "PolicyViolation"}
    assert {s.id for s in sessions if s.state == SessionState.PLANNING} == winners
    blocked = await svc.audit.transitions(TransitionQuery(outcome="blocked", limit=10_000))
    assert sorted(r.session_id for r in blocked) == sorted(losers) and len(losers) == 47
    for session in sessions:
        await assert_log_matches_session(svc, session.id)

    # toggles: both processes fired on the same two sessions; every applied fire owns one distinct version step
    for session_id, start_version in v0.items():
        mine = [o for o in by_kind["toggle"] if o["key"] == session_id]
        assert len(mine) == 20
        assert {o["outcome"] for o in mine} <= {"applied", "InvalidTransition"}
        for o in mine:
            if o["outcome"] == "InvalidTransition":
                assert o["state"] == ("suspended" if o["trigger"] == "suspend" else "executing"), o
        versions = sorted(o["record_version"] for o in mine if o["outcome"] == "applied")
        assert versions and versions == list(range(start_version + 1, start_version + len(versions) + 1))
        final = await svc.sessions.get(session_id)
        assert final.version == start_version + len(versions)
        rows = await assert_log_matches_session(svc, session_id)
        assert len([r for r in rows if r.session_version > start_version]) == len(versions)

    # creates: one session for the contested task, whichever process won
    creates = by_kind["create"]
    assert Counter(o["outcome"] == "applied" for o in creates) == {True: 1, False: 9}
    assert {o["outcome"] for o in creates} <= {"applied", "PolicyViolation", "SessionAlreadyActive"}
    assert all(o["policies"] == ["one_active_session_per_task"] for o in creates if o["outcome"] == "PolicyViolation")
    contested = [s for s in await svc.sessions.list_sessions(project_id=project_id) if s.task_id == create_task]
    assert [s.id for s in contested] == [o["session_id"] for o in creates if o["outcome"] == "applied"]


# -- 5. identical decisions from two OS processes ------------------------------------------------------------------

APPROVE_THEN_CHECK = """
id: approve-then-check
description: an approval step, then a checklist that keeps the session waiting
steps:
  - id: approve-plan
    type: approval
    message: Approve the plan.
  - id: check
    type: checklist
    items:
      - {id: tests, text: Tests pass}
"""


def decide_specs(
    svc: Services, session: Session, operator: str = OPERATOR, *, workflows: Path | None = None
) -> list[dict[str, Any]]:
    """Two workers sending 50 identical approvals each (every other one with the version they were shown)."""
    decide = {"session_id": session.id, "operator": operator, "decision": "approve", "count": 50,
              "expected_version": session.version}  # fmt: skip
    spec = {"url": svc.url, "wip_limit": WIP_LIMIT, "decide": decide,
            "workflows": str(workflows) if workflows else None}  # fmt: skip
    return [{**spec, "actor": f"worker-{n}"} for n in range(2)]


def assert_one_result(reports: list[list[dict[str, Any]]], session: Session) -> dict[str, Any]:
    """Every caller got the same decision: one first result, 99 replays of it. Returns the first result."""
    outcomes = [o for report in reports for o in report]
    assert len(outcomes) == 100
    assert [o for o in outcomes if o["outcome"] != "applied"] == []
    assert Counter(o["replayed"] for o in outcomes) == {False: 1, True: 99}
    same = {(o["decision_id"], o["decision"], o["decision_version"], o["to_state"], o["pending"]) for o in outcomes}
    assert len(same) == 1, same
    assert next(iter(same))[2] == session.version
    return next(o for o in outcomes if not o["replayed"])


async def decisions_of(svc: Services, session_id: str) -> list[Any]:
    async with svc.uow(write=False) as uow:  # type: ignore[operator]
        return await uow.decisions.of_session(session_id)


@pytest.mark.slow
async def test_a_hundred_identical_approvals_from_two_processes_apply_once_and_replay_the_rest(
    sql_services: Services, git_repo: Path
) -> None:
    svc = sql_services
    project_id = await seed_project(svc, git_repo)
    _plan_id, (task_id,) = await seed_plan(svc, project_id, "decide", 1)
    executing = await executing_session(svc, task_id)
    session = (await svc.sessions.fire(FireTrigger(executing.id, "work_complete", ACTOR))).session

    reports = await run_workers(decide_specs(svc, session))

    first = assert_one_result(reports, session)
    outcomes = [o for report in reports for o in report]
    assert {(o["state"], o["version"]) for o in outcomes} == {("awaiting_merge", session.version + 1)}
    assert first["to_state"] == "awaiting_merge"
    [decision] = await decisions_of(svc, session.id)
    assert (decision.id, decision.outcome) == (first["decision_id"], "applied")
    rows = await assert_log_matches_session(svc, session.id)
    assert [(r.trigger, r.outcome) for r in rows if r.trigger == "approve"] == [("approve", Outcome.APPLIED)]


@pytest.mark.slow
async def test_a_hundred_identical_answers_to_a_workflow_approval_from_two_processes_act_once(
    sql_services: Services, git_repo: Path, tmp_path: Path
) -> None:
    svc = sql_services
    r = rig(svc, tmp_path, {"dev/approve-then-check.yaml": APPROVE_THEN_CHECK})
    planning = await planning_with(svc, git_repo, r, "approve-then-check", actor=ACTOR)
    await r.agents.execute(planning.id, ACTOR)
    await run_until_idle(r, planning.id)
    session = await svc.sessions.get(planning.id)
    assert r.engine.approval_step(session) is not None

    reports = await run_workers(decide_specs(svc, session, SEEDED_OPERATOR, workflows=tmp_path / "config"))

    first = assert_one_result(reports, session)
    assert first["to_state"] == "executing"
    [decision] = await decisions_of(svc, session.id)
    assert (decision.id, decision.outcome) == (first["decision_id"], "applied")
    runs = [(x.step_id, x.status.value) for x in await r.engine.step_runs(session.id)]
    assert runs == [("approve-plan", "approved"), ("check", "waiting")]
    final = await svc.sessions.get(session.id)
    assert final.state == SessionState.EXECUTING and r.engine.view(final).waiting.kind == "checklist"
