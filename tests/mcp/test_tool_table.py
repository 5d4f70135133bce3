"""`serve` over stdio answers `initialize` and `tools/list` from the handshake (handshake.py, front.py) before its
database is open: the generated tool table must be what the registered server lists, the front must say what the
full server says in both name styles, and list to each operator what the full server lists to it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp.client import Client

from taskgate.application.operators.roster import AddOperator
from taskgate.bootstrap import App
from taskgate.domain.access import Principal
from taskgate.entrypoints.mcp.front import FrontServer, Opening
from taskgate.entrypoints.mcp.handshake import listed_tools, table_rows
from taskgate.entrypoints.mcp.server import build_server
from taskgate.entrypoints.mcp.tool_table import registered_rows, wire
from taskgate.infrastructure.grants_cache import Remembered
from tests.mcp.conftest import app_of

REGENERATE = "python -m taskgate.entrypoints.mcp.tool_table"
STYLES = ["underscore", "colon"]


async def test_the_tool_table_is_what_the_registered_server_lists() -> None:
    table, registered = table_rows(), await registered_rows()
    assert [row["name"] for row in table] == [row["name"] for row in registered], f"regenerate: {REGENERATE}"
    for ours, theirs in zip(table, registered, strict=True):
        assert ours == theirs, f"{ours['name']} differs from the registered tool; regenerate: {REGENERATE}"


@pytest.mark.parametrize("style", STYLES)
async def test_the_front_lists_every_tool_as_the_full_server_does_in_either_style(style: str) -> None:
    registered = await registered_rows(style)  # type: ignore[arg-type]
    assert [wire(tool) for tool in listed_tools(table_rows(), style)] == registered  # type: ignore[arg-type]


@pytest.mark.parametrize("style", STYLES)
def test_initialize_says_the_same_from_the_front_and_from_the_full_server(style: str) -> None:
    front = FrontServer(Opening(_unused), tool_names=style, operator_id="alice", database_url="sqlite:///nowhere.db")  # type: ignore[arg-type]
    full = build_server(_never, local_principal=None, tool_names=style)  # type: ignore[arg-type]
    ours, theirs = (s._lowlevel_server.create_initialization_options() for s in (front, full))
    assert ours.model_dump() == theirs.model_dump()


async def test_each_operator_is_listed_by_the_front_what_the_full_server_lists_it(sql_services, tmp_path) -> None:
    """On SQLite the front reads the operator's roles itself (the full server is not open yet); on PostgreSQL it
    waits for the full server and asks it: either way the list is the same."""
    await sql_services.operators.add(AddOperator("alice", ["admin"], actor="operator:setup"))
    await sql_services.operators.add(AddOperator("dev", ["developer"], actor="operator:alice"))
    await sql_services.operators.add(AddOperator("rev", ["reviewer"], actor="operator:alice"))
    await sql_services.operators.grant("rev", permissions=["write"], actor="operator:alice")
    app = app_of(sql_services)
    for who in ("alice", "dev", "rev", "nobody"):  # nobody: not registered, every tool listed (each call says why)
        full = _full(app, who, "underscore")
        async with Client(full) as client:
            expected = [wire(tool) for tool in (await client.list_tools()).tools]
        built: list[str] = []
        opening = Opening(_builder(app, who, built), open_after_s=600)
        front = FrontServer(opening, tool_names="underscore", operator_id=who, database_url=sql_services.url)
        async with Client(front) as client:
            listed = [wire(tool) for tool in (await client.list_tools()).tools]
            built_first = list(built)
        assert listed == expected, who
        if sql_services.backend == "sqlite":
            assert built_first == [], "SQLite: listed before the full server was built"


class FakeGrantsMemory:
    """The front's memory of grants (infrastructure/grants_cache.py), in a dict."""

    def __init__(self, remembered: Remembered | None = None) -> None:
        self.remembered, self.written = remembered, []

    def recall(self) -> Remembered | None:
        return self.remembered

    def remember(self, found: Remembered) -> None:
        self.written.append(found)


async def test_where_the_roster_cannot_be_read_the_front_lists_from_remembered_grants_and_remembers_the_real_ones(
    sql_services,
) -> None:
    """On PostgreSQL the front lists what the remembered grants allow before the full server is built; once it is
    open the real grants are remembered, and the list is what the full server lists."""
    await sql_services.operators.add(AddOperator("rev", ["reviewer"], actor="operator:setup"))
    app = app_of(sql_services)
    full = _full(app, "rev", "underscore")
    async with Client(full) as client:
        expected = [wire(tool) for tool in (await client.list_tools()).tools]
    built: list[str] = []
    memory = FakeGrantsMemory(Remembered("rev", "underscore", None, (["reviewer"], [])))
    front = FrontServer(Opening(_builder(app, "rev", built), open_after_s=600), tool_names="underscore",
                        operator_id="rev", database_url=sql_services.url, memory=memory)  # fmt: skip
    async with Client(front) as client:
        assert [wire(tool) for tool in (await client.list_tools()).tools] == expected
        assert built == [], "listed before the full server was built"
        await client.call_tool("ping", {})  # opens the full server
        with anyio.fail_after(30):
            while not memory.written:
                await anyio.sleep(0.01)
    roster = sql_services.url if sql_services.backend == "sqlite" else None  # never a PostgreSQL URL
    assert memory.written == [Remembered("rev", "underscore", roster, (["reviewer"], []))]


def test_answering_tools_list_imports_neither_the_services_nor_sqlalchemy(tmp_path) -> None:
    script = f"""
import os, sys, anyio
from mcp.client import Client
from taskgate.entrypoints.mcp.front import FrontServer, Opening

def build():
    raise AssertionError("not built to list tools")

async def main():
    front = FrontServer(Opening(build, open_after_s=600), tool_names="underscore", operator_id="alice",
                        database_url="sqlite:///{tmp_path}/taskgate.db")
    async with Client(front) as client:
        tools = (await client.list_tools()).tools
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("sqlalchemy", "alembic", "asyncpg")
                       or m.startswith(("taskgate.bootstrap", "taskgate.application", "taskgate.infrastructure.db")))
        print(len(tools), heavy)
        sys.stdout.flush()
        os._exit(0)  # leave before the opening starts by itself

anyio.run(main)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    count, heavy = done.stdout.split(" ", 1)
    assert int(count) == len(table_rows()) and heavy.strip() == "[]", done.stdout


def _full(app: App, operator_id: str, style: str) -> Any:
    @asynccontextmanager
    async def open_app() -> AsyncIterator[App]:
        yield app

    return build_server(open_app, local_principal=Principal.operator(operator_id), tool_names=style)  # type: ignore[arg-type]


def _builder(app: App, operator_id: str, built: list[str]) -> Any:
    def build() -> Any:
        built.append(operator_id)
        return _full(app, operator_id, "underscore")

    return build


def _unused() -> Any:
    raise AssertionError("not built")


@asynccontextmanager
async def _never() -> AsyncIterator[App]:
    raise AssertionError("not opened")
    yield  # pragma: no cover
