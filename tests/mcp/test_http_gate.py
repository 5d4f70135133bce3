"""The HTTP gate in-process, as `serve --http` assembles it (`beside_mcp(http_app(…), console)`) over an ASGI client.

A refusal is 403 with a JSON-RPC error that says why, never 401: to MCP clients a 401 is an OAuth challenge, and
taskgate does not do OAuth (issue 18; tests/e2e/test_mcp_auth_clients.py drives the real clients). The OAuth
discovery documents and default endpoints answer 404 with a JSON message, token or not. A valid token reaches
the MCP app with its principal, and nothing else ever sets one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from taskgate.bootstrap import App
from taskgate.domain.access import Principal
from taskgate.entrypoints.console.app import beside_mcp, console_app
from taskgate.entrypoints.mcp.calls import PRINCIPAL_SCOPE_KEY
from taskgate.entrypoints.mcp.server import NO_OAUTH, REFUSED, BearerGate, build_server, http_app, oauth_path
from tests.conftest import wire
from tests.fakes import InMemoryDatabase
from tests.mcp.conftest import app_of

BASE = "http://127.0.0.1:8765"
MISSING = "a bearer token issued by `taskgate token create` is required"
UNKNOWN = "the bearer token is unknown or revoked"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
OAUTH_PATHS = [
    "/.well-known/oauth-protected-resource",
    "/.well-known/oauth-protected-resource/mcp",
    "/.well-known/oauth-authorization-server",
    "/.well-known/oauth-authorization-server/mcp",
    "/.well-known/openid-configuration",
    "/mcp/.well-known/openid-configuration",
    "/register",
    "/authorize",
    "/token",
]


@dataclass
class Site:
    asgi: Any
    http: httpx2.AsyncClient
    app: App
    token: str
    token_id: str


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    """The ASGI app of `serve --http` over in-memory services, and an operator token for alice."""
    app = app_of(wire("memory", InMemoryDatabase(), None))

    @asynccontextmanager
    async def open_app() -> AsyncIterator[App]:
        yield app

    server = build_server(open_app, local_principal=None)
    console, _pages = console_app(lambda: app)
    asgi = beside_mcp(http_app(server, lambda: app, "127.0.0.1"), console)
    await app.tracker.ensure_operator("alice")
    issued = await app.access.create_operator_token("alice")
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=asgi), base_url=BASE) as http:
        yield Site(asgi, http, app, issued.secret, issued.token.id)


def assert_refused(response: httpx2.Response, says: str) -> None:
    assert response.status_code == 403, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"jsonrpc": "2.0", "id": None, "error": {"code": REFUSED, "message": says}}
    challenge = response.headers["www-authenticate"]
    assert challenge == f'Bearer realm="taskgate", error="invalid_token", error_description="{says}"'


@pytest.mark.parametrize(
    ("authorization", "says"),
    [
        (None, MISSING),
        ("Bearer tg_" + "x" * 43, UNKNOWN),
        ("Bearer not-a-taskgate-token", MISSING),
        ("Basic YWxpY2U6eA==", MISSING),
        ("Bearer", MISSING),
    ],
    ids=["none", "unknown", "not a taskgate token", "basic", "empty bearer"],
)
async def test_a_refusal_is_403_with_a_json_rpc_error_never_an_oauth_challenge(
    site: Site, authorization: str | None, says: str
):
    headers = MCP_HEADERS | ({"Authorization": authorization} if authorization else {})
    assert_refused(await site.http.post("/mcp", json=INITIALIZE, headers=headers), says)
    assert_refused(await site.http.get("/mcp", headers=headers), says)  # the SSE stream is gated the same way
    assert_refused(await site.http.delete("/mcp", headers=headers), says)


async def test_a_revoked_token_is_refused_as_unknown(site: Site):
    await site.app.access.revoke(site.token_id)
    headers = MCP_HEADERS | {"Authorization": f"Bearer {site.token}"}
    assert_refused(await site.http.post("/mcp", json=INITIALIZE, headers=headers), UNKNOWN)


async def test_the_oauth_discovery_paths_answer_404_with_a_message_never_metadata(site: Site):
    for path in OAUTH_PATHS:
        for headers in ({}, {"Authorization": f"Bearer {site.token}"}):
            for method in ("GET", "POST"):
                response = await site.http.request(method, path, headers=headers)
                assert response.status_code == 404, (method, path, response.text)
                assert response.headers["content-type"] == "application/json"
                assert response.json() == {"error": "not_found", "message": NO_OAUTH}
                assert "www-authenticate" not in response.headers


async def test_other_paths_stay_the_consoles(site: Site):
    assert (await site.http.get("/.well-known/security.txt")).text == "Not Found"  # Starlette's, not ours
    assert (await site.http.get("/signin")).status_code == 200
    assert (await site.http.get("/")).status_code == 303  # to /signin: the console's own sign-in, unchanged


def test_oauth_path_is_exact():
    assert all(oauth_path(path) for path in OAUTH_PATHS)
    for path in ("/mcp", "/", "/registered", "/tokens", "/signin", "/.well-known/oauth-protected-resources"):
        assert not oauth_path(path), path


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


@pytest.mark.parametrize(("authorization", "says"), [(None, MISSING), ("Bearer tg_" + "y" * 43, UNKNOWN)])
async def test_the_python_sdk_client_reports_the_gates_message(site: Site, authorization: str | None, says: str):
    headers = {"Authorization": authorization} if authorization else {}
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=site.asgi), headers=headers) as http:
        with pytest.raises((MCPError, BaseExceptionGroup)) as raised:
            async with Client(streamable_http_client(f"{BASE}/mcp", http_client=http), read_timeout_seconds=10):
                pass
    [error] = leaves(raised.value)
    assert isinstance(error, MCPError) and str(error) == says, repr(error)  # before: "Server returned an error …"


async def test_only_a_verified_token_sets_the_principal_and_a_refused_request_never_reaches_the_app(site: Site):
    reached: list[Any] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reached.append(scope.get(PRINCIPAL_SCOPE_KEY))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gate = BearerGate(inner, site.app.access.authenticate)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=gate), base_url=BASE) as http:
        forged = {"X-Taskgate-Principal": "operator:root", "X-Forwarded-User": "root"}
        assert (await http.post("/mcp", headers=forged)).status_code == 403
        assert reached == []
        ok = await http.post("/mcp", headers=forged | {"Authorization": f"Bearer {site.token}"})
        assert ok.status_code == 204
    assert reached == [Principal.operator("alice")]
