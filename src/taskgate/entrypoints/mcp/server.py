"""Builds taskgate's `MCPServer`, and runs it over stdio or streamable HTTP behind a bearer-token gate.

Over stdio the caller is the local operator of the config (`operator.default`). Over HTTP every request must
carry `Authorization: Bearer <token>` (issued by `taskgate token create`); `BearerGate` puts the token's principal
into the ASGI scope, where the tools read it, and refuses anything else with 403 and a JSON-RPC error that says
why. The principal never comes from a tool parameter or a client-supplied header the gate did not verify.

Not 401: taskgate does not do MCP authorization (OAuth), and MCP clients take a 401 for an OAuth challenge (the
MCP Inspector and Claude Code start OAuth discovery, Codex says only "Auth required"). A 403 whose body is a
JSON-RPC error is shown as taskgate's message by the Inspector, Codex, the Python SDK and Claude Code (for a
token it was given), with no OAuth attempted (docs/mcp.md#authentication-and-clients). The OAuth discovery
documents and default endpoints are answered 404 with a JSON message, never metadata.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.types import ListToolsResult

from taskgate.bootstrap import App
from taskgate.domain.access import Principal
from taskgate.domain.errors import Unauthenticated
from taskgate.entrypoints.mcp import session_items
from taskgate.entrypoints.mcp.annotations import AGENT_TOOLS, annotated, visible_to_operator
from taskgate.entrypoints.mcp.calls import PRINCIPAL_SCOPE_KEY, Runtime, crashed, wrapped_by_tool_errors
from taskgate.entrypoints.mcp.handshake import server_keywords
from taskgate.entrypoints.mcp.names import ToolNames, canonical, renamed, tool_name
from taskgate.entrypoints.mcp.tools import TOOLS


def build_server(
    open_app: Callable[[], AbstractAsyncContextManager[App]],
    *,
    local_principal: Principal | None,
    tool_names: ToolNames = "underscore",
) -> MCPServer:
    """The taskgate MCP server. `open_app` is entered once per server run (the lifespan) and yields the services.

    `local_principal` is the caller when the transport carries no token (stdio, in-process clients).

    Raises: TypeError for a tool of TOOLS not wrapped by `tool_errors` (its failures would not be explained).
    """
    if unwrapped := [fn.__name__ for fn in TOOLS if not wrapped_by_tool_errors(fn)]:
        raise TypeError(f"MCP tools not wrapped by tool_errors: {', '.join(unwrapped)}")

    @asynccontextmanager
    async def lifespan(_server: MCPServer) -> AsyncIterator[Runtime]:
        async with open_app() as app:
            yield Runtime(app, local_principal)

    server = TaskgateServer(tool_names, lifespan=lifespan, **server_keywords(tool_names))
    if tool_names == "colon":  # the seed's names: the SDK warns that ':' is outside SEP-986; that is the point
        logging.getLogger("mcp.shared.tool_name_validation").setLevel(logging.ERROR)
    for fn in TOOLS:
        name, keywords = tool_name(fn.__name__, tool_names), annotated(fn)
        keywords["description"] = renamed(keywords["description"], tool_names)
        # Claude Code reads a permission prompt's answer from a single text block, never from structured content
        structured = fn.__name__ not in UNSTRUCTURED
        server.add_tool(fn, name=name, structured_output=structured, **keywords)
        server.tool_of[name] = fn.__name__
    session_items.register(server)
    return server


UNSTRUCTURED = frozenset({"permission_prompt"})
"""Tools whose result is their text alone (with structured content, Claude Code took the structure and refused it)."""


class TaskgateServer(MCPServer):
    """The SDK's server, listing each caller only the tools it may use: an agent token its own session's tools
    (annotations.AGENT_TOOLS), an operator those its permissions allow. A hidden tool called anyway is refused by
    its own permission check, as before; listing is a courtesy to clients, never the guard."""

    def __init__(self, style: ToolNames, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.style = style
        self.tool_of: dict[str, str] = {}  # registered name (maybe colon style) → tool function name

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        """A call by either style's name (an agent written for the other style works too); errors name tools in
        this server's style. What fails outside the tool's own `tool_errors` (the SDK's conversion of its result,
        an argument validator that crashed) is said as `crashed` says it too, never as a bare "Error executing
        tool X"."""
        if name not in self.tool_of:
            name = tool_name(canonical(name), self.style)
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError as exc:
            cause = exc.__cause__ or exc
            error = ToolError(f"Error executing tool {name}: {crashed(name, cause)}")
        except ToolError as exc:
            if self.style == "underscore":
                raise
            error, cause = exc, exc.__cause__
        raise ToolError(renamed(str(error), self.style)) from cause

    async def _handle_list_tools(self, ctx: Any, params: Any) -> ListToolsResult:
        listed = await super()._handle_list_tools(ctx, params)
        runtime = ctx.lifespan_context
        scope = getattr(ctx.request, "scope", None)
        principal = (scope.get(PRINCIPAL_SCOPE_KEY) if isinstance(scope, dict) else None) or runtime.local_principal
        if principal is None:
            return listed
        if principal.operator_id is None:
            keep = {name for name, fn in self.tool_of.items() if fn in AGENT_TOOLS}
        else:
            permissions = await runtime.app.operators.permissions(principal)
            if permissions is None:
                return listed  # not registered: every call says how to register it
            keep = {name for name, fn in self.tool_of.items() if visible_to_operator(fn, permissions)}
        return ListToolsResult(tools=[tool for tool in listed.tools if tool.name in keep])


