"""The MCP server as a client sees it: `taskgate serve` as a real subprocess, over stdio and over HTTP.

Stdio: the official SDK client spawns the server and drives a session from `project_init` to `completed`; the
caller is the configured local operator. HTTP: the data dir is prepared with the CLI, tokens are issued with
`taskgate token create`, and the bearer gate, the operator and agent principals, the agent rules of
`domain/access.py`, the `operator_id` check and revocation are exercised over the wire.

Lines a server cannot read (a lone surrogate, invalid UTF-8, not JSON, not JSON-RPC) are written raw, over stdio
and over HTTP: both answer the same JSON-RPC error and go on serving (issue 13, point 4: stdio used to leave
them unanswered). Integers out of range are refused by name through the real server, on SQLite and PostgreSQL,
writing nothing (issue 13, point 5).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client import Client  # not `from mcp import`: ruff's isort would take `mcp` for the tests/mcp package
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from taskgate import __version__
from taskgate.entrypoints.mcp.server import UNSTRUCTURED
from taskgate.entrypoints.mcp.tools import TOOLS
from taskgate.infrastructure.db.engine import Database
from tests.conftest import SQL_BACKENDS, make_git_repo, open_database, wire

TASKGATE = str(Path(sys.executable).with_name("taskgate"))
TOOL_NAMES = {fn.__name__ for fn in TOOLS}
HAPPY_PATH = [
    ("plan_complete", "planning", "executing"),
    ("work_complete", "executing", "verifying"),
    ("approve", "verifying", "awaiting_merge"),
    ("merge", "awaiting_merge", "merged"),  # cleanup_done (merged → completed) follows by itself
]
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw-http-probe", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def taskgate_env(workdir: Path) -> dict[str, str]:
    """A private data dir (and so SQLite file) and operator for the server and the CLI of one test."""
    return {"TASKGATE_DATA_DIR": str(workdir / "data"), "TASKGATE_OPERATOR__DEFAULT": "alice", "COLUMNS": "200"}


async def ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool that must succeed; its structured output."""
    result = await client.call_tool(tool, arguments)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert not result.is_error, f"{tool}({arguments}) failed: {text}"
    assert result.structured_content is not None, f"{tool} returned no structured output"
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """Call a tool that must be refused as a tool error: a readable message, no traceback, nothing changed."""
    result = await client.call_tool(tool, arguments)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert result.is_error, f"{tool}({arguments}) should have been refused, got {result.structured_content}"
    assert "Traceback" not in text and 'File "' not in text, text
    assert "Nothing was changed" in text, text
    return text


# -- stdio ------------------------------------------------------------------------------------------------------


