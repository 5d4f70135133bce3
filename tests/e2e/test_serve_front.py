"""`taskgate serve` over stdio answers `initialize` and `tools/list` before its database is open (issue 43: Codex
builds its tool list ~1.1 s after spawning its MCP servers), and a tool call waits for the database. A database it
cannot open still fails by name: the first tool call says why, and serve exits non-zero.

Each test sets a repository up as a user does (`git init`, `taskgate init .`) and runs the real console script."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import anyio
from mcp.client import Client  # not `from mcp import`: ruff's isort would take `mcp` for the tests/mcp package
from mcp.client.stdio import StdioServerParameters, stdio_client

from taskgate.entrypoints.mcp.handshake import table_rows

TASKGATE = str(Path(sys.executable).with_name("taskgate"))
HOLD_S = 2.0  # how long the test keeps the database locked after the tool call was sent
BOUND_S = 60.0


def initialised_repo(tmp_path: Path, **more_env: str) -> tuple[Path, dict[str, str]]:
    """A git repository set up with `taskgate init .` (its operator alice, an admin), and the environment (with
    `more_env`, e.g. TASKGATE_DATABASE_URL)."""
    repo = tmp_path / "shop"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "start"],
                   cwd=repo, check=True)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")} | {
        "TASKGATE_OPERATOR__DEFAULT": "alice",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # what taskgate remembers: this test's own
        **more_env,
    }
    done = subprocess.run([TASKGATE, "init", "."], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return repo, env


def database_of(repo: Path) -> Path:
    (path,) = (repo / ".taskgate").rglob("taskgate.db")
    return path


async def test_tools_are_listed_while_the_database_is_locked_and_a_tool_call_waits_for_it(tmp_path: Path) -> None:
    repo, env = initialised_repo(tmp_path)
    lock = sqlite3.connect(database_of(repo), isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # serve's start writes (its heartbeat): it cannot open until this ends
    released_at = None
    params = StdioServerParameters(command=TASKGATE, args=["serve"], env=env, cwd=str(repo))
    try:
        with (tmp_path / "server.stderr").open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=BOUND_S) as client:
                with anyio.fail_after(BOUND_S):
                    listed = (await client.list_tools()).tools
                assert [tool.name for tool in listed] == [row["name"] for row in table_rows()]  # alice: an admin
                answered: dict[str, object] = {}

                async def call() -> None:
                    result = await client.call_tool("plan_list", {})
                    answered.update(result=result, at=time.monotonic())

                async with anyio.create_task_group() as calls:
                    calls.start_soon(call)
                    await anyio.sleep(HOLD_S)
                    assert not answered, "the tool call was answered while the database could not be opened"
                    lock.execute("ROLLBACK")
                    released_at = time.monotonic()
                result = answered["result"]
                assert not result.is_error, result.content  # type: ignore[attr-defined]
                assert result.structured_content is not None  # type: ignore[attr-defined]
                assert answered["at"] >= released_at  # type: ignore[operator]
    finally:
        lock.close()
    assert "Traceback" not in (tmp_path / "server.stderr").read_text()


async def test_a_database_taskgate_cannot_open_fails_the_first_tool_call_by_name_and_serve_exits_non_zero(
    tmp_path: Path,
) -> None:
    repo, env = initialised_repo(tmp_path)
    with sqlite3.connect(database_of(repo)) as db:  # as a newer taskgate would have migrated it
        db.execute("UPDATE alembic_version SET version_num = '9999_future'")
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "plan_list", "arguments": {}}},
    ]  # fmt: skip
    server = await asyncio.create_subprocess_exec(
        TASKGATE, "serve", cwd=repo, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, limit=2**24,
    )  # fmt: skip
    assert server.stdin is not None and server.stdout is not None and server.stderr is not None
    try:
        server.stdin.write(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        await server.stdin.drain()  # and stdin stays open: serve ends by itself once the tool call is told
        with anyio.fail_after(BOUND_S):
            out, err = await asyncio.gather(server.stdout.read(), server.stderr.read())
            code = await server.wait()
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
    replies = {reply["id"]: reply for reply in map(json.loads, out.splitlines())}
    assert replies[1]["result"]["serverInfo"]["name"] == "taskgate"
    assert len(replies[2]["result"]["tools"]) == len(table_rows())
    told = replies[3]["result"]
    assert told["isError"], told
    assert "could not open its database" in told["content"][0]["text"] and "9999_future" in told["content"][0]["text"]
    assert code == 1
    last = err.decode().strip().splitlines()[-1]
    assert last.startswith("error: taskgate serve could not open its database") and "9999_future" in last, last


HANDSHAKE = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize",
     "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
]  # fmt: skip
CALL = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "plan_list", "arguments": {}}}


async def serve_lines(repo: Path, env: dict[str, str], lines: list[dict]) -> tuple[dict, int, str]:
    """Run serve on `lines`, stdin closed once each request is answered (or serve left), to its exit: its replies
    by id, its exit code, its stderr."""
    server = await asyncio.create_subprocess_exec(
        TASKGATE, "serve", cwd=repo, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, limit=2**24,
    )  # fmt: skip
    assert server.stdin is not None and server.stdout is not None and server.stderr is not None
    asked, replies = {line["id"] for line in lines if "id" in line}, {}
    try:
        with anyio.fail_after(BOUND_S):
            server.stdin.write(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
            await server.stdin.drain()
            while not asked <= replies.keys() and (line := await server.stdout.readline()):
                reply = json.loads(line)
                replies[reply.get("id")] = reply
            server.stdin.close()
            err = await server.stderr.read()
            code = await server.wait()
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
    return replies, code, err.decode()


async def test_serve_answers_from_what_its_last_opening_remembered_and_forgets_it_when_the_settings_say_otherwise(
    tmp_path: Path,
) -> None:
    """The second serve of a configuration answers before loading its settings, with the operator and tool-name
    style its last opening remembered; settings that, once loaded, say otherwise fail the opening by name, and the
    next serve loads them first again."""
    repo, env = initialised_repo(tmp_path)
    replies, code, err = await serve_lines(repo, env, HANDSHAKE)
    assert code == 0, err
    (entry,) = (tmp_path / "cache" / "taskgate" / "grants").glob("*.json")
    remembered = json.loads(entry.read_text())
    assert remembered["operator_id"] == "alice" and remembered["tool_names"] == "underscore"
    assert remembered["roster_url"].startswith("sqlite:///") and remembered["grants"][0] == ["admin"]
    entry.write_text(json.dumps(remembered | {"tool_names": "colon"}))  # as if another configuration had written it

    replies, code, err = await serve_lines(repo, env, [*HANDSHAKE, CALL])
    names = [tool["name"] for tool in replies[2]["result"]["tools"]]
    assert "project:init" in names and "project_init" not in names  # answered as remembered, settings not loaded
    told = replies[3]["result"]
    assert told["isError"] and "configuration changed while serve started" in told["content"][0]["text"], told
    assert code == 1
    assert not entry.exists()

    replies, code, err = await serve_lines(repo, env, [*HANDSHAKE, CALL])
    assert code == 0, err
    assert [tool["name"] for tool in replies[2]["result"]["tools"]] == [row["name"] for row in table_rows()]
    assert not replies[3]["result"]["isError"], replies[3]
    assert json.loads(entry.read_text())["tool_names"] == "underscore"
