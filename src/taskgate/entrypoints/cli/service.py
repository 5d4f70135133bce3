"""Running the service and its chores: demo, serve, context, worktrees, sweep, webhooks."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from taskgate.bootstrap import App, load_settings
from taskgate.domain.entities import Project
from taskgate.domain.errors import InvalidInput, TaskgateError
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import (
    JsonOpt,
    ProjectOpt,
    command,
    emit,
    fail,
    group,
    run,
    run_in_project,
    worktrees_app,
)
from taskgate.entrypoints.render import console, terminal_safe

if TYPE_CHECKING:
    from taskgate.application.nodes.heartbeats import NodeView
    from taskgate.application.webhooks.outbox import SubscriberStatus


@command("demo")
def demo(
    workdir: Annotated[Path | None, typer.Option(help="Where to put the scratch repo and database.")] = None,
) -> None:
    """Run the guided demo on a scratch git repository and a fresh SQLite database."""
    from taskgate.entrypoints.demo import run_demo

    try:
        asyncio.run(run_demo(workdir))
    except TaskgateError as exc:
        fail(str(exc))


@command("serve")
def serve(
    http: Annotated[bool, typer.Option("--http", help="Streamable HTTP (bearer tokens) instead of stdio.")] = False,
    host: Annotated[str | None, typer.Option(help="HTTP host (default: mcp.host, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default: mcp.port, 8765).")] = None,
) -> None:
    """Run the MCP server: over stdio as the local operator, or over HTTP for token holders."""
    try:
        settings = load_settings()
        if http:
            from taskgate.entrypoints.mcp.runner import serve_http

            serve_http(settings, host or settings.mcp.host, port or settings.mcp.port)
        else:
            from taskgate.entrypoints.mcp.front import serve_stdio  # `taskgate serve` alone comes by main()

            serve_stdio(settings)
    except TaskgateError as exc:
        fail(str(exc))


@command("console")
def console_command(
    host: Annotated[str | None, typer.Option(help="HTTP host (default: mcp.host, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default: mcp.port, 8765).")] = None,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the sign-in link in a browser.")] = False,
) -> None:
    """Serve the operator console (and MCP beside it, as `serve --http` does) and print a one-time sign-in link
    for the local operator."""
    from taskgate.entrypoints.mcp.runner import serve_http

    try:
        settings = load_settings()
        serve_http(settings, host or settings.mcp.host, port or settings.mcp.port, sign_in_link=True,
                   open_browser=open_browser)  # fmt: skip
    except TaskgateError as exc:
        fail(str(exc))


@command("context")
def context(
    project: ProjectOpt = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="Ignore the cached snapshot.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The project's git and tracker context (what the context_discover MCP tool returns)."""

    async def work(services: App, found: Project):
        return await services.context.discover(found.id, refresh=refresh)

    found = run_in_project(project, work)
    if as_json:
        render.print_json(found.as_dict())
        return
    console.print(render.context_panel(found))


@worktrees_app.callback(invoke_without_command=True)
def worktrees(ctx: typer.Context, project: ProjectOpt = None, as_json: JsonOpt = False) -> None:
    """List session worktrees with their session, state and disk use (orphans are marked)."""
    if ctx.invoked_subcommand is not None:
        return

    async def work(services: App):
        found = await services.tracker.resolve_project(project, os.getcwd()) if project else None
        return await services.workspaces.list_worktrees(found.id if found else None)

    rows = run(work)
    emit(rows, as_json, lambda: render.worktrees_table(rows))