async def test_over_stdio_a_client_drives_a_session_from_project_init_to_completed(tmp_path: Path):
    repo = make_git_repo(tmp_path / "repo")
    params = StdioServerParameters(command=TASKGATE, args=["serve"], env=taskgate_env(tmp_path), cwd=str(tmp_path))
    server_log = tmp_path / "server.stderr"
    with server_log.open("w") as errlog:
        # `Client(params)` would do; the explicit transport lets the test read the server's stderr.
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=60) as client:
            assert client.server_info is not None
            assert (client.server_info.name, client.server_info.version) == ("taskgate", __version__)
            assert client.instructions and "project_session_start" in client.instructions

            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == TOOL_NAMES
            for tool in tools.values():
                assert tool.description and tool.description.strip(), tool.name
                assert tool.input_schema["type"] == "object", tool.name
                if tool.name in UNSTRUCTURED:  # one text block, as Claude Code's permission prompt reads it
                    assert tool.output_schema is None, tool.name
                else:
                    assert tool.output_schema is not None and "summary" in tool.output_schema["properties"], tool.name
            fire_schema = tools["session_fire"].input_schema
            assert fire_schema["required"] == ["session_id", "trigger"]
            assert "ctx" not in fire_schema["properties"]

            project = await ok(client, "project_init", path=str(repo), name="demo")
            assert (project["key"], project["root_path"], project["archived"]) == ("DEMO", str(repo), False)
            plan = await ok(client, "plan_add", name="Phase 1")
            assert (plan["id"], plan["status"]) == (1, "open")
            first = await ok(client, "task_add", title="Build the API", plan_id=1, priority=1)
            second = await ok(client, "task_add", title="Document it", plan_id=1, blocked_by=["DEMO-1"])
            assert (first["id"], second["id"], second["blockers"]) == ("DEMO-1", "DEMO-2", ["DEMO-1"])
            ready = await ok(client, "project_ready_tasks")
            assert [t["id"] for t in ready["tasks"]] == ["DEMO-1"]

            session = await ok(client, "project_session_start", task_id="DEMO-1")
            assert (session["state"], session["operator_id"], session["version"]) == ("planning", "alice", 4)
            assert "plan_complete" in session["allowed_triggers"]
            sid = session["id"]

            version = session["version"]
            for trigger, before, after in HAPPY_PATH:
                if before == "executing":  # a refusal over stdio: a tool error that says why, and nothing moves
                    text = await refused(client, "session_fire", session_id=sid[:8], trigger="merge")
                    assert "InvalidTransition" in text and "'merge' is not allowed" in text and "executing" in text
                    unchanged = await ok(client, "session_status", session_id=sid)
                    assert (unchanged["state"], unchanged["version"]) == ("executing", version)
                fired = await ok(client, "session_fire", session_id=sid[:8], trigger=trigger, reason=f"via {trigger}")
                version += 1 + len(fired["then"])
                assert (fired["from_state"], fired["to_state"]) == (before, after)
                assert (fired["state"], fired["version"]) == (after if not fired["then"] else "completed", version)
                assert fired["actor"] == "operator:alice"
                assert fired["reason"] == f"via {trigger}"

            done = await ok(client, "session_status", session_id=sid)
            assert (done["state"], done["version"], done["allowed_triggers"]) == ("completed", 9, [])
            assert done["completed_at"] is not None

            history = (await ok(client, "session_history", session_id=sid))["transitions"]
            assert [r["to_state"] for r in history] == [
                "created", "initializing", "ready", "planning", *(after for _, _, after in HAPPY_PATH), "completed"
            ]  # fmt: skip
            assert {r["outcome"] for r in history} == {"applied"}  # the refused merge wrote nothing
            by_operator = [r for r in history if r["trigger"] in {"start", *(t for t, _, _ in HAPPY_PATH)}]
            assert len(by_operator) == 5 and {r["actor"] for r in by_operator} == {"operator:alice"}

            audit = await ok(client, "audit_query", actor="operator:alice", session_id=sid)
            assert [r["trigger"] for r in audit["transitions"]][-4:] == [t for t, _, _ in HAPPY_PATH]
            ready = await ok(client, "project_ready_tasks")
            assert [t["id"] for t in ready["tasks"]] == ["DEMO-2"]
    assert "Traceback" not in server_log.read_text()


# -- stdio: lines the server cannot read --------------------------------------------------------------------------

REPLY_TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0  # the first reply waits for the lifespan: migrations, start-up recovery


def tool_call(ident: int | str, tool: str, arguments: bytes) -> bytes:
    """A raw tools/call line; `arguments` is the JSON object, as bytes, exactly as sent."""
    head = json.dumps({"jsonrpc": "2.0", "id": ident, "method": "tools/call"}).encode()[:-1]
    return head + b', "params": {"name": "' + tool.encode() + b'", "arguments": ' + arguments + b"}}"


UNREADABLE = [
    # (what, line, JSON-RPC error code, words of its message, the id the reply carries)
    ("a lone surrogate escape", tool_call(2, "plan_add", rb'{"name": "\udcff"}'), -32700, "surrogate", 2),
    ("an invalid UTF-8 byte", tool_call(3, "plan_add", b'{"name": "a\xffb"}'), -32700, "invalid unicode", 3),
    ("a line that is not JSON", b"{not json", -32700, "Parse error", None),
    ("JSON that is not JSON-RPC", b'{"jsonrpc": "2.0", "id": 5, "method": 7}', -32602, "Validation error", 5),
]


