"""Driving a session's workflow in this process, and saying where it stands (session and workflow commands)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Annotated

import typer

from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.workflows.engine import WorkflowEngine
from taskgate.application.workflows.views import StackView
from taskgate.domain.entities import Outcome, Session
from taskgate.domain.errors import InvalidInput
from taskgate.domain.states import SessionState
from taskgate.entrypoints import render

if TYPE_CHECKING:
    from taskgate.bootstrap import App

# -- running workflows on sessions ------------------------------------------------------------------------------

SessionArg = Annotated[str, typer.Argument(help="Session id or a unique prefix of it.")]
_RUNNABLE = {SessionState.READY, SessionState.PLANNING, SessionState.EXECUTING}


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """Where a session stands after this process drove its workflow: the session, its stack, why it failed."""

    session: Session
    view: StackView
    reason: str | None = None


def _engine(services: App) -> WorkflowEngine:
    if services.workflows is None:
        raise InvalidInput("this taskgate runs no workflow engine")
    return services.workflows


async def _marks(services: App, session_id: str) -> dict[int, str]:
    """The step runs seen before a change, so that only what the change causes is printed."""
    if services.workflows is None:
        return {}
    return render.step_marks(await services.workflows.step_runs(session_id))


async def _outcome(services: App, session_id: str) -> _Outcome:
    session = await services.sessions.get(session_id)
    reason = None
    if session.state == SessionState.FAILED:
        records = await services.sessions.history(session_id, 20)
        failed = [r for r in records if r.outcome == Outcome.APPLIED and r.to_state == SessionState.FAILED.value]
        reason = failed[-1].reason if failed else None
    return _Outcome(session, _engine(services).view(session), reason)


async def _drive(services: App, session_id: str, *, known: dict[int, str], quiet: bool) -> _Outcome:
    """Drive the session's workflow in this process until it must wait for a person or ends (state changes kick
    a driver in the process that made them; with no `serve` running, this one is the only driver), printing
    each step run as it starts and ends unless `quiet`."""
    engine = _engine(services)
    if quiet:
        await engine.wait(session_id)
    else:
        await render.follow_steps(services, session_id, until=engine.wait(session_id), known=known)
    return await _outcome(services, session_id)


async def _until_launched(services: App, session_id: str, known: dict[int, str]) -> None:
    """`--no-wait`: until the current step's agents started (or it waits for a person, a retry's delay, or the
    session left executing); the agents then run on in their own process groups."""
    engine = _engine(services)

    async def launched() -> None:
        while True:
            session = await services.sessions.get(session_id)
            view = engine.view(session)
            runs = [r for r in await engine.step_runs(session_id) if r.id not in known]
            if session.state != SessionState.EXECUTING or view.waiting is not None or not view.depth:
                return
            if view.frames[-1]["status"] == "retry" or any(r.status.value == "running" and r.agent_ids for r in runs):
                assert services.agents is not None
                await services.agents.started(session_id)
                return
            await asyncio.sleep(0.1)

    await render.follow_steps(services, session_id, until=_first_of(launched(), engine.wait(session_id)), known=known)


async def _first_of(*work: Awaitable[None]) -> None:
    tasks = [asyncio.ensure_future(w) for w in work]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)


def _report(outcome: _Outcome) -> bool:
    """Print where the session stands; False when it failed."""
    return render.print_workflow_outcome(outcome.session, outcome.view, outcome.reason)


async def _to_executing(services: App, session_id: str, actor: str) -> None:
    """Fire what the session needs to execute its workflow: start (ready), plan_complete (planning); an executing
    session's driver is kicked in this process."""
    session = await services.sessions.get(session_id)
    if session.state == SessionState.READY:
        session = (await services.sessions.fire(FireTrigger(session_id, "start", actor))).session
    if session.state == SessionState.PLANNING:
        assert services.agents is not None
        await services.agents.execute(session_id, actor, [])
    elif session.state == SessionState.EXECUTING:
        _engine(services).kick(session_id)
