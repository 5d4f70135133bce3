"""The operators' ports: operators with their roles, and the API tokens of operators and agents."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from taskgate.domain.entities import (
    ApiToken,
    Operator,
)
from taskgate.domain.questions import Question


class OperatorRepository(Protocol):
    async def add(self, operator: Operator) -> None: ...
    async def get(self, operator_id: str) -> Operator:
        """Raises: OperatorNotFound."""

    async def find(self, operator_id: str) -> Operator | None: ...
    async def list(self) -> list[Operator]: ...
    async def update(self, operator: Operator) -> None: ...
    async def lock(self, operator_id: str) -> None:
        """Hold the operator's row until the unit of work ends. Raises: OperatorNotFound."""


class TokenRepository(Protocol):
    async def add(self, token: ApiToken) -> None: ...
    async def find_by_hash(self, token_hash: str) -> ApiToken | None: ...
    async def get(self, token_id: str) -> ApiToken | None: ...
    async def list(self) -> list[ApiToken]: ...
    async def revoke(self, token_id: str, at: datetime) -> bool:
        """Mark revoked; False when no such token exists."""

    async def revoke_for_agent(self, agent_id: str, at: datetime) -> int:
        """Revoke the agent's live tokens; how many were live."""

    async def revoke_for_session(self, session_id: str, at: datetime) -> int:
        """Revoke every live token scoped to the session (its agents' and any issued for it); how many."""

    async def revoke_dangling(self, at: datetime) -> list[str]:
        """Revoke live agent tokens whose agent is neither queued, running nor lost (or is gone), or whose
        session ended (completed, cancelled); the ids revoked. Start-up runs it for agents that ended while no
        service watched."""


class QuestionRepository(Protocol):
    """Agents' questions to the operator (`operator_questions`, domain/questions.py)."""

    async def add(self, question: Question) -> None: ...
    async def get(self, question_id: str) -> Question | None: ...
    async def open(self, session_ids: Sequence[str] | None = None) -> list[Question]:
        """The open questions (of these sessions, when given), oldest first."""

    async def of_session(self, session_id: str, limit: int = 50) -> list[Question]:
        """The session's questions, newest first."""

    async def settle(self, question: Question) -> bool:
        """Write how `question` ended (status, answer, message, answered_by, answered_at) if it is still open in the
        store: a compare-and-swap on `open`. False when it had ended already (nothing written)."""

    async def due(self, now: datetime) -> list[Question]:
        """Open questions whose deadline has passed."""
