"""Bearer tokens for the MCP HTTP transport: issue, authenticate, list, revoke.

Tokens are 256-bit random strings; only their SHA-256 is stored (a fast hash is enough for secrets with
that much entropy: there is nothing to brute-force), so a database leak reveals no usable token.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.domain.access import Principal, PrincipalKind
from taskgate.domain.entities import ApiToken
from taskgate.domain.errors import InvalidInput, Unauthenticated

TOKEN_PREFIX = "tg_"


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A new token: `secret` is shown to the user once and never stored."""

    secret: str
    token: ApiToken


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class AccessService:
    """Issues tokens and turns a presented token into a `Principal`."""

    def __init__(self, uow: UnitOfWorkFactory, clock: Clock, configured: Sequence[ApiToken] = ()) -> None:
        """`configured` are tokens provisioned in config (hashes only); they cannot be revoked from the CLI."""
        self._uow, self._clock = uow, clock
        self._configured = {token.token_hash: token for token in configured}
        self._agent_seen: Callable[[str], None] | None = None

    def on_agent_request(self, listener: Callable[[str], None]) -> None:
        """Call `listener(agent_id)` whenever an agent's own token authenticates a request (a tool call, a tool
        list): a sign the agent is working, which the supervisor's stall watch counts as progress."""
        self._agent_seen = listener

    def agent_seen(self, agent_id: str) -> None:
        """Tell the stall watch that the agent is working (it waits on a question in one of its tool calls)."""
        if self._agent_seen is not None:
            self._agent_seen(agent_id)

    async def create_operator_token(self, operator_id: str, label: str = "") -> IssuedToken:
        """Raises: OperatorNotFound."""
        async with self._uow(write=True) as uow:
            await uow.operators.get(operator_id)
            return await self._issue(uow, PrincipalKind.OPERATOR, label, operator_id=operator_id)

    async def create_agent_token(
        self, session_id: str, label: str = "", agent_id: str | None = None,
        check: Callable[[UnitOfWork], Awaitable[None]] | None = None,
    ) -> IssuedToken:  # fmt: skip
        """A token that reaches only `session_id`; with `agent_id`, that agent's own, revoked when it ends.
        Every token of a session is revoked when the session ends. `check` runs first in the same transaction (the
        agent supervisor claims the agent's start there, fenced: application/agents/processes.py) and may refuse.
        Raises: SessionNotFound, and what `check` raises (nothing written)."""
        async with self._uow(write=True) as uow:
            if check is not None:
                await check(uow)
            await uow.sessions.get(session_id)
            owner = {"session_id": session_id} | ({"agent_id": agent_id} if agent_id else {})
            return await self._issue(uow, PrincipalKind.AGENT, label, **owner)

    async def revoke_dangling(self) -> list[str]:
        """At start: revoke agent tokens whose agent or session ended while no service ran; the ids revoked."""
        async with self._uow(write=True) as uow:
            revoked = await uow.tokens.revoke_dangling(self._clock.now())
            if revoked:
                await uow.events.append("token.revoked", self._clock.now(), {"tokens": revoked, "why": "ended"})
            await uow.commit()
        return revoked

    async def authenticate(self, secret: str | None) -> Principal:
        """The principal a bearer token stands for. Raises: Unauthenticated (missing, unknown or revoked)."""
        if not secret or not secret.startswith(TOKEN_PREFIX) or len(secret) > 200:
            raise Unauthenticated("a bearer token issued by `taskgate token create` is required")
        digest = hash_token(secret)
        token = self._configured.get(digest)
        if token is None:
            async with self._uow(write=False) as uow:
                token = await uow.tokens.find_by_hash(digest)
        if token is None or token.revoked_at is not None:
            raise Unauthenticated("the bearer token is unknown or revoked")
        if token.kind == PrincipalKind.AGENT:
            assert token.session_id is not None
            if token.agent_id and self._agent_seen is not None:
                self._agent_seen(token.agent_id)
            return Principal.agent(token.id, token.session_id)
        assert token.operator_id is not None
        return Principal.operator(token.operator_id)

    async def agent_type(self, principal: Principal) -> str | None:
        """The agent type of an agent principal's own agent (what a workflow's `visible_to` names), or None: an
        operator, or a token made by hand for a whole session, which belongs to no agent."""
        if principal.kind != PrincipalKind.AGENT:
            return None
        async with self._uow(write=False) as uow:
            token = await uow.tokens.get(principal.subject)
            agents = await uow.agents.many([token.agent_id]) if token is not None and token.agent_id else []
        return agents[0].agent_type if agents else None

    async def list_tokens(self) -> list[ApiToken]:
        """Issued tokens, then the configured ones."""
        async with self._uow(write=False) as uow:
            return await uow.tokens.list() + list(self._configured.values())

    async def revoke(self, token_id: str) -> ApiToken:
        """Raises: InvalidInput for an unknown token id."""
        async with self._uow(write=True) as uow:
            if not await uow.tokens.revoke(token_id, self._clock.now()):
                raise InvalidInput(f"token {token_id} not found")
            revoked = await uow.tokens.get(token_id)  # by id: revoking must not cost a read of every token
            assert revoked is not None
            await uow.events.append("token.revoked", self._clock.now(), {"tokens": [token_id], "why": "revoked"},
                                    revoked.session_id)  # fmt: skip
            await uow.commit()
            return revoked

    @staticmethod
    def new_secret() -> tuple[str, str]:
        """A fresh token and its SHA-256, for provisioning in config; nothing is stored."""
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        return secret, hash_token(secret)

    async def _issue(self, uow, kind: PrincipalKind, label: str, **owner: str) -> IssuedToken:
        if len(label) > 200:
            raise InvalidInput("token label must be at most 200 characters")
        secret, _ = self.new_secret()
        token = ApiToken(
            id=secrets.token_hex(6),
            token_hash=hash_token(secret),
            kind=kind.value,
            created_at=self._clock.now(),
            label=label,
            **owner,
        )
        await uow.tokens.add(token)
        issued = {"token": token.id, "kind": token.kind, "label": label, **owner}  # never the secret, nor its hash
        await uow.events.append("token.issued", token.created_at, issued, owner.get("session_id"))
        await uow.commit()
        return IssuedToken(secret, token)
