"""The use cases refuse integers out of range themselves (issue 13, point 5), so a caller that is not the MCP
server (the CLI, a script) meets the same refusal: InvalidInput naming the parameter and its range, raised
before any I/O, on every backend. The ranges live in domain/bounds.py."""

from __future__ import annotations

import pytest

from taskgate.application.operators.decisions import Decide
from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sessions.ports import TransitionQuery
from taskgate.application.trackers.beads_import import ImportBeads
from taskgate.application.trackers.builtin import AddTask
from taskgate.domain.bounds import INT32_MAX
from taskgate.domain.errors import InvalidInput
from tests.builders import ACTOR, OPERATOR, seed, start
from tests.conftest import make_git_repo

VERSION_RANGE = "expected_version must be from 1 to 2147483647"


@pytest.mark.parametrize(
    "version",
    [INT32_MAX + 1, 2**63, 0, -1, pytest.param(10**5000, id="5001 digits")],  # str() of it would raise
)
def test_a_fire_or_a_decision_cannot_even_be_built_with_a_version_out_of_range(version):
    with pytest.raises(InvalidInput, match=VERSION_RANGE):
        FireTrigger("s", "approve", ACTOR, expected_version=version)
    with pytest.raises(InvalidInput, match=VERSION_RANGE):
        Decide("s", OPERATOR, "approve", expected_version=version)
    FireTrigger("s", "approve", ACTOR, expected_version=INT32_MAX)  # the bounds themselves are in range
    Decide("s", OPERATOR, "approve", expected_version=1)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: AddTask(1, "x", plan_id=INT32_MAX + 1), "plan_id must be from 1 to 2147483647, got 2147483648"),
        (lambda: AddTask(1, "x", plan_id=0), "plan_id must be from 1 to 2147483647, got 0"),
        (lambda: AddTask(2**63, "x"), "project_id must be from 1 to 2147483647"),
        (lambda: AddTask(1, "x", priority=5), "priority must be from 0 to 4, got 5"),
        (lambda: ImportBeads(1, "", plan_id=2**63), "plan_id must be from 1 to 2147483647"),
    ],
)
def test_tracker_commands_cannot_be_built_with_an_id_or_priority_out_of_range(build, message):
    with pytest.raises(InvalidInput, match=message):
        build()


async def test_read_use_cases_refuse_limits_and_plan_ids_out_of_range_before_reading(services, tmp_path):
    seeded = await seed(services, make_git_repo(tmp_path / "repo"))
    session = await start(services, seeded.tasks[0])
    before = await services.snapshot()
    for limit in (0, 100_001, 2**63):
        with pytest.raises(InvalidInput, match="limit must be from 1 to 100000"):
            await services.sessions.history(session.id, limit)
        with pytest.raises(InvalidInput, match="limit must be from 1 to 100000"):
            await services.audit.transitions(TransitionQuery(limit=limit))
    for plan_id in (INT32_MAX + 1, 2**63, -1):
        with pytest.raises(InvalidInput, match="plan_id must be from 1 to 2147483647"):
            await services.tracker.list_tasks(seeded.project.id, plan_id)
    assert await services.snapshot() == before
    assert len(await services.sessions.history(session.id, 100_000)) == 4  # the top of the range still answers
