"""Nodes (application/nodes.py): heartbeats into the shared database, one row per node however many processes
of it beat at once, and the list with liveness and live agents. On the fakes, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

from taskgate.application.nodes import NodeIdentity, NodeService
from taskgate.domain.entities import Agent, AgentStatus
from tests.builders import seed, start
from tests.fakes import FakeClock


def node(services, clock, node_id: str, pid: int = 1) -> NodeService:
    return NodeService(services.uow, clock, NodeIdentity(node_id, "host", "/data", pid, "0.1.0"), heartbeat_s=10)


async def test_nodes_beat_list_and_go_stale_after_three_missed_heartbeats(services):
    clock = FakeClock()
    a, b = node(services, clock, "host-a-1111"), node(services, clock, "host-b-2222", pid=2)
    await a.beat()
    await b.beat()
    first = {n.id: n for n in await a.nodes()}
    assert sorted(first) == ["host-a-1111", "host-b-2222"] and all(n.alive for n in first.values())
    assert first["host-a-1111"].this and not first["host-b-2222"].this
    clock.advance(seconds=25)
    await a.beat()  # a beats again: its started_at stays, its heartbeat moves
    clock.advance(seconds=10)
    later = {n.id: n for n in await a.nodes()}
    assert later["host-a-1111"].alive and later["host-a-1111"].started_at == first["host-a-1111"].started_at
    assert later["host-a-1111"].heartbeat_at > first["host-a-1111"].heartbeat_at
    assert not later["host-b-2222"].alive  # 35 s without a beat: more than three intervals of 10 s


async def test_processes_of_one_node_beating_at_once_leave_one_row(services):
    clock = FakeClock()
    beats = [node(services, clock, "host-a-1111", pid=p) for p in range(8)]
    await asyncio.gather(*(n.beat() for n in beats))
    listed = await beats[0].nodes()
    assert [n.id for n in listed] == ["host-a-1111"] and listed[0].pid in range(8)


async def test_live_agents_are_counted_per_node(services, git_repo):
    clock = FakeClock()
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    async with services.uow(write=True) as uow:
        a, b = "host-a-1111", "host-b-2222"
        rows = [
            (a, AgentStatus.RUNNING),
            (a, AgentStatus.QUEUED),
            (a, AgentStatus.COMPLETED),
            (b, AgentStatus.RUNNING),
            (None, AgentStatus.RUNNING),
        ]
        for n, (node_id, status) in enumerate(rows):
            await uow.agents.add(Agent(f"agent-{n}", session.id, "coder", ["x"], status, node_id=node_id))
        await uow.commit()
    a = node(services, clock, "host-a-1111")
    await a.beat()
    await node(services, clock, "host-b-2222").beat()
    assert {n.id: n.live_agents for n in await a.nodes()} == {"host-a-1111": 2, "host-b-2222": 1}
