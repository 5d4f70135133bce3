"""`session stop`: end a session's agents, whichever process on this node launched them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import JsonOpt, _operator_actor, run, session_app
from taskgate.entrypoints.cli.interrupts import print_stopped

if TYPE_CHECKING:
    from taskgate.bootstrap import App


@session_app.command("stop")
def session_stop(
    session_id: Annotated[str, typer.Argument(help="Session id or a unique prefix of it.")],
    reason: Annotated[str | None, typer.Option("--reason", help="Why (recorded in the log).")] = None,
    operator: Annotated[str | None, typer.Option("--operator")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop the session's agents: SIGTERM to each agent's process group, SIGKILL after [execution] stop_grace_s,
    from any terminal of the node that runs them (also when the command that launched them has ended). An
    executing session is failed (`session fire ID retry` runs its agents again); in another state, agents still
    running are stopped and the session stays. Says what became of each agent."""

    async def work(services: App):
        assert services.agents is not None
        full_id = await services.sessions.resolve_id(session_id)
        _operator_id, actor = _operator_actor(services, operator)
        return await services.agents.stop_session(full_id, actor, reason)

    stopped = run(work)
    if as_json:
        render.print_json({"session": stopped.session, "agents": stopped.agents, "failed": stopped.failed})
        return
    print_stopped(stopped)
