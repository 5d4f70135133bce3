"""`taskgate serve` over stdio answers `initialize` and `tools/list` before its database is open.

Why: Codex builds its first turn's tool list about 1.1 s after spawning its MCP servers, and serve took ~1.8 s
to list its tools (its modules and SQLAlchemy imported, the database opened, recovery, a heartbeat), so Codex
offered none of taskgate's tools on that turn (issue 43; docs/decisions.md, "serve answers before its database
is open").

How: `FrontServer` is an `MCPServer` built with the full server's keywords (handshake.server_keywords), so
`initialize` answers the same. It lists the tools from the generated table (handshake.py), filtered as the full
server filters them for the local operator, whose roles it reads with sqlite3 (infrastructure/sqlite_roster.py);
for another database (PostgreSQL), or one it cannot read, it lists what the grants remembered from the last opening
allow (infrastructure/grants_cache.py), and with none remembered the list waits for the opened database. Once the
database is open, the front remembers the grants it has and, when a list it answered before differs from what the
full server now lists, sends `notifications/tools/list_changed` (serve over stdio advertises `tools.listChanged`
for this). When that memory also holds the operator, the tool-name style and the SQLite file, serve answers without
loading its settings at all (`serve_stdio_remembered`): they load in the opening. Meanwhile `Opening` builds the
full server (its modules imported in a worker thread) and enters its lifespan: the database opened and
migrated, start-up recovery, the first heartbeat, the background loops, as before. Everything else (tool calls,
resources, prompts, and `tools/list` once it is open) waits for it and is handed to the full server with that
lifespan's state. The opening starts when the first `tools/list` is answered, when a request needs it, or
`OPEN_AFTER_S` after start, whichever comes first: started at once, its imports would hold the GIL while the
front answers.

When the opening fails, its error goes to stderr at once; tool calls are answered with it (a tool error naming
the problem), and serve then stops and exits non-zero, after the first such answer or when stdin closes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from mcp.server.lowlevel import NotificationOptions
from mcp.server.mcpserver import MCPServer
from mcp.server.subscriptions import ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import INTERNAL_ERROR, CallToolResult, ListToolsResult, TextContent
from mcp_types import JSONRPCError, JSONRPCResponse, RequestId

from taskgate.domain.access import permissions_of
from taskgate.domain.errors import InvalidInput, TaskgateError
from taskgate.entrypoints.mcp.annotations import visible_to_operator
from taskgate.entrypoints.mcp.handshake import listed_tools, server_keywords, table_rows
from taskgate.entrypoints.mcp.names import ToolNames
from taskgate.entrypoints.mcp.stdio import ServerStreams, plain_logging, serve_over_stdio
from taskgate.infrastructure.grants_cache import Grants, Remembered, RememberedGrants, roster_url
from taskgate.infrastructure.sqlite_roster import CannotTell, operator_grants

if TYPE_CHECKING:
    from mcp.server.session import ServerSession

    from taskgate.infrastructure.settings import Settings

OPEN_AFTER_S = 0.5
"""At the latest, the opening starts this long after serve starts, whatever the client asks."""

CORRECT_WITHIN_S = 10.0
"""How long, once open, the front may take to read the operator's grants and tell a changed list (closing waits)."""

_log = logging.getLogger("taskgate.mcp")


class OpeningFailed(TaskgateError):
    """The full server or its services could not be opened; the message names the problem."""


class GrantsMemory(Protocol):
    """Where the front finds the grants the last opening remembered (infrastructure/grants_cache.py)."""

    def recall(self) -> Remembered | None: ...

    def remember(self, found: Remembered) -> None: ...


