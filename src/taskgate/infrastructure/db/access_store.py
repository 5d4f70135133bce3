"""Who may act: operators and their API tokens (an agent's or a session's too)."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime

from sqlalchemy import and_, insert, or_, select, update

from taskgate.domain.entities import ApiToken, Operator
from taskgate.domain.errors import OperatorNotFound
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.repository_base import SqlRepository


class SqlAlchemyOperatorRepository(SqlRepository):
    async def add(self, operator: Operator) -> None:
        await self._conn.execute(insert(t.operators), {f.name: getattr(operator, f.name) for f in fields(operator)})

    async def get(self, operator_id: str) -> Operator:
        found = await self.find(operator_id)
        if found is None:
            raise OperatorNotFound(operator_id)
        return found

    async def find(self, operator_id: str) -> Operator | None:
        row = await self._one(sql.OPERATOR_BY_ID, {"id": operator_id})
        return Operator(**dict(row)) if row else None

    async def list(self) -> list[Operator]:
        return [Operator(**dict(r)) for r in await self._all(select(t.operators).order_by(t.operators.c.id))]

    async def update(self, operator: Operator) -> None:
        values = {f.name: getattr(operator, f.name) for f in fields(operator) if f.name not in {"id", "created_at"}}
        await self._conn.execute(update(t.operators).where(t.operators.c.id == operator.id).values(**values))

    async def lock(self, operator_id: str) -> None:
        """Hold the operator's row until the unit of work ends (one decision at a time per operator)."""
        if await self._one(sql.OPERATOR_ID_FOR_UPDATE, {"id": operator_id}) is None:
            raise OperatorNotFound(operator_id)


class SqlAlchemyTokenRepository(SqlRepository):
    async def add(self, token: ApiToken) -> None:
        await self._conn.execute(insert(t.api_tokens), {f.name: getattr(token, f.name) for f in fields(token)})

    async def find_by_hash(self, token_hash: str) -> ApiToken | None:
        row = await self._one(sql.TOKEN_BY_HASH, {"token_hash": token_hash})
        return ApiToken(**row) if row else None

    async def get(self, token_id: str) -> ApiToken | None:
        row = await self._one(sql.TOKEN_BY_ID, {"id": token_id})
        return ApiToken(**row) if row else None

    async def list(self) -> list[ApiToken]:
        rows = await self._all(select(t.api_tokens).order_by(t.api_tokens.c.created_at, t.api_tokens.c.id))
        return [ApiToken(**r) for r in rows]

    async def revoke(self, token_id: str, at: datetime) -> bool:
        stmt = update(t.api_tokens).where(t.api_tokens.c.id == token_id).values(revoked_at=at)
        return (await self._conn.execute(stmt)).rowcount == 1

    async def revoke_for_agent(self, agent_id: str, at: datetime) -> int:
        c = t.api_tokens.c
        stmt = update(t.api_tokens).where(c.agent_id == agent_id, c.revoked_at.is_(None)).values(revoked_at=at)
        return (await self._conn.execute(stmt)).rowcount

    async def revoke_for_session(self, session_id: str, at: datetime) -> int:
        params = {"match_session": session_id, "revoked_at": at}
        return (await self._conn.execute(sql.REVOKE_SESSION_TOKENS, params)).rowcount

    async def revoke_dangling(self, at: datetime) -> list[str]:
        c, a, s = t.api_tokens.c, t.agents.c, t.sessions.c
        # a lost agent (its node is down) may still run on its machine: its token lives until its node settles it
        live_agents = select(a.id).where(a.status.in_(("queued", "running", "lost")))
        ended_sessions = select(s.id).where(s.state.in_(("completed", "cancelled")))
        dangling = and_(
            c.kind == "agent",
            c.revoked_at.is_(None),
            or_(and_(c.agent_id.is_not(None), c.agent_id.not_in(live_agents)), c.session_id.in_(ended_sessions)),
        )
        ids = [r[0] for r in (await self._conn.execute(select(c.id).where(dangling))).all()]
        if ids:
            await self._conn.execute(update(t.api_tokens).where(c.id.in_(ids)).values(revoked_at=at))
        return ids
