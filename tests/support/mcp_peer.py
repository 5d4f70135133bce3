"""A tiny streamable-HTTP MCP server that real agent CLIs call in end-to-end tests.

`with McpPeer(token="s3cret") as peer:` serves `save_output(name, content)` at `peer.url` (…/mcp) on
127.0.0.1, behind a gate that answers 401 to any request whose `Authorization` is not
`Bearer <token>`. `peer.calls` lists the tool calls, `peer.authorizations` the `Authorization`
headers of the requests that got through, `peer.refused` those of the requests refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer


class BearerOnly:
    """ASGI middleware: 401 unless `Authorization: Bearer <expected>`."""

    def __init__(self, app: Any, expected: str, peer: McpPeer) -> None:
        self._app, self._expected, self._peer = app, expected, peer

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        if header != f"Bearer {self._expected}":
            self._peer.refused.append(header)
            body = json.dumps({"error": "unauthorized"}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"www-authenticate", b'Bearer realm="mcp-peer", error="invalid_token"'),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        self._peer.authorizations.append(header)
        await self._app(scope, receive, send)


class McpPeer:
    def __init__(self, token: str = "peer-token") -> None:
        self.token = token
        self.calls: list[dict[str, str]] = []
        self.authorizations: list[str] = []
        self.refused: list[str] = []
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}/mcp"

    def _app(self) -> Any:
        server = MCPServer("taskgate-peer", log_level="WARNING")
        calls = self.calls

        def save_output(name: str, content: str) -> str:
            """Save a named output file of the task (its name and full text)."""
            calls.append({"name": name, "content": content})
            return f"saved {name} ({len(content)} chars)"

        server.add_tool(save_output, name="save_output")
        return BearerOnly(server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1"), self.token, self)

    def __enter__(self) -> McpPeer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)

        def run() -> None:
            assert self._server is not None
            asyncio.run(self._server.serve(sockets=[sock]))

        self._thread = threading.Thread(target=run, name="mcp-peer", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("MCP peer did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
