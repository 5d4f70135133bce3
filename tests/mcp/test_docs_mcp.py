"""docs/mcp.md matches the server: its tool table lists exactly the registered tools, with their parameters."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from taskgate.domain.access import AGENT_TRIGGERS
from taskgate.domain.states import Trigger
from taskgate.entrypoints.mcp.annotations import TABLE
from taskgate.entrypoints.mcp.names import tool_name
from taskgate.entrypoints.mcp.server import build_server

DOC = Path(__file__).resolve().parents[2] / "docs" / "mcp.md"


@asynccontextmanager
async def no_app() -> AsyncIterator[Any]:
    raise AssertionError("list_tools must not need the lifespan (the database)")
    yield  # pragma: no cover


async def listed_tools(tool_names: str = "underscore") -> dict[str, Any]:
    server = build_server(open_app=no_app, local_principal=None, tool_names=tool_names)  # type: ignore[arg-type]
    return {tool.name: tool for tool in await server.list_tools()}


def table_rows() -> dict[str, list[str]]:
    """The doc's tool table: tool name → its cells (parameters, who, what it does)."""
    text = DOC.read_text()
    start, end = text.index("<!-- tools:start"), text.index("<!-- tools:end -->")
    rows: dict[str, list[str]] = {}
    for line in text[start:end].splitlines():
        match = re.match(r"^\| `([a-z_:]+)` \|(.*)\|$", line)
        if match:
            name, cells = match[1], [c.strip() for c in match[2].split(" | ")]
            assert name not in rows, f"{name} is listed twice in docs/mcp.md"
            assert len(cells) == 3, f"row {name}: expected parameters | who | what, got {cells}"
            rows[name] = cells
    assert rows, "no tool table between <!-- tools:start --> and <!-- tools:end --> in docs/mcp.md"
    return rows


def documented_parameters(cell: str) -> dict[str, bool]:
    """`name`? → optional, `name` → required; backticks inside (…) are examples, not parameters."""
    without_notes = re.sub(r"\([^)]*\)", "", cell)
    return {m[1]: m[2] != "?" for m in re.finditer(r"`([a-z_]+)`(\??)", without_notes)}


async def test_every_registered_tool_is_in_the_doc_table_and_every_row_is_a_tool():
    tools, rows = await listed_tools(), table_rows()
    assert sorted(set(tools) - set(rows)) == [], "tools missing from the table in docs/mcp.md"
    assert sorted(set(rows) - set(tools)) == [], "docs/mcp.md lists tools the server does not have"


async def test_each_row_names_exactly_the_tools_parameters_and_which_are_required():
    tools, rows = await listed_tools(), table_rows()
    for name, (parameters, _who, what) in rows.items():
        if name not in tools:
            continue  # reported by the test above
        schema = tools[name].input_schema
        expected = {p: p in schema.get("required", []) for p in schema.get("properties", {})}
        assert documented_parameters(parameters) == expected, f"parameters of {name} in docs/mcp.md"
        assert what, f"{name} has no description in docs/mcp.md"


def test_the_doc_gives_agents_exactly_the_triggers_access_allows():
    who = table_rows()["session_fire"][1]
    named = {t for t in Trigger if f"`{t.value}`" in who}
    assert named == set(AGENT_TRIGGERS)


async def test_colon_names_in_the_doc_are_the_servers_colon_names():
    colon = await listed_tools("colon")
    groups = {name.split(":")[0] for name in colon if ":" in name}
    mentioned = {m for m in re.findall(r"`([a-z]+:[a-z_]+)`", DOC.read_text()) if m.split(":")[0] in groups}
    assert "project:session_start" in mentioned
    assert mentioned <= set(colon), f"not colon tool names: {sorted(mentioned - set(colon))}"


@pytest.mark.parametrize("tool_names", ["underscore", "colon"])
async def test_both_styles_name_the_same_tools(tool_names: str):
    assert len(await listed_tools(tool_names)) == len(table_rows())


async def test_every_tool_has_a_title_hints_and_a_description_without_source_indentation():
    tools = await listed_tools()
    assert set(TABLE) == set(tools), "entrypoints/mcp/annotations.py and the server's tools differ"
    for name, tool in tools.items():
        hints = tool.annotations
        assert tool.title and hints is not None and hints.title == tool.title, name
        assert None not in (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint), name
        assert not (hints.read_only_hint and hints.destructive_hint), name
        assert "\n    " not in tool.description and tool.description.strip() == tool.description, name
    read_only = {name for name, tool in tools.items() if tool.annotations.read_only_hint}
    assert {"session_status", "session_list", "events_list", "audit_query"} <= read_only
    assert {"project_decide", "session_fire", "project_session_merge"}.isdisjoint(read_only)
    assert tools["session_cancel"].annotations.destructive_hint and tools["project_decide"].annotations.idempotent_hint


async def test_the_docs_name_table_is_the_servers_names_in_both_styles():
    text = DOC.read_text()
    table = text[text.index("<!-- names:start -->") : text.index("<!-- names:end -->")]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| `([a-z_:]+)` \|$", table, re.MULTILINE))
    assert sorted(rows) == sorted(await listed_tools("underscore"))
    assert sorted(rows.values()) == sorted(await listed_tools("colon"))
    assert all(tool_name(underscore, "colon") == colon for underscore, colon in rows.items())
