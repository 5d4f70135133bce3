"""The session engine's read side: sessions by id or prefix, pages and listings, a session's history, and its state at
any moment rebuilt by replaying its log (`replay`)."""

from __future__ import annotations

from datetime import datetime

from taskgate.application.sessions import references
from taskgate.application.sessions.commands import (
    SessionPage,
)
from taskgate.domain.bounds import ROW_LIMITS
from taskgate.domain.entities import (
    Session,
    TransitionRecord,
)
from taskgate.domain.errors import (
    InvalidInput,
    TaskgateError,
)
from taskgate.domain.session_fsm import find_transition, prior_state_after
from taskgate.domain.states import TERMINAL_STATES, SessionState, Trigger


class SessionReads:
    """The engine's reads: a session by id or prefix, its history, its state at any moment replayed from the log, and
    listings."""

    async def resolve_id(self, ref: str) -> str:
        """The full id of the session whose id is or starts with `ref` (at least 4 characters).

        Raises: InvalidInput (too short or ambiguous), SessionNotFound.
        """
        prefix = references.prefix_of(ref)
        if prefix is None:
            return ref.strip().lower()  # nothing to resolve; what reads or fires next raises SessionNotFound if unknown
        async with self._uow(write=False) as uow:
            matches = await uow.sessions.ids_with_prefix(prefix, limit=2)
        return references.pick(prefix, matches)

    async def get(self, session_id: str) -> Session:
        """Raises: SessionNotFound."""
        async with self._uow(write=False) as uow:
            return await uow.sessions.get(session_id)

    async def history(self, session_id: str, limit: int = 100) -> list[TransitionRecord]:
        """The newest `limit` log rows of a session (applied and blocked), oldest first.

        Raises: SessionNotFound, InvalidInput when limit is outside 1..100,000.
        """
        ROW_LIMITS.check("limit", limit)
        async with self._uow(write=False) as uow:
            await uow.sessions.get(session_id)
            return await uow.transitions.history(session_id, limit=limit)

    async def state_at(self, session_id: str, at: datetime) -> SessionState:
        """The state the session was in at `at`, rebuilt by replaying its log through the transition table.

        Raises: SessionNotFound; InvalidInput when `at` is naive or before the session existed;
        TaskgateError when the stored log does not replay (tampering or a bug: never silently wrong).
        """
        if at.tzinfo is None:
            raise InvalidInput("timestamp must carry a timezone (e.g. 2026-11-21T10:00:00Z)")
        async with self._uow(write=False) as uow:
            session = await uow.sessions.get(session_id)
            rows = await uow.transitions.applied_until(session_id, at)
        if not rows:
            raise InvalidInput(
                f"session {session_id} did not exist at {at.isoformat()} (created {session.created_at.isoformat()})"
            )
        return replay(rows)

    async def active_sessions(self, project_id: int | None = None, plan_id: int | None = None) -> list[Session]:
        """Sessions that have not reached a terminal state."""
        states = set(SessionState) - TERMINAL_STATES
        async with self._uow(write=False) as uow:
            return await uow.sessions.list(project_id=project_id, plan_id=plan_id, states=states)

    async def page(self, query: SessionPage) -> tuple[list[Session], int]:
        """One page of the sessions matching `query`, newest first, and how many match in all.

        Raises: InvalidInput for a limit outside 1..1,000 or a negative offset.
        """
        query.check()
        async with self._uow(write=False) as uow:
            found = await uow.sessions.list(project_id=query.project_id, plan_id=query.plan_id, states=query.states)
        if query.operator_id is not None:
            found = [s for s in found if s.operator_id == query.operator_id]
        found.reverse()  # the repository lists oldest first
        return found[query.offset : query.offset + query.limit], len(found)

    async def list_sessions(
        self, project_id: int | None = None, states: set[SessionState] | None = None
    ) -> list[Session]:
        async with self._uow(write=False) as uow:
            return await uow.sessions.list(project_id=project_id, states=states)


def replay(rows: list[TransitionRecord]) -> SessionState:
    """Fold applied log rows through the transition table; the result is the state after the last row.

    Raises: TaskgateError when a row does not follow from the state before it.
    """
    state: SessionState | None = None
    prior: SessionState | None = None
    for rec in rows:
        row = find_transition(state, Trigger(rec.trigger), prior)
        if (
            row is None
            or row.dest.value != rec.to_state
            or (rec.from_state or None) != (state.value if state else None)
        ):
            raise TaskgateError(f"transition log of session {rec.session_id} does not replay at seq {rec.seq}")
        prior = prior_state_after(row, state, prior) if state is not None else None
        state = row.dest
    assert state is not None
    return state
