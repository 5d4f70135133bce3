"""Who is calling, and what they may do: principals and the authorisation rules (pure).

Operators may do everything this release offers (role-based permissions arrive with the policies issue).
Agents act only on their own session: they may read it and fire the triggers of their own work
(`AGENT_TRIGGERS`), and never decide, merge, start work or change projects, plans, tasks or policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from taskgate.domain.errors import Forbidden
from taskgate.domain.states import Trigger


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
    AUDIT = "query the audit log"


AGENT_TRIGGERS: frozenset[Trigger] = frozenset({Trigger.PLAN_COMPLETE, Trigger.WORK_COMPLETE, Trigger.FAIL})
"""Triggers an agent may fire on its own session: reporting on its own work, never deciding about it."""

_AGENT_CAPABILITIES = frozenset({Capability.READ_SESSION, Capability.FIRE})


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
