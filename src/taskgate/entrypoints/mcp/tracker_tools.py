"""MCP tools for the external tracker: each project's last poll and what dispatch did with it, and the status writes
owed to the tracker: see them, retry them, dismiss them.

The CLI's `taskgate tracker status|retry|dismiss` over the same use cases (application/trackers/writebacks.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from taskgate.domain import writebacks as wb
from taskgate.domain.access import Capability
from taskgate.domain.bounds import IDS, ROW_LIMITS
from taskgate.domain.writebacks import Writeback
from taskgate.entrypoints.mcp.calls import call_of, tool_errors

WritebackId = Annotated[int, Field(description="The write-back's number.", ge=IDS.low, le=IDS.high)]


class WritebackOut(BaseModel):
    id: int
    task_id: str
    session_id: str | None
    tracker: str
    status: str = Field(description="The taskgate task status to write (the tracker's word comes from its map).")
    state: str = Field(description="pending (retried with backoff), failed (gave up), done, dismissed, superseded.")
    attempts: int
    next_attempt_at: datetime | None
    last_error: str | None = Field(description="The tracker's own error text of the last attempt.")
    created_at: datetime
    resolved_by: str | None

    @classmethod
    def of(cls, row: Writeback) -> WritebackOut:
        return cls(**{name: getattr(row, name) for name in cls.model_fields})


class DispatchDecision(BaseModel):
    task: str
    outcome: str = Field(description="started, waiting, held, would_start (dry run), skipped or error.")
    detail: str = Field(description="Why: the cap, the review queue, the retry back-off, the guard that refused.")
    session: str | None = None


class TrackerPollOut(BaseModel):
    """A project's last tracker poll (`taskgate tracker status`): what it cost, found, and what dispatch did."""

    project: str
    tracker: str = Field(description="The provider and its filter, e.g. `github acme/shop, label taskgate`.")
    polled_at: datetime
    error: str | None
    requests: int
    not_modified: int
    ready: list[str]
    held: dict[str, str] = Field(description="Task id → why the tracker's own rule keeps it out of ready.")
    claimed: list[str]
    lost: dict[str, str] = Field(description="Claimed task id → why the tracker took the issue back.")
    dispatch: list[DispatchDecision]
    dry_run: bool


class WritebackList(BaseModel):
    summary: str
    writebacks: list[WritebackOut]
    projects: list[TrackerPollOut] = Field(default_factory=list, description="Each project's last tracker poll.")


class WritebackDismissed(BaseModel):
    summary: str
    writeback: WritebackOut


class WritebackAttempt(BaseModel):
    summary: str
    ok: bool
    error: str | None
    writeback: WritebackOut


@tool_errors
async def tracker_status(
    ctx: Context,
    state: Annotated[
        Literal["pending", "failed", "done", "dismissed", "superseded"] | None,
        Field(description="Only write-backs in this state; default: the owed ones (pending and failed)."),
    ] = None,
    limit: Annotated[
        int, Field(description="At most this many, newest first.", ge=ROW_LIMITS.low, le=ROW_LIMITS.high)
    ] = 100,
) -> WritebackList:
    """Each project's last tracker poll (ready, held and why, claimed, lost, what dispatch did with each ready issue
    and why), and the status writes owed to the tracker, newest first, each with the tracker's own error: a failed
    one means the tracker still shows an older status than taskgate."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.READ)
    assert call.app.writebacks is not None
    rows = await call.app.writebacks.rows([state] if state else sorted(wb.OPEN_STATES), limit)
    failed = sum(row.state == wb.FAILED for row in rows)
    polls = [_poll(project.name, poll) for project, poll in await call.app.tracker.polls()]
    broken = sum(p.error is not None for p in polls)
    summary = f"{len(rows)} write-back(s), {failed} failed; {len(polls)} tracker poll(s), {broken} failed"
    return WritebackList(summary=summary, writebacks=[WritebackOut.of(r) for r in rows], projects=polls)


def _poll(project: str, poll) -> TrackerPollOut:
    report = poll.report
    decisions = [DispatchDecision(**{k: d.get(k) for k in ("task", "outcome", "detail", "session")})
                 for d in report.get("dispatch", [])]  # fmt: skip
    return TrackerPollOut(project=project, tracker=poll.describe, polled_at=poll.polled_at, error=poll.error,
                          requests=poll.calls, not_modified=poll.not_modified, ready=report.get("ready", []),
                          held=report.get("held", {}), claimed=report.get("claimed", []), lost=report.get("lost", {}),
                          dispatch=decisions, dry_run=bool(report.get("dry_run")))  # fmt: skip


@tool_errors
async def tracker_retry(ctx: Context, writeback_id: WritebackId) -> WritebackAttempt:
    """Try a pending or failed write-back again now, with a fresh series of retries; says whether it was written."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.FIRE)
    assert call.app.writebacks is not None
    attempt = await call.app.writebacks.retry(writeback_id, call.principal.actor)
    row = WritebackOut.of(attempt.writeback)
    summary = "written" if attempt.ok else f"failed again (it will be retried): {attempt.error}"
    return WritebackAttempt(
        summary=f"write-back #{writeback_id} {summary}", ok=attempt.ok, error=attempt.error, writeback=row
    )


@tool_errors
async def tracker_dismiss(
    ctx: Context,
    writeback_id: WritebackId,
    reason: Annotated[str, Field(description="Why it is no longer owed (recorded).", min_length=1, max_length=2000)],
) -> WritebackDismissed:
    """Stop owing a write-back (the tracker was put right by hand, say); recorded with who and why."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.DECIDE)
    assert call.app.writebacks is not None
    row = await call.app.writebacks.dismiss(writeback_id, call.principal.actor, reason)
    return WritebackDismissed(summary=f"write-back #{row.id} dismissed", writeback=WritebackOut.of(row))


TRACKER_TOOLS = [tracker_status, tracker_retry, tracker_dismiss]
