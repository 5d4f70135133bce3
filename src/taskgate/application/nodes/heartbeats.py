"""Nodes: the service processes that share one database, each known by a node id that is stable per machine and
data dir (docs/nodes.md).

A node records itself with the agents it launches (`agents.node_id`) and the sessions it creates
(`sessions.node_id`: it holds their worktrees), and heartbeats into `nodes` while `serve` runs. Its heartbeat is
its lease on that work: once the last beat is older than `lease_s`, the node is down.

- **Leases** (`hold`) name work that one process at a time does for all nodes: the sweeper's turn. Taking one is
  a single compare-and-swap statement (the repository's `acquire`), so two nodes never both hold it; the holder
  renews it, and when the holder stops renewing, another takes it over once it has expired.
- **Reaping** (`reap`, run by the sweeper's holder): a node whose lease lapsed is marked down (a compare-and-swap
  on `nodes.down_at`, so of several survivors exactly one does the rest), its queued and running agents become
  `lost`, and its live sessions wait for it, each with an event, in the same transaction. Nothing of the node is
  taken over silently: its worktrees are on its disk (docs/nodes.md says why a session moves only when an
  operator adopts it).
- **Coming back**: a restarted node's start-up recovery settles its `lost` agents (re-attached, ended or failed);
  then its first beat clears the mark and records `node.back` and a `session.node_back` for each session that
  waited. A node that was only slow to beat still supervises its agents: that beat makes them running again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from taskgate.application.nodes.ports import Lease, NodeRecord
from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.domain.entities import Agent, AgentStatus
from taskgate.domain.errors import TaskgateError

_log = logging.getLogger(__name__)
STALE_AFTER_BEATS = 3  # the default lease: a node whose last heartbeat is older than this many intervals is down
SWEEPER_LEASE = "sweeper"
_LIVE = frozenset({AgentStatus.QUEUED, AgentStatus.RUNNING})


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """Who this process is: its node id and where it runs."""

    id: str
    host: str
    data_dir: str
    pid: int
    version: str
    url: str | None = None  # where it serves MCP over HTTP, when it does


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as `taskgate nodes` shows it."""

    record: NodeRecord
    alive: bool
    live_agents: int
    live_sessions: int
    this: bool  # the node of the process asking

    @property
    def id(self) -> str:
        return self.record.id

    def as_dict(self) -> dict[str, object]:
        """The node's row and what is derived from it, flat (JSON and MCP)."""
        r = self.record
        return {"id": r.id, "host": r.host, "data_dir": r.data_dir, "pid": r.pid, "version": r.version,
                "url": r.url, "started_at": r.started_at, "heartbeat_at": r.heartbeat_at, "down_at": r.down_at,
                "alive": self.alive, "live_agents": self.live_agents, "live_sessions": self.live_sessions,
                "this": self.this}  # fmt: skip


