"""Nodes (application/nodes/heartbeats.py, application/sessions/affinity.py): heartbeats into the shared database, one
row per node however many processes of it beat at once, the list with liveness and live agents and sessions; leases
taken by exactly one of many concurrent callers; a lapsed node marked down exactly once, its agents lost and its
sessions waiting, and its return; sessions changed only on the node that holds them. On the fakes, SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from taskgate.application.nodes.adoption import SessionAdoption
from taskgate.application.nodes.heartbeats import SWEEPER_LEASE, NodeIdentity, NodeService
from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sweeper import Sweeper, SweeperOptions
from taskgate.domain.entities import Agent, AgentStatus
from taskgate.domain.errors import ConflictError, InvalidInput, WrongNode
from tests.builders import fire, seed, start
from tests.fakes import FakeClock
from tests.integration.workflows.test_engine import LINEAR
from tests.workflow_support import planning_with, rig


def node(services, clock, node_id: str, pid: int = 1) -> NodeService:
    identity = NodeIdentity(node_id, "host", "/data", pid, "0.1.0", url=f"http://{node_id}:8765/mcp")
    return NodeService(services.uow, clock, identity, heartbeat_s=10)


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
    assert (
        later["host-a-1111"].alive and later["host-a-1111"].record.started_at == first["host-a-1111"].record.started_at
    )
    assert later["host-a-1111"].record.heartbeat_at > first["host-a-1111"].record.heartbeat_at
    assert not later["host-b-2222"].alive  # 35 s without a beat: more than three intervals of 10 s


async def test_processes_of_one_node_beating_at_once_leave_one_row(services):
    clock = FakeClock()
    beats = [node(services, clock, "host-a-1111", pid=p) for p in range(8)]
    await asyncio.gather(*(n.beat() for n in beats))
    listed = await beats[0].nodes()
    assert [n.id for n in listed] == ["host-a-1111"] and listed[0].record.pid in range(8)


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


async def test_a_lease_is_taken_by_exactly_one_of_many_concurrent_callers(services):
    clock = FakeClock()
    callers = [node(services, clock, f"host-{n}-0000", pid=n) for n in range(10)]
    held = await asyncio.gather(*(c.hold(SWEEPER_LEASE, 30) for c in callers))
    winners = {lease.holder for lease in held}
    assert len(winners) == 1  # every caller was told the same holder
    [winner] = [c for c in callers if c.holder in winners]
    others = [c for c in callers if c is not winner]
    clock.advance(seconds=20)
    renewed = await winner.hold(SWEEPER_LEASE, 30)  # a renewal moves the expiry, keeps when it was taken
    assert renewed.holder == winner.holder and renewed.acquired_at == held[0].acquired_at
    assert (await others[0].hold(SWEEPER_LEASE, 30)).holder == winner.holder  # 20 s in: still the winner's
    clock.advance(seconds=31)  # the winner stopped renewing: it expires, and one other takes it over
    taken = await asyncio.gather(*(c.hold(SWEEPER_LEASE, 30) for c in others))
    assert len({lease.holder for lease in taken}) == 1 and taken[0].holder != winner.holder
    await winner.release(SWEEPER_LEASE)  # not the holder any more: releasing changes nothing
    assert (await winner.hold(SWEEPER_LEASE, 30)).holder == taken[0].holder
    successor = next(c for c in others if c.holder == taken[0].holder)
    await successor.release(SWEEPER_LEASE)  # a clean stop: the next caller takes it at once
    assert (await winner.hold(SWEEPER_LEASE, 30)).holder == winner.holder


async def _agents_of(services, session_id: str, *rows: tuple[str | None, AgentStatus]) -> None:
    async with services.uow(write=True) as uow:
        for n, (node_id, status) in enumerate(rows):
            await uow.agents.add(Agent(f"{session_id[:8]}-{n}", session_id, "coder", ["x"], status, node_id=node_id))
        await uow.commit()


async def test_a_lapsed_node_is_marked_down_once_its_agents_lost_its_sessions_waiting(services, git_repo):
    clock = FakeClock()
    seeded = await seed(services, git_repo, tasks=2)
    services.sessions.on_node("host-b-2222")
    theirs = await start(services, seeded.tasks[0])
    services.sessions.on_node("host-a-1111")
    ours = await start(services, seeded.tasks[1])
    await _agents_of(services, theirs.id, ("host-b-2222", AgentStatus.RUNNING), ("host-b-2222", AgentStatus.COMPLETED))
    await _agents_of(services, ours.id, ("host-a-1111", AgentStatus.RUNNING))
    a, b = node(services, clock, "host-a-1111"), node(services, clock, "host-b-2222")
    await b.beat()
    clock.advance(seconds=29)
    await a.beat()
    assert await a.reap() == []  # 29 s: within b's lease of three 10 s heartbeats
    clock.advance(seconds=2)
    survivors = [a, *(node(services, clock, f"host-{n}-3333", pid=n) for n in range(4))]
    found = await asyncio.gather(*(s.reap() for s in survivors))
    lines = [line for lines in found for line in lines]
    assert len(lines) == 1 and "node host-b-2222 down" in lines[0] and "1 agent(s) lost, 1 session(s)" in lines[0]
    async with services.uow(write=False) as uow:
        agents = {
            x.id: x.status for x in [*await uow.agents.of_session(theirs.id), *await uow.agents.of_session(ours.id)]
        }
        down = await uow.nodes.get("host-b-2222")
        events = await uow.events.list(limit=500)
    assert agents == {f"{theirs.id[:8]}-0": AgentStatus.LOST, f"{theirs.id[:8]}-1": AgentStatus.COMPLETED,
                      f"{ours.id[:8]}-0": AgentStatus.RUNNING}  # fmt: skip
    assert down is not None and down.down_at is not None
    kinds = [(e["kind"], e["session_id"]) for e in events if e["kind"] in ("node.down", "session.waiting_for_node")]
    assert sorted(kinds, key=str) == sorted([("node.down", None), ("session.waiting_for_node", theirs.id)], key=str)
    assert {n.id: (n.alive, n.live_agents, n.live_sessions) for n in await a.nodes()} == {
        "host-a-1111": (True, 1, 1), "host-b-2222": (False, 0, 1)}  # fmt: skip
    assert await a.reap() == []  # marked once

    await b.beat()  # b was only slow: the mark is cleared, its return recorded, and the agent it still runs is back
    async with services.uow(write=False) as uow:
        back = await uow.nodes.get("host-b-2222")
        events = await uow.events.list(limit=500)
        [again, _] = await uow.agents.of_session(theirs.id)
    assert back is not None and back.down_at is None
    assert again.status == AgentStatus.RUNNING and again.completed_at is None
    kinds = [(e["kind"], e["session_id"]) for e in events if e["kind"] in ("node.back", "session.node_back")]
    assert sorted(kinds, key=str) == sorted([("node.back", None), ("session.node_back", theirs.id)], key=str)


async def test_a_session_is_changed_only_on_the_node_that_holds_it(services, git_repo):
    clock = FakeClock()
    seeded = await seed(services, git_repo, tasks=1)
    services.sessions.on_node("host-a-1111")
    session = await start(services, seeded.tasks[0])
    assert session.node_id == "host-a-1111"
    await node(services, clock, "host-a-1111").beat()
    services.sessions.on_node("host-b-2222")  # the same database, seen from another node
    before = await services.snapshot()
    with pytest.raises(WrongNode) as refused:
        await services.sessions.fire(FireTrigger(session.id, "suspend", "operator:alice"))
    assert "held by node host-a-1111" in str(refused.value) and "http://host-a-1111:8765/mcp" in str(refused.value)
    assert await services.snapshot() == before  # not even a blocked row
    with pytest.raises(WrongNode):
        await services.workspaces.review(session.id)
    assert (await services.sessions.get(session.id)).state == session.state  # reads are answered anywhere
    services.sessions.on_node("host-a-1111")
    suspended = await services.sessions.fire(FireTrigger(session.id, "suspend", "operator:alice"))
    assert suspended.session.state.value == "suspended"


async def test_only_the_sweeper_lease_holder_does_the_once_for_all_work(services, git_repo):
    clock = FakeClock()
    a, b = node(services, clock, "host-a-1111"), node(services, clock, "host-b-2222")
    await a.beat()
    await b.beat()
    options = SweeperOptions(interval_s=5)
    first = await Sweeper(services.uow, services.sessions, clock, options, nodes=a).sweep_once()
    second = await Sweeper(services.uow, services.sessions, clock, options, nodes=b).sweep_once()
    assert first.turn == "held"
    assert (
        second.turn.startswith(f"held by {a.holder} until")
        and "no dispatch, tracker or node checks" in second.summary()
    )
    clock.advance(seconds=36)  # a died: its node lease (30 s) and its sweeper lease (30 + 5 s) lapse
    taken = await Sweeper(services.uow, services.sessions, clock, options, nodes=b).sweep_once()
    assert taken.turn == "held" and len(taken.nodes_down) == 1 and "node host-a-1111 down" in taken.nodes_down[0]


def adoption(services, clock, here: NodeService, alive=lambda pid: False) -> SessionAdoption:
    return SessionAdoption(services.uow, services.sessions, services.workspaces, here, clock, alive)


async def test_a_down_nodes_session_is_adopted_only_when_safe_and_then_runs_here(services, git_repo):
    clock = FakeClock()
    seeded = await seed(services, git_repo, tasks=1)
    services.sessions.on_node("host-b-2222")
    session = await fire(services, await start(services, seeded.tasks[0]), "plan_complete")  # executing on b
    await _agents_of(services, session.id, ("host-b-2222", AgentStatus.RUNNING))
    async with services.uow(write=True) as uow:
        [agent] = await uow.agents.of_session(session.id)
        await uow.agents.update(replace(agent, pid=4242))
        await uow.commit()
    a, b = node(services, clock, "host-a-1111"), node(services, clock, "host-b-2222")
    await b.beat()
    await a.beat()
    services.sessions.on_node("host-a-1111")
    before = await services.snapshot()
    with pytest.raises(ConflictError, match=r"node host-b-2222 holding session .* is not down"):
        await adoption(services, clock, a).adopt(session.id, "operator:alice")
    assert await services.snapshot() == before
    clock.advance(seconds=31)
    await a.beat()
    assert len(await a.reap()) == 1  # b is down: its agent lost, its session waiting
    before = await services.snapshot()
    with pytest.raises(ConflictError, match=r"still run on this host: .* \(pid 4242\)"):  # b ran on this host
        await adoption(services, clock, a, alive=lambda pid: pid == 4242).adopt(session.id, "operator:alice")
    assert await services.snapshot() == before

    adopted = await adoption(services, clock, a).adopt(session.id, "operator:alice")

    assert adopted.from_node == "host-b-2222" and adopted.worktree == "reachable"
    assert adopted.session.node_id == "host-a-1111" and adopted.session.state.value == "abandoned"
    assert adopted.agents_failed == (agent.id,)
    async with services.uow(write=False) as uow:
        [failed] = await uow.agents.of_session(session.id)
        events = await uow.events.list(session_id=session.id, limit=100)
    assert failed.status == AgentStatus.FAILED and "lost with node host-b-2222" in (failed.error or "")
    assert [e["payload"]["from"] for e in events if e["kind"] == "session.adopted"] == ["host-b-2222"]
    resumed = await services.sessions.fire(FireTrigger(session.id, "resume", "operator:alice"))  # runs here now
    assert resumed.session.state.value == "ready"
    with pytest.raises(InvalidInput, match="held by this node"):
        await adoption(services, clock, a).adopt(session.id, "operator:alice")


async def test_a_session_of_a_node_that_never_beat_is_not_adopted(services, git_repo):
    clock = FakeClock()
    seeded = await seed(services, git_repo, tasks=1)
    services.sessions.on_node("host-b-2222")  # a CLI-only node: it never ran serve, so it never beat
    session = await start(services, seeded.tasks[0])
    services.sessions.on_node("host-a-1111")
    here = node(services, clock, "host-a-1111")
    await here.beat()
    before = await services.snapshot()
    with pytest.raises(ConflictError, match="never recorded a heartbeat"):
        await adoption(services, clock, here).adopt(session.id, "operator:alice")
    assert await services.snapshot() == before


async def test_a_lost_agent_keeps_its_token_when_another_node_restarts(services, git_repo):
    """A lost agent may still run on its down node's machine: a survivor's start-up revocation leaves its token."""
    clock = FakeClock()
    seeded = await seed(services, git_repo, tasks=1)
    services.sessions.on_node("host-b-2222")
    session = await start(services, seeded.tasks[0])
    await _agents_of(services, session.id, ("host-b-2222", AgentStatus.RUNNING), ("host-b-2222", AgentStatus.RUNNING))
    [lost, ended] = [f"{session.id[:8]}-0", f"{session.id[:8]}-1"]
    tokens = {a: await services.access.create_agent_token(session.id, a, agent_id=a) for a in (lost, ended)}
    b = node(services, clock, "host-b-2222")
    await b.beat()
    clock.advance(seconds=31)
    assert len(await node(services, clock, "host-a-1111").reap()) == 1
    async with services.uow(write=True) as uow:
        await uow.agents.set_status(ended, AgentStatus.FAILED, clock.now())
        await uow.commit()
    revoked = await services.access.revoke_dangling()  # node a restarts
    assert revoked == [tokens[ended].token.id]
    assert (await services.access.authenticate(tokens[lost].secret)).session_id == session.id


async def test_another_nodes_workflow_stack_and_agents_are_not_changed_here(services, git_repo, tmp_path):
    services.sessions.on_node("host-a-1111")
    r = rig(
        services, tmp_path, {"dev/linear.yaml": LINEAR, "dev/again.yaml": LINEAR.replace("id: linear", "id: again")}
    )
    session = await planning_with(services, git_repo, r, "linear")  # on node a, with a workflow on its stack
    await node(services, FakeClock(), "host-a-1111").beat()
    services.sessions.on_node("host-b-2222")
    before = await services.snapshot()
    with pytest.raises(WrongNode):
        await r.engine.add_workflow(session.id, "again", "alice")
    with pytest.raises(WrongNode):
        await r.engine.advance(session.id, "alice")
    with pytest.raises(WrongNode):
        await r.agents.execute(session.id, "alice", ["ok"])
    assert await services.snapshot() == before
