"""MCP tools of the nodes sharing one database (docs/nodes.md): who they are, and adopting a down node's session."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from taskgate.domain.access import Capability
from taskgate.domain.errors import InvalidInput
from taskgate.entrypoints.mcp.calls import SessionRef, call_of, session_out, tool_errors
from taskgate.entrypoints.mcp.models import SessionOut


class NodeOut(BaseModel):
    id: str = Field(description="The node id: [node] id, or the host and a hash of the data dir.")
    host: str
    data_dir: str
    pid: int
    version: str
    url: str | None = Field(description="Where it serves MCP over HTTP, when it does.")
    started_at: datetime
    heartbeat_at: datetime
    down_at: datetime | None = Field(description="When a surviving node found its lease lapsed (None: not down).")
    alive: bool = Field(description="Its lease holds: not down, last heartbeat within [node] lease_s.")
    live_agents: int = Field(description="Its queued and running agents.")
    live_sessions: int = Field(description="Its sessions not in a terminal state (it holds their worktrees).")
    this: bool = Field(description="The node serving this call.")


class NodeList(BaseModel):
    summary: str
    nodes: list[NodeOut]


@tool_errors
async def nodes_list(ctx: Context) -> NodeList:
    """The service processes sharing this database (docs/nodes.md), by id: each one's host, data dir, MCP address,
    last heartbeat, whether its lease holds (or when it was found down) and its live agents and sessions."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.READ)
    if call.app.nodes is None:
        raise InvalidInput("this server keeps no node record")
    found = await call.app.nodes.nodes()
    alive = sum(1 for n in found if n.alive)
    nodes = [NodeOut(**n.as_dict()) for n in found]
    return NodeList(summary=f"{len(found)} node(s), {alive} alive", nodes=nodes)


class AdoptedOut(BaseModel):
    summary: str
    from_node: str = Field(description="The down node that held the session.")
    agents_failed: list[str] = Field(description="Its agents lost with that node, now failed.")
    worktree: str = Field(description="reachable, or why not (adopted with without_worktree).")
    session: SessionOut


@tool_errors
async def session_adopt(
    session_id: SessionRef,
    ctx: Context,
    without_worktree: Annotated[
        bool, Field(description="Adopt even when the worktree is not usable on this node (to cancel or fail it).")
    ] = False,
) -> AdoptedOut:
    """Move a down node's session to the node serving this call (docs/nodes.md#adopting-a-down-nodes-session):
    refused, with nothing written, unless that node is marked down, the worktree is the session's checkout here
    and none of its agents still runs on this host. Its lost agents fail; an executing session is abandoned, and
    resume runs it again here."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.DECIDE)
    if call.app.adoption is None:
        raise InvalidInput("this server keeps no node record")
    sid = await call.app.sessions.resolve_id(session_id)
    adopted = await call.app.adoption.adopt(sid, call.principal.actor, without_worktree=without_worktree)
    summary = (f"session {sid} adopted from node {adopted.from_node} by node {adopted.session.node_id}; "
               f"now {adopted.session.state.value}")  # fmt: skip
    return AdoptedOut(summary=summary, from_node=adopted.from_node, agents_failed=list(adopted.agents_failed),
                      worktree=adopted.worktree, session=await session_out(call, adopted.session))  # fmt: skip


NODE_TOOLS = [nodes_list, session_adopt]