class Opening:
    """The full server, built and its lifespan entered in the background; what waits for it awaits `ready()`."""

    def __init__(self, build: Callable[[], MCPServer], open_after_s: float = OPEN_AFTER_S) -> None:
        self._build, self._open_after_s = build, open_after_s
        self._go, self._done, self._closing = anyio.Event(), anyio.Event(), anyio.Event()
        self.server: MCPServer | None = None
        self.state: Any = None
        self.error: OpeningFailed | None = None
        self.refused: set[RequestId] = set()  # tool calls answered with the error
        self.told = anyio.Event()  # one of them was written: serve stops
        self.then: Callable[[Any], Awaitable[None]] | None = None
        """Run with the lifespan's state once open, beside the answers; closing waits for it to end."""

    @property
    def is_open(self) -> bool:
        """Whether the full server is open (its lifespan entered)."""
        return self.server is not None

    def start(self) -> None:
        """Start opening now, if it has not started yet."""
        self._go.set()

    async def run(self) -> None:
        """Open the full server when asked (or after `open_after_s`) and hold it open until `close()`."""
        with anyio.move_on_after(self._open_after_s):
            await self._go.wait()
        try:
            server = await anyio.to_thread.run_sync(self._build)  # imports that would hold up the event loop
            lowlevel = server._lowlevel_server
            async with lowlevel.lifespan(lowlevel) as state, anyio.create_task_group() as after:
                self.server, self.state = server, state
                self._done.set()
                if self.then is not None:
                    after.start_soon(self.then, state)
                await self._closing.wait()
        except Exception as exc:
            if self.server is not None:  # closing failed: the answers were given; say it, as before
                _log.exception("taskgate serve: closing failed")
                return
            self.error = OpeningFailed(f"taskgate serve could not open its database and services: "
                                       f"{type(exc).__name__}: {exc}")  # fmt: skip
            _log.error("%s", self.error, exc_info=exc)
        finally:
            self._done.set()

    async def ready(self) -> tuple[MCPServer, Any]:
        """The full server and its lifespan's state, once open (the opening starts now if it has not).

        Raises: OpeningFailed when it could not be opened.
        """
        self.start()
        await self._done.wait()
        if self.error is not None:
            raise self.error
        assert self.server is not None
        return self.server, self.state

    async def close(self) -> None:
        """Close the full server (its services stop and the database closes), opening it first if it never was:
        serve's start-up work (recovery, a bad database's error) happens whenever serve ran."""
        self.start()
        await self._done.wait()
        self._closing.set()