class NodeService:
    """This process's node: its heartbeat, the leases it holds, the reaping of lapsed nodes, the list of nodes."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        clock: Clock,
        identity: NodeIdentity,
        heartbeat_s: float,
        lease_s: float | None = None,
    ) -> None:
        self._uow, self._clock, self.identity, self.heartbeat_s = uow, clock, identity, heartbeat_s
        self.lease_s = lease_s if lease_s is not None else heartbeat_s * STALE_AFTER_BEATS
        self._started: datetime | None = None
        # A lease is held by a process, not a node: `serve` and a one-shot `taskgate sweep` of the same node are
        # two sweepers, and only one of them may hold the sweeper's turn.
        self.holder = f"{identity.id}/{identity.pid}"

    async def beat(self) -> None:
        """Record a heartbeat of this node (its row is created on the first one). The first beat after a
        survivor marked the node down records that it is back, for the node and each session that waited."""
        now = self._clock.now()
        self._started = self._started or now
        me = self.identity
        record = NodeRecord(me.id, me.host, me.data_dir, me.pid, me.version, self._started, now, me.url)
        async with self._uow(write=True) as uow:
            before = await uow.nodes.get(me.id)
            await uow.nodes.beat(record)
            if before is not None and before.down_at is not None:
                await self._record_back(uow, before.down_at, now)
            await uow.commit()

    async def _record_back(self, uow: UnitOfWork, down_at: datetime, now: datetime) -> None:
        # Agents still lost here were never settled by a restart's recovery (which runs before the first beat): this
        # process was only slow to beat (a pause, a partition) and still supervises them, so they run again.
        for agent in await uow.agents.of_node(self.identity.id, frozenset({AgentStatus.LOST})):
            await uow.agents.set_status(agent.id, AgentStatus.RUNNING, now)
            payload = {"agent": agent.id, "type": agent.agent_type, "to": AgentStatus.RUNNING.value, "found": True}
            await uow.events.append("agent.status", now, payload, agent.session_id)
        sessions = await uow.sessions.active_of_node(self.identity.id)
        payload = {"node": self.identity.id, "down_at": down_at.isoformat(), "sessions": sessions}
        await uow.events.append("node.back", now, payload)
        for session_id in sessions:
            await uow.events.append("session.node_back", now, {"node": self.identity.id}, session_id)
        _log.warning("node %s: back after being marked down at %s", self.identity.id, down_at.isoformat())

    async def run(self, stop: asyncio.Event) -> None:
        """Heartbeat every `heartbeat_s` until `stop` is set. A beat that fails is logged and tried at the next
        interval: the service goes on serving."""
        while not stop.is_set():
            try:
                await self.beat()
            except TaskgateError as exc:
                _log.warning("node %s: heartbeat failed: %s", self.identity.id, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.heartbeat_s)

    async def hold(self, name: str, ttl_s: float) -> Lease:
        """Take or renew the named lease for `ttl_s` from now. The result says who holds it: this process
        (`lease.holder == self.holder`) or the one that kept it."""
        # `now` is read before the statement waits for its lock: a takeover then compares the old expiry with an
        # earlier time than the real one, and the new expiry is shorter than `ttl_s`; both err on the safe side.
        now = self._clock.now()
        async with self._uow(write=True) as uow:
            lease = await uow.leases.acquire(name, self.holder, self.identity.id, now, now + timedelta(seconds=ttl_s))
            await uow.commit()
        return lease

    async def release(self, name: str) -> None:
        """Give up the named lease if this process holds it (a clean stop: the next holder need not wait)."""
        async with self._uow(write=True) as uow:
            await uow.leases.release(name, self.holder)
            await uow.commit()

    async def reap(self) -> list[str]:
        """Mark down every other node whose lease lapsed and that is not marked yet: its live agents become
        `lost`, its live sessions wait for it, each with an event, one transaction per node. Returns one line
        per node marked."""
        now = self._clock.now()
        beat_before = now - timedelta(seconds=self.lease_s)
        async with self._uow(write=False) as uow:
            lapsed = [n for n in await uow.nodes.list() if self._lapsed(n, beat_before)]
        lines = []
        for node in lapsed:
            async with self._uow(write=True) as uow:
                if not await uow.nodes.mark_down(node.id, beat_before, now):
                    continue  # it beat meanwhile, or another survivor marked it first
                agents, sessions = await self._mark_work(uow, node, now)
                await uow.commit()
            lines.append(
                f"node {node.id} down (last heartbeat {node.heartbeat_at.isoformat()}): "
                f"{len(agents)} agent(s) lost, {len(sessions)} session(s) wait for it"
            )
        return lines

    def _lapsed(self, node: NodeRecord, beat_before: datetime) -> bool:
        return node.id != self.identity.id and node.down_at is None and node.heartbeat_at < beat_before

    async def _mark_work(self, uow: UnitOfWork, node: NodeRecord, now: datetime) -> tuple[list[Agent], list[str]]:
        """In the transaction that marked `node` down: its agents lost, its sessions waiting, and the events."""
        why = f"node {node.id} stopped beating (last heartbeat {node.heartbeat_at.isoformat()})"
        agents = await uow.agents.of_node(node.id, _LIVE)
        for agent in agents:
            # Only the status and why: the process may still run on its machine (a partition, not a crash), so its
            # token stays valid and the node settles it when it comes back (AgentService.recover).
            await uow.agents.set_status(agent.id, AgentStatus.LOST, now)
            payload = {"agent": agent.id, "type": agent.agent_type, "to": AgentStatus.LOST.value, "reason": why}
            await uow.events.append("agent.status", now, payload, agent.session_id)
        sessions = await uow.sessions.active_of_node(node.id)
        for session_id in sessions:
            await uow.events.append("session.waiting_for_node", now, {"node": node.id, "reason": why}, session_id)
        payload = {"node": node.id, "host": node.host, "heartbeat_at": node.heartbeat_at.isoformat(),
                   "agents_lost": [a.id for a in agents], "sessions_waiting": sessions,
                   "marked_by": self.identity.id}  # fmt: skip
        await uow.events.append("node.down", now, payload)
        return agents, sessions

    async def node(self, node_id: str) -> NodeRecord | None:
        """One node's row, or None when it never beat."""
        async with self._uow(write=False) as uow:
            return await uow.nodes.get(node_id)

    def is_alive(self, node: NodeRecord) -> bool:
        """Whether the node's lease holds: not marked down, last heartbeat within `lease_s`."""
        return node.down_at is None and node.heartbeat_at >= self._clock.now() - timedelta(seconds=self.lease_s)

    async def nodes(self) -> list[NodeView]:
        """Every node that ever beat, by id, with whether its lease holds and its live agents and sessions.
        Agents and sessions recorded by no node (before nodes existed) count for none."""
        async with self._uow(write=False) as uow:
            records = await uow.nodes.list()
            agents = await uow.nodes.live_agents()
            sessions = await uow.nodes.live_sessions()
        return [
            NodeView(r, self.is_alive(r), agents.get(r.id, 0), sessions.get(r.id, 0), r.id == self.identity.id)
            for r in records
        ]
