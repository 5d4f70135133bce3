"""What the workflow engine is configured with and what it needs of the services around it (the agents, the
worktrees, the decisions); the composition root attaches those once, since they need the engine too."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from taskgate.application.ports import StepClaim
from taskgate.application.workspaces.ports import WorkspaceContext
from taskgate.domain.entities import (
    Agent,
)
from taskgate.domain.workflows.run import LoopLimits

SYSTEM_ACTOR = "system"  # who the log names for what the engine fires itself (fail, work_complete)


@dataclass(frozen=True, slots=True)
class WorkflowOptions:
    """`[workflows]` settings: the workflow a new session runs (None: none, agents run as configured) and
    the loop guard."""

    default_workflow: str | None = None
    limits: LoopLimits = field(default_factory=LoopLimits)


class StepLauncher(Protocol):
    """What the engine needs of the agents (AgentService)."""

    async def launch_step(
        self,
        session_id: str,
        specs: Sequence[tuple[str, str]],
        *,
        instructions: str,
        timeout_s: float | None,
        claim: StepClaim | None = None,
    ) -> list[Agent]:
        """Launch the step's agents; `claim(uow, agent_ids)` runs in the transaction that writes their rows,
        before any of them starts."""
        ...

    async def stop_agents(self, session_id: str, agent_ids: Sequence[str]) -> None: ...
    async def wait(self, session_id: str) -> None: ...


class WorktreeChanges(Protocol):
    """What the engine needs of WorkspaceService: a session's changes against its base."""

    async def review(self, session_id: str) -> WorkspaceContext: ...


class VerificationDecider(Protocol):
    """What the engine needs of DecisionService: to take an operator's approval as the verification decision.
    Plain arguments, not the decision's command: the workflows import nothing of the decisions, which drive the
    workflows' approval steps (no import circle)."""

    async def approve_verification(self, session_id: str, operator_id: str, reason: str, version: int) -> None:
        """Approve the session in verifying at `version` as `operator_id` would, guards and all; a refusal (logged
        as blocked) leaves it verifying. Raises: TaskgateError."""
