"""`taskgate tracker`: each project's tracker poll and what dispatch made of it, the status writes owed to the tracker,
and what an operator does about them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from taskgate.application.trackers.ports import TrackerPoll
from taskgate.application.trackers.writebacks import Attempt
from taskgate.domain import writebacks as wb
from taskgate.domain.entities import Project
from taskgate.domain.writebacks import Writeback
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import JsonOpt, _local_actor, fail, group, run
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
    """Per project: the tracker, its last poll (when, what it cost, its error), what is ready, claimed, waiting for a
    slot, and why each ready issue is not dispatched; then the write-backs still owed to the tracker (pending: being
    retried; failed: gave up, waiting for an operator), each with the tracker's own error. Exits 4 while a
    write-back has failed or a tracker's last poll failed, so scripts notice."""
    states = None if every else sorted(wb.OPEN_STATES)

    async def read(services: App):
        return await services.tracker.polls(), await _writebacks(services).rows(states, limit)

    polls, rows = run(read)
    if as_json:
        render.print_json({"projects": [poll_json(project, poll) for project, poll in polls], "writebacks": rows})
    else:
        for project, poll in polls:
            print_poll(project, poll)
        if rows:
            console.print(writebacks_table(rows))
        else:
            console.print("nothing owed to the tracker", highlight=False)
    if any(row.state == wb.FAILED for row in rows) or any(poll.error for _, poll in polls):
        raise typer.Exit(4)


def poll_json(project: Project, poll: TrackerPoll) -> dict:
    """A project's last poll as `tracker status --json` shows it."""
    report = poll.report
    return {"project": project.name, "provider": poll.provider, "tracker": poll.describe,
            "polled_at": poll.polled_at.isoformat(), "error": poll.error, "requests": poll.calls,
            "not_modified": poll.not_modified, "seconds": poll.seconds, "candidates": report.get("candidates", 0),
            "ready": report.get("ready", []), "held": report.get("held", {}), "claimed": report.get("claimed", []),
            "lost": report.get("lost", {}), "dispatch": report.get("dispatch", []),
            "dry_run": report.get("dry_run", False)}  # fmt: skip


def print_poll(project: Project, poll: TrackerPoll) -> None:
    """A project's last poll for people: the tracker, the poll's cost, then one line per issue that is ready but
    not started (waiting, held by a cap, the back-off, the dry run), per claimed issue lost, per held issue."""
    report = poll.report
    cost = f"{poll.calls} requests, {poll.not_modified} not modified, {poll.seconds:.2f} s"
    head = f"{project.name}: {poll.describe}, polled {poll.polled_at:%Y-%m-%d %H:%M:%S} ({cost})"
    console.print(terminal_safe(head), highlight=False, markup=False)
    if poll.error:
        console.print(f"  poll failed: {terminal_safe(poll.error)}", highlight=False, markup=False)
    claimed, ready = report.get("claimed", []), report.get("ready", [])
    shadow = " (dry run: nothing is started)" if report.get("dry_run") else ""
    console.print(f"  {report.get('candidates', 0)} candidates, {len(ready)} ready, {len(claimed)} claimed{shadow}",
                  highlight=False, markup=False)  # fmt: skip
    for decision in report.get("dispatch", []):
        if decision["outcome"] != "started":
            line = f"  {decision['task']} {decision['outcome']}: {decision['detail']}"
            console.print(terminal_safe(line), highlight=False, markup=False)
    for task_id, why in report.get("lost", {}).items():
        console.print(terminal_safe(f"  {task_id} lost in the tracker: {why}"), highlight=False, markup=False)
    for task_id, why in report.get("held", {}).items():
        console.print(terminal_safe(f"  {task_id} held: {why}"), highlight=False, markup=False)


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
