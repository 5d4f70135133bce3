"""Running the MCP server from the CLI: the database opens in the server's lifespan, once per run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from taskgate.bootstrap import App, Settings, bootstrap
from taskgate.domain.access import Principal
from taskgate.entrypoints.mcp.server import build_server, http_app


class _OpenApp:
    """Opens the services in the lifespan and remembers them for the HTTP gate."""

    def __init__(self, settings: Settings) -> None:
        self.settings, self.app = settings, None

    @asynccontextmanager
    async def __call__(self) -> AsyncIterator[App]:
        app = await bootstrap(self.settings)
        self.app = app
        try:
            yield app
        finally:
            self.app = None
            await app.close()


def serve_stdio(settings: Settings) -> None:
    """MCP over stdin/stdout; the caller is the configured local operator."""
    opener = _OpenApp(settings)
    principal = Principal.operator(settings.operator.default)
    build_server(opener, local_principal=principal, tool_names=settings.mcp.tool_names).run()


def serve_http(settings: Settings, host: str, port: int) -> None:
    """MCP over streamable HTTP at http://HOST:PORT/mcp; every request needs a bearer token."""
    import uvicorn

    opener = _OpenApp(settings)
    server = build_server(opener, local_principal=None, tool_names=settings.mcp.tool_names)
    config = uvicorn.Config(http_app(server, lambda: opener.app, host), host=host, port=port, log_level="warning")
    anyio.run(uvicorn.Server(config).serve)
