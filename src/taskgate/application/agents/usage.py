"""What agents used, across sessions: the read behind `taskgate usage` (the sums themselves are the domain's,
`domain/agents/usage.py`), and the spend held against the budgets (`domain/budgets.py`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from taskgate.application.ports import UnitOfWorkFactory
from taskgate.domain.agents.usage import Usage
from taskgate.domain.budgets import Amount, Budgets, Line, Spent, Subject, holds_reservation, lines
from taskgate.domain.entities import Agent
from taskgate.domain.states import ACTIVE_STATES, WIP_STATES


class UsageQuery:
    """The agents that ended, with their tasks, to be summed by task, agent type or preset."""

    def __init__(self, uow: UnitOfWorkFactory) -> None:
        self._uow = uow

    async def ended(self, project_id: int | None = None, since: datetime | None = None) -> list[tuple[Agent, str]]:
        """Agents that ended (of one project, ended at or after `since`, when given), each with its task id,
        oldest first."""
        async with self._uow(write=False) as uow:
            return await uow.agents.ended(project_id=project_id, since=since)

    async def budgets(
        self, budgets: Budgets, today: datetime, preset_of: Callable[[str], str], project_id: int | None = None
    ) -> list[Line]:
        """Every cap as it stands: each project's (and its day's), and those of each active session and its task,
        with what was spent and what sessions in progress reserve. Empty when no budget is configured."""
        if not budgets.set:
            return []
        async with self._uow(write=False) as uow:
            projects = [await uow.projects.get(project_id)] if project_id is not None else await uow.projects.list()
            found: dict[tuple[str, str, str], Line] = {}
            for project in projects:
                agents = await uow.agents.of_project(project.id)
                active = await uow.sessions.list(project_id=project.id, states=set(ACTIVE_STATES))
                statuses: dict[str, list[str]] = {}
                for agent, _ in agents:
                    statuses.setdefault(agent.session_id, []).append(agent.status.value)
                spent = [Spent(a.session_id, task, a.agent_type, a.completed_at or a.started_at, spend_of(a))
                         for a, task in agents]  # fmt: skip
                reserving = [(s.id, s.task_id) for s in active
                             if holds_reservation(s.state in WIP_STATES, statuses.get(s.id, ()))]  # fmt: skip
                config = budgets.of(project.name)
                subjects = [Subject(s.id, s.task_id, project.name) for s in active] or [Subject("", "", project.name)]
                for subject in subjects:
                    for line in lines(config, subject, spent, reserving, today.date(), preset_of):
                        if line.key:
                            found.setdefault((line.scope, line.key, line.unit), line)
        return list(found.values())


def spend_of(agent: Agent) -> Amount:
    """What an agent reported it spent, as budgets count it (tokens in and out; dollars when it reported a cost)."""
    used = Usage.of(agent.report)
    return Amount(used.tokens, used.cost_usd or 0.0)
