"""The MCP call path of issue 20: authorisation inside the call's own read transaction, never cached.

`session_status` authorises the caller and reads the session and its agents in one read transaction;
`project_decide` authorises the operator in the decision's own first read transaction. Neither caches the
operator: every call reads its row again, so a permission taken away (or an operator not registered) is
refused on the very next call, with nothing written.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from taskgate.application.operators.roster import AddOperator
from taskgate.domain.access import Principal
from taskgate.domain.entities import Agent, AgentStatus
from taskgate.domain.errors import Forbidden, SessionNotFound
from tests.builders import OPERATOR, fire, seed, start
from tests.conftest import Services, make_git_repo, wire
from tests.mcp.conftest import connect

REVIEWER = "rev"


async def verifying_sessions(services: Services, tmp_path, n: int) -> list[str]:
    """`n` sessions of alice's, each moved to verifying (waiting for a decision)."""
    seeded = await seed(services, make_git_repo(tmp_path / "repo"), tasks=n)
    return [(await fire(services, await start(services, task), "plan_complete", "work_complete")).id
            for task in seeded.tasks]  # fmt: skip


async def set_roles(services: Services, operator_id: str, roles: list[str]) -> None:
    """What an admin's change of roles leaves in the database (there is no command that takes a role away)."""
    async with services.uow(write=True) as uow:
        current = await uow.operators.get(operator_id)
        await uow.operators.update(replace(current, roles=roles, permissions=[]))
        await uow.commit()


async def test_session_status_is_one_read_transaction_and_shows_the_session(sql_services, tmp_path):
    [session_id] = await verifying_sessions(sql_services, tmp_path, 1)
    engine = sql_services.database.engine
    engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
    begun: list[object] = []

    def count(conn) -> None:
        begun.append(conn)

    async with connect(sql_services, Principal.operator(OPERATOR)) as tools:
        await tools.ok("session_status", session_id=session_id)  # the client's first call lists the tools too
        event.listen(engine, "begin", count)
        try:
            status = await tools.ok("session_status", session_id=session_id)
        finally:
            event.remove(engine, "begin", count)
    stored = await sql_services.sessions.get(session_id)
    # authorisation and session (and, under `taskgate serve`, its agents): one transaction; it was two here, and
    # three in the server
    assert len(begun) == 1
    assert (status["id"], status["state"], status["version"]) == (session_id, "verifying", stored.version)
    assert status["agents"] == [] and "approve" in status["allowed_triggers"]


async def test_a_permission_taken_away_is_refused_from_the_very_next_call(services, tmp_path):
    services = wire(services.backend, services.database, services.url, wip_limit=10)
    first, second = await verifying_sessions(services, tmp_path, 2)
    await services.operators.add(AddOperator(REVIEWER, ["reviewer"]))
    async with connect(services, Principal.operator(REVIEWER)) as tools:
        assert (await tools.ok("session_status", session_id=first))["state"] == "verifying"
        assert (await tools.ok("project_decide", session_id=first, decision="approve"))["state"] == "awaiting_merge"

        await set_roles(services, REVIEWER, ["developer"])  # reads, but may no longer approve
        before = await services.snapshot()
        refusal = await tools.refused("project_decide", session_id=second, decision="approve")
        assert "Forbidden" in refusal and "needs the 'approve' permission" in refusal
        assert await services.snapshot() == before
        assert (await tools.ok("session_status", session_id=second))["state"] == "verifying"

        await set_roles(services, REVIEWER, [])  # no role at all: not even reading
        refusal = await tools.refused("session_status", session_id=second)
        assert "Forbidden" in refusal and "needs the 'read' permission" in refusal

        await set_roles(services, REVIEWER, ["reviewer"])  # given back: allowed again, at once
        decided = await tools.ok("project_decide", session_id=second, decision="approve")
        assert decided["state"] == "awaiting_merge" and decided["operator"] == REVIEWER


async def test_an_unregistered_operator_is_refused_by_status_and_decide_and_nothing_is_written(services, tmp_path):
    [session_id] = await verifying_sessions(services, tmp_path, 1)
    before = await services.snapshot()
    async with connect(services, Principal.operator("mallory")) as tools:
        for tool, arguments in (("session_status", {}), ("project_decide", {"decision": "approve"})):
            refusal = await tools.refused(tool, session_id=session_id, **arguments)
            assert "not registered" in refusal and "taskgate operator add mallory" in refusal, refusal
        # an invalid decision from a caller who may not decide at all is refused for who it is, as before
        refusal = await tools.refused("project_decide", session_id=session_id, decision="approve",
                                      instructions="only with request_changes")  # fmt: skip
        assert "not registered" in refusal
    assert await services.snapshot() == before


async def test_read_session_returns_the_agents_and_holds_an_agent_to_its_own_session(services, tmp_path):
    mine, other = await verifying_sessions(services, tmp_path, 2)
    agent = Agent("a1", mine, "coder", ["true"], AgentStatus.COMPLETED, exit_code=0)
    async with services.uow(write=True) as uow:
        await uow.agents.add(agent)
        await uow.commit()
    operator = Principal.operator(OPERATOR)
    session, agents = await services.operators.read_session(operator, mine)
    assert session.id == mine and [(a.id, a.status) for a in agents] == [("a1", AgentStatus.COMPLETED)]
    assert (await services.operators.read_session(operator, mine, with_agents=False))[1] == []
    token = Principal.agent("tok", mine)
    assert (await services.operators.read_session(token, mine))[0].id == mine
    with pytest.raises(Forbidden, match="scoped to session"):
        await services.operators.read_session(token, other)
    with pytest.raises(SessionNotFound):
        await services.operators.read_session(operator, "00000000-0000-0000-0000-000000000000")