class FrontServer(MCPServer):
    """Answers `initialize` and `tools/list` from the handshake; hands everything else to the full server."""

    def __init__(
        self,
        opening: Opening,
        *,
        tool_names: ToolNames,
        operator_id: str,
        database_url: str | None,
        memory: GrantsMemory | None = None,
    ) -> None:
        """As the local operator `operator_id` on `database_url` (None: not a SQLite file, whose URL serve did not
        need to know yet), with the grants remembered in `memory`."""
        super().__init__(lifespan=self._hold, **server_keywords(tool_names))
        self.opening, self.style = opening, tool_names
        self._operator_id, self._database_url, self._memory = operator_id, database_url, memory
        self._rows = table_rows()
        self._lists: set[RequestId] = set()  # tools/list requests answered from the table
        self._shown: set[frozenset[str]] = set()  # the tool sets those answers listed
        self._listener: ServerSession | None = None  # the connection they went to: told when the set changes
        self._unwritten: set[RequestId] = set()  # answered from the table, not yet written (when the transport tells)
        self._all_written = anyio.Event()
        self.tells_writes = False
        """Whether the transport calls `written` (stdio does; an in-process client does not)."""
        opening.then = self._correct

    def written(self, message: SessionMessage) -> None:
        """Told by the transport of each message written: once a tools/list answered here is out, the opening
        starts (its imports would hold the GIL while the answer is encoded); once a tool call refused for a failed
        opening is out, serve may stop."""
        answer = message.message
        if not isinstance(answer, JSONRPCResponse | JSONRPCError):
            return
        if answer.id in self._lists:
            self.opening.start()
            self._unwritten.discard(answer.id)
            if not self._unwritten:
                self._all_written.set()
        if answer.id in self.opening.refused:
            self.opening.told.set()

    @asynccontextmanager
    async def _hold(self, _server: MCPServer) -> AsyncIterator[Opening]:
        async with anyio.create_task_group() as group:
            group.start_soon(self.opening.run)
            try:
                yield self.opening
            finally:
                with anyio.CancelScope(shield=True):  # serve may end cancelled: the services still close
                    await self.opening.close()

    async def _handle_list_tools(self, ctx: Any, params: Any) -> ListToolsResult:
        if not self.opening.is_open:
            try:
                keep = self._visible(self._grants())
            except CannotTell as exc:
                _log.debug("tools/list waits for the database: %s", exc)
            else:
                if ctx.request_id is not None:
                    self._lists.add(ctx.request_id)
                    self._unwritten.add(ctx.request_id)
                self._shown.add(keep)
                self._listener = ctx.session
                return ListToolsResult(tools=listed_tools(self._rows, self.style, keep))
        return await self._handed("_handle_list_tools", ctx, params)

    def _grants(self) -> Grants | None:
        """The local operator's grants as known before the database is open: read from the SQLite file, else as the
        last opening remembered them. Raises: CannotTell when neither can say."""
        try:
            if self._database_url is None:
                raise CannotTell("not a SQLite file")
            return operator_grants(self._database_url, self._operator_id)
        except CannotTell:
            remembered = self._memory.recall() if self._memory is not None else None
            if remembered is None or remembered.operator_id != self._operator_id:
                raise
            return remembered.grants

    def _visible(self, grants: Grants | None) -> frozenset[str]:
        """The tools an operator with `grants` may use, as `server.TaskgateServer` lists them: every tool when it is
        not registered (None; each call says how to register)."""
        if grants is None:
            return frozenset(row["name"] for row in self._rows)
        permissions = permissions_of(*grants)
        return frozenset(row["name"] for row in self._rows if visible_to_operator(row["name"], permissions))

    async def _correct(self, state: Any) -> None:
        """Once the full server is open (its lifespan's `state`): remember the operator's grants as the database
        has them, for the next serve, and when a list answered before the opening differs from what the full server
        lists now, tell the client (`notifications/tools/list_changed`); later lists come from the full server.

        The list is a courtesy to clients, never the guard: every tool call is authorised against the database, as
        ever (application/operators/roster.py), so a list from stale grants lets no call through. Failing here
        only costs the correction (said on stderr); the answers go on.
        """
        try:
            with anyio.fail_after(CORRECT_WITHIN_S):
                operator = next((o for o in await state.app.operators.list() if o.id == self._operator_id), None)
                grants = None if operator is None else (list(operator.roles), list(operator.permissions))
                if self._memory is not None:
                    roster = None if self._database_url is None else roster_url(self._database_url)
                    self._memory.remember(Remembered(self._operator_id, self.style, roster, grants))
                if not self._shown - {self._visible(grants)}:
                    return
                if self.tells_writes and self._unwritten:
                    await self._all_written.wait()  # the stale answer goes out before the word that it changed
                if self._listener is not None:
                    await self._listener.send_tool_list_changed()  # stdio's connection, before 2026-07-28
                await self._subscriptions.publish(ToolsListChanged())  # `subscriptions/listen` streams, from it on
        except Exception as exc:
            _log.warning("taskgate serve: the tool list given before the database opened was not checked against "
                         "it: %s: %s", type(exc).__name__, exc)  # fmt: skip

    async def _handle_call_tool(self, ctx: Any, params: Any) -> Any:
        try:
            server, state = await self.opening.ready()
        except OpeningFailed as exc:
            if ctx.request_id is not None:
                self.opening.refused.add(ctx.request_id)
            return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
        return await server._handle_call_tool(dataclasses.replace(ctx, lifespan_context=state), params)

    async def _handed(self, name: str, ctx: Any, params: Any) -> Any:
        """What the full server's handler `name` answers, once it is open. Raises: MCPError when it failed to."""
        try:
            server, state = await self.opening.ready()
        except OpeningFailed as exc:
            raise MCPError(INTERNAL_ERROR, str(exc)) from None
        return await getattr(server, name)(dataclasses.replace(ctx, lifespan_context=state), params)

    async def _handle_list_resources(self, ctx: Any, params: Any) -> Any:
        return await self._handed("_handle_list_resources", ctx, params)

    async def _handle_read_resource(self, ctx: Any, params: Any) -> Any:
        return await self._handed("_handle_read_resource", ctx, params)

    async def _handle_list_resource_templates(self, ctx: Any, params: Any) -> Any:
        return await self._handed("_handle_list_resource_templates", ctx, params)

    async def _handle_list_prompts(self, ctx: Any, params: Any) -> Any:
        return await self._handed("_handle_list_prompts", ctx, params)

    async def _handle_get_prompt(self, ctx: Any, params: Any) -> Any:
        return await self._handed("_handle_get_prompt", ctx, params)


