"""Audit queries over the append-only transition log."""

from __future__ import annotations

from datetime import datetime

from taskgate.application.ports import TransitionQuery, UnitOfWorkFactory
from taskgate.domain.bounds import ROW_LIMITS
from taskgate.domain.entities import Outcome, TransitionRecord
from taskgate.domain.errors import InvalidInput
from taskgate.domain.states import SessionState


class AuditService:
    """Answers "who moved which session where, when, and what did the guards say"."""

    def __init__(self, uow: UnitOfWorkFactory) -> None:
        self._uow = uow

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
