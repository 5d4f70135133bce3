"""Properties of the engine under arbitrary trigger sequences (hypothesis, on the in-memory fakes)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sessions.reads import replay
from taskgate.domain.entities import Outcome, TransitionRecord
from taskgate.domain.errors import InvalidTransition, PolicyViolation, TaskgateError
from taskgate.domain.states import TERMINAL_STATES, SessionState, Trigger
from tests.builders import ACTOR, seed, start
from tests.conftest import wire
from tests.fakes import FakeClock, FakeVcs, InMemoryDatabase, SequentialIds

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FIREABLE = [t.value for t in Trigger if t != Trigger.CREATE]


async def run_sequence(triggers: list[str], repo) -> None:
    clock = FakeClock()
    services = wire("memory", InMemoryDatabase(), None, clock=clock, ids=SequentialIds(), vcs=FakeVcs(), wip_limit=1)
    seeded = await seed(services, repo, tasks=2)
    session = await start(services, seeded.tasks[0])
    applied, stamps = 0, []
    for trigger in triggers:
        clock.advance(seconds=1)
        try:
            result = await services.sessions.fire(FireTrigger(session.id, trigger, ACTOR))
            session = result.session
            applied += 1 + len(result.follow_ups)  # merge and compensate run cleanup_done by themselves
            stamps.append((clock.current, session.state))
        except (InvalidTransition, PolicyViolation):
            pass  # refused: the invariants below must still hold
        if session.state in TERMINAL_STATES and seeded.tasks[1:]:
            session = await start(services, seeded.tasks.pop())
            applied = 0
            stamps = []

    live = await services.sessions.get(session.id)
    history = await services.sessions.history(session.id, limit=10_000)
    applied_rows = [r for r in history if r.outcome == Outcome.APPLIED]
    # the version counts applied transitions, the log is in version order, and replay gives the live state
    assert live.version == len(applied_rows) == 4 + applied
    assert [r.session_version for r in applied_rows] == list(range(1, live.version + 1))
    assert replay(applied_rows) == live.state
    assert await services.sessions.state_at(session.id, clock.current) == live.state
    for at, state in stamps:
        assert await services.sessions.state_at(session.id, at) == state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(FIREABLE), max_size=25))
def test_any_trigger_sequence_keeps_log_versions_and_replay_consistent(tmp_path, triggers):
    asyncio.run(run_sequence(triggers, tmp_path))


def test_replay_refuses_a_log_that_does_not_follow_the_table():
    rows = [
        TransitionRecord(1, "s", "create", None, "created", Outcome.APPLIED, "system", None, [], 1, T0),
        TransitionRecord(2, "s", "merge", "created", "merged", Outcome.APPLIED, "system", None, [], 2, T0),
    ]
    assert replay(rows[:1]) == SessionState.CREATED
    with pytest.raises(TaskgateError, match="does not replay at seq 2"):
        replay(rows)
