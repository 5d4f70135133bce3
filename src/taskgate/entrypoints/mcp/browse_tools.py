"""MCP tools that list what is there: sessions (the CLI's `session list`), events (the outbox every write appends
to: transitions, decisions, agents, tracker write-backs) and nodes (`taskgate nodes`). A session has one shape
everywhere: `SessionOut`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from taskgate.application.audit.queries import EventQuery
from taskgate.application.sessions.commands import SessionPage
from taskgate.domain.access import Capability
from taskgate.domain.bounds import IDS, OFFSETS, PAGE_SIZES, ROW_LIMITS
from taskgate.domain.errors import InvalidInput
from taskgate.domain.states import SessionState
from taskgate.entrypoints.mcp.calls import ProjectRef, call_of, parse_when, session_out, tool_errors
from taskgate.entrypoints.mcp.models import SessionOut


class SessionList(BaseModel):
    summary: str
    total: int = Field(description="How many sessions match the filters (this page holds at most `limit`).")
    offset: int
    sessions: list[SessionOut] = Field(description="Newest first; each as session_status returns it.")


class EventOut(BaseModel):
    id: int
    kind: str = Field(description="e.g. session.transition, decision.recorded, tracker.writeback_failed.")
    at: datetime
    session_id: str | None
    payload: dict[str, Any]


class EventList(BaseModel):
    summary: str
    events: list[EventOut] = Field(description="Oldest first (the newest `limit` that match).")


@tool_errors
async def session_list(
    ctx: Context,
    project: ProjectRef = None,
    plan_id: Annotated[int | None, Field(description="Only sessions of this plan.", ge=IDS.low, le=IDS.high)] = None,
    state: Annotated[
        list[str] | None, Field(description='Only sessions in these states (e.g. ["verifying"]).', max_length=15)
    ] = None,
    operator: Annotated[str | None, Field(description="Only sessions of this operator.", max_length=100)] = None,
    limit: Annotated[int, Field(description="Page size.", ge=PAGE_SIZES.low, le=PAGE_SIZES.high)] = 100,
    offset: Annotated[int, Field(description="Where the page starts.", ge=OFFSETS.low, le=OFFSETS.high)] = 0,
) -> SessionList:
    """Sessions, newest first, filtered by project, plan, state and operator, a page at a time; each with its
    agents and workflow as session_status shows them."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.READ)
    found = await call.app.tracker.resolve_project(project) if project is not None else None
    states = {_state(s) for s in state} if state else None
    query = SessionPage(found.id if found else None, plan_id, states, operator, limit, offset)
    sessions, total = await call.app.sessions.page(query)
    out = [await session_out(call, s) for s in sessions]
    shown = f"{offset + 1}-{offset + len(out)} of {total}" if out else f"none of {total}"
    return SessionList(summary=f"sessions {shown}", total=total, offset=offset, sessions=out)


@tool_errors
async def events_list(
    ctx: Context,
    session_id: Annotated[str | None, Field(description="Only this session's (id or prefix).", max_length=64)] = None,
    kind: Annotated[
        str | None,
        Field(
            description="Only this kind, or kinds starting with it when it ends in '.' (e.g. tracker.).", max_length=100
        ),
    ] = None,
    since: Annotated[str | None, Field(description="ISO 8601, inclusive.", max_length=64)] = None,
    until: Annotated[str | None, Field(description="ISO 8601, inclusive.", max_length=64)] = None,
    limit: Annotated[int, Field(description="At most this many (the newest).", ge=ROW_LIMITS.low, le=10_000)] = 100,
) -> EventList:
    """Events, the record every write appends (transitions, decisions, agents, tracker write-backs that failed,
    plans reopened, ...), filtered by session, kind and time; oldest first."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.AUDIT)
    sid = await call.app.sessions.resolve_id(session_id) if session_id else None
    rows = await call.app.audit.events(EventQuery(sid, kind, parse_when(since), parse_when(until), limit))
    events = [EventOut(**{k: row[k] for k in ("id", "kind", "at", "session_id", "payload")}) for row in rows]
    return EventList(summary=f"{len(events)} event(s)", events=events)


def _state(value: str) -> SessionState:
    try:
        return SessionState(value)
    except ValueError:
        raise InvalidInput(f"unknown state {value[:40]!r}; valid: {', '.join(s.value for s in SessionState)}") from None


BROWSE_TOOLS = [session_list, events_list]
