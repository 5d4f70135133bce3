"""Running the MCP server from the CLI: the database opens in the server's lifespan, once per run."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer

from taskgate.bootstrap import (
    App,
    Settings,
    bootstrap,
    build_notifier,
    build_outbox,
    build_sweeper,
    dispatch_report,
    redact,
)
from taskgate.domain.access import Principal
from taskgate.domain.errors import InvalidInput
from taskgate.entrypoints.mcp.agent_endpoint import FixedEndpoint, serve_agents_locally
from taskgate.entrypoints.mcp.server import build_server, http_app
from taskgate.entrypoints.mcp.stdio import plain_logging


class _OpenApp:
    """Opens the services in the lifespan and remembers them for the HTTP gate."""

    def __init__(self, settings: Settings, agent_url: str | None = None) -> None:
        self.settings, self.app, self.agent_url = settings, None, agent_url

    @asynccontextmanager
    async def __call__(self) -> AsyncIterator[App]:
        app = await bootstrap(self.settings)
        if self.agent_url is not None and app.agents is not None:  # HTTP: agents call this very server
            app.agents.use_endpoint(FixedEndpoint(self.agent_url))
        else:  # stdio: agents get a loopback endpoint while they run
            serve_agents_locally(app)
        await _recover(app)
        self.app = app
        if self.agent_url is not None and app.nodes is not None:  # other nodes' refusals name where this one serves
            app.nodes.identity = dataclasses.replace(app.nodes.identity, url=self.agent_url)
        beating = await _start_heartbeat(app)
        sweeping = _start_sweeper(self.settings, app)
        following = _start_forge(app)
        sealing = asyncio.create_task(_seal_audit_log(app), name="taskgate-audit-seal")  # off the first answer's path
        linking = _start_linker(self.settings, app)
        notifying = _start_notifier(self.settings, app)
        delivering = None
        try:
            delivering = _start_webhooks(self.settings, app)  # raises for a webhook whose secret is missing
            yield app
        finally:
            self.app = None
            await asyncio.wait({sealing}, timeout=_WEBHOOK_GRACE_S)  # a checkpoint in flight is signed, not cut
            sealing.cancel()
            await _stop_webhooks(delivering)
            await _stop_webhooks(notifying)  # a message in flight is sent and recorded, or sent again next start
            await _stop_sweeper(linking)  # a pass in flight rolls back whole; the next start links its records
            await _stop_sweeper(sweeping)
            await _stop_sweeper(following)
            await _stop_sweeper(beating)
            await app.close()


async def _recover(app: App) -> None:
    """Before the first call: carry forward what a crash cut off (application/recovery.py). What it did goes to
    stderr, one line each; nothing here is fatal."""
    assert app.recovery is not None
    report = await app.recovery.run()
    log = logging.getLogger("taskgate")
    for line in report.lines:
        log.warning("start-up recovery: %s", line)
    if report.lines:
        log.warning("start-up recovery: done in %.2f s (%d session(s) resumed)", report.seconds, len(report.resumed))


async def _seal_audit_log(app: App) -> None:
    """The first audit checkpoint, over records no checkpoint covers yet (a database migrated to 0014), when this
    process has the key (docs/audit.md#existing-databases). A failure is logged, not fatal."""
    log, ledger = logging.getLogger("taskgate.audit"), app.ledger
    try:
        # reading the key loads `cryptography` (tens of ms): in a thread, so the first answers need not wait for it
        if ledger is None or not await asyncio.to_thread(lambda: ledger.can_sign):
            return
        sealed = await ledger.seal_if_unsealed()
    except Exception as exc:  # the service runs without it; `taskgate audit checkpoint` signs later
        log.warning("audit: the first checkpoint could not be signed at start: %s: %s", type(exc).__name__, exc)
        return
    if sealed is not None:
        log.warning("audit: signed checkpoint #%d over the %d chain(s) no checkpoint covered yet", sealed.number,
                    len(sealed.heads))  # fmt: skip


async def _start_heartbeat(app: App) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """This node's heartbeat (docs/nodes.md): one beat before the first request, then every `[node] heartbeat_s`."""
    assert app.nodes is not None
    await app.nodes.beat()
    stop = asyncio.Event()
    return stop, asyncio.create_task(app.nodes.run(stop), name="taskgate-node-heartbeat")


def _start_linker(settings: Settings, app: App) -> tuple[asyncio.Event, asyncio.Task[None]] | None:
    """The audit linker (application/audit/linking.py) every `[audit] link_interval_s`, unless that is 0."""
    if settings.audit.link_interval_s <= 0 or app.uow is None:
        return None
    from taskgate.application.audit.linking import run_linker

    stop = asyncio.Event()
    task = asyncio.create_task(run_linker(app.uow, settings.audit.link_interval_s, stop), name="taskgate-audit-link")
    return stop, task


def _start_sweeper(settings: Settings, app: App) -> tuple[asyncio.Event, asyncio.Task[None]] | None:
    """The sweeper (timeouts, escalations, abandoned sessions, dispatch) as a background task, unless `[sweeper]` is
    off. Says on stderr whether dispatch is on (it starts sessions by itself), and what stands in its way."""
    line, problems = dispatch_report(settings)
    log = logging.getLogger("taskgate.dispatch")
    # dispatch off is the default, not a warning: said only at INFO (and by `taskgate doctor`), so `serve` and the
    # console start quietly; when it is on, what it will do is worth a line, and what stands in its way a warning
    (log.warning if settings.dispatch.auto_start else log.info)("dispatch %s", line)
    for problem in problems:
        log.warning("dispatch: %s", problem)
    if not settings.sweeper.enabled:
        return None
    stop = asyncio.Event()
    return stop, asyncio.create_task(build_sweeper(settings, app).run(stop), name="taskgate-sweeper")


def _start_forge(app: App) -> tuple[asyncio.Event, asyncio.Task[None]] | None:
    """The forge loop (docs/forge.md) when a project has a `[forge]`: looks at open pull requests, acts on them."""
    if app.forge is None:
        return None
    stop = asyncio.Event()
    return stop, asyncio.create_task(app.forge.run(stop), name="taskgate-forge")


async def _stop_sweeper(sweeping: tuple[asyncio.Event, asyncio.Task[None]] | None) -> None:
    if sweeping is None:
        return
    stop, task = sweeping
    stop.set()
    task.cancel()  # a sweep in flight rolls back; the next start sweeps again
    with contextlib.suppress(asyncio.CancelledError):
        await task


_WEBHOOK_GRACE_S = 5.0


def _start_webhooks(settings: Settings, app: App) -> tuple[asyncio.Event, asyncio.Task[None]] | None:
    """The webhook dispatcher (docs/events.md) as a background task, when `[[webhooks]]` are configured."""
    assert app.uow is not None and app.clock is not None
    dispatcher = build_outbox(settings, app.uow, app.clock)
    if dispatcher is None:
        return None
    stop = asyncio.Event()
    return stop, asyncio.create_task(dispatcher.run(stop), name="taskgate-webhooks")


def _start_notifier(settings: Settings, app: App) -> tuple[asyncio.Event, asyncio.Task[None]] | None:
    """The notifier (docs/notifications.md) as a background task, when `[notify]` has channels."""
    notifier = build_notifier(settings, app)
    if notifier is None:
        return None
    stop = asyncio.Event()
    return stop, asyncio.create_task(notifier.run(stop), name="taskgate-notify")


async def _stop_webhooks(delivering: tuple[asyncio.Event, asyncio.Task[None]] | None) -> None:
    if delivering is None:
        return
    stop, task = delivering
    stop.set()  # the dispatcher finishes the send in flight and records it, then stops
    await asyncio.wait({task}, timeout=_WEBHOOK_GRACE_S)
    task.cancel()  # still sending: that delivery stays claimed and is sent again after its lease (at least once)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def stdio_server(settings: Settings) -> MCPServer:
    """The full server of `serve` over stdio, as the configured local operator; front.py answers before it is
    open and hands it the rest. Our transport, not the SDK's: that one leaves a line it cannot parse unanswered
    (see stdio.py)."""
    principal = Principal.operator(settings.operator.default)
    return build_server(_OpenApp(settings), local_principal=principal, tool_names=settings.mcp.tool_names)


def serve_http(
    settings: Settings, host: str, port: int, *, sign_in_link: bool = False, open_browser: bool = False
) -> None:
    """MCP over streamable HTTP at http://HOST:PORT/mcp (every request needs a bearer token) and the operator
    console at http://HOST:PORT/. Says on stderr where it listens once it does; with `sign_in_link`, also a
    one-time link that signs the local operator in (`taskgate console`), opened in a browser with `open_browser`.
    Raises: InvalidInput when the port is taken."""
    import webbrowser

    import uvicorn

    from taskgate.entrypoints.console.app import beside_mcp, console_app  # HTTP only: stdio serves no console

    plain_logging()
    _port_free(host, port)
    url = f"http://{host}:{port}/mcp"
    local = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/mcp"
    opener = _OpenApp(settings, agent_url=local)
    server = build_server(opener, local_principal=None, tool_names=settings.mcp.tool_names)
    console, pages = console_app(lambda: opener.app)
    asgi = beside_mcp(http_app(server, lambda: opener.app, host), console)
    home = local.removesuffix("mcp")
    # open console pages hold an event stream each: stop waiting for them after a few seconds
    config = uvicorn.Config(asgi, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3)

    class Announcing(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            await pages.feed.stop()  # open console pages' event streams end now instead of holding the shutdown
            await super().shutdown(sockets)

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:
                where = settings.config_file or "built-in defaults"
                print(f"taskgate MCP server listening on {url} (tokens: taskgate token create --operator ID); "
                      f"config {where}; database {redact(settings.resolved_database_url)}",
                      file=sys.stderr, flush=True)  # fmt: skip
                print(f"taskgate console at {home} (sign in with an operator token)", file=sys.stderr, flush=True)
                if sign_in_link and opener.app is not None:
                    link = await _sign_in_link(opener.app, settings.operator.default, pages, home)
                    print(f"sign in once with {link} (valid 10 minutes)", file=sys.stderr, flush=True)
                    if open_browser:
                        webbrowser.open(link)

    anyio.run(Announcing(config).serve)


async def _sign_in_link(app: App, operator_id: str, pages: Any, home: str) -> str:
    """A one-time sign-in link for the local operator: an operator token of its own (never shown, revoked when the
    server stops) behind a single-use code."""
    issued = await app.access.create_operator_token(operator_id, label="taskgate console sign-in link")

    async def revoke() -> None:
        with contextlib.suppress(Exception):  # stopping anyway; a token left behind is listed by `token list`
            await app.access.revoke(issued.token.id)

    app.closers.append(revoke)
    return f"{home}signin/link?code={pages.sign_ins.link(issued.secret)}"


def _port_free(host: str, port: int) -> None:
    """Raises: InvalidInput naming the port and the setting when something already listens there."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise InvalidInput(f"cannot listen on {host}:{port} ({exc.strerror}); pick another port with --port or "
                               f"mcp.port in taskgate.toml") from None  # fmt: skip
