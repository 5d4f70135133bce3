"""`taskgate tracker`: status writes owed to the external tracker (Beads), and what an operator does about them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from taskgate.application.trackers.writebacks import Attempt
from taskgate.domain import writebacks as wb
from taskgate.domain.writebacks import Writeback
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import JsonOpt, _local_actor, emit, fail, group, run
from taskgate.entrypoints.render import console, terminal_safe

if TYPE_CHECKING:
    from taskgate.bootstrap import App

tracker_app = group("tracker", no_args_is_help=True)


def _writebacks(services: App):
    assert services.writebacks is not None, "built by bootstrap()"
    return services.writebacks


@tracker_app.command("status")
def tracker_status(
    every: Annotated[bool, typer.Option("--all", help="Also the written, dismissed and superseded ones.")] = False,
    limit: Annotated[int, typer.Option("--limit", help="At most this many rows, newest first.")] = 100,
    as_json: JsonOpt = False,
) -> None:
    """Write-backs still owed to the tracker (pending: being retried; failed: gave up, waiting for an operator),
    each with the tracker's own error. Exits 4 while any has failed, so scripts notice."""
    states = None if every else sorted(wb.OPEN_STATES)
    rows = run(lambda services: _writebacks(services).rows(states, limit))
    if rows or as_json:
        emit(rows, as_json, lambda: writebacks_table(rows))
    else:
        console.print("nothing owed to the tracker", highlight=False)
    if any(row.state == wb.FAILED for row in rows):
        raise typer.Exit(4)


@tracker_app.command("retry")
def tracker_retry(writeback_id: Annotated[int, typer.Argument(help="The write-back's number (#).")]) -> None:
    """Try a pending or failed write-back again now, with a fresh series of retries."""
    attempt: Attempt = run(lambda services: _writebacks(services).retry(writeback_id, _local_actor(services)))
    if not attempt.ok:
        fail(f"write-back #{writeback_id} failed again (it will be retried): {attempt.error}")
    console.print(f"write-back #{writeback_id}: {attempt.writeback.task_id} → {attempt.writeback.status} written",
                  highlight=False, markup=False)  # fmt: skip


@tracker_app.command("dismiss")
def tracker_dismiss(
    writeback_id: Annotated[int, typer.Argument(help="The write-back's number (#).")],
    reason: Annotated[str, typer.Option("--reason", help="Why it is no longer owed (recorded).")] = "",
) -> None:
    """Stop owing a write-back (the tracker was put right by hand, say). Recorded with who and why."""
    row = run(lambda services: _writebacks(services).dismiss(writeback_id, _local_actor(services), reason))
    console.print(f"write-back #{row.id} dismissed", highlight=False)


def writebacks_table(rows: list[Writeback]):
    """One row per write-back: number, task, status to write, state, attempts, next try, the tracker's error."""
    cells = [(f"#{r.id}", r.task_id, r.status, r.state, r.attempts, _next_try(r), terminal_safe(r.last_error or ""))
             for r in rows]  # fmt: skip
    return render.table("Tracker write-backs", ["#", "task", "status", "state", "attempts", "next try", "error"],
                        cells, markup=False)  # fmt: skip


def _next_try(row: Writeback) -> str:
    if row.state != wb.PENDING or row.next_attempt_at is None:
        return ""
    return row.next_attempt_at.strftime("%Y-%m-%d %H:%M:%S")
