"""The nodes' ports: their heartbeats (one row per node) and the leases of work one node does for all."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A service process's node as it last heartbeat: `id` (stable per machine and data dir), where it runs, where
    it serves MCP over HTTP (if it does) and when a surviving node found its heartbeat lapsed (None: not found)."""

    id: str
    host: str
    data_dir: str
    pid: int
    version: str
    started_at: datetime
    heartbeat_at: datetime
    url: str | None = None
    down_at: datetime | None = None


class NodeRepository(Protocol):
    async def beat(self, node: NodeRecord) -> None:
        """Record the node's heartbeat (its row is created on the first one, replaced on the next; a beat clears
        `down_at`)."""

    async def get(self, node_id: str) -> NodeRecord | None:
        """The node's row, or None when it never beat."""

    async def list(self) -> list[NodeRecord]:
        """Every node that ever beat, by id."""

    async def live_agents(self) -> dict[str | None, int]:
        """Queued and running agents per node id (None: agents recorded by no node)."""

    async def live_sessions(self) -> dict[str | None, int]:
        """Sessions not in a terminal state per node id (None: sessions recorded by no node)."""

    async def mark_down(self, node_id: str, beat_before: datetime, at: datetime) -> bool:
        """Compare-and-swap: set `down_at = at` when the node is not marked down yet and its last heartbeat is older
        than `beat_before`. True for the one caller that marked it."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds a named lease and until when."""

    name: str
    holder: str
    node_id: str
    acquired_at: datetime
    expires_at: datetime


class LeaseRepository(Protocol):
    async def acquire(self, name: str, holder: str, node_id: str, now: datetime, until: datetime) -> Lease:
        """Take or renew the lease in one statement: it becomes `holder`'s until `until` when it is free, already
        `holder`'s, or expired at `now`. Returns the lease as it stands after (someone else's when refused)."""

    async def release(self, name: str, holder: str) -> None:
        """Give the lease up, if `holder` holds it."""
