"""Bearer tokens: issued once, stored as a hash, authenticated to their principal, revocable."""

from __future__ import annotations

from dataclasses import replace

import pytest

from taskgate.domain.access import Principal
from taskgate.domain.entities import Agent, AgentStatus
from taskgate.domain.errors import InvalidInput, OperatorNotFound, SessionNotFound, Unauthenticated
from taskgate.domain.states import SessionState
from tests.builders import fire, seed, start


async def test_tokens_authenticate_as_their_principal_and_stop_working_when_revoked(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    operator = await services.access.create_operator_token("alice", "laptop")
    agent = await services.access.create_agent_token(session.id)
    assert await services.access.authenticate(operator.secret) == Principal.operator("alice")
    assert await services.access.authenticate(agent.secret) == Principal.agent(agent.token.id, session.id)
    stored = repr(await services.snapshot())
    assert operator.secret not in stored and agent.secret not in stored and operator.token.token_hash in stored
    revoked = await services.access.revoke(operator.token.id)
    assert revoked.revoked_at is not None and (revoked.id, revoked.label) == (operator.token.id, "laptop")
    for bad in (operator.secret, None, "", "tg_unknown", "Bearer x", "tg_" + "x" * 500):
        with pytest.raises(Unauthenticated):
            await services.access.authenticate(bad)
    assert [t.id for t in await services.access.list_tokens()] == [operator.token.id, agent.token.id]


async def test_tokens_are_refused_for_unknown_owners(services, git_repo):
    await seed(services, git_repo, tasks=1)
    before = await services.snapshot()
    with pytest.raises(OperatorNotFound, match="operator bob not found"):
        await services.access.create_operator_token("bob")
    with pytest.raises(SessionNotFound):
        await services.access.create_agent_token("no-such-session")
    with pytest.raises(InvalidInput):
        await services.access.revoke("nope")
    assert await services.snapshot() == before


async def test_configured_tokens_authenticate_without_a_database_row(services):
    from taskgate.application.operators.access import AccessService
    from taskgate.bootstrap import configured_tokens
    from taskgate.infrastructure.settings import load_settings
    from taskgate.infrastructure.system import SystemClock

    secret, digest = AccessService.new_secret()
    agent_secret, agent_digest = AccessService.new_secret()
    settings = load_settings(
        mcp={
            "tokens": [
                {"operator": "alice", "sha256": digest},
                {"session": "s-1", "sha256": agent_digest, "label": "ci"},
            ]
        }
    )
    access = AccessService(services.uow, SystemClock(), configured_tokens(settings))
    assert await access.authenticate(secret) == Principal.operator("alice")
    assert (await access.authenticate(agent_secret)).session_id == "s-1"
    assert {t.label for t in await access.list_tokens()} == {"from config", "ci"}
    with pytest.raises(Unauthenticated):
        await access.authenticate(secret + "x")


async def test_a_sessions_end_revokes_every_token_scoped_to_it(services, git_repo):
    seeded = await seed(services, git_repo, tasks=2)
    ending, other = await start(services, seeded.tasks[0]), await start(services, seeded.tasks[1])
    issued = [await services.access.create_agent_token(ending.id, "by hand"),
              await services.access.create_agent_token(ending.id, "agent x", agent_id="x")]  # fmt: skip
    survivor = await services.access.create_agent_token(other.id)
    operator = await services.access.create_operator_token("alice")
    await fire(services, ending, "cancel")  # cancelled is an end: the tokens die in the same commit
    for token in issued:
        with pytest.raises(Unauthenticated, match="unknown or revoked"):
            await services.access.authenticate(token.secret)
    assert await services.access.authenticate(survivor.secret) == Principal.agent(survivor.token.id, other.id)
    assert await services.access.authenticate(operator.secret) == Principal.operator("alice")


async def test_start_up_revokes_the_tokens_of_agents_that_ended_while_no_service_ran(services, git_repo):
    """An agent's end revokes its token when a service records it; one recorded some other way (the row moved by
    another process, an older release) is caught at start-up, and so is a token of an ended session."""
    seeded = await seed(services, git_repo, tasks=2)
    live, ended = await start(services, seeded.tasks[0]), await start(services, seeded.tasks[1])
    async with services.uow(write=True) as uow:
        for agent_id, status in (("a-running", AgentStatus.RUNNING), ("a-done", AgentStatus.COMPLETED)):
            await uow.agents.add(Agent(agent_id, live.id, "coder", ["true"], status))
        await uow.commit()
    running = await services.access.create_agent_token(live.id, agent_id="a-running")
    done = await services.access.create_agent_token(live.id, agent_id="a-done")
    gone = await services.access.create_agent_token(live.id, agent_id="a-never-recorded")
    by_hand = await services.access.create_agent_token(live.id, "an operator's agent token")
    of_ended = await services.access.create_agent_token(ended.id)
    async with services.uow(write=True) as uow:  # ended behind the engine's back: no revocation happened
        row = await uow.sessions.get(ended.id, lock=True)
        await uow.sessions.update(replace(row, state=SessionState.CANCELLED), expected_version=row.version)
        await uow.commit()

    revoked = await services.access.revoke_dangling()

    assert sorted(revoked) == sorted([done.token.id, gone.token.id, of_ended.token.id])
    for token in (done, gone, of_ended):
        with pytest.raises(Unauthenticated):
            await services.access.authenticate(token.secret)
    for token in (running, by_hand):
        assert (await services.access.authenticate(token.secret)).session_id == live.id
    assert await services.access.revoke_dangling() == []  # idempotent
