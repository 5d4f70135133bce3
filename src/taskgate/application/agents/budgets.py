"""Spend caps while an agent runs: at each heartbeat its log so far is read for the usage its CLI reported
(`domain/agents/reports.py` reads a log cut off before its result: Claude Code's per-message usage, Codex's
`turn.completed`, aider's `Tokens: … Cost: …` lines), added to what the project's other agents reported, and held
against the budgets that apply to its session (`domain/budgets.py`).

- past `warn_at` of a cap: a `budget.nearly_spent` event, once per scope and key in this process;
- a cap reached: a `budget.reached` event, and the session's agents are stopped as any stop is (their process
  groups end, `stopping.py`); their commits stay on the session's branch and the worktree stays. Once an agent so
  stopped has ended, the session is *suspended* with the budget as the reason (not cancelled: a cancel removes the
  branch), waiting for the operator to raise the budget and `resume` it (the `budget` guard checks `resume` too).

Dollars count only once a CLI reports a cost: Claude Code reports its cost in its final `result`, so a run's dollars
are known at its end, while its tokens are known message by message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import replace

from taskgate.application.agents.processes import REPORT_BYTES
from taskgate.application.agents.runs import LAUNCH
from taskgate.application.agents.usage import spend_of
from taskgate.application.sessions.commands import FireTrigger
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.agents.reports import parse_report
from taskgate.domain.agents.usage import Usage
from taskgate.domain.budgets import NO_BUDGETS, Amount, Budgets, Crossing, Spent, Subject, crossings, lines
from taskgate.domain.entities import Agent, Session
from taskgate.domain.errors import TaskgateError, WrongNode
from taskgate.domain.states import SessionState, Trigger

BUDGET_ACTOR = "system:budget"
BUDGET_STOP = "budget_stop"  # state_data key: the budget a suspended session's agents were stopped for


class AgentBudgets:
    """The spend caps' side of supervising an agent."""

    _budgets: Budgets = NO_BUDGETS
    _presets: Mapping[str, str] = {}

    def use_budgets(self, budgets: Budgets, presets: Mapping[str, str]) -> None:
        """Hold agents from now on to `budgets` (`presets`: agent type → preset, for the per-preset caps)."""
        self._budgets, self._presets = budgets, dict(presets)
        self._budget_stops: dict[str, str] = {}  # agent id → the budget it was stopped for
        self._warned: set[tuple[str, str, str]] = set()  # (scope, key, unit) warned of in this process

    async def _watch_spend(self, agent: Agent, kind: AgentType, stop: asyncio.Event) -> None:
        """Check the agent's spend so far against its session's caps; stop the session's agents at one."""
        if not self._budgets.set or stop.is_set() or not agent.output_path:
            return
        log = self._runner.read_log(agent.output_path, REPORT_BYTES)
        report = parse_report(kind.output_format, log)
        used = Usage.of(report.as_dict() if report is not None else None)
        so_far = Amount(used.tokens, used.cost_usd or 0.0)
        found = await self._crossings(agent, so_far)
        reached = [c for c in found if c.kind == "reached"]
        warned = [c for c in found if c.kind == "nearly" and self._first_warning(c)]
        if reached or warned:
            await self._announce(agent, [*warned, *reached[:1]])
        if reached:
            await self._stop_for_budget(agent.session_id, reached[0].reason())

    async def _crossings(self, agent: Agent, so_far: Amount) -> list[Crossing]:
        now = self._clock.now()
        async with self._uow(write=False) as uow:
            session = await uow.sessions.get(agent.session_id)
            project = await uow.projects.get(session.project_id)
            agents = await uow.agents.of_project(session.project_id)
        spent = [Spent(a.session_id, task, a.agent_type, a.completed_at or a.started_at, spend_of(a))
                 for a, task in agents if a.id != agent.id]  # fmt: skip
        spent.append(Spent(agent.session_id, session.task_id, agent.agent_type, now, so_far))
        config = self._budgets.of(project.name)
        subject = Subject(session.id, session.task_id, project.name)
        preset_of = lambda name: self._presets.get(name, name)  # noqa: E731
        mine = preset_of(agent.agent_type)  # a preset's caps stop only that preset's agents
        caps = [line for line in lines(config, subject, spent, [], now.date(), preset_of)
                if " " not in line.scope or line.scope.split(" ")[0] == mine]  # fmt: skip
        return crossings(config, caps)

    def _first_warning(self, crossing: Crossing) -> bool:
        key = (crossing.line.scope, crossing.line.key, crossing.line.unit)
        if key in self._warned:
            return False
        self._warned.add(key)
        return True

    async def _announce(self, agent: Agent, found: list[Crossing]) -> None:
        with suppress(WrongNode):
            async with self._uow(write=True) as uow:
                await self._sessions.fence(uow, agent.session_id, f"the budget of agent {agent.id}")
                for crossing in found:
                    payload = crossing.payload(agent.session_id) | {"agent": agent.id}
                    await uow.events.append(crossing.event, self._clock.now(), payload, agent.session_id)
                await uow.commit()

    async def _stop_for_budget(self, session_id: str, reason: str) -> None:
        """Stop the session's agents supervised here; each, once ended, suspends the session (the first one does)."""
        async with self._uow(write=False) as uow:
            agents = await uow.agents.of_session(session_id)
        for agent in agents:
            if agent.id in self._stops and not self._stops[agent.id].is_set():
                self._budget_stops.setdefault(agent.id, reason)
                self._stops[agent.id].set()

    def _stopped_for_budget(self, agent: Agent) -> str | None:
        return self._budget_stops.pop(agent.id, None) if self._budgets.set else None

    async def _suspend_for_budget(self, session_id: str, reason: str) -> None:
        """The session waits for the operator: suspended with the budget as the reason (its work stays), and the
        stop remembered (`BUDGET_STOP`) so that its `resume` launches the stopped run's agents again."""
        cmd = FireTrigger(session_id, Trigger.SUSPEND.value, BUDGET_ACTOR, reason,
                          changes={"state_data": {BUDGET_STOP: reason}})  # fmt: skip
        with suppress(TaskgateError):  # moved meanwhile (another of its agents suspended it, a cancel)
            await self._sessions.fire(cmd)

    async def _resume_after_budget(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        """A `resume` of a session a budget stopped while executing records the relaunch of the stopped run's agents
        (in the resume's own transaction, as a retry records its relaunch); `after` launches it."""
        stopped = session.state_data.get(BUDGET_STOP)
        if not stopped or session.workflow_stack or session.prior_state != SessionState.EXECUTING:
            return cmd
        kinds = await self._previous_kinds(session.id)
        if not kinds:
            return cmd
        changes = dict(cmd.changes or {})
        data = dict(changes.get("state_data") or {})
        instructions = f"You were stopped when a budget was reached ({stopped}); your commits are on the branch. " \
                       "Go on with the task from where it stands."  # fmt: skip
        data[LAUNCH] = {"run": await self._next_run(session.id), "agents": [k.name for k in kinds],
                        "instructions": instructions}  # fmt: skip
        data[BUDGET_STOP] = None
        return replace(cmd, changes={**changes, "state_data": data})
