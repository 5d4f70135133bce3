"""Stopping agents, from whichever taskgate process on their node, and agents that stalled.

A stop (cancel, fail, reject, timeout, abandon, `session stop`) ends each agent's whole process group:

- an agent this process supervises: its supervising task is told (`_stops`); it sends SIGTERM to the group, then
  SIGKILL after `[execution] stop_grace_s`, waits until the group is gone and records the end with the signal;
- an agent of this node that no task of this process supervises (launched by a `session execute` that has ended,
  or is still running in another terminal): this process records its end first (cancelled, in one conditional
  statement), then ends its process group the same way (checked by the leader's start time, so a pid the system
  gave to another process is never signalled) and records the signal. The supervisor in the other process, if any,
  finds the row ended (its write changes nothing; its next heartbeat tells it to stop);
- an agent of another node: its row is recorded cancelled; that node's supervisor sees it at its next heartbeat and
  ends the process there.

Two stoppers never record two ends: an agent's end is written by `update(only_unended=True)`, one statement that
writes only while the row has not ended (queued, running or lost), so the first writer wins and the second writes
nothing; the signal is written by `record_signal`, only while none is recorded. Both may signal the group: a second
SIGTERM or SIGKILL to a group that is ending changes nothing.

Every stop returns only once the agents' process groups are gone (bounded), so what follows (a cancel removes the
worktree) never runs under a live agent.

Stalls (domain/agents/stalls.py): an agent without progress for its type's `stall_s` gets an `agent.stalled` event
and a `session.escalated` event (the operator's escalation channel: webhooks named in `[escalation] webhooks`), then
is stopped at once and ends `failed` ("stalled: no progress for 300 s …"), which concludes its run as any failure
does (the session fails for the operator, or goes to verifying with `on_agent_failure = "verify"`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace

from taskgate.application.agents.ports import GroupEnded
from taskgate.application.agents.processes import ENDED, STOP_WAIT_S, UNENDED, WRONG_NODE
from taskgate.application.sessions.commands import FireTrigger
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.entities import Agent, AgentStatus, Compensation, Session
from taskgate.domain.errors import ConcurrentModification, InvalidTransition, WrongNode
from taskgate.domain.states import SessionState, Trigger


@dataclass(frozen=True, slots=True)
class Stopped:
    """What `stop_session` did: the session as it is now (`failed`: this stop failed it) and its agents."""

    session: Session
    agents: list[Agent]
    failed: bool


STALLED_EVENT = "agent.stalled"
ESCALATED_EVENT = "session.escalated"  # the sweeper's escalation event (application/sweeper.py), same channel


class AgentStops:
    """Stops that reach every agent process of this node, and what a stall does."""

    async def stop_session(self, session_id: str, actor: str, reason: str | None = None) -> Stopped:
        """`session stop`: end the session's agents. An executing session is failed (compensation manual_review,
        `retry` runs its agents again), and its `fail` stops them before it returns; in any other state the agents
        still running (left over by a process that died) are stopped and the session stays where it is.

        Raises: SessionNotFound, InvalidTransition, PolicyViolation (nothing stopped)."""
        session = await self._sessions.get(session_id)
        why = f"agents stopped by {actor}" + (f": {reason}" if reason else "")
        if session.state == SessionState.EXECUTING:
            cmd = FireTrigger(session_id, Trigger.FAIL.value, actor, why, expected_version=session.version,
                              changes={"compensation_plan": Compensation.MANUAL_REVIEW.value})  # fmt: skip
            try:
                session = (await self._sessions.fire(cmd)).session
                await self._settled(session_id)
                return Stopped(session, await self.agents(session_id), failed=True)
            except (ConcurrentModification, InvalidTransition):  # it moved meanwhile (another stop): stop them here
                session = await self._sessions.get(session_id)
        await self.stop(session_id)
        await self._settled(session_id)
        return Stopped(session, await self.agents(session_id), failed=False)

    async def _settled(self, session_id: str) -> None:
        """Until this process's supervisors of the session's stopped agents have recorded their ends (bounded). The
        stop inside a transition waits only for their processes: their rows wait on the session's lock, which the
        transition holds until it returns."""
        tasks = list(self._tasks.get(session_id, ()))
        if tasks:
            await asyncio.wait(tasks, timeout=self._options.stop_grace_s + STOP_WAIT_S)

    async def stop_agents(self, session_id: str, agent_ids: Sequence[str]) -> None:
        """Stop these agents of the session (the others run on)."""
        await self.stop(session_id, only=frozenset(agent_ids))

    async def stop(self, session_id: str, only: frozenset[str] | None = None) -> list[Agent]:
        """Stop every agent of the session (or those in `only`): their process groups end (SIGTERM, then SIGKILL),
        whichever process of this node launched them, and they end as cancelled. Returns once their groups are
        gone (bounded by the grace period and STOP_WAIT_S), with the agents as recorded then."""
        async with self._uow(write=False) as uow:
            agents = await uow.agents.of_session(session_id)
        if only is not None:
            agents = [a for a in agents if a.id in only]
        gone: list[asyncio.Event] = []
        elsewhere = []
        for agent in agents:
            if agent.id in self._stops:  # supervised here: its task ends the group and records how
                self._stops[agent.id].set()
                gone += [self._gone[agent.id]] if agent.id in self._gone else []
            elif agent.status in UNENDED or self._still_running(agent):
                elsewhere.append(agent)
        await asyncio.gather(*(self._stop_elsewhere(agent) for agent in elsewhere))
        # Until their processes are gone, not until their rows are written: that may wait on this very session's
        # lock, which the caller (a cancel's `after`) holds.
        waits = [asyncio.ensure_future(event.wait()) for event in gone]
        if waits:
            _done, pending = await asyncio.wait(waits, timeout=self._options.stop_grace_s + STOP_WAIT_S)
            for waiting in pending:
                waiting.cancel()
        async with self._uow(write=False) as uow:
            return await uow.agents.many([a.id for a in agents])

    def progressed(self, agent_id: str) -> None:
        """A sign of progress from the agent (a tool call with its token): its stall watch counts it."""
        watch = self._progress.get(agent_id)
        if watch is not None:
            watch.progress(asyncio.get_running_loop().time())

    def _still_running(self, agent: Agent) -> bool:
        """An agent of this node recorded as ended whose process group is still there (the sweeper failed it for
        missed heartbeats after the process that supervised it died): a stop ends it too."""
        if not agent.pid or agent.process_start is None or agent.ended_by is not None or not self._mine(agent):
            return False
        return self._runner.process_start(agent.pid) == agent.process_start

    async def _stop_elsewhere(self, agent: Agent) -> None:
        """Stop an agent no task of this process supervises: its end recorded first (so its supervisor, if any,
        records nothing else), then its process group ended on this node, then the signal recorded."""
        if agent.status in UNENDED:
            at = self._clock.now()
            done = replace(agent, status=AgentStatus.CANCELLED, completed_at=at, error="stopped")
            saved = await self._save(done, {"to": AgentStatus.CANCELLED.value, "reason": "cancelled"})
            if saved == WRONG_NODE or (saved == ENDED and not self._still_running(agent)):
                return
        if not agent.pid or not self._mine(agent):
            return  # never started, or another node's process: that node's supervisor ends it at its next beat
        ended = await self._runner.end(agent.pid, agent.process_start, self._options.stop_grace_s)
        await self._record_end(agent, ended)
        await self._bring_back(agent)  # what it committed in its sandbox before the stop is kept on the branch

    async def _record_end(self, agent: Agent, ended: GroupEnded) -> None:
        """The signal that ended the group, on the agent's row (unless a stopper recorded one first) and as an
        `agent.stopped` event; nothing when the group was gone already."""
        if ended.signal is None and not ended.not_ours and not ended.left:
            return
        payload = {"agent": agent.id, "type": agent.agent_type, "pid": agent.pid, "signal": ended.signal,
                   "not_ours": ended.not_ours, "left": list(ended.left), "node": self._options.node_id}  # fmt: skip
        try:
            async with self._uow(write=True) as uow:
                await self._sessions.fence(uow, agent.session_id, f"the stop of agent {agent.id}")
                if ended.signal is not None:
                    await uow.agents.record_signal(agent.id, ended.signal)
                await uow.events.append("agent.stopped", self._clock.now(), payload, agent.session_id)
                await uow.commit()
        except WrongNode:
            return

    async def _stalled(self, agent: Agent, kind: AgentType, why: str) -> None:
        """The agent stalled: an `agent.stalled` event and an escalation to the operator, in one commit, before its
        supervisor stops it (the stop is the policy: a stalled agent holds a slot and a worktree for nothing)."""
        self._stalls[agent.id] = why
        now = self._clock.now()
        reason = f"agent {agent.id[:8]} ({agent.agent_type}) {why}; stopped"
        try:
            async with self._uow(write=True) as uow:
                await self._sessions.fence(uow, agent.session_id, f"the stall of agent {agent.id}")
                stalled = {"agent": agent.id, "type": agent.agent_type, "stall_s": kind.stall_s, "why": why}
                await uow.events.append(STALLED_EVENT, now, stalled, agent.session_id)
                escalated = {"reason": reason, "agent": agent.id, "cause": "agent_stalled", "action": "stopped"}
                await uow.events.append(ESCALATED_EVENT, now, escalated, agent.session_id)
                await uow.commit()
        except WrongNode:
            return
