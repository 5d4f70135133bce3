"""Side effects of transitions: what happens outside the database when a session moves (DESIGN §3 effects).

A transition itself stays one database transaction. Effects run around it, never inside it, so no git
command or tracker call ever holds the database write lock:

- `before` runs first and may refuse (raise) or add changes to the transition, e.g. `merge` merges the
  branch in git and only then records `merged`; `initialize` fixes the branch and worktree names.
- `after` runs once the transition committed and may ask for a follow-up trigger (the automatic ones:
  `context_discovered` after `initialize`, `cleanup_done` after `merge` and `compensate`) or report an error
  the caller must see (the worktree could not be created, so the session was failed).

Effects are written to be idempotent: after a crash between an effect and its transition, running the
effect again finds the work done and carries on. `resume` is how: at start-up (and when an operator's start
finds a session a crash left half-made) the engine asks the effects what the session's state still owes,
and gets back the very follow-up the interrupted call would have fired (see docs/failure-model.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from taskgate.domain.errors import TaskgateError
from taskgate.domain.states import Trigger

if TYPE_CHECKING:
    from taskgate.application.sessions.commands import FireResult, FireTrigger
    from taskgate.domain.entities import Project, Session


@dataclass(frozen=True, slots=True)
class Aftermath:
    """What `after` (or `resume`) asks of the engine: fire `follow_up` next, then raise `error` (if any) to the
    caller. `note` says what an effect did by itself while resuming (e.g. launched the recorded agents);
    `warning` is something the caller must be told although the transition stands (a tracker write-back that
    failed and will be retried)."""

    follow_up: FireTrigger | None = None
    error: TaskgateError | None = None
    note: str = ""
    warning: str = ""


NOTHING = Aftermath()


class SessionEffects(Protocol):
    async def check_new_session(self, project: Project) -> None:
        """Refuse a new session of `project` before anything is written (its base branch is missing). Raises."""

    def wants_before(self, trigger: Trigger) -> bool:
        """Whether `before` has work for `trigger` (saves a session read on every other trigger)."""

    async def before(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        """Do the work the transition stands for; return `cmd`, possibly with `changes`. Raise to refuse."""

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        """React to an applied transition."""

    async def resume(self, session: Session) -> Aftermath:
        """Carry on the work a crash cut off in the session's current state: the follow-up its interrupted
        call would have fired, or the work done (`note`); NOTHING when the state owes nothing."""


class NoEffects:
    """For engines that only keep state (unit tests of the engine, benchmarks of the bare transition), and the
    base of effects that act only after a transition (they override `after`)."""

    async def check_new_session(self, project: Project) -> None:
        return None

    def wants_before(self, trigger: Trigger) -> bool:
        return False

    async def before(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        return cmd

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        return NOTHING

    async def resume(self, session: Session) -> Aftermath:
        return NOTHING


class CompositeEffects:
    """Several effect sets in order. At most one of them may ask for a follow-up per transition."""

    def __init__(self, parts: Sequence[SessionEffects]) -> None:
        self._parts = list(parts)

    async def check_new_session(self, project: Project) -> None:
        for part in self._parts:
            await part.check_new_session(project)

    def wants_before(self, trigger: Trigger) -> bool:
        return any(p.wants_before(trigger) for p in self._parts)

    async def before(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        for part in self._parts:
            if part.wants_before(Trigger(cmd.trigger)):
                cmd = await part.before(session, cmd)
        return cmd

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        follow_up, error, warnings = None, None, []
        for part in self._parts:
            found = await part.after(result, cmd)
            follow_up = follow_up or found.follow_up
            error = error or found.error
            warnings += [found.warning] if found.warning else []
        return Aftermath(follow_up, error, warning="; ".join(warnings))

    async def resume(self, session: Session) -> Aftermath:
        """The first part whose state the session owes work to resumes it (states belong to one part each)."""
        for part in self._parts:
            found = await part.resume(session)
            if found.follow_up is not None or found.note or found.error is not None:
                return found
        return NOTHING
