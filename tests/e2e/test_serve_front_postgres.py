"""`taskgate serve` over stdio on PostgreSQL lists its tools before its database is open, from the local operator's
grants remembered when a serve last opened that database (issue 43): nothing reads PostgreSQL fast enough for an
MCP client's first turn. When the grants changed since, the client is told (`notifications/tools/list_changed`)
once the database is open, and the next list is the real one; tool calls are authorised against the database as
ever. With nothing remembered (the first serve of a configuration), the list waits for the database.

Each test has a PostgreSQL database of its own, a repository set up with `taskgate init .` on it (its operator alice,
an admin), a cache folder of its own, and drives the real console script with JSON-RPC lines (a 2025 handshake, as
Codex and Claude Code speak it), or with the SDK's client (the 2026 protocol, where the notification comes on a
`subscriptions/listen` stream). The database is held shut by a transaction that locks `alembic_version`: serve's
opening reads it first (the schema check)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from mcp.client import Client  # not `from mcp import`: ruff's isort would take `mcp` for the tests/mcp package
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.subscriptions import ToolsListChanged
from sqlalchemy.engine import make_url

from taskgate.domain.access import permissions_of
from taskgate.entrypoints.mcp.annotations import visible_to_operator
from taskgate.entrypoints.mcp.handshake import table_rows
from tests.conftest import pg_admin, pg_database_url
from tests.e2e.test_serve_front import initialised_repo

TASKGATE = str(Path(sys.executable).with_name("taskgate"))
HOLD_S = 2.0  # how long the database stays locked while the test checks what was (not) answered
BOUND_S = 60.0
EVERY_TOOL = [row["name"] for row in table_rows()]
REVIEWER_TOOLS = [name for name in EVERY_TOOL if visible_to_operator(name, permissions_of(["reviewer"], []))]


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A PostgreSQL database of this test's own (serve's start-up recovery and heartbeat write into it)."""
    name = f"taskgate_test_front_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    pg_admin(f'CREATE DATABASE "{name}"')
    yield pg_database_url(name)
    pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def repo(tmp_path: Path, pg_database: str) -> tuple[Path, dict[str, str]]:
    """A git repository set up with `taskgate init .` on the test's database, and its environment."""
    return initialised_repo(tmp_path, TASKGATE_DATABASE_URL=pg_database)


def remembered_grants(env: dict[str, str]) -> list[Any]:
    """What the grants cache holds for this test (its own cache folder)."""
    folder = Path(env["XDG_CACHE_HOME"]) / "taskgate" / "grants"
    return [json.loads(path.read_text())["grants"] for path in folder.glob("*.json")]


async def _connect(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))


async def make_reviewer(url: str, operator_id: str = "alice") -> None:
    """Change the operator's role in the database itself, as another admin's command would."""
    conn = await _connect(url)
    try:
        await conn.execute("UPDATE operators SET roles = $1::json, permissions = '[]'::json WHERE id = $2",
                           '["reviewer"]', operator_id)  # fmt: skip
    finally:
        await conn.close()


@asynccontextmanager
async def database_locked(url: str) -> AsyncIterator[asyncpg.Connection]:
    """The database held shut for serve: `alembic_version` locked (serve's schema check waits) until `ROLLBACK`."""
    conn = await _connect(url)
    try:
        await conn.execute("BEGIN; LOCK TABLE alembic_version IN ACCESS EXCLUSIVE MODE")
        yield conn
    finally:
        await conn.close()


class Serve:
    """A `taskgate serve` process driven with JSON-RPC lines; replies by id, notifications in order of arrival."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.replies: dict[int, dict[str, Any]] = {}
        self.notifications: list[str] = []
        self._arrived = asyncio.Condition()
        self._reading = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            message = json.loads(line)
            async with self._arrived:
                if "id" in message:
                    self.replies[message["id"]] = message
                else:
                    self.notifications.append(message["method"])
                self._arrived.notify_all()

    def send(self, *messages: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))

    def ask(self, request_id: int, method: str, params: dict[str, Any] | None = None) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method} | ({"params": params} if params else {}))

    def handshake(self) -> None:
        client = {"name": "t", "version": "0"}
        self.ask(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def reply(self, request_id: int, within: float = BOUND_S) -> dict[str, Any]:
        """The reply to `request_id`. Raises: TimeoutError when none came `within` seconds."""
        with anyio.fail_after(within):
            async with self._arrived:
                await self._arrived.wait_for(lambda: request_id in self.replies)
        return self.replies[request_id]

    async def notified(self, method: str, within: float = BOUND_S) -> None:
        with anyio.fail_after(within):
            async with self._arrived:
                await self._arrived.wait_for(lambda: method in self.notifications)

    async def close(self) -> int:
        """Close stdin and wait for serve to exit; its exit code."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        with anyio.fail_after(BOUND_S):
            code = await self.process.wait()
            await self._reading
        return code


@asynccontextmanager
async def serving(repo: Path, env: dict[str, str], errlog: Path) -> AsyncIterator[Serve]:
    with errlog.open("a") as err:
        process = await asyncio.create_subprocess_exec(
            TASKGATE, "serve", cwd=repo, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=err, limit=2**24,
        )  # fmt: skip
        try:
            yield Serve(process)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def listed(serve: Serve, request_id: int, within: float = BOUND_S) -> list[str]:
    serve.ask(request_id, "tools/list")
    return [tool["name"] for tool in (await serve.reply(request_id, within))["result"]["tools"]]


