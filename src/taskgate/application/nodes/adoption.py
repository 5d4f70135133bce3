"""Adoption (docs/nodes.md): an operator moves a down node's session to this node.

A session is held by the node that created it (application/sessions/affinity.py). When that node is down (a survivor
found its lease lapsed and marked it), its sessions wait for it. Restarting the node carries them on; when it will
not come back, an operator adopts each session on a node that can reach its worktree (a shared disk, or the same
machine with another data dir).

Why an operator's act and not automatic: a lapsed lease proves that the node stopped beating, not that its agents
stopped writing to the worktree (a network partition, a paused machine, agent processes that outlived their
supervisor). Two writers on one worktree lose work. So adoption requires the node to be marked down, the worktree
to be reachable and the right checkout here (or `without_worktree`, to end a session whose disk is gone), and,
when the node ran on this host, none of its agents' processes alive.

What adoption writes, in one transaction: the session's node, its lost agents failed ("lost with node X"), and a
`session.adopted` event. Then an executing session (its run died with its node) is abandoned, so that `resume`
runs it again here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from taskgate.application.nodes.heartbeats import NodeService
from taskgate.application.nodes.ports import NodeRecord
from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sessions.engine import SessionService
from taskgate.application.workspaces.worktrees import WorkspaceService
from taskgate.domain.entities import Agent, AgentStatus, Session
from taskgate.domain.errors import ConcurrentModification, ConflictError, InvalidInput, VcsError
from taskgate.domain.states import SessionState, Trigger

_UNSETTLED = frozenset({AgentStatus.QUEUED, AgentStatus.RUNNING, AgentStatus.LOST})


@dataclass(frozen=True, slots=True)
class Adopted:
    """What adoption did: the session as it now stands, the node it came from, the agents it failed."""

    session: Session
    from_node: str
    agents_failed: tuple[str, ...]
    worktree: str  # "reachable", or why not (adopted without it)


class SessionAdoption:
    """Moves sessions of down nodes to this node, on an operator's word."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        sessions: SessionService,
        workspaces: WorkspaceService,
        nodes: NodeService,
        clock: Clock,
        process_alive: Callable[[int], bool],
    ) -> None:
        self._uow, self._sessions, self._workspaces, self._nodes, self._clock = uow, sessions, workspaces, nodes, clock
        self._alive = process_alive  # only asked for pids of this host

    async def adopt(self, session_id: str, actor: str, *, without_worktree: bool = False) -> Adopted:
        """Move the session to this node (see the module's doc for the checks). Nothing is written when one fails.

        Raises: SessionNotFound, InvalidInput (held here already, or by no node), ConflictError (its node is not
        down, or one of its agents still runs on this host), VcsError (the worktree is not reachable here).
        """
        session = await self._sessions.get(session_id)
        here, held_by = self._nodes.identity.id, session.node_id
        if held_by is None or held_by == here:
            raise InvalidInput(
                f"session {session_id} is held by {'this node' if held_by else 'no node'}: nothing to adopt"
            )
        if session.state in (SessionState.COMPLETED, SessionState.CANCELLED):
            raise InvalidInput(f"session {session_id} is {session.state.value}: nothing to adopt")
        node = await self._require_down(session_id, held_by)
        worktree = await self._workspaces.worktree_problem(session)
        if worktree is not None and not without_worktree:
            raise VcsError(
                f"the worktree of session {session_id} is not usable from node {here}: {worktree}. Nothing was "
                f"changed; adopt it on a node that reaches it, or pass --without-worktree to take the session "
                f"without its work (to cancel or fail it)"
            )
        failed = await self._take(session, node, here, actor, worktree or "reachable")
        adopted = await self._sessions.get(session_id)
        if adopted.state == SessionState.EXECUTING:  # its run died with its node: resume runs it again here
            reason = f"adopted from node {held_by}, whose agents were lost: `resume` runs it again on node {here}"
            adopted = (await self._sessions.fire(FireTrigger(session_id, Trigger.ABANDON.value, actor, reason))).session
        return Adopted(adopted, held_by, failed, worktree or "reachable")

    async def _require_down(self, session_id: str, held_by: str) -> NodeRecord:
        node = await self._nodes.node(held_by)
        if node is None:  # a CLI-only node: no heartbeat ever said whether it is alive
            raise ConflictError(
                f"node {held_by} holding session {session_id} never recorded a heartbeat (it never ran `taskgate "
                f"serve`), so nothing shows that it is down: change the session there. Nothing was changed"
            )
        if node.down_at is None:
            raise ConflictError(
                f"node {held_by} holding session {session_id} is not down (last heartbeat "
                f"{node.heartbeat_at.isoformat(timespec='seconds')}): change the session there. A node is marked "
                f"down once its heartbeat is older than its lease ([node] lease_s). Nothing was changed"
            )
        return node

    async def _take(self, session: Session, node: NodeRecord, here: str, actor: str, worktree: str) -> tuple[str, ...]:
        held_by, now = str(session.node_id), self._clock.now()
        async with self._uow(write=True) as uow:
            current = await uow.sessions.get(session.id, lock=True)
            if current.node_id != held_by:  # another node adopted it meanwhile
                raise ConcurrentModification(f"session {session.id} moved to node {current.node_id} meanwhile")
            agents = [a for a in await uow.agents.of_session(session.id) if a.status in _UNSETTLED]
            if node.host == self._nodes.identity.host:  # its pids are this host's pids
                self._refuse_live_processes(session.id, held_by, agents)
            await uow.sessions.update(replace(current, node_id=here), expected_version=current.version)
            why = f"lost with node {held_by}; session adopted by node {here}"
            for agent in agents:
                await uow.agents.update(replace(agent, status=AgentStatus.FAILED, completed_at=now, error=why))
                await uow.tokens.revoke_for_agent(agent.id, now)
                payload = {"agent": agent.id, "type": agent.agent_type, "to": AgentStatus.FAILED.value, "reason": why}
                await uow.events.append("agent.status", now, payload, session.id)
            payload = {"from": held_by, "to": here, "actor": actor, "worktree": worktree,
                       "agents_failed": [a.id for a in agents]}  # fmt: skip
            await uow.events.append("session.adopted", now, payload, session.id)
            await uow.commit()
        return tuple(a.id for a in agents)

    def _refuse_live_processes(self, session_id: str, held_by: str, agents: list[Agent]) -> None:
        running = [a for a in agents if a.pid and self._alive(a.pid)]
        if running:
            pids = ", ".join(f"{a.id} (pid {a.pid})" for a in running)
            raise ConflictError(
                f"session {session_id}: agent process(es) of node {held_by} still run on this host: {pids}. They "
                f"may still write to the worktree; stop them or wait for them to end, then adopt. Nothing was changed"
            )
