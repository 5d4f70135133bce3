"""Runs the domain transition table on `transitions.AsyncMachine`.

One machine is built from `TRANSITIONS` at start-up. Adding a model to a machine costs more than a persisted
transition (~170 µs for 15 states), so models are pooled: a fire checks one out, sets its state, triggers,
and returns it. Each model serves one fire at a time, which matters because `transitions` cancels an
in-flight trigger when a second trigger arrives on the same model; the per-session serialisation itself
comes from the database lock the caller holds (see `SessionService.fire`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from transitions.extensions.asyncio import AsyncMachine

from taskgate.domain.session_fsm import TRANSITIONS, TransitionSpec
from taskgate.domain.states import SessionState

GuardCallback = Callable[[TransitionSpec], Awaitable[bool]]


class _SessionModel:
    """The object `transitions` moves; it carries the selected table row and the guard callback."""

    state: str

    def __init__(self) -> None:
        self.selected: TransitionSpec | None = None
        self.guard: GuardCallback | None = None

    async def passes(self, row: TransitionSpec) -> bool:
        # Only the row the domain selected may evaluate the guards: transitions gathers the conditions of
        # every candidate row of a trigger (e.g. each `resume` row), and guards must run exactly once.
        if row is not self.selected or self.guard is None:
            return False
        return await self.guard(row)


def _condition_for(row: TransitionSpec) -> Callable[[Any], Awaitable[bool]]:
    async def condition(event: Any) -> bool:
        return await event.model.passes(row)

    return condition


class SessionMachine:
    """Applies one table row to a state through the AsyncMachine, with the guards as its condition."""

    def __init__(self) -> None:
        self._machine = AsyncMachine(
            model=None,
            states=[state.value for state in SessionState],
            transitions=[
                {
                    "trigger": row.trigger.value,
                    "source": src.value,
                    "dest": row.dest.value,
                    "conditions": [_condition_for(row)],
                }
                for row in TRANSITIONS
                for src in sorted(row.sources)
            ],
            initial=None,
            auto_transitions=False,
            send_event=True,
        )
        self._free: list[_SessionModel] = []

    async def run(self, state: SessionState, row: TransitionSpec, guard: GuardCallback) -> SessionState:
        """Fire `row` from `state`; returns the new state, or `state` unchanged if the guard refused."""
        model = self._checkout()
        try:
            self._machine.set_state(state.value, model)
            model.selected, model.guard = row, guard
            await self._machine.events[row.trigger.value].trigger(model)
            return SessionState(model.state)
        finally:
            model.selected = model.guard = None
            self._free.append(model)

    def _checkout(self) -> _SessionModel:
        if self._free:
            return self._free.pop()
        model = _SessionModel()
        self._machine.add_model(model, initial=SessionState.CREATED.value)
        return model