class RawStdio:
    """`taskgate serve` as a subprocess, driven with raw lines; every wait for a reply is bounded."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def send(self, line: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        await self.process.stdin.drain()

    async def reply(self, timeout: float = REPLY_TIMEOUT_S) -> dict[str, Any]:
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        except TimeoutError:
            pytest.fail(f"no reply within {timeout:.0f} s: the server left the line unanswered")
        assert line, "the server closed stdout"
        return json.loads(line)

    async def call(self, ident: int, tool: str, **arguments: Any) -> dict[str, Any]:
        await self.send(tool_call(ident, tool, json.dumps(arguments).encode()))
        answer = await self.reply()
        assert answer["id"] == ident and "result" in answer, answer
        return answer["result"]


@asynccontextmanager
async def raw_stdio(workdir: Path) -> AsyncIterator[RawStdio]:
    """A started and initialised `taskgate serve`; stdin closed (and the exit awaited, bounded) at the end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")} | taskgate_env(workdir)
    log = workdir / "server.stderr"
    with log.open("w") as errlog:
        process = await asyncio.create_subprocess_exec(
            TASKGATE, "serve", cwd=workdir, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=errlog, limit=2**24,
        )  # fmt: skip
    wire = RawStdio(process)
    try:
        await wire.send(json.dumps(INITIALIZE).encode())
        assert (await wire.reply(START_TIMEOUT_S))["result"]["serverInfo"]["name"] == "taskgate"
        await wire.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        yield wire
        assert process.stdin is not None
        process.stdin.close()
        assert await asyncio.wait_for(process.wait(), REPLY_TIMEOUT_S) == 0, log.read_text()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert "Traceback" not in log.read_text(), log.read_text()


async def test_over_stdio_every_unreadable_line_is_answered_and_the_server_goes_on(tmp_path: Path):
    repo = make_git_repo(tmp_path / "repo")
    async with raw_stdio(tmp_path) as wire:
        assert not (await wire.call(1, "project_init", path=str(repo), name="demo"))["isError"]
        for what, line, code, says, ident in UNREADABLE:
            await wire.send(line)
            answer = await wire.reply()
            assert answer["id"] == ident and answer["error"]["code"] == code, (what, answer)
            assert says in answer["error"]["message"], (what, answer)
            assert (await wire.call(10, "ping"))["structuredContent"] == {"summary": "pong"}, what
        assert (await wire.call(11, "plan_list"))["structuredContent"]["plans"] == []  # the refused adds wrote nothing
        added = await wire.call(12, "plan_add", name="Phase 1")
        assert added["structuredContent"]["id"] == 1, added


async def test_over_stdio_blank_lines_are_skipped_and_a_notification_needs_no_answer(tmp_path: Path):
    async with raw_stdio(tmp_path) as wire:
        await wire.send(b"")
        await wire.send(b"   ")
        await wire.send(b'{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}}')
        assert (await wire.call(2, "ping"))["structuredContent"] == {"summary": "pong"}  # the next line is its reply


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_the_real_server_refuses_integers_out_of_range_by_name_and_writes_nothing(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
):
    database, url = await open_database(backend, request, tmp_path)
    assert isinstance(database, Database) and url is not None
    services = wire(backend, database, url)
    repo = make_git_repo(tmp_path / "repo")
    env = taskgate_env(tmp_path) | {"TASKGATE_DATABASE_URL": url}
    params = StdioServerParameters(command=TASKGATE, args=["serve"], env=env, cwd=str(tmp_path))
    try:
        async with Client(params, read_timeout_seconds=60) as client:
            await ok(client, "project_init", path=str(repo), name="demo")
            await ok(client, "plan_add", name="Phase 1", project="demo")
            await ok(client, "task_add", title="Build the API", plan_id=1, project="demo")
            sid = (await ok(client, "project_session_start", task_id="DEMO-1"))["id"]
            for trigger in ("plan_complete", "work_complete"):
                verifying = await ok(client, "session_fire", session_id=sid, trigger=trigger)
            before = await services.snapshot()
            for tool, arguments in [
                ("project_decide", {"session_id": sid, "decision": "approve", "expected_version": 2**63}),
                ("session_fire", {"session_id": sid, "trigger": "approve", "expected_version": 2**63}),
                ("task_add", {"title": "x", "plan_id": 2**63, "project": "demo"}),
            ]:
                result = await client.call_tool(tool, arguments)
                text = " ".join(getattr(c, "text", "") for c in result.content)
                assert result.is_error, (tool, result.structured_content)
                assert text != f"Error executing tool {tool}" and "Traceback" not in text, text
                name = "plan_id" if tool == "task_add" else "expected_version"
                assert name in text and "less than or equal to 2147483647" in text, text
                assert "asyncpg" not in text and "Overflow" not in text, text
            assert await services.snapshot() == before
            decided = await ok(client, "project_decide", session_id=sid, decision="approve",
                               expected_version=verifying["version"])  # fmt: skip
            assert decided["state"] == "awaiting_merge"
    finally:
        await database.dispose()