@worktrees_app.command("reconcile")
def worktrees_reconcile(
    report_only: Annotated[bool, typer.Option("--report-only", help="Only report orphans; prune nothing.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """What `taskgate serve` does at start: prune (or report) orphan worktrees and branches, flag sessions whose
    worktree vanished, and finish initialisations a crash interrupted."""

    async def work(services: App):
        return await services.workspaces.reconcile(prune=False if report_only else None)

    report = run(work)
    if as_json:
        render.print_json(report)
        return
    console.print(report.summary(), highlight=False)
    found = (
        ("orphan worktree", report.orphan_worktrees),
        ("orphan branch", report.orphan_branches),
        ("missing worktree of session", report.missing_worktrees),
        ("error", report.errors),
    )
    for label, items in found:
        for item in items:
            console.print(f"  {label}: {item}", highlight=False, markup=False)


@command("nodes")
def nodes(as_json: JsonOpt = False) -> None:
    """The service processes sharing this database (docs/nodes.md): each node's id, host, data dir, last
    heartbeat, whether it is alive (its lease holds: a heartbeat within [node] lease_s, not marked down) and its
    live agents and sessions."""

    async def work(services: App):
        assert services.nodes is not None
        return services.nodes.identity.id, await services.nodes.nodes()

    mine, found = run(work)
    if as_json:
        render.print_json({"this_node": mine, "nodes": [n.as_dict() for n in found]})
        return
    rows = [(n.id + (" (this one)" if n.this else ""), n.record.host, n.record.data_dir, n.record.pid, n.record.version,
             n.record.heartbeat_at.isoformat(timespec="seconds"), _alive(n), n.live_agents, n.live_sessions)
            for n in found]  # fmt: skip
    columns = ["node", "host", "data dir", "pid", "version", "last heartbeat", "alive", "live agents", "sessions"]
    console.print(render.table("Nodes", columns, rows, markup=False))
    if not found:
        console.print(f"no node has beaten yet: `taskgate serve` heartbeats as node {mine}", highlight=False,
                      markup=False)  # fmt: skip


def _alive(node: NodeView) -> str:
    if node.record.down_at is not None:
        return f"no: down since {node.record.down_at.isoformat(timespec='seconds')}"
    return "yes" if node.alive else "no"


@command("sweep")
def sweep(as_json: JsonOpt = False) -> None:
    """Run the sweeper once (what `taskgate serve` does every [sweeper] interval_s): time out sessions past their
    deadline, escalate or fail verifications waiting for a decision, abandon sessions whose agents went silent;
    with [dispatch] auto_start on, start sessions on ready tasks that a workflow's trigger takes."""
    from taskgate.bootstrap import build_sweeper

    async def work(services: App):
        sweeper = build_sweeper(services.settings or load_settings(), services, serving=False)  # it exits: no agents
        try:
            return await sweeper.sweep_once()
        finally:
            await sweeper.release_turn()  # one sweep: the turn goes back at once

    report = run(work)
    if as_json:
        render.print_json(report)
        return
    console.print(report.summary(), highlight=False)
    for action in report.actions:
        console.print(
            f"  {action.session_id} {action.action} ({action.from_state} -> {action.to_state}): {action.reason}",
            highlight=False,
            markup=False,
        )
    for skip in report.skipped:
        console.print(f"  {skip.session_id} skipped {skip.action}: {skip.why}", highlight=False, markup=False)
    for line in report.writebacks:
        console.print(f"  tracker write-back {terminal_safe(line)}", highlight=False, markup=False)
    for agent_id in report.silent_agents:
        console.print(f"  agent {agent_id} marked failed (no heartbeat)", highlight=False)
    for line in report.polls:
        console.print(f"  tracker poll {terminal_safe(line)}", highlight=False, markup=False)
    for line in report.lost:
        console.print(f"  tracker issue lost: {terminal_safe(line)}", highlight=False, markup=False)
    for done in report.dispatched:
        console.print(f"  dispatch {terminal_safe(done.line())}", highlight=False, markup=False)
    for line in report.nodes_down:
        console.print(f"  {terminal_safe(line)}", highlight=False, markup=False)
    for error in report.errors:
        console.print(f"  error: {error}", highlight=False, markup=False)


webhooks_app = group("webhooks", no_args_is_help=True)


def _dispatcher(services: App):
    """The configured webhook dispatcher. Raises: InvalidInput when no `[[webhooks]]` are configured."""
    from taskgate.bootstrap import build_outbox

    assert services.uow is not None and services.clock is not None
    dispatcher = build_outbox(services.settings or load_settings(), services.uow, services.clock)
    if dispatcher is None:
        raise InvalidInput("no webhooks configured: add a [[webhooks]] table to the config (see docs/events.md)")
    return dispatcher


@webhooks_app.command("status")
def webhooks_status(as_json: JsonOpt = False) -> None:
    """Deliveries per webhook: where it started, pending, delivered, failed (gave up), and the oldest pending one."""

    async def work(services: App):
        return await _dispatcher(services).status()

    rows = run(work)
    columns = ["webhook", "url", "events", "start", "pending", "delivered", "failed", "oldest pending", "attempts"]
    emit(
        rows,
        as_json,
        lambda: render.table(
            "Webhooks",
            [*columns, "next try", "last error"],
            (
                [
                    s.name,
                    s.url,
                    ", ".join(s.events),
                    _start_of(s),
                    s.pending,
                    s.delivered,
                    s.failed,
                    f"event {s.oldest_pending_event_id}" if s.oldest_pending_event_id else "",
                    s.attempts or "",
                    s.next_attempt_at.isoformat(timespec="seconds") if s.next_attempt_at else "",
                    s.last_error,
                ]
                for s in rows
            ),
            markup=False,
        ),
    )


def _start_of(status: SubscriberStatus) -> str:
    """Where a subscriber started: after its `start` marker, at the beginning of the log, or not yet."""
    if status.started_after_event_id is not None:
        return f"after event {status.started_after_event_id}"
    if status.started:
        return "beginning"
    return f"not yet (backfill {status.backfill})"


@webhooks_app.command("deliver")
def webhooks_deliver(
    once: Annotated[bool, typer.Option("--once", help="Deliver what is due now, then exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between idle rounds.")] = 1.0,
) -> None:
    """Send the pending webhook deliveries, printing each attempt. Without --once it keeps going (like `taskgate
    serve` does in the background) until interrupted; with --once it stops when nothing more is due now."""

    async def work(services: App):
        dispatcher = _dispatcher(services)
        totals = [0, 0, 0, 0]
        while True:
            report = await dispatcher.run_once()
            for line in report.lines:
                console.print(line, highlight=False, markup=False, soft_wrap=True)
            for i, n in enumerate((report.enqueued, report.delivered, report.retried, report.failed)):
                totals[i] += n
            if report.sent == 0:
                if once:
                    return totals
                await asyncio.sleep(interval)

    try:
        enqueued, delivered, retried, failed = run(work)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    console.print(
        f"enqueued {enqueued}, delivered {delivered}, will retry {retried}, gave up {failed}", highlight=False
    )
