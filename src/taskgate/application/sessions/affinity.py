"""Session affinity (docs/nodes.md): a session is changed only by the node holding its worktree.

The node that creates a session records itself on it (`sessions.node_id`); from then on every transition of it
(and so every effect: worktree, agents, merge), its review context, checkpoints and agent launches run on that
node. Another node refuses with WrongNode, naming the holder, its MCP address and whether it is alive, and writes
nothing. Reads (status, history, events, audits) are answered by any node.

Why refuse rather than forward through a database command queue: a forwarded request needs the holder alive,
and then the caller can reach it directly (the refusal gives its address); a queue adds a second execution path
whose outcome is ambiguous when the caller gives up waiting (an operator's approve that may still apply later).
A refusal is unambiguous: nothing happened here.
"""

from __future__ import annotations

import logging

from taskgate.application.nodes.ports import NodeRecord
from taskgate.application.ports import UnitOfWork
from taskgate.domain.entities import Session
from taskgate.domain.errors import WrongNode

_log = logging.getLogger("taskgate.nodes")


def held_here(session: Session, node_id: str | None) -> bool:
    """Whether this process may change `session`: it is held by this node, or by none (created before nodes were
    recorded, or by a process with no node: one machine, as before)."""
    return session.node_id is None or node_id is None or session.node_id == node_id


async def refuse_unless_held(uow: UnitOfWork, session: Session, node_id: str | None) -> None:
    """Raise WrongNode (naming the holder and how to reach or replace it) unless `session` is held here."""
    if held_here(session, node_id):
        return
    assert session.node_id is not None and node_id is not None
    holder = await uow.nodes.get(session.node_id)
    raise WrongNode(session.id, session.node_id, node_id, _advice(session.id, holder))


def _advice(session_id: str, holder: NodeRecord | None) -> str:
    if holder is None:
        return "That node never beat: start `taskgate serve` there."
    seen = holder.heartbeat_at.isoformat(timespec="seconds")
    if holder.down_at is not None:
        since = holder.down_at.isoformat(timespec="seconds")
        return (
            f"Node {holder.id} (host {holder.host}) is down since {since}. Restart it to carry the session on, or, "
            f"from a node that can reach its worktree, move the session there: `taskgate session adopt {session_id}`."
        )
    where = f"its MCP server at {holder.url}" if holder.url else f"`taskgate` on host {holder.host}"
    return f"Node {holder.id} last beat at {seen}: use {where}."


async def fence(uow: UnitOfWork, session_id: str, node_id: str | None, what: str) -> Session:
    """The session, its row locked for the caller's transaction, when this node still holds it: the fence of
    every write a node makes about a session or its agents (agent rows, heartbeats, events, tokens, outputs).

    Why in the same transaction as the write: a node paused past its lease (SIGSTOP, a partition) may wake up
    with writes half-way, after another node adopted the session (application/nodes/adoption.py). Adoption changes
    `sessions.node_id` under the same row lock (PostgreSQL: FOR UPDATE; SQLite: one writer at a time), so a write
    either commits before the adoption does, or reads the new holder here and is refused: never after it.

    Raises: WrongNode (naming the holder), after logging on this node that `what` was not written.
    """
    session = await uow.sessions.get(session_id, lock=True)
    if not held_here(session, node_id):
        _log.warning(
            "fenced: node %s no longer holds session %s (node %s does): %s was not written",
            node_id, session_id, session.node_id, what,
        )  # fmt: skip
        await refuse_unless_held(uow, session, node_id)
    return session
