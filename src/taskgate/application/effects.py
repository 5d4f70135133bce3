"""Side effects of transitions: what happens outside the database when a session moves (DESIGN §3 effects).

A transition itself stays one database transaction. Effects run around it, never inside it, so no git
command or tracker call ever holds the database write lock:

- `before` runs first and may refuse (raise) or add changes to the transition, e.g. `merge` merges the
  branch in git and only then records `merged`; `initialize` fixes the branch and worktree names.
- `after` runs once the transition committed and may ask for a follow-up trigger (the automatic ones:
  `context_discovered` after `initialize`, `cleanup_done` after `merge` and `compensate`) or report an error
  the caller must see (the worktree could not be created, so the session was failed).

Effects are written to be idempotent: after a crash between an effect and its transition, running the
effect again (startup reconciliation does) finds the work done and carries on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from taskgate.domain.errors import TaskgateError
from taskgate.domain.states import Trigger

if TYPE_CHECKING:
    from taskgate.application.sessions import FireResult, FireTrigger
    from taskgate.domain.entities import Session


@dataclass(frozen=True, slots=True)
class Aftermath:
    """What `after` asks of the engine: fire `follow_up` next, then raise `error` (if any) to the caller."""

    follow_up: FireTrigger | None = None
    error: TaskgateError | None = None


NOTHING = Aftermath()


class SessionEffects(Protocol):
    def wants_before(self, trigger: Trigger) -> bool:
        """Whether `before` has work for `trigger` (saves a session read on every other trigger)."""

    async def before(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        """Do the work the transition stands for; return `cmd`, possibly with `changes`. Raise to refuse."""

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        """React to an applied transition."""


class NoEffects:
    """For engines that only keep state (unit tests of the engine, benchmarks of the bare transition), and the
    base of effects that act only after a transition (they override `after`)."""

    def wants_before(self, trigger: Trigger) -> bool:
        return False

    async def before(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        return cmd

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        return NOTHING


class CompositeEffects:
    """Several effect sets in order. At most one of them may ask for a follow-up per transition."""

    def __init__(self, parts: Sequence[SessionEffects]) -> None:
        self._parts = list(parts)

    def wants_before(self, trigger: Trigger) -> bool:
        return any(p.wants_before(trigger) for p in self._parts)

    async def before(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        for part in self._parts:
            if part.wants_before(Trigger(cmd.trigger)):
                cmd = await part.before(session, cmd)
        return cmd

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        follow_up, error = None, None
        for part in self._parts:
            found = await part.after(result, cmd)
            follow_up = follow_up or found.follow_up
            error = error or found.error
        return Aftermath(follow_up, error)
