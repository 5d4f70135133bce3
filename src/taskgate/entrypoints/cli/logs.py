"""`taskgate session logs`: the agents' own output, as lines a person reads (or, with --raw, as they wrote it).

An agent's log is whatever its process printed (stdout and stderr). By default each line goes through
`transcripts.Transcript`, the one renderer the console uses too: Claude Code's and Codex's JSON events become
their assistant text, each tool call with its command or path, each result folded to one line, and the tokens;
other lines stay as written. `--raw` prints the log as written: the bytes themselves into a pipe or a file, and on
a terminal without what a terminal acts on.

Escape sequences in a log could recolour, retitle or clear the operator's terminal, write to its clipboard (OSC 52)
or fake a prompt: on a terminal, and always in the readable form, everything printed goes through `terminal_safe`
(`render.TerminalSafeStream` for the raw bytes: escape sequences and control characters dropped; newlines and tabs
kept), with Rich markup, highlighting and emoji codes off."""

from __future__ import annotations

import asyncio
import codecs
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from taskgate.application.workspaces.hooks import HOOKS_LOG
from taskgate.domain.agents.transcripts import Transcript, step_output
from taskgate.domain.entities import Agent, AgentStatus
from taskgate.domain.errors import InvalidInput
from taskgate.entrypoints.cli.common import JsonOpt, run, session_app
from taskgate.entrypoints.render import TerminalSafeStream, console, err_console, print_json, terminal_safe

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
    """One agent's log, read from where the last read ended: readable lines (`Transcript`), or with `raw` the bytes
    as written (terminal-safe when `safe`)."""

    def __init__(self, agent: Agent, *, raw: bool = False, safe: bool = True) -> None:
        self.agent, self.offset, self.raw, self.safe = agent, 0, raw, safe
        self.stream = TerminalSafeStream()
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.transcript = Transcript()

    def header(self) -> str:
        a = self.agent
        return f"==> agent {a.id[:8]} {a.agent_type} (run {a.run}, {a.status.value}): {a.output_path or 'no log'} <=="

    def read(self, *, final: bool = False) -> str | bytes:
        """What was written since the last read (all of it); with `final` nothing is held back."""
        pieces = []
        while self.agent.output_path:
            try:
                with open(self.agent.output_path, "rb") as log:
                    log.seek(self.offset)
                    data = log.read(_READ)
            except OSError:  # not started yet (no file), or gone
                data = b""
            self.offset += len(data)
            pieces.append(data)
            if not data:
                break
        data = b"".join(pieces)
        if self.raw:
            return self.stream.feed(data, final=final) if self.safe else data
        lines = self.transcript.feed(self.decoder.decode(data, final=final))
        lines += self.transcript.end() if final else []
        return "".join(f"{terminal_safe(line)}\n" for line in lines)


class _Printer:
    def __init__(self) -> None:
        self.current: _Log | None = None
        self.at_line_start = True

    def show(self, log: _Log, text: str | bytes, *, header: bool = False) -> None:
        if log is not self.current or header:
            if log.raw and not log.safe:  # the bytes alone on stdout (`--raw | jq`): the header to stderr
                err_console.print(log.header(), markup=False, highlight=False, soft_wrap=True)
            else:
                self._out("" if self.at_line_start else "\n")
                self._out(log.header() + "\n")
            self.current = log
        self._out(text)

    def end(self) -> None:
        if self.current is None or self.current.safe:  # the raw bytes end as they ended
            self._out("" if self.at_line_start else "\n")

    def _out(self, text: str | bytes) -> None:
        if isinstance(text, bytes):  # --raw into a pipe or a file: the bytes as written
            if text:
                sys.stdout.flush()
                sys.stdout.buffer.write(text)
                sys.stdout.buffer.flush()
                self.at_line_start = text.endswith(b"\n")
        elif text:
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
    raw: Annotated[
        bool, typer.Option("--raw", help="The log as written (JSON events and all); on a terminal, made safe.")
    ] = False,
    hooks: Annotated[
        bool, typer.Option("--hooks", help="The worktree hooks' log (hooks.log in the session folder) instead.")
    ] = False,
) -> None:
    """Print the logs of the session's latest run of agents (their own output: stdout and stderr), each after a
    header line, as lines a person reads: assistant text, each tool call with its command or path, its result
    folded to one line, and the tokens. --raw prints the log as written (into a pipe, byte for byte). Escape
    sequences and control characters are dropped on a terminal, so an agent cannot drive it. With --follow it goes
    on printing as they write, until every one of them ended. --hooks prints what the worktree hooks
    ([hooks] after_create, before_agent, …) and the `.worktreeinclude` copy wrote instead."""
    if hooks:
        if follow or agent:
            raise typer.BadParameter("--hooks prints the session's hooks.log whole: not with --follow or --agent")
        run(lambda services: _print_hooks_log(services, session_id, raw))
        return

    async def work(services: App) -> None:
        assert services.agents is not None, "the app was not built by bootstrap()"
        full_id = await services.sessions.resolve_id(session_id)
        safe = not raw or sys.stdout.isatty()
        logs = [_Log(a, raw=raw, safe=safe) for a in pick(full_id, await services.agents.agents(full_id), agent)]
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


async def _print_hooks_log(services: App, session_id: str, raw: bool) -> None:
    """The session folder's hooks.log, through `terminal_safe` unless it goes byte for byte into a pipe."""
    assert services.outputs is not None, "the app was not built by bootstrap()"
    full_id = await services.sessions.resolve_id(session_id)
    path = Path(services.outputs.folder(full_id)) / HOOKS_LOG
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidInput(f"session {full_id[:8]} has no hooks log: no hook ran ({path} does not exist)") from None
    err_console.print(f"==> {path} <==", markup=False, highlight=False, soft_wrap=True)
    if raw and not sys.stdout.isatty():
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        return
    text = data.decode("utf-8", errors="replace")
    console.print(terminal_safe(text), markup=False, highlight=False, emoji=False, soft_wrap=True, end="")


@session_app.command("output")
def session_output(
    session_id: Annotated[str, typer.Argument(help="Session id or a unique prefix of it.")],
    step: Annotated[str | None, typer.Option("--step", "-s", help="The step (default: the latest).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a step's whole output: its agent's final message (Claude Code's result, Codex's last message, aider's
    reply, a script's last lines), e.g. the plan an approval asks you to read. Without --step, the latest step
    that ended with an output; a session without a workflow prints its latest agents' results. What it is goes to
    stderr, the output alone to stdout."""

    async def work(services: App) -> list[tuple[str, str]]:
        assert services.agents is not None, "the app was not built by bootstrap()"
        full_id = await services.sessions.resolve_id(session_id)
        runs = await services.workflows.step_runs(full_id, 1000) if services.workflows is not None else []
        return step_output(full_id, runs, await services.agents.agents(full_id), step)

    chosen = run(work)
    if as_json:
        print_json([{"what": what, "output": text} for what, text in chosen])
        return
    for what, text in chosen:
        err_console.print(f"==> {what} <==", markup=False, highlight=False, soft_wrap=True)
        console.print(terminal_safe(text), markup=False, highlight=False, emoji=False, soft_wrap=True)