# -- streamable HTTP --------------------------------------------------------------------------------------------


@dataclass
class HttpServer:
    url: str
    workdir: Path
    env: dict[str, str]
    operator_token: str
    agent_token: str
    agent_token_id: str
    agent_session: str  # session 1 (DEMO-1): the one the agent token reaches
    other_session: str  # session 2 (DEMO-2)

    def cli(self, *args: str) -> str:
        return run_cli(self.workdir, self.env, *args)

    def cli_json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json"))


def run_cli(workdir: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([TASKGATE, *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"taskgate {' '.join(args)} failed: {done.stderr}"
    return done.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_listening(process: subprocess.Popen, port: int, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"taskgate serve --http exited with {process.returncode}: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return  # uvicorn binds only after the app's lifespan (which opens the database) has started
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"taskgate serve --http did not listen on port {port} within {timeout:.0f}s: {log.read_text()}")


def stop_server(process: subprocess.Popen) -> None:
    """Stop a `taskgate serve` process: SIGTERM, then SIGKILL if it has not exited within 10 s."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """`taskgate serve --http` over a data dir prepared with the CLI: project demo, plan 1, DEMO-1..3, sessions
    for DEMO-1 and DEMO-2 (both planning), an operator token for alice and an agent token for DEMO-1's session."""
    workdir = tmp_path_factory.mktemp("mcp-http")
    make_git_repo(workdir / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")} | taskgate_env(workdir)

    def cli_json(*args: str) -> Any:
        return json.loads(run_cli(workdir, env, *args, "--json"))

    run_cli(workdir, env, "init", "repo", "--name", "demo")
    run_cli(workdir, env, "plan", "add", "Phase 1")
    for title in ("Build the API", "Write the client", "Document it"):
        run_cli(workdir, env, "task", "add", title, "--plan", "1")
    first = cli_json("session", "start", "DEMO-1")["id"]
    second = cli_json("session", "start", "DEMO-2")["id"]
    operator = cli_json("token", "create", "--operator", "alice")
    agent = cli_json("token", "create", "--agent", "--session", first[:8])
    assert (operator["kind"], agent["kind"], agent["session_id"]) == ("operator", "agent", first)

    port = _free_port()
    log = workdir / "server.stderr"
    with log.open("w") as errlog:
        process = subprocess.Popen(
            [TASKGATE, "serve", "--http", "--host", "127.0.0.1", "--port", str(port)],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=errlog,
            stderr=errlog,
        )
    try:
        _wait_until_listening(process, port, log)
        yield HttpServer(
            f"http://127.0.0.1:{port}/mcp",
            workdir,
            env,
            operator["token"],
            agent["token"],
            agent["id"],
            first,
            second,
        )
        assert process.poll() is None, f"the server died: {log.read_text()}"
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        stop_server(process)


@asynccontextmanager
async def connect(server: HttpServer, token: str) -> AsyncIterator[Client]:
    """An SDK client whose every request carries `Authorization: Bearer <token>`."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0)) as http,
        Client(streamable_http_client(server.url, http_client=http), read_timeout_seconds=60) as client,
    ):
        yield client


def raw_post(server: HttpServer, token: str | None) -> httpx2.Response:
    headers = dict(MCP_HEADERS) | ({"Authorization": f"Bearer {token}"} if token is not None else {})
    return httpx2.post(server.url, json=INITIALIZE, headers=headers, timeout=30.0)


@pytest.mark.parametrize(("what", "line", "code", "says", "_ident"), UNREADABLE, ids=[u[0] for u in UNREADABLE])
def test_http_answers_the_lines_stdio_cannot_read_with_the_same_errors(
    http_server: HttpServer, what: str, line: bytes, code: int, says: str, _ident: Any
):
    headers = MCP_HEADERS | {"Authorization": f"Bearer {http_server.operator_token}"}
    response = httpx2.post(http_server.url, content=line, headers=headers, timeout=30.0)
    answer = response.json()
    assert response.status_code == 400 and answer["id"] is None, (what, answer)  # one POST, one answer: no id needed
    assert answer["error"]["code"] == code and says in answer["error"]["message"], (what, answer)


def assert_refused(response: httpx2.Response, says: str) -> None:
    """The gate's refusal: 403 (not 401, which MCP clients take for an OAuth challenge) with a JSON-RPC error."""
    assert response.status_code == 403, response.text
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer ") and 'realm="taskgate"' in challenge and says in challenge
    assert "resource_metadata" not in challenge
    error = response.json()["error"]
    assert response.json()["jsonrpc"] == "2.0" and says in error["message"]


def test_http_without_a_valid_bearer_token_is_403_with_the_reason(http_server: HttpServer):
    assert_refused(raw_post(http_server, None), "a bearer token issued by `taskgate token create` is required")
    assert_refused(raw_post(http_server, "tg_" + "x" * 43), "unknown or revoked")
    assert_refused(raw_post(http_server, "not-even-a-taskgate-token"), "bearer token issued by")
    basic = httpx2.post(
        http_server.url, json=INITIALIZE, headers=MCP_HEADERS | {"Authorization": "Basic YWxpY2U6eA=="}, timeout=30.0
    )
    assert basic.status_code == 403
    # the same request with the operator's token passes the gate: the 403s above are the gate's, not the body's
    assert raw_post(http_server, http_server.operator_token).status_code == 200


async def test_http_operator_token_drives_a_session_to_completed_as_that_operator(http_server: HttpServer):
    async with connect(http_server, http_server.operator_token) as client:
        assert client.server_info is not None and client.server_info.name == "taskgate"
        assert {t.name for t in (await client.list_tools()).tools} == TOOL_NAMES
        sid = http_server.other_session
        assert (await ok(client, "session_status", session_id=sid))["state"] == "planning"
        for trigger, before, after in HAPPY_PATH:
            fired = await ok(client, "session_fire", session_id=sid, trigger=trigger)
            assert (fired["from_state"], fired["to_state"]) == (before, after)
            assert fired["actor"] == "operator:alice"
        assert fired["state"] == "completed" and fired["then"] == ["cleanup_done: merged → completed"]
        history = (await ok(client, "session_history", session_id=sid, limit=5))["transitions"]
        assert [r["trigger"] for r in history] == [*(t for t, _, _ in HAPPY_PATH), "cleanup_done"]
        assert {r["actor"] for r in history[:-1]} == {"operator:alice"} and history[-1]["actor"] == "system"
        assert (await ok(client, "session_status", session_id=sid))["state"] == "completed"
    # what the server logged is what the CLI reads from the same database
    rows = http_server.cli_json("session", "history", sid, "--limit", "5")
    expected = [(t, "operator:alice") for t, _, _ in HAPPY_PATH] + [("cleanup_done", "system")]
    assert [(r["trigger"], r["actor"]) for r in rows] == expected


async def test_http_agent_token_reaches_only_its_own_session_and_only_its_own_triggers(http_server: HttpServer):
    own, other = http_server.agent_session, http_server.other_session
    async with connect(http_server, http_server.agent_token) as client:
        before = await ok(client, "session_status", session_id=own[:8])
        assert before["id"] == own

        # operator-only tools: refused as tool errors that say agents may not
        for tool, arguments in [
            ("project_session_start", {"task_id": "DEMO-3"}),
            ("project_init", {"path": str(http_server.workdir / "repo")}),
            ("audit_query", {}),
            ("project_ready_tasks", {}),
            ("task_add", {"title": "sneaky"}),
        ]:
            text = await refused(client, tool, **arguments)
            assert "Forbidden: agent tokens may not" in text and "ask an operator" in text, text
        for trigger in ("approve", "merge", "cancel"):
            text = await refused(client, "session_fire", session_id=own, trigger=trigger)
            assert f"Forbidden: agents may not fire '{trigger}'" in text, text
        text = await refused(client, "session_suspend", session_id=own)
        assert "agents may not fire 'suspend'" in text

        # another session: neither readable nor fireable, even with a trigger agents may fire
        for tool, arguments in [
            ("session_status", {"session_id": other}),
            ("session_history", {"session_id": other}),
            ("session_fire", {"session_id": other, "trigger": "plan_complete"}),
        ]:
            text = await refused(client, tool, **arguments)
            assert f"Forbidden: this agent token is scoped to session {own}" in text, text

        unchanged = await ok(client, "session_status", session_id=own)
        assert (unchanged["state"], unchanged["version"]) == ("planning", before["version"])

        # its own work: reported by the agent, logged as the agent
        actor = f"agent:{http_server.agent_token_id}"
        for trigger, from_state, to_state in HAPPY_PATH[:2]:
            fired = await ok(client, "session_fire", session_id=own, trigger=trigger, reason="done")
            assert (fired["from_state"], fired["state"]) == (from_state, to_state)
            assert fired["actor"] == actor
        history = (await ok(client, "session_history", session_id=own, limit=2))["transitions"]
        assert [(r["trigger"], r["actor"]) for r in history] == [("plan_complete", actor), ("work_complete", actor)]
        text = await refused(client, "session_fire", session_id=own, trigger="approve")
        assert "agents may not fire 'approve'" in text

    async with connect(http_server, http_server.operator_token) as operator:
        other_now = await ok(operator, "session_status", session_id=other)
        assert other_now["state"] in {"planning", "completed"}  # untouched by the agent (the operator test may run)
        by_agent = await ok(operator, "audit_query", actor=actor)
        assert {r["session_id"] for r in by_agent["transitions"]} == {own}


async def test_http_operator_id_must_match_the_token(http_server: HttpServer):
    async with connect(http_server, http_server.operator_token) as client:
        text = await refused(client, "project_session_start", task_id="DEMO-3", operator_id="bob")
        assert "Forbidden: operator_id 'bob' does not match the caller (operator:alice)" in text
        assert "DEMO-3" in [t["id"] for t in (await ok(client, "project_ready_tasks"))["tasks"]]
        started = await ok(client, "project_session_start", task_id="DEMO-3", operator_id="alice")
        assert (started["state"], started["operator_id"]) == ("planning", "alice")
        start_row = (await ok(client, "session_history", session_id=started["id"], limit=1))["transitions"][0]
        assert (start_row["trigger"], start_row["actor"]) == ("start", "operator:alice")
    async with connect(http_server, http_server.agent_token) as agent:  # an agent is no operator at all
        text = await refused(agent, "project_session_start", task_id="DEMO-3", operator_id="alice")
        assert "agent tokens may not start sessions" in text


async def test_http_a_revoked_token_stops_working_at_once(http_server: HttpServer):
    issued = http_server.cli_json("token", "create", "--operator", "alice", "--label", "to revoke")
    async with connect(http_server, issued["token"]) as client:
        assert (await ok(client, "ping"))["summary"] == "pong"
        http_server.cli("token", "revoke", issued["id"])
        with pytest.raises(MCPError, match="the bearer token is unknown or revoked"):  # the gate's JSON-RPC error
            await client.call_tool("ping", {})
    assert_refused(raw_post(http_server, issued["token"]), "unknown or revoked")
    assert raw_post(http_server, http_server.operator_token).status_code == 200  # only that token is gone
    listed = {t["id"]: t for t in http_server.cli_json("token", "list")}
    assert listed[issued["id"]]["revoked_at"] is not None and listed[issued["id"]]["token_hash"] is None


async def test_http_the_serving_node_heartbeats_and_both_the_cli_and_nodes_list_show_it(http_server: HttpServer):
    listed = http_server.cli_json("nodes")
    (node,) = listed["nodes"]
    assert node["alive"] and node["data_dir"].endswith("data") and node["live_agents"] == 0
    assert node["id"] == listed["this_node"]  # the CLI of the same machine and data dir is the same node
    async with connect(http_server, http_server.operator_token) as client:
        over_mcp = await ok(client, "nodes_list")
    assert [n["id"] for n in over_mcp["nodes"]] == [node["id"]] and over_mcp["summary"] == "1 node(s), 1 alive"
    async with connect(http_server, http_server.agent_token) as client:  # agents do not see the nodes
        assert "nodes_list" not in {t.name for t in (await client.list_tools()).tools}
