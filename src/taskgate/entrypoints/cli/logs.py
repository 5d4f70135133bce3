"""`taskgate session logs`: the agents' own output, as they wrote it to their logs, made safe for a terminal.

An agent's log is whatever its process printed (stdout and stderr): escape sequences in it could recolour, retitle
or clear the operator's terminal, write to its clipboard (OSC 52) or fake a prompt. Everything printed here goes
through `render.TerminalSafeStream` (escape sequences and control characters dropped; newlines and tabs kept),
with Rich markup, highlighting and emoji codes off."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from taskgate.domain.entities import Agent, AgentStatus
from taskgate.domain.errors import InvalidInput
from taskgate.entrypoints.cli.common import run, session_app
from taskgate.entrypoints.render import TerminalSafeStream, console

if TYPE_CHECKING:
    from taskgate.bootstrap import App

POLL_S = 0.2  # how often --follow looks at the logs and at the agents' status
_READ = 256 * 1024  # bytes read at a time
_LIVE = frozenset({AgentStatus.QUEUED, AgentStatus.RUNNING})


def latest_run(agents: Sequence[Agent]) -> list[Agent]:
    """The agents of the session's latest run (every launch, relaunch and workflow step is a run)."""
    last = max((a.run for a in agents), default=0)
    return [a for a in agents if a.run == last]


def pick(session_id: str, agents: Sequence[Agent], wanted: str | None) -> list[Agent]:
    """The latest run's agents; or those `wanted` names: an agent id prefix (any run), or an agent type (its
    latest run).

    Raises: InvalidInput naming the session's agents when none is found."""
    if not agents:
        raise InvalidInput(f"session {session_id[:8]} has no agents yet (`taskgate session execute` launches them)")
    if wanted is None:
        return latest_run(agents)
    by_id = [a for a in agents if a.id.startswith(wanted.lower())] if wanted else []
    if len(by_id) == 1:
        return by_id
    by_type = latest_run([a for a in agents if a.agent_type == wanted])
    if by_type:
        return by_type
    known = ", ".join(f"{a.id[:8]} {a.agent_type} (run {a.run}, {a.status.value})" for a in agents)
    what = "matches more than one agent" if by_id else "is neither an agent id prefix nor an agent type"
    raise InvalidInput(f"'{wanted}' {what} of session {session_id[:8]}; its agents: {known}")


class _Log:
    """One agent's log, read from where the last read ended."""

    def __init__(self, agent: Agent) -> None:
        self.agent, self.offset, self.stream = agent, 0, TerminalSafeStream()

    def header(self) -> str:
        a = self.agent
        return f"==> agent {a.id[:8]} {a.agent_type} (run {a.run}, {a.status.value}): {a.output_path or 'no log'} <=="

    def read(self, *, final: bool = False) -> str:
        """What was written since the last read (all of it), terminal-safe; with `final` nothing is held back."""
        pieces = []
        while self.agent.output_path:
            try:
                with open(self.agent.output_path, "rb") as log:
                    log.seek(self.offset)
                    data = log.read(_READ)
            except OSError:  # not started yet (no file), or gone
                data = b""
            self.offset += len(data)
            pieces.append(self.stream.feed(data, final=final and not data))
            if not data:
                break
        return "".join(pieces)


class _Printer:
    def __init__(self) -> None:
        self.current: _Log | None = None
        self.at_line_start = True

    def show(self, log: _Log, text: str, *, header: bool = False) -> None:
        if log is not self.current or header:
            self._out("" if self.at_line_start else "\n")
            self._out(log.header() + "\n")
            self.current = log
        self._out(text)

    def end(self) -> None:
        self._out("" if self.at_line_start else "\n")

    def _out(self, text: str) -> None:
        if text:
            console.print(text, end="", markup=False, highlight=False, emoji=False, soft_wrap=True)
            self.at_line_start = text.endswith("\n")


@session_app.command("logs")
def session_logs(
    session_id: Annotated[str, typer.Argument(help="Session id or a unique prefix of it.")],
    agent: Annotated[
        str | None, typer.Option("--agent", "-a", help="Only this agent: an agent id prefix, or an agent type.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing what they write until none is queued or running.")
    ] = False,
) -> None:
    """Print the logs of the session's latest run of agents (their own output: stdout and stderr), each after a
    header line. Escape sequences and control characters in them are dropped, so an agent cannot drive your
    terminal. With --follow it goes on printing as they write, until every one of them ended."""

    async def work(services: App) -> None:
        assert services.agents is not None, "the app was not built by bootstrap()"
        full_id = await services.sessions.resolve_id(session_id)
        logs = [_Log(a) for a in pick(full_id, await services.agents.agents(full_id), agent)]
        printer = _Printer()
        for log in logs:
            printer.show(log, log.read(final=not follow), header=True)
        while follow:
            # the status first: an agent seen ended had written all of its log before, so this read gets the rest
            now = {a.id: a for a in await services.agents.agents(full_id)}
            ended = all(now[log.agent.id].status not in _LIVE for log in logs if log.agent.id in now)
            for log in logs:
                log.agent = now.get(log.agent.id, log.agent)
                if text := log.read(final=ended):
                    printer.show(log, text)
            if ended:
                break
            await asyncio.sleep(POLL_S)
        printer.end()

    try:
        run(work)
    except KeyboardInterrupt:  # the way out of a --follow on agents nobody supervises: no traceback
        raise typer.Exit(130) from None
