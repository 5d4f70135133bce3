"""MCP tools for the status writes owed to the external tracker (Beads): see them, retry them, dismiss them.

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


class WritebackList(BaseModel):
    summary: str
    writebacks: list[WritebackOut]


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
    """Status writes owed to the external tracker (Beads), newest first, each with the tracker's own error: a
    failed one means the tracker still shows an older status than taskgate."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.READ)
    assert call.app.writebacks is not None
    rows = await call.app.writebacks.rows([state] if state else sorted(wb.OPEN_STATES), limit)
    failed = sum(row.state == wb.FAILED for row in rows)
    return WritebackList(
        summary=f"{len(rows)} write-back(s), {failed} failed", writebacks=[WritebackOut.of(r) for r in rows]
    )


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