async def serve(front: FrontServer, streams: ServerStreams) -> None:
    """Serve one client over `streams` until it leaves or, when the opening failed, until a tool call was told."""
    read, write = streams
    lowlevel = front._lowlevel_server
    async with anyio.create_task_group() as group:

        async def run() -> None:
            # honest: a list answered before the database opened is corrected with this notification (_correct)
            changes = NotificationOptions(tools_changed=True)
            await lowlevel.run(read, write, lowlevel.create_initialization_options(changes))
            group.cancel_scope.cancel()

        group.start_soon(run)
        await front.opening.told.wait()
        group.cancel_scope.cancel()


def serve_stdio(settings: Settings) -> None:
    """MCP over stdin/stdout as the configured local operator, answering before the full server is open.

    Raises: OpeningFailed when the full server could not be opened (after the replies are written: serve exits
    non-zero, as it did when it opened first).
    """
    _serve_stdio(settings.operator.default, settings.mcp.tool_names, settings.resolved_database_url,
                 lambda: _full_server(settings))  # fmt: skip


def serve_stdio_remembered(load: Callable[[], Settings]) -> None:
    """`serve_stdio` with the settings `load()` gives, loaded in the opening when the last opening of this
    configuration remembered what the front needs (infrastructure/grants_cache.py: the operator, the tool-name
    style, the SQLite file), else first. Loading them is the largest part of the front's own start (~55 ms).

    Raises: InvalidInput when the settings are invalid and nothing was remembered; OpeningFailed when the full
    server could not be opened, the settings included (after the replies are written).
    """
    known = RememberedGrants().recall()
    if known is None:
        serve_stdio(load())
        return
    style: Any = known.tool_names
    _serve_stdio(known.operator_id, style, known.roster_url, lambda: _full_server(_as_remembered(load(), known)))


def _as_remembered(settings: Settings, known: Remembered) -> Settings:
    """`settings`, once checked to be what the front answered with. Raises: InvalidInput when they are not (the
    key covers the config file and the environment's `TASKGATE_*`; a file the config names may still change)."""
    loaded = (settings.operator.default, settings.mcp.tool_names, roster_url(settings.resolved_database_url))
    if loaded != (known.operator_id, known.tool_names, known.roster_url):
        RememberedGrants().forget()  # the next serve loads its settings first, and remembers them anew
        raise InvalidInput("the configuration changed while serve started (its operator, tool names or database "
                           "are not those it answered with): start serve again")  # fmt: skip
    return settings


def _serve_stdio(operator_id: str, tool_names: ToolNames, database_url: str | None,
                 build: Callable[[], MCPServer]) -> None:  # fmt: skip
    plain_logging()
    front = FrontServer(
        Opening(build),
        tool_names=tool_names,
        operator_id=operator_id,
        database_url=database_url,
        memory=RememberedGrants(),
    )
    front.tells_writes = True
    anyio.run(serve_over_stdio, lambda streams: serve(front, streams), front.written)
    if front.opening.error is not None:
        raise front.opening.error


def _full_server(settings: Settings) -> MCPServer:
    from taskgate.entrypoints.mcp.runner import stdio_server  # the services, SQLAlchemy, the tools: in the thread

    return stdio_server(settings)
