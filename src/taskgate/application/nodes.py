"""Nodes: the service processes that share one database, each known by a node id that is stable per machine and
data dir (docs/nodes.md).

A node records itself with the agents it launches (`agents.node_id`) and heartbeats into `nodes` while `serve`
runs. Recovery at start touches only the node's own agents (and those recorded by no node, from before nodes
existed): another machine's agents are not this machine's processes, whatever their pid says here. `nodes()`
lists every node with its last heartbeat, whether that is recent (within three heartbeat intervals), and its
live agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from taskgate.application.ports import Clock, NodeRecord, UnitOfWorkFactory
from taskgate.domain.errors import TaskgateError

_log = logging.getLogger(__name__)
STALE_AFTER_BEATS = 3  # a node whose last heartbeat is older than this many intervals is shown as not alive


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """Who this process is: its node id and where it runs."""

    id: str
    host: str
    data_dir: str
    pid: int
    version: str


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as `taskgate nodes` shows it."""

    id: str
    host: str
    data_dir: str
    pid: int
    version: str
    started_at: datetime
    heartbeat_at: datetime
    alive: bool
    live_agents: int
    this: bool  # the node of the process asking


class NodeService:
    """This process's node: its heartbeat, and the list of every node."""

    def __init__(self, uow: UnitOfWorkFactory, clock: Clock, identity: NodeIdentity, heartbeat_s: float) -> None:
        self._uow, self._clock, self.identity, self.heartbeat_s = uow, clock, identity, heartbeat_s
        self._started: datetime | None = None

    async def beat(self) -> None:
        """Record a heartbeat of this node (its row is created on the first one)."""
        now = self._clock.now()
        self._started = self._started or now
        me = self.identity
        record = NodeRecord(me.id, me.host, me.data_dir, me.pid, me.version, self._started, now)
        async with self._uow(write=True) as uow:
            await uow.nodes.beat(record)
            await uow.commit()

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

    async def nodes(self) -> list[NodeView]:
        """Every node that ever beat, by id, with whether its heartbeat is recent and its live agents. Agents
        recorded by no node (before nodes existed) count for none."""
        async with self._uow(write=False) as uow:
            records = await uow.nodes.list()
            agents = await uow.nodes.live_agents()
        horizon = self._clock.now() - timedelta(seconds=self.heartbeat_s * STALE_AFTER_BEATS)
        return [
            NodeView(r.id, r.host, r.data_dir, r.pid, r.version, r.started_at, r.heartbeat_at,
                     r.heartbeat_at >= horizon, agents.get(r.id, 0), r.id == self.identity.id)
            for r in records
        ]  # fmt: skip
