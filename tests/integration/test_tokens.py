"""Bearer tokens: issued once, stored as a hash, authenticated to their principal, revocable."""

from __future__ import annotations

import pytest

from taskgate.domain.access import Principal
from taskgate.domain.errors import InvalidInput, OperatorNotFound, SessionNotFound, Unauthenticated
from tests.builders import seed, start


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
    from taskgate.application.access import AccessService
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