REFUSED = -32010
"""The JSON-RPC error code of the gate's refusals: in the band the MCP spec leaves to implementations
(-32000..-32019), clear of the SDK's own -32000 and -32001."""

NO_OAUTH = "taskgate does not use OAuth: send `Authorization: Bearer <token>`, a token from `taskgate token create`"

_OAUTH_DOCUMENTS = (
    "/.well-known/oauth-protected-resource",  # RFC 9728, also with the resource's path appended
    "/.well-known/oauth-authorization-server",  # RFC 8414
    "/.well-known/openid-configuration",
)
_OAUTH_ENDPOINTS = frozenset({"/authorize", "/token", "/register"})  # where clients go when no metadata is found


def oauth_path(path: str) -> bool:
    """Whether an OAuth client looks for metadata or an endpoint at `path` (the MCP authorization spec's discovery:
    protected-resource and authorization-server metadata, path-inserted or not, then the default endpoints)."""
    return (
        path in _OAUTH_ENDPOINTS
        or path.endswith("/.well-known/openid-configuration")
        or any(path == doc or path.startswith(doc + "/") for doc in _OAUTH_DOCUMENTS)
    )


class BearerGate:
    """ASGI middleware: no valid bearer token, no MCP. Sets the principal for the tools on success.

    OAuth discovery paths are answered 404 (`oauth_path`), before and without any token check."""

    def __init__(self, app: Any, authenticate: Callable[[str | None], Any]) -> None:
        self._app, self._authenticate = app, authenticate

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if oauth_path(scope.get("path", "")):
            await no_oauth(scope, receive, send)
            return
        try:
            scope[PRINCIPAL_SCOPE_KEY] = await self._authenticate(_bearer(scope))
        except Unauthenticated as exc:
            await _refused(send, str(exc))
            return
        await self._app(scope, receive, send)


def _bearer(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


async def _refused(send: Any, message: str) -> None:
    """403 with a JSON-RPC error carrying `message`: the Python SDK, Codex and the MCP Inspector show that message;
    the `WWW-Authenticate` header names the scheme for plain HTTP clients (no `resource_metadata`: no OAuth)."""
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": REFUSED, "message": message}}).encode()
    quoted = message.replace("\\", "\\\\").replace('"', '\\"')
    challenge = f'Bearer realm="taskgate", error="invalid_token", error_description="{quoted}"'
    await _send_json(send, 403, body, [(b"www-authenticate", challenge.encode("latin-1", "replace"))])


async def no_oauth(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """ASGI app: 404 with a JSON body that says taskgate takes bearer tokens, not OAuth."""
    await _send_json(send, 404, json.dumps({"error": "not_found", "message": NO_OAUTH}).encode())


async def _send_json(send: Any, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def http_app(
    server: MCPServer,
    runtime_app: Callable[[], App | None],
    host: str,
    authenticate: Callable[[str | None], Awaitable[Principal]] | None = None,
) -> Any:
    """The streamable-HTTP ASGI app at /mcp, behind `BearerGate`. Tokens are checked against the open database
    (or by `authenticate`, e.g. one that admits agent tokens only)."""
    inner = server.streamable_http_app(streamable_http_path="/mcp", host=host)

    async def any_token(token: str | None) -> Principal:
        app = runtime_app()
        if app is None:
            raise Unauthenticated("taskgate is starting; retry")
        return await app.access.authenticate(token)

    return BearerGate(inner, authenticate or any_token)
