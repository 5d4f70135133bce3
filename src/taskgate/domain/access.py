"""Who is calling, and what they may do: principals and the authorisation rules (pure).

Operators hold roles; each role grants permissions (`ROLE_PERMISSIONS`), and an admin may grant extra
permissions to one operator. Every capability a tool needs maps to one permission (`required_permission`):
reading needs `read`; changing projects, plans, tasks and moving sessions needs `write`; deciding
(approve, request_changes, reject) and merging needs `approve`; overriding a policy needs `override`;
managing operators and tokens needs `admin`. See docs/operators.md for the matrix.

Agents act only on their own session: they may read it, save files into its folder (`save_output`) and fire
the triggers of their own work (`AGENT_TRIGGERS`), and never decide, merge, start work or change projects,
plans, tasks or policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from taskgate.domain.entities import Operator, Permission, Role
from taskgate.domain.errors import Forbidden
from taskgate.domain.states import FORGE_ROUNDS, Trigger


class PrincipalKind(StrEnum):
    OPERATOR = "operator"
    AGENT = "agent"


class Capability(StrEnum):
    """What a tool needs; every MCP tool declares one."""

    READ = "read projects, plans, tasks and sessions"
    READ_SESSION = "read a session"
    MANAGE = "change projects, plans and tasks"
    START = "start sessions"
    FIRE = "fire triggers"
    STEER = "change a session's workflow stack"
    AUDIT = "query the audit log"
    SIGN_AUDIT = "sign audit checkpoints"
    DECIDE = "decide on a verification (approve, request changes, reject) and merge"
    OVERRIDE = "override policies"
    ADMINISTER = "manage operators and tokens"
    SAVE_OUTPUT = "save files into a session folder"
    ASK = "ask the operator a question"


ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.ADMIN: frozenset(Permission),
    Role.ARCHITECT: frozenset({Permission.READ, Permission.WRITE, Permission.APPROVE}),
    Role.DEVELOPER: frozenset({Permission.READ, Permission.WRITE}),
    Role.REVIEWER: frozenset({Permission.READ, Permission.APPROVE}),
    Role.QA: frozenset({Permission.READ, Permission.APPROVE}),
}

DECISION_TRIGGERS: frozenset[Trigger] = frozenset({Trigger.APPROVE, Trigger.REQUEST_CHANGES, Trigger.REJECT})
"""Triggers that are an operator's decision on a verification (project_decide fires them)."""

_APPROVER_TRIGGERS = (
    DECISION_TRIGGERS | FORGE_ROUNDS | {Trigger.MERGE, Trigger.REVERIFY, Trigger.UPDATE_PR, Trigger.FORGE_MERGED}
)
# reverify reopens a decision; the forge's triggers act on an approval (fired by hand they need approve too)
_PERMISSION_OF: dict[Capability, Permission] = {
    Capability.READ: Permission.READ,
    Capability.READ_SESSION: Permission.READ,
    Capability.AUDIT: Permission.READ,
    Capability.SIGN_AUDIT: Permission.WRITE,
    Capability.MANAGE: Permission.WRITE,
    Capability.START: Permission.WRITE,
    Capability.FIRE: Permission.WRITE,
    Capability.STEER: Permission.WRITE,
    Capability.DECIDE: Permission.APPROVE,
    Capability.OVERRIDE: Permission.OVERRIDE,
    Capability.ADMINISTER: Permission.ADMIN,
    Capability.SAVE_OUTPUT: Permission.WRITE,
    Capability.ASK: Permission.WRITE,
}


def required_permission(capability: Capability, trigger: Trigger | None = None) -> Permission:
    """The permission an operator needs for `capability` (firing a decision or `merge` needs `approve`)."""
    if capability == Capability.FIRE and trigger in _APPROVER_TRIGGERS:
        return Permission.APPROVE
    return _PERMISSION_OF[capability]


def effective_permissions(operator: Operator) -> frozenset[Permission]:
    """The permissions of the operator's roles plus those granted to it alone."""
    return permissions_of(operator.roles, operator.permissions)


def permissions_of(roles: Iterable[str], permissions: Iterable[str]) -> frozenset[Permission]:
    """The permissions of `roles` plus `permissions` (as stored: names a later release may not know are skipped)."""
    granted = {Permission(p) for p in permissions if p in Permission._value2member_map_}
    for role in roles:
        if role in Role._value2member_map_:
            granted |= ROLE_PERMISSIONS[Role(role)]
    return frozenset(granted)


def authorize_operator(operator: Operator, capability: Capability, trigger: Trigger | None = None) -> None:
    """Refuse what the operator's roles and grants do not allow. Raises: Forbidden naming the missing permission."""
    needed = required_permission(capability, trigger)
    if needed not in effective_permissions(operator):
        what = f"fire '{trigger.value}'" if capability == Capability.FIRE and trigger else capability.value
        roles = ", ".join(operator.roles) or "no role"
        raise Forbidden(
            f"operator {operator.id} ({roles}) may not {what}: it needs the '{needed.value}' permission; "
            f"an admin can grant it with `taskgate operator grant {operator.id} --permission {needed.value}`"
        )


AGENT_TRIGGERS: frozenset[Trigger] = frozenset({Trigger.PLAN_COMPLETE, Trigger.WORK_COMPLETE, Trigger.FAIL})
"""Triggers an agent may fire on its own session: reporting on its own work, never deciding about it."""

_AGENT_CAPABILITIES = frozenset(
    {Capability.READ_SESSION, Capability.FIRE, Capability.STEER, Capability.SAVE_OUTPUT, Capability.ASK}
)


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller. `subject` is the operator id, or the token id of an agent."""

    kind: PrincipalKind
    subject: str
    session_id: str | None = None

    @classmethod
    def operator(cls, operator_id: str) -> Principal:
        return cls(PrincipalKind.OPERATOR, operator_id)

    @classmethod
    def agent(cls, token_id: str, session_id: str) -> Principal:
        return cls(PrincipalKind.AGENT, token_id, session_id)

    @property
    def actor(self) -> str:
        """How the transition log names this caller."""
        return f"{self.kind.value}:{self.subject}"

    @property
    def operator_id(self) -> str | None:
        return self.subject if self.kind == PrincipalKind.OPERATOR else None


def authorize(
    principal: Principal, capability: Capability, *, session_id: str | None = None, trigger: Trigger | None = None
) -> None:
    """Refuse what `principal` may not do. Raises: Forbidden, naming what was refused and why."""
    if principal.kind == PrincipalKind.OPERATOR:
        return
    if capability not in _AGENT_CAPABILITIES:
        raise Forbidden(f"agent tokens may not {capability.value}; ask an operator")
    if session_id != principal.session_id:
        raise Forbidden(f"this agent token is scoped to session {principal.session_id} only")
    if trigger is not None and trigger not in AGENT_TRIGGERS:
        allowed = ", ".join(sorted(t.value for t in AGENT_TRIGGERS))
        raise Forbidden(
            f"agents may not fire '{trigger.value}' (decisions and merges are for operators); "
            f"agents may fire: {allowed}"
        )


def check_operator_param(principal: Principal, operator_id: str | None) -> str | None:
    """The operator to act as: the principal's own. A different `operator_id` is refused, never trusted.

    Raises: Forbidden.
    """
    if operator_id is not None and operator_id != principal.operator_id:
        raise Forbidden(
            f"operator_id '{operator_id}' does not match the caller ({principal.actor}); "
            "the caller's identity comes from its token"
        )
    return principal.operator_id
