"""Quota waits: an agent whose run failed on the model API's rate limit, usage limit or quota (its log ends with a
line its type's `quota_patterns` match, `domain/agents/quota.py`) is not a failure of its session. It ends
`cancelled`, its error saying it was retried; an `agent.quota_wait` event says how long it waits and which attempt
follows; after the back-off (`quota_wait_s`, doubled each time) the same command is launched again as a new agent of
the same run, at most `quota_retries` times. The last attempt's failure is a failure as any other.

Not retried: a run that was stopped (a cancel, a stall, a budget), and the agents of a workflow's step (the workflow
engine decides what its step's agents' ends mean).
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from dataclasses import replace

from taskgate.application.agents.ports import AgentExit
from taskgate.application.agents.processes import REPORT_BYTES
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.agents.quota import QUOTA_EVENT, backoff_s, quota_error
from taskgate.domain.entities import Agent, AgentStatus
from taskgate.domain.errors import TaskgateError
from taskgate.domain.states import SessionState


class AgentQuotas:
    """The quota waits' side of supervising an agent."""

    async def _quota_line(self, agent: Agent, kind: AgentType, outcome: AgentExit, stop: asyncio.Event) -> str | None:
        """The quota error that ended the agent's failed run, when it may be launched again; else None."""
        attempts = getattr(self, "_quota_attempts", {})
        if stop.is_set() or outcome.reason != "exited" or outcome.exit_code == 0 or not agent.output_path:
            return None
        if not kind.quota_patterns or attempts.get(agent.id, 0) >= kind.quota_retries:
            return None
        line = quota_error(kind.quota_patterns, self._runner.read_log(agent.output_path, REPORT_BYTES))
        if line is None or (await self._sessions.get(agent.session_id)).workflow_stack:
            return None
        return line

    async def _relaunch_after_quota(self, agent: Agent, kind: AgentType, line: str, stop: asyncio.Event) -> None:
        """Wait out the back-off (a stop meanwhile ends the wait, and nothing is launched), then launch the same
        command again as a new agent of the run."""
        attempts: dict[str, int] = self.__dict__.setdefault("_quota_attempts", {})
        attempt = attempts.pop(agent.id, 0) + 1
        wait_s = backoff_s(kind.quota_wait_s, attempt)
        new_id = self._ids.new_session_id()
        payload = {"agent": agent.id, "type": agent.agent_type, "attempt": attempt, "of": kind.quota_retries,
                   "wait_s": wait_s, "line": line, "next_agent": new_id}  # fmt: skip
        async with self._uow(write=True) as uow:
            await self._sessions.fence(uow, agent.session_id, f"the quota wait of agent {agent.id}")
            await uow.events.append(QUOTA_EVENT, self._clock.now(), payload, agent.session_id)
            await uow.commit()
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=wait_s)
            return  # stopped while it waited
        again = replace(agent, id=new_id, command=[part.replace(agent.id, new_id) for part in agent.command],
                        status=AgentStatus.QUEUED, exit_code=None, started_at=None, completed_at=None,
                        heartbeat_at=None, pid=None, pgid=None, process_start=None, output_tail="", error=None,
                        report=None, ended_by=None, sandbox=None, node_id=self._options.node_id,
                        output_path=(agent.output_path or "").replace(agent.id, new_id) or None)  # fmt: skip
        with suppress(TaskgateError):  # the session moved on meanwhile (cancelled, failed): nothing to launch
            async with self._uow(write=True) as uow:
                current = await self._sessions.fence(uow, agent.session_id, f"the relaunch of agent {agent.id}")
                if current.state != SessionState.EXECUTING:
                    return
                await uow.agents.add(again)
                queued = {"agent": new_id, "type": again.agent_type, "to": "queued", "run": again.run,
                          "after_quota_wait_of": agent.id}  # fmt: skip
                await uow.events.append("agent.status", self._clock.now(), queued, agent.session_id)
                await uow.commit()
            attempts[new_id] = attempt
            self._supervise(again, kind, reattach=False)
