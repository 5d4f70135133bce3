"""What agents used, across sessions: the read behind `taskgate usage` (the sums themselves are the domain's,
`domain/agents/usage.py`)."""

from __future__ import annotations

from datetime import datetime

from taskgate.application.ports import UnitOfWorkFactory
from taskgate.domain.entities import Agent


class UsageQuery:
    """The agents that ended, with their tasks, to be summed by task, agent type or preset."""

    def __init__(self, uow: UnitOfWorkFactory) -> None:
        self._uow = uow

    async def ended(self, project_id: int | None = None, since: datetime | None = None) -> list[tuple[Agent, str]]:
        """Agents that ended (of one project, ended at or after `since`, when given), each with its task id,
        oldest first."""
        async with self._uow(write=False) as uow:
            return await uow.agents.ended(project_id=project_id, since=since)
