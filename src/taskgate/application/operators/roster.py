"""Operators, their roles and permissions, and the authorisation of an authenticated caller.

Operators are added and granted by admins (`taskgate operator add|list|grant`). The very first operator of
a fresh installation (the one `taskgate init` or the first `project_init` creates) is an admin, so that
someone can administer the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.domain.access import Capability, Principal, authorize, authorize_operator, effective_permissions
from taskgate.domain.entities import Agent, Operator, Permission, Role, Session
from taskgate.domain.errors import AlreadyExists, Forbidden, InvalidInput
from taskgate.domain.states import Trigger

_OPERATOR_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$")


@dataclass(frozen=True, slots=True)
class AddOperator:
    operator_id: str
    roles: list[str]
    name: str | None = None
    email: str | None = None
    max_active_sessions: int = 5
    permissions: list[str] = field(default_factory=list)
    actor: str = "system"


def _roles(values: list[str]) -> list[str]:
    unknown = [r for r in values if r not in Role._value2member_map_]
    if unknown or not values:
        raise InvalidInput(f"unknown or missing role(s) {unknown}; roles: {', '.join(r.value for r in Role)}")
    return sorted(set(values))


def _permissions(values: list[str]) -> list[str]:
    unknown = [p for p in values if p not in Permission._value2member_map_]
    if unknown:
        raise InvalidInput(f"unknown permission(s) {unknown}; permissions: {', '.join(p.value for p in Permission)}")
    return sorted(set(values))


class OperatorService:
    """Adds, lists and grants operators, and authorises callers against their roles."""

    def __init__(self, uow: UnitOfWorkFactory, clock: Clock) -> None:
        self._uow, self._clock = uow, clock

    async def add(self, cmd: AddOperator) -> Operator:
        """Raises: InvalidInput (bad id, role, permission or capacity), AlreadyExists."""
        if not _OPERATOR_ID.match(cmd.operator_id):
            raise InvalidInput(f"operator id {cmd.operator_id[:40]!r}: 1-100 letters, digits and . _ @ - only")
        if not 1 <= cmd.max_active_sessions <= 1000:
            raise InvalidInput(f"max_active_sessions must be 1-1000, got {cmd.max_active_sessions}")
        operator = Operator(
            id=cmd.operator_id,
            name=(cmd.name or cmd.operator_id).strip()[:200],
            email=cmd.email,
            roles=_roles(cmd.roles),
            permissions=_permissions(cmd.permissions),
            max_active_sessions=cmd.max_active_sessions,
            created_at=self._clock.now(),
        )
        async with self._uow(write=True) as uow:
            if await uow.operators.find(operator.id) is not None:
                raise AlreadyExists(f"operator {operator.id} already exists; use `taskgate operator grant`")
            await uow.operators.add(operator)
            await self._record(uow, "operator.added", cmd.actor, operator.id, roles=operator.roles)
            await uow.commit()
        return operator

    async def grant(
        self,
        operator_id: str,
        *,
        roles: list[str] = (),  # type: ignore[assignment]
        permissions: list[str] = (),  # type: ignore[assignment]
        max_active_sessions: int | None = None,
        actor: str = "system",
    ) -> Operator:
        """Add roles and permissions to an operator (and set its capacity). Raises: OperatorNotFound, InvalidInput."""
        new_roles, new_permissions = (_roles(list(roles)) if roles else []), _permissions(list(permissions))
        if max_active_sessions is not None and not 1 <= max_active_sessions <= 1000:
            raise InvalidInput(f"max_active_sessions must be 1-1000, got {max_active_sessions}")
        async with self._uow(write=True) as uow:
            current = await uow.operators.get(operator_id)
            updated = replace(
                current,
                roles=sorted(set(current.roles) | set(new_roles)),
                permissions=sorted(set(current.permissions) | set(new_permissions)),
                max_active_sessions=max_active_sessions or current.max_active_sessions,
            )
            await uow.operators.update(updated)
            details = {"roles": new_roles, "permissions": new_permissions, "max_active_sessions": max_active_sessions}
            await self._record(uow, "operator.granted", actor, operator_id, **details)
            await uow.commit()
        return updated

    async def list(self) -> list[Operator]:
        async with self._uow(write=False) as uow:
            return await uow.operators.list()

    async def permissions(self, principal: Principal) -> frozenset[Permission] | None:
        """What an operator may do (its roles' permissions and its grants); None for an agent or an operator that
        is not registered (its calls are refused with how to register it)."""
        if principal.operator_id is None:
            return None
        async with self._uow(write=False) as uow:
            operator = await uow.operators.find(principal.operator_id)
        return effective_permissions(operator) if operator is not None else None

    async def authorize(
        self,
        principal: Principal,
        capability: Capability,
        *,
        session_id: str | None = None,
        trigger: Trigger | None = None,
    ) -> None:
        """Refuse what the caller may not do: agents by their token's scope, operators by their roles.

        Raises: Forbidden (naming the permission missing, or that the operator is not registered).
        """
        if principal.operator_id is None:
            authorize(principal, capability, session_id=session_id, trigger=trigger)
            return
        async with self._uow(write=False) as uow:
            await authorize_in(uow, principal, capability, session_id=session_id, trigger=trigger)

    async def read_session(
        self, principal: Principal, session_id: str, *, capability: Capability = Capability.READ_SESSION,
        with_agents: bool = True,
    ) -> tuple[Session, list[Agent]]:  # fmt: skip
        """The session and its agents (oldest first; none unless `with_agents`) as `principal` may see them:
        the authorisation and both reads in one read transaction, where they used to take three.

        Raises: Forbidden (as `authorize`, checked before anything of the session is read), SessionNotFound.
        """
        async with self._uow(write=False) as uow:
            await authorize_in(uow, principal, capability, session_id=session_id)
            session = await uow.sessions.get(session_id)
            return session, (await uow.agents.of_session(session_id) if with_agents else [])

    async def _record(self, uow, kind: str, actor: str, operator_id: str, **details: object) -> None:
        await uow.events.append(kind, self._clock.now(), {"actor": actor, "operator": operator_id, **details})


async def authorize_in(
    uow: UnitOfWork,
    principal: Principal,
    capability: Capability,
    *,
    session_id: str | None = None,
    trigger: Trigger | None = None,
) -> Operator | None:
    """`OperatorService.authorize` inside a unit of work the caller opened anyway, so that a call's
    authorisation costs one statement in its own transaction instead of a transaction of its own.

    The operator's row is read afresh every time (nothing is cached), so a role or permission taken away is
    refused from the very next call. Returns the operator (None for an agent, whose token's scope decides, and
    for the bootstrap case: no operator registered at all and the first one registering a project).
    Raises: Forbidden (naming the permission missing, or that the operator is not registered).
    """
    if principal.operator_id is None:
        authorize(principal, capability, session_id=session_id, trigger=trigger)
        return None
    operator = await uow.operators.find(principal.operator_id)
    if operator is None:
        if capability == Capability.MANAGE and not await uow.operators.list():
            return None  # bootstrap: the first operator registers the first project and becomes its admin
        raise Forbidden(
            f"operator {principal.operator_id} is not registered; an admin adds it with "
            f"`taskgate operator add {principal.operator_id} --role developer`"
        )
    authorize_operator(operator, capability, trigger)
    return operator
