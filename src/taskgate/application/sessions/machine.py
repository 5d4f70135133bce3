"""Runs the domain transition table on a `transitions.Machine`.

One machine is built from `TRANSITIONS` at start-up. Adding a model to a machine costs more than a persisted
transition (~170 µs for 15 states), so models are pooled: a fire checks one out, sets its state, triggers,
and returns it.

The guards are evaluated first (they are async: they may read facts in the caller's transaction), exactly
once, for the row the domain selected; the machine's condition then reads that verdict. The synchronous
`Machine` does this in ~10 µs where `AsyncMachine` took ~50 µs: it spawned a task per trigger and gathered
the conditions of every candidate row (docs/decisions.md, "The hot path"). Each model serves one fire at a
time; the per-session serialisation itself comes from the database lock the caller holds (see
`SessionService.fire`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from transitions import Machine

from taskgate.domain.session_fsm import TRANSITIONS, TransitionSpec
from taskgate.domain.states import SessionState

GuardCallback = Callable[[TransitionSpec], Awaitable[bool]]


class _SessionModel:
    """The object `transitions` moves; it carries the selected table row and the guards' verdict on it."""

    state: str

    def __init__(self) -> None:
        self.selected: TransitionSpec | None = None
        self.allowed = False

    def passes(self, row: TransitionSpec) -> bool:
        # Only the row the domain selected may pass: a trigger has several candidate rows (e.g. each `resume`
        # row), and `transitions` tries each one whose source matches.
        return row is self.selected and self.allowed


def _condition_for(row: TransitionSpec) -> Callable[[Any], bool]:
    def condition(event: Any) -> bool:
        return event.model.passes(row)

    return condition


class SessionMachine:
    """Applies one table row to a state through the Machine, with the guards' verdict as its condition."""

    def __init__(self) -> None:
        self._machine = Machine(
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
        """Evaluate the guards once, then fire `row` from `state`; returns the new state, or `state` unchanged
        if the guards refused."""
        allowed = await guard(row)
        model = self._checkout()
        try:
            self._machine.set_state(state.value, model)
            model.selected, model.allowed = row, allowed
            self._machine.events[row.trigger.value].trigger(model)
            return SessionState(model.state)
        finally:
            model.selected, model.allowed = None, False
            self._free.append(model)

    def _checkout(self) -> _SessionModel:
        if self._free:
            return self._free.pop()
        model = _SessionModel()
        self._machine.add_model(model, initial=SessionState.CREATED.value)
        return model
