"""Audit queries over the append-only transition log."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from taskgate.application.ports import UnitOfWorkFactory
from taskgate.application.sessions.ports import TransitionQuery
from taskgate.domain.bounds import ROW_LIMITS
from taskgate.domain.entities import Outcome, TransitionRecord
from taskgate.domain.errors import InvalidInput
from taskgate.domain.states import SessionState

_KIND = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*\.?$")


@dataclass(frozen=True, slots=True)
class EventQuery:
    """Which events: of one session, of one kind (or a prefix ending in "."), in a time window; the newest `limit`."""

    session_id: str | None = None
    kind: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = 100


class AuditService:
    """Answers "who moved which session where, when, and what did the guards say"."""

    def __init__(self, uow: UnitOfWorkFactory) -> None:
        self._uow = uow

    async def events(self, query: EventQuery) -> list[dict[str, Any]]:
        """Events (the outbox: transitions, decisions, agents, tracker write-backs, …) matching the filters, oldest
        first: the newest `limit` of them.

        Raises: InvalidInput for naive or inverted time bounds, a bad kind or limit.
        """
        for bound in (query.since, query.until):
            _require_aware(bound)
        if query.since and query.until and query.since > query.until:
            raise InvalidInput("since is after until")
        if query.kind is not None and not _KIND.fullmatch(query.kind):
            raise InvalidInput(f"event kind {query.kind[:60]!r}: words joined by '.', e.g. tracker.writeback_failed "
                               "(or a prefix ending in '.', e.g. tracker.)")  # fmt: skip
        ROW_LIMITS.check("limit", query.limit)
        async with self._uow(write=False) as uow:
            return await uow.events.list(query.session_id, query.limit, kind=query.kind, since=query.since,
                                         until=query.until)  # fmt: skip

    async def transitions(self, query: TransitionQuery) -> list[TransitionRecord]:
        """Log rows matching the filters, oldest first.

        Raises: InvalidInput for an unknown state or outcome, naive or inverted time bounds, a bad limit.
        """
        _validate(query)
        async with self._uow(write=False) as uow:
            return await uow.transitions.query(query)


def _validate(query: TransitionQuery) -> None:
    if query.state is not None and query.state not in {s.value for s in SessionState}:
        raise InvalidInput(f"unknown state '{query.state}'; valid: {', '.join(s.value for s in SessionState)}")
    if query.outcome is not None and query.outcome not in {o.value for o in Outcome}:
        raise InvalidInput(f"unknown outcome '{query.outcome}'; valid: applied, blocked")
    for bound in (query.since, query.until):
        _require_aware(bound)
    if query.since and query.until and query.since > query.until:
        raise InvalidInput("--since is after --until")
    ROW_LIMITS.check("limit", query.limit)


def _require_aware(bound: datetime | None) -> None:
    if bound is not None and bound.tzinfo is None:
        raise InvalidInput("time bounds must carry a timezone")
