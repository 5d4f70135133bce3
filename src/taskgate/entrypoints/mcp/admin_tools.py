"""MCP tools for what only the CLI could do: operators (list, add, grant) and closing a plan by hand. The CLI's
`operator list|add|grant` and `plan close` over the same use cases and the same permission checks."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from taskgate.application.operators.roster import AddOperator
from taskgate.domain.access import Capability, effective_permissions
from taskgate.domain.bounds import IDS
from taskgate.domain.entities import Operator
from taskgate.domain.errors import InvalidInput
from taskgate.entrypoints.mcp.calls import call_of, tool_errors
from taskgate.entrypoints.mcp.models import PlanOut

RoleName = Literal["admin", "architect", "developer", "reviewer", "qa"]
PermissionName = Literal["read", "write", "approve", "override", "admin"]
OperatorId = Annotated[str, Field(description="The operator's id, e.g. alice.", min_length=1, max_length=100)]


class OperatorOut(BaseModel):
    summary: str
    id: str
    name: str
    email: str | None
    roles: list[str]
    permissions: list[str] = Field(description="Granted to it alone (besides its roles').")
    effective_permissions: list[str] = Field(description="What it may do: its roles' permissions and its grants.")
    max_active_sessions: int
    created_at: datetime

    @classmethod
    def of(cls, o: Operator, done: str = "") -> OperatorOut:
        effective = sorted(p.value for p in effective_permissions(o))
        return cls(summary=f"{done}operator {o.id} ({', '.join(o.roles) or 'no role'}): {', '.join(effective)}",
                   id=o.id, name=o.name, email=o.email, roles=list(o.roles), permissions=list(o.permissions),
                   effective_permissions=effective, max_active_sessions=o.max_active_sessions,
                   created_at=o.created_at)  # fmt: skip


class OperatorList(BaseModel):
    summary: str
    operators: list[OperatorOut]


@tool_errors
async def operator_list(ctx: Context) -> OperatorList:
    """Operators with their roles, grants, effective permissions and capacity."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.READ)
    operators = [OperatorOut.of(o) for o in await call.app.operators.list()]
    return OperatorList(summary=f"{len(operators)} operator(s)", operators=operators)


@tool_errors
async def operator_add(
    ctx: Context,
    operator_id: OperatorId,
    roles: Annotated[list[RoleName], Field(description="Its roles (default: developer).", max_length=5)] = [],  # noqa: B006
    name: Annotated[str | None, Field(description="Display name.", max_length=200)] = None,
    email: Annotated[str | None, Field(description="E-mail address.", max_length=320)] = None,
    max_active_sessions: Annotated[int, Field(description="Sessions it may have in progress.", ge=1, le=1000)] = 5,
) -> OperatorOut:
    """Add an operator (admins only); it signs in with a token an admin creates for it (`taskgate token create`)."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.ADMINISTER)
    cmd = AddOperator(operator_id, list(roles) or ["developer"], name, email, max_active_sessions, [],
                      call.principal.actor)  # fmt: skip
    return OperatorOut.of(await call.app.operators.add(cmd), "added ")


@tool_errors
async def operator_grant(
    ctx: Context,
    operator_id: OperatorId,
    roles: Annotated[list[RoleName], Field(description="Roles to add.", max_length=5)] = [],  # noqa: B006
    permissions: Annotated[
        list[PermissionName], Field(description="Permissions to grant it alone.", max_length=5)
    ] = [],  # noqa: B006
    max_active_sessions: Annotated[
        int | None, Field(description="Its new capacity (sessions in progress).", ge=1, le=1000)
    ] = None,
) -> OperatorOut:
    """Give an operator more roles or permissions, or another capacity (admins only); recorded with who did it."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.ADMINISTER)
    if not (roles or permissions or max_active_sessions):
        raise InvalidInput("nothing to grant: give roles, permissions or max_active_sessions")
    granted = await call.app.operators.grant(
        operator_id,
        roles=list(roles),
        permissions=list(permissions),
        max_active_sessions=max_active_sessions,
        actor=call.principal.actor,
    )
    return OperatorOut.of(granted, "granted; ")


@tool_errors
async def plan_close(
    ctx: Context,
    plan_id: Annotated[int, Field(description="The plan's id.", ge=IDS.low, le=IDS.high)],
    reason: Annotated[str, Field(description="Why (recorded).", max_length=2000)] = "",
) -> PlanOut:
    """Close a plan by hand: none of its tasks starts or is listed ready until a task is added to it (which reopens
    it); sessions already running go on. Closing a closed plan changes nothing."""
    call = call_of(ctx)
    await call.app.operators.authorize(call.principal, Capability.MANAGE)
    return PlanOut.of(await call.app.tracker.close_plan(plan_id, call.principal.actor, reason))


ADMIN_TOOLS = [operator_list, operator_add, operator_grant, plan_close]
