"""The MCP endpoint agents call back to, served by whatever process launches them.

`serve --http` is such an endpoint already (`FixedEndpoint`: its own URL). Every other process that launches
agents (`session execute`, `workflow run`, `session decide`, `serve` over stdio) gets a `LoopbackEndpoint`: the
same MCP tools over streamable HTTP on 127.0.0.1 and a free port, in this process's event loop, sharing its open
`App`, accepting agent tokens only (an operator talks to `taskgate serve`). It starts when the first agent is
about to start and stops a short while after the last one ended, so nothing else has to run while agents work.

Races: acquire and release run under one asyncio lock, so concurrent launches start one listener, and a release
never stops a listener that another acquire has just taken. The stop is delayed (`grace_s`): back-to-back
workflow steps reuse the listener instead of restarting it, and an agent's last MCP reply is not cut off.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from taskgate.bootstrap import App
from taskgate.domain.errors import Unauthenticated

if TYPE_CHECKING:  # the MCP SDK and uvicorn load when an agent first needs the endpoint (~0.45 s), not before:
    import uvicorn  # every CLI command that opens taskgate gives its agents this endpoint, and most launch none

    from taskgate.entrypoints.mcp.server import ToolNames


class FixedEndpoint:
    """An endpoint that is always there (the HTTP server itself, or a URL agents are told as it is)."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def acquire(self) -> str:
        return self.url

    async def release(self) -> None:
        return None


class LoopbackEndpoint:
    """MCP for agents on 127.0.0.1:<free port>, alive while at least one acquirer holds it (plus `grace_s`)."""

    def __init__(self, app: App, tool_names: ToolNames = "underscore", grace_s: float = 2.0) -> None:
        self._app, self._tool_names, self._grace_s = app, tool_names, grace_s
        self._lock = asyncio.Lock()
        self._holders = 0
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._stopping: asyncio.Task[None] | None = None
        self.url: str | None = None

    async def acquire(self) -> str:
        """The URL, starting the listener first when none runs."""
        async with self._lock:
            if self._stopping is not None:  # taken again within the grace period: keep it
                self._stopping.cancel()
                self._stopping = None
            if self._server is None:
                await self._start()
            self._holders += 1
            assert self.url is not None
            return self.url

    async def release(self) -> None:
        """One holder less; the last one schedules the stop."""
        async with self._lock:
            self._holders = max(0, self._holders - 1)
            if self._holders == 0 and self._server is not None and self._stopping is None:
                self._stopping = asyncio.create_task(self._stop_later(), name="taskgate-agent-endpoint-stop")

    async def close(self) -> None:
        """Stop now (the process is ending)."""
        async with self._lock:
            if self._stopping is not None:
                self._stopping.cancel()
                self._stopping = None
            await self._stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    async def _start(self) -> None:
        import uvicorn

        from taskgate.entrypoints.mcp.server import build_server, http_app

        app = self._app

        @asynccontextmanager
        async def shared() -> AsyncIterator[App]:
            yield app  # the process's open App: nothing is opened or closed here

        server = build_server(shared, local_principal=None, tool_names=self._tool_names)

        async def agents_only(token: str | None):
            principal = await app.access.authenticate(token)
            if principal.kind != "agent":
                raise Unauthenticated("this endpoint serves agents only; operators use `taskgate serve --http`")
            return principal

        asgi = http_app(server, lambda: app, "127.0.0.1", authenticate=agents_only)
        config = uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        self._server = _quiet_server_class()(config)
        self._serving = asyncio.create_task(self._server.serve(), name="taskgate-agent-endpoint")
        while not self._server.started:
            if self._serving.done():  # it could not start: say why
                self._server = None
                self._serving.result()
                raise RuntimeError("the agent MCP endpoint stopped while starting")
            await asyncio.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/mcp"

    async def _stop_later(self) -> None:
        await asyncio.sleep(self._grace_s)
        async with self._lock:
            if self._holders == 0:
                self._stopping = None
                await self._stop()

    async def _stop(self) -> None:
        if self._server is None or self._serving is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._serving, 5)
        self._server, self._serving, self.url = None, None, None


@functools.cache
def _quiet_server_class() -> type[uvicorn.Server]:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """A uvicorn server that leaves the process's signals alone: uvicorn's own handlers would take Ctrl-C to
        shut this endpoint (under a running agent) and leave the command running (entrypoints/cli/interrupts.py
        decides what Ctrl-C does)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietServer


def serve_agents_locally(app: App) -> LoopbackEndpoint | None:
    """Give `app`'s agents a loopback endpoint for as long as they run (closed with the app). None when the app
    launches no agents."""
    if app.agents is None or app.settings is None:
        return None
    endpoint = LoopbackEndpoint(app, app.settings.mcp.tool_names)
    app.agents.use_endpoint(endpoint)
    app.closers.append(endpoint.close)
    return endpoint
