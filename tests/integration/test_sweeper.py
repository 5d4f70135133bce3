"""The sweeper on every backend, driven by a fake clock (no test sleeps): deadlines, verification escalation and
expiry, missed heartbeats, and concurrent sweeps that never act twice."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sweeper import ESCALATED_EVENT, Sweeper, SweeperOptions, SweepReport
from taskgate.domain.entities import Agent, AgentStatus, Session
from taskgate.domain.errors import InvalidInput
from taskgate.domain.states import SessionState
from taskgate.infrastructure.db.engine import Database
from tests.builders import ACTOR, fire, seed, start
from tests.conftest import BACKENDS, Services, open_database, wire
from tests.fakes import FakeClock, FakeVcs

_agent_ids = itertools.count(1)


@dataclass
class Env:
    services: Services
    clock: FakeClock
    sweeper: Sweeper

    async def sweep(self) -> SweepReport:
        report = await self.sweeper.sweep_once()
        assert not report.errors, report.errors
        return report

    async def get(self, session: Session) -> Session:
        return await self.services.sessions.get(session.id)

    async def events(self, session: Session, kind: str) -> list[dict]:
        async with self.services.uow(write=False) as uow:
            return [e for e in await uow.events.list(session.id, limit=1000) if e["kind"] == kind]

    async def add_agent(self, session: Session, *, started_ago: timedelta, heartbeat_ago: timedelta | None = None):
        now = self.clock.now()
        agent = Agent(
            id=f"agent-{next(_agent_ids)}",
            session_id=session.id,
            agent_type="claude-code",
            command=["claude", "-p", "work"],
            status=AgentStatus.RUNNING,
            started_at=now - started_ago,
            heartbeat_at=now - heartbeat_ago if heartbeat_ago is not None else None,
        )
        async with self.services.uow(write=True) as uow:
            await uow.agents.add(agent)
            await uow.commit()
        return agent

    async def set_deadline(self, session: Session, deadline: datetime) -> None:
        async with self.services.uow(write=True) as uow:
            current = await uow.sessions.get(session.id, lock=True)
            await uow.sessions.update(replace(current, deadline=deadline), expected_version=current.version)
            await uow.commit()


@pytest.fixture(params=BACKENDS)
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    database, url = await open_database(request.param, request, tmp_path)
    clock = FakeClock()
    services = wire(request.param, database, url, clock=clock, vcs=FakeVcs(), wip_limit=20)
    yield Env(services, clock, Sweeper(services.uow, services.sessions, clock, SweeperOptions()))
    if isinstance(database, Database):
        await database.dispose()


async def _sessions(env: Env, tmp_path: Path, count: int) -> list[Session]:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    seeded = await seed(env.services, repo, tasks=count)
    return [await start(env.services, task) for task in seeded.tasks]


async def test_a_session_past_its_deadline_times_out_then_fails_for_manual_review(env, tmp_path):
    [session] = await _sessions(env, tmp_path, 1)
    session = await fire(env.services, session, "plan_complete")
    env.clock.advance(hours=23, minutes=59)
    assert not (await env.sweep()).actions

    env.clock.advance(minutes=2)
    report = await env.sweep()
    [action] = report.actions
    assert (action.session_id, action.action, action.from_state, action.to_state) == (
        session.id,
        "timed_out",
        "executing",
        "failed",
    )
    after = await env.get(session)
    assert after.state == SessionState.FAILED and after.compensation_plan == "manual_review"
    *_, timeout, failed = await env.services.sessions.history(session.id)
    assert (timeout.trigger, timeout.from_state, timeout.to_state, timeout.actor) == (
        "timeout",
        "executing",
        "timed_out",
        "system",
    )
    assert (failed.trigger, failed.to_state, failed.actor) == ("fail", "failed", "system")
    assert "deadline" in timeout.reason and "started_at + 1d" in timeout.reason
    assert "manual_review" in failed.reason
    assert not (await env.sweep()).actions  # failed: nothing more to do


async def test_an_explicit_deadline_wins_and_also_applies_in_verifying(env, tmp_path):
    executing, verifying = await _sessions(env, tmp_path, 2)
    executing = await fire(env.services, executing, "plan_complete")
    verifying = await fire(env.services, verifying, "plan_complete", "work_complete")
    soon = env.clock.now() + timedelta(hours=1)
    await env.set_deadline(executing, soon)
    await env.set_deadline(verifying, soon)
    env.clock.advance(hours=2)
    report = await env.sweep()
    assert sorted((a.session_id, a.action, a.to_state) for a in report.actions) == sorted(
        [(executing.id, "timed_out", "failed"), (verifying.id, "timed_out", "failed")]
    )
    history = await env.services.sessions.history(verifying.id)
    assert "set on the session" in history[-2].reason


async def test_a_session_left_in_timed_out_is_failed_by_the_next_sweep(env, tmp_path):
    [session] = await _sessions(env, tmp_path, 1)
    session = await fire(env.services, session, "plan_complete", "timeout")  # e.g. a crash after the timeout
    [action] = (await env.sweep()).actions
    assert (action.action, action.from_state, action.to_state) == ("finished", "timed_out", "failed")
    assert (await env.get(session)).compensation_plan == "manual_review"


async def test_a_verification_waiting_72_hours_escalates_once_and_fails_after_7_days(env, tmp_path):
    [session] = await _sessions(env, tmp_path, 1)
    session = await fire(env.services, session, "plan_complete", "work_complete")
    env.clock.advance(hours=71)
    assert not (await env.sweep()).actions  # waiting for an operator: the 24 h default deadline does not apply

    env.clock.advance(hours=2)
    [action] = (await env.sweep()).actions
    assert (action.action, action.to_state) == ("escalated", "verifying")
    env.clock.advance(hours=1)
    second = await env.sweep()
    assert not second.actions and not second.skipped
    [event] = await env.events(session, ESCALATED_EVENT)
    assert "waiting_since" in event["payload"] and "fails_at" in event["payload"]
    after = await env.get(session)
    assert after.state == SessionState.VERIFYING and after.version == session.version  # a mark, not a transition
    assert after.state_data["escalated_version"] == session.version

    env.clock.advance(days=4)
    [expired] = (await env.sweep()).actions
    assert (expired.action, expired.to_state) == ("expired", "failed")
    after = await env.get(session)
    assert after.state == SessionState.FAILED and after.compensation_plan == "manual_review"
    last = (await env.services.sessions.history(session.id))[-1]
    assert (last.trigger, last.actor) == ("fail", "system") and "no operator decision" in last.reason
    assert len(await env.events(session, ESCALATED_EVENT)) == 1


async def test_a_new_verification_after_request_changes_escalates_again(env, tmp_path):
    [session] = await _sessions(env, tmp_path, 1)
    session = await fire(env.services, session, "plan_complete", "work_complete")
    env.clock.advance(hours=73)
    assert [a.action for a in (await env.sweep()).actions] == ["escalated"]
    session = await fire(env.services, await env.get(session), "request_changes", "work_complete")
    env.clock.advance(hours=10)
    assert not (await env.sweep()).actions  # the clock restarted with the new verification
    env.clock.advance(hours=63)
    assert [a.action for a in (await env.sweep()).actions] == ["escalated"]
    assert len(await env.events(session, ESCALATED_EVENT)) == 2


async def test_missed_heartbeats_abandon_the_session_and_resume_makes_it_ready(env, tmp_path):
    [session] = await _sessions(env, tmp_path, 1)
    session = await fire(env.services, session, "plan_complete")
    agent = await env.add_agent(session, started_ago=timedelta(minutes=30), heartbeat_ago=timedelta(minutes=11))
    report = await env.sweep()
    [action] = report.actions
    assert (action.action, action.from_state, action.to_state) == ("abandoned", "executing", "abandoned")
    assert agent.id in action.reason and report.silent_agents == [agent.id]
    last = (await env.services.sessions.history(session.id))[-1]
    assert (last.trigger, last.actor) == ("abandon", "system") and agent.id in last.reason
    async with env.services.uow(write=False) as uow:
        [stored] = await uow.agents.of_session(session.id)
    assert stored.status == AgentStatus.FAILED and stored.completed_at is not None

    resumed = await fire(env.services, await env.get(session), "resume")
    assert resumed.state == SessionState.READY
    env.clock.advance(hours=1)
    assert not (await env.sweep()).actions  # the silent agent no longer counts
    assert (await env.get(session)).state == SessionState.READY


async def test_an_agent_without_heartbeats_counts_from_its_start(env, tmp_path):
    young, old = await _sessions(env, tmp_path, 2)
    await env.add_agent(young, started_ago=timedelta(minutes=5))
    await env.add_agent(old, started_ago=timedelta(minutes=15))
    [action] = (await env.sweep()).actions
    assert (action.session_id, action.action, action.from_state) == (old.id, "abandoned", "planning")


async def test_a_fresh_heartbeat_leaves_the_session_alone(env, tmp_path):
    [session] = await _sessions(env, tmp_path, 1)
    session = await fire(env.services, session, "plan_complete")
    agent = await env.add_agent(session, started_ago=timedelta(hours=3), heartbeat_ago=timedelta(minutes=9))
    assert not (await env.sweep()).actions
    env.clock.advance(minutes=5)
    async with env.services.uow(write=True) as uow:
        assert await uow.agents.heartbeat(agent.id, env.clock.now())
        await uow.commit()
    assert not (await env.sweep()).actions
    assert (await env.get(session)).state == SessionState.EXECUTING


async def test_sessions_in_other_states_are_untouched_while_one_sweep_handles_many(env, tmp_path):
    sessions = await _sessions(env, tmp_path, 7)
    planning, awaiting, suspended, failed, late_a, late_b, late_c = sessions
    await fire(env.services, awaiting, "plan_complete", "work_complete", "approve")
    await fire(env.services, suspended, "plan_complete", "suspend")
    await fire(env.services, failed, "plan_complete", "fail")
    for late in (late_a, late_b, late_c):
        await fire(env.services, late, "plan_complete")
    before = {s.id: await env.get(s) for s in (planning, awaiting, suspended, failed)}
    env.clock.advance(days=30)
    report = await env.sweep()
    assert report.examined == 6  # the failed one is not even read
    assert sorted(a.session_id for a in report.actions) == sorted([late_a.id, late_b.id, late_c.id])
    assert {a.to_state for a in report.actions} == {"failed"}
    for sid, was in before.items():
        now = await env.services.sessions.get(sid)
        assert (now.state, now.version, now.state_data) == (was.state, was.version, was.state_data)


async def test_a_session_that_moved_meanwhile_is_skipped_not_crashed_on(env, tmp_path):
    [session] = await _sessions(env, tmp_path, 1)
    session = await fire(env.services, session, "plan_complete")
    env.clock.advance(hours=25)
    real_fire = env.services.sessions.fire

    async def operator_first(cmd: FireTrigger):  # the operator's work_complete lands between scan and timeout
        if cmd.trigger == "timeout":
            await real_fire(FireTrigger(cmd.session_id, "work_complete", ACTOR))
        return await real_fire(cmd)

    env.services.sessions.fire = operator_first  # type: ignore[method-assign]
    report = await env.sweeper.sweep_once()
    assert not report.actions and not report.errors
    [skip] = report.skipped
    assert (skip.session_id, skip.action) == (session.id, "timed_out") and "moved meanwhile" in skip.why
    assert (await env.get(session)).state == SessionState.VERIFYING


async def test_concurrent_sweeps_act_once_on_each_session(env, tmp_path):
    sessions = await _sessions(env, tmp_path, 5)
    late, late_too, waiting, silent, idle = sessions
    for s in (late, late_too):
        await fire(env.services, s, "plan_complete")
    await fire(env.services, waiting, "plan_complete", "work_complete")
    env.clock.advance(hours=73)
    await env.add_agent(silent, started_ago=timedelta(hours=1))

    reports = await asyncio.gather(*(env.sweeper.sweep_once() for _ in range(5)))
    assert not [e for r in reports for e in r.errors]
    for s in (late, late_too):
        triggers = [r.trigger for r in await env.services.sessions.history(s.id)]
        assert triggers.count("timeout") == 1 and triggers.count("fail") == 1, triggers
        assert (await env.get(s)).state == SessionState.FAILED
    assert len(await env.events(waiting, ESCALATED_EVENT)) == 1
    assert [r.trigger for r in await env.services.sessions.history(silent.id)].count("abandon") == 1
    assert (await env.get(idle)).state == SessionState.PLANNING
    escalations = [a for r in reports for a in r.actions if a.action == "escalated"]
    abandons = [a for r in reports for a in r.actions if a.action == "abandoned"]
    assert len(escalations) == 1 and len(abandons) == 1


async def test_run_sweeps_until_stopped_without_sleeping(env, tmp_path):
    [session] = await _sessions(env, tmp_path, 1)
    await fire(env.services, session, "plan_complete")
    env.clock.advance(hours=25)
    stop, seen = asyncio.Event(), []

    def on_sweep(report: SweepReport) -> None:
        seen.append(report)
        if len(seen) == 2:
            stop.set()

    sweeper = Sweeper(env.services.uow, env.services.sessions, env.clock, SweeperOptions(interval_s=0), on_sweep)
    await asyncio.wait_for(sweeper.run(stop), timeout=30)
    assert [len(r.actions) for r in seen] == [1, 0]

    stopped = Sweeper(env.services.uow, env.services.sessions, env.clock, SweeperOptions(interval_s=3600))
    await asyncio.wait_for(stopped.run(stop), timeout=5)  # already stopped: returns at once


def test_sweeper_settings_become_options_and_are_checked(tmp_path, monkeypatch):
    from taskgate.bootstrap import load_settings, sweeper_options

    config = tmp_path / "config"
    config.mkdir()
    (config / "taskgate.toml").write_text(
        "[sweeper]\nsession_deadline_hours = 2\nverification_escalation_hours = 12\n"
        "verification_timeout_days = 1.5\nheartbeat_timeout_minutes = 3\ninterval_s = 5\n"
    )
    monkeypatch.delenv("TASKGATE_CONFIG", raising=False)
    options = sweeper_options(load_settings(tmp_path))
    assert options == SweeperOptions(
        session_deadline=timedelta(hours=2),
        verification_escalation=timedelta(hours=12),
        verification_timeout=timedelta(hours=36),
        heartbeat_timeout=timedelta(minutes=3),
        interval_s=5,
    )
    assert sweeper_options(load_settings(tmp_path / "elsewhere")) == SweeperOptions()
    (config / "taskgate.toml").write_text("[sweeper]\nverification_escalation_hours = 200\n")
    with pytest.raises(InvalidInput, match="sweeper"):
        load_settings(tmp_path)


@pytest.mark.parametrize("enabled", [True, False])
async def test_serve_sweeps_in_the_background_and_stops_with_the_server(tmp_path, monkeypatch, enabled):
    from taskgate.bootstrap import load_settings
    from taskgate.entrypoints.mcp.runner import _OpenApp

    monkeypatch.delenv("TASKGATE_CONFIG", raising=False)
    monkeypatch.setenv("TASKGATE_SWEEPER__ENABLED", str(enabled).lower())
    settings = load_settings(tmp_path, data_dir=tmp_path / "data")
    async with _OpenApp(settings)():
        running = [t for t in asyncio.all_tasks() if t.get_name() == "taskgate-sweeper"]
        assert len(running) == (1 if enabled else 0)
    assert all(t.done() for t in running)
