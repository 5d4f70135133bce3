"""Integers out of range are invalid input (issue 13, point 5): every integer parameter of every tool carries
its range in the input schema, and an argument outside it is refused naming the parameter and the bound,
before anything reaches the database, writing nothing, on SQLite and on PostgreSQL alike (before, 2**63 ended
in SQLite's bare "Error executing tool project_decide" and PostgreSQL's asyncpg wording)."""

from __future__ import annotations

from typing import Any

import pytest

from taskgate.domain.access import Principal
from taskgate.domain.bounds import INT32_MAX
from tests.builders import fire, seed, start
from tests.conftest import Services, make_git_repo
from tests.mcp.conftest import connect
from tests.mcp.test_docs_mcp import listed_tools

ALICE = Principal.operator("alice")
TOO_BIG = [INT32_MAX + 1, 2**63, 10**30]
TOO_SMALL = [0, -(2**63) - 1]


def integer_parameters(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Parameter name → its integer schema, for the parameters that take an integer (alone or or-null)."""
    found = {}
    for name, prop in schema.get("properties", {}).items():
        for option in prop.get("anyOf", [prop]):
            if option.get("type") == "integer":
                found[name] = option
    return found


async def test_every_integer_parameter_of_every_tool_has_a_range_a_database_can_hold():
    tools = await listed_tools()
    ranged = {
        (tool, name): (spec.get("minimum"), spec.get("maximum"))
        for tool, listed in tools.items()
        for name, spec in integer_parameters(listed.input_schema).items()
    }
    assert ("project_decide", "expected_version") in ranged and ("task_add", "plan_id") in ranged
    unbounded = {key: bounds for key, bounds in ranged.items() if None in bounds}
    assert unbounded == {}, f"integer parameters without a minimum and a maximum: {unbounded}"
    assert all(low >= 0 and high <= INT32_MAX for low, high in ranged.values()), ranged
    versions = {bounds for (_, name), bounds in ranged.items() if name == "expected_version"}
    assert versions == {(1, INT32_MAX)}


async def _verifying(services: Services, tmp_path) -> Any:
    seeded = await seed(services, make_git_repo(tmp_path / "repo"))
    return await fire(services, await start(services, seeded.tasks[0]), "plan_complete", "work_complete")


@pytest.mark.parametrize("value", TOO_BIG + TOO_SMALL)
async def test_project_decide_refuses_an_expected_version_out_of_range_and_writes_nothing(
    sql_services, tmp_path, value
):
    session = await _verifying(sql_services, tmp_path)
    async with connect(sql_services, ALICE) as tools:
        before = await sql_services.snapshot()
        text = await tools.refused("project_decide", session_id=session.id, decision="approve", expected_version=value)
        assert await sql_services.snapshot() == before
        assert "expected_version" in text, text
        bound = "less than or equal to 2147483647" if value > 0 else "greater than or equal to 1"
        assert bound in text, text
        assert "asyncpg" not in text and "OverflowError" not in text and "internal error" not in text
        decided = await tools.ok("project_decide", session_id=session.id, decision="approve",
                                 expected_version=session.version)  # fmt: skip
        assert decided["state"] == "awaiting_merge"


@pytest.mark.parametrize(
    ("tool", "arguments", "bound"),
    [
        ("session_fire", {"trigger": "approve", "expected_version": 2**63}, "less than or equal to 2147483647"),
        ("session_fire", {"trigger": "approve", "expected_version": 0}, "greater than or equal to 1"),
        ("session_history", {"limit": 2**63}, "less than or equal to 10000"),
        ("audit_query", {"limit": 2**63}, "less than or equal to 10000"),
        ("task_add", {"title": "x", "plan_id": INT32_MAX + 1}, "less than or equal to 2147483647"),
        ("task_add", {"title": "x", "plan_id": 2**63}, "less than or equal to 2147483647"),
        ("task_add", {"title": "x", "priority": 2**63}, "less than or equal to 4"),
        ("task_list", {"plan_id": 2**63}, "less than or equal to 2147483647"),
        ("task_list", {"plan_id": -1}, "greater than or equal to 1"),
    ],
)
async def test_other_integer_parameters_out_of_range_are_refused_naming_the_parameter(
    sql_services, tmp_path, tool, arguments, bound
):
    session = await _verifying(sql_services, tmp_path)
    if tool.startswith("session_"):
        arguments = {"session_id": session.id, **arguments}
    async with connect(sql_services, ALICE) as tools:
        before = await sql_services.snapshot()
        text = await tools.refused(tool, **arguments)
        assert await sql_services.snapshot() == before
        parameter = next(name for name in arguments if name not in {"session_id", "trigger", "title"})
        assert parameter in text and bound in text, text