async def serve_once(repo: Path, env: dict[str, str], errlog: Path) -> list[str]:
    """One serve that lists the tools and leaves (its opening remembers the operator's grants)."""
    async with serving(repo, env, errlog) as serve:
        serve.handshake()
        tools = await listed(serve, 2)
        assert await serve.close() == 0
    return tools


async def test_a_second_serve_lists_the_remembered_grants_tools_while_postgresql_is_locked_and_a_call_waits(
    repo: tuple[Path, dict[str, str]], pg_database: str, tmp_path: Path
) -> None:
    path, env = repo
    await make_reviewer(pg_database)
    errlog = tmp_path / "serve.stderr"
    assert await serve_once(path, env, errlog) == REVIEWER_TOOLS  # the first serve waited for the database
    assert remembered_grants(env) == [[["reviewer"], []]]
    async with database_locked(pg_database) as lock, serving(path, env, errlog) as serve:
        serve.handshake()
        initialized = (await serve.reply(1))["result"]
        assert initialized["capabilities"]["tools"] == {"listChanged": True}
        assert await listed(serve, 2, within=BOUND_S) == REVIEWER_TOOLS  # the database is shut: remembered
        serve.ask(3, "tools/call", {"name": "plan_list", "arguments": {}})
        with pytest.raises(TimeoutError):
            await serve.reply(3, within=HOLD_S)  # the call needs the database: it waits
        await lock.execute("ROLLBACK")
        answered = (await serve.reply(3))["result"]
        assert not answered["isError"] and "structuredContent" in answered, answered
        assert await listed(serve, 4) == REVIEWER_TOOLS
        assert await serve.close() == 0
    assert serve.notifications == []  # the grants were as remembered: nothing to correct
    assert "Traceback" not in errlog.read_text()


async def test_grants_changed_since_the_last_serve_are_told_to_the_client_and_the_next_list_is_the_real_one(
    repo: tuple[Path, dict[str, str]], pg_database: str, tmp_path: Path
) -> None:
    path, env = repo
    errlog = tmp_path / "serve.stderr"
    assert await serve_once(path, env, errlog) == EVERY_TOOL  # alice is an admin: remembered so
    await make_reviewer(pg_database)  # and then she is not
    async with database_locked(pg_database) as lock, serving(path, env, errlog) as serve:
        serve.handshake()
        assert await listed(serve, 2) == EVERY_TOOL  # as remembered: the database is not open yet
        # listed from the stale grants, refused by the database's: authorisation at call time is the guard
        serve.ask(3, "tools/call", {"name": "plan_add", "arguments": {"name": "Phase 1"}})
        await lock.execute("ROLLBACK")
        await serve.notified("notifications/tools/list_changed")
        assert await listed(serve, 4) == REVIEWER_TOOLS
        refused = (await serve.reply(3))["result"]
        assert refused["isError"] and "may not" in refused["content"][0]["text"], refused
        assert "'write' permission" in refused["content"][0]["text"], refused
        assert await serve.close() == 0
    assert serve.notifications == ["notifications/tools/list_changed"]
    assert remembered_grants(env) == [[["reviewer"], []]]
    assert await serve_once(path, env, errlog) == REVIEWER_TOOLS  # the next serve lists the new grants at once


async def test_the_first_serve_of_a_configuration_waits_for_postgresql_to_list_its_tools(
    repo: tuple[Path, dict[str, str]], pg_database: str, tmp_path: Path
) -> None:
    path, env = repo
    assert remembered_grants(env) == []  # `taskgate init` remembers no grants: only serve's opening does
    errlog = tmp_path / "serve.stderr"
    async with database_locked(pg_database) as lock, serving(path, env, errlog) as serve:
        serve.handshake()
        assert (await serve.reply(1))["result"]["serverInfo"]["name"] == "taskgate"  # initialize needs no database
        serve.ask(2, "tools/list")
        with pytest.raises(TimeoutError):
            await serve.reply(2, within=HOLD_S)  # nothing remembered: the list waits for the grants in the database
        await lock.execute("ROLLBACK")
        assert [tool["name"] for tool in (await serve.reply(2))["result"]["tools"]] == EVERY_TOOL
        assert await serve.close() == 0
    assert serve.notifications == []
    assert remembered_grants(env) == [[["admin"], ["admin", "approve", "override", "read", "write"]]]
    assert "Traceback" not in errlog.read_text()


async def test_a_client_of_the_2026_protocol_hears_of_changed_grants_on_its_subscriptions_listen_stream(
    repo: tuple[Path, dict[str, str]], pg_database: str, tmp_path: Path
) -> None:
    """From 2026-07-28 on, change notifications travel only on a `subscriptions/listen` stream the client opened."""
    path, env = repo
    errlog = tmp_path / "serve.stderr"
    assert await serve_once(path, env, errlog) == EVERY_TOOL
    await make_reviewer(pg_database)
    params = StdioServerParameters(command=TASKGATE, args=["serve"], env=env, cwd=str(path))
    with errlog.open("a") as err:
        async with Client(stdio_client(params, errlog=err), read_timeout_seconds=BOUND_S) as client:
            assert client.protocol_version == "2026-07-28"
            async with client.listen(tools_list_changed=True) as changes:
                assert [tool.name for tool in (await client.list_tools()).tools] == EVERY_TOOL
                with anyio.fail_after(BOUND_S):
                    event = await anext(aiter(changes))
                assert isinstance(event, ToolsListChanged)
                assert [tool.name for tool in (await client.list_tools()).tools] == REVIEWER_TOOLS
