"""Ctrl-C on a command that supervises agents (`session execute`, `session fire ID retry`): it stops them.

The agents' MCP endpoint is this process's (entrypoints/mcp/agent_endpoint.py) and dies with it, and nothing would
supervise them any more, so an interrupted command does not leave them running: Ctrl-C (SIGINT) or SIGTERM stops
the session's agents as `session stop` does (an executing session is failed, so `session fire ID retry` runs them
again), says what became of each agent, and the command exits with status 130. The stop is bounded: SIGTERM, then
SIGKILL after `[execution] stop_grace_s`; a second Ctrl-C meanwhile only says it is stopping.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from taskgate.domain.entities import Agent
from taskgate.entrypoints.render import console, err_console

if TYPE_CHECKING:
    from taskgate.application.agents.stopping import Stopped
    from taskgate.bootstrap import App

T = TypeVar("T")
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as shells report a command ended by Ctrl-C
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class Interrupted:
    """The command was interrupted; what its stop did."""

    stopped: Stopped


async def interruptible(app: App, session_id: str, actor: str, work: Awaitable[T]) -> T | Interrupted:
    """`work`'s result, or, when SIGINT or SIGTERM comes first, `work` cancelled and the session's agents stopped."""
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()

    def on_signal() -> None:
        if interrupted.is_set():
            err_console.print("still stopping the agents…", highlight=False, markup=False)
        interrupted.set()

    for sig in _SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    task, waiter = asyncio.ensure_future(work), asyncio.ensure_future(interrupted.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        assert app.agents is not None and app.settings is not None
        grace = app.settings.execution.stop_grace_s
        err_console.print(f"interrupted: stopping the session's agents (SIGTERM, then SIGKILL after {grace:g} s)",
                          highlight=False, markup=False)  # fmt: skip
        task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await task
        return Interrupted(await app.agents.stop_session(session_id, actor, "interrupted (Ctrl-C)"))
    finally:
        waiter.cancel()
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)


def print_stopped(stopped: Stopped) -> None:
    """What became of each agent, and of the session."""
    for agent in stopped.agents:
        console.print(f"agent {agent.id[:8]} {agent.agent_type} (run {agent.run}): {fate(agent)}",
                      highlight=False, markup=False)  # fmt: skip
    if not stopped.agents:
        console.print("no agent", highlight=False)
    short = stopped.session.id[:8]
    then = f"; `taskgate session fire {short} retry` runs its agents again" if stopped.failed else ""
    console.print(f"session {short} is now {stopped.session.state.value}{then}", highlight=False, markup=False)


def fate(agent: Agent) -> str:
    """`cancelled, ended by SIGTERM`, `completed (exit 0)`, `running (another node's: ended there)`."""
    text = agent.status.value
    if agent.ended_by:
        text += f", its process group ended by {agent.ended_by}"
    elif agent.exit_code is not None:
        text += f" (exit {agent.exit_code})"
    elif agent.status.value == "cancelled" and agent.pid:
        text += ", its process had ended"
    return text
