"""How agents read in the terminal and the console: their table, one line each, their result, the readable end of
their log, their usage and the conversations they continued; and `follow_agents`, the live view of a session's
agents.

Apart from `render.py` so that the read commands' fast path (`session list`, `task ready`) prints without loading
the agents' report, transcript and usage parsers (entrypoints/cli/fast_reads.py).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

from taskgate.domain.agents import usage
from taskgate.domain.agents.reports import AgentReport
from taskgate.domain.agents.transcripts import Transcript, result_of
from taskgate.domain.entities import Agent
from taskgate.entrypoints.render import console, first_line, table, terminal_safe, when


def agents_table(agents: list[Agent], title: str = "Agents") -> Table:
    rows = []
    for a in agents:
        said = AgentReport.from_dict(a.report)  # a CLI's JSON events: its final message says more than their last
        last = said.headline(60) if said else last_line_read(a.output_tail)[:60]
        note = escape(terminal_safe(a.error or last))  # agent output is data, never Rich markup
        rows.append((a.id[:8], a.agent_type, a.run, a.status.value, "" if a.exit_code is None else a.exit_code,
                     when(a.heartbeat_at), report_cell(a), note))  # fmt: skip
    columns = ["agent", "type", "run", "status", "exit", "heartbeat", "turns / tokens / cost", "note / last output"]
    return table(title, columns, rows)


def last_line_read(output: str) -> str:
    """The last non-blank line of an agent's output as a person reads it (a JSON event rendered, not raw)."""
    transcript = Transcript()
    lines = [line for line in transcript.feed(output) + transcript.end() if line.strip()]
    return terminal_safe(lines[-1]).strip() if lines else ""


def report_cell(agent: Agent) -> str:
    """`4 / 400 in, 80 out / $0.0032` from the agent's report ("" before it ended or for plain-text agents)."""
    report = AgentReport.from_dict(agent.report)
    if report is None or not report.measured():
        return ""
    cost = "-" if report.cost_usd is None else f"${report.cost_usd:.4f}"
    return f"{report.turns} / {report.input_tokens} in, {report.output_tokens} out / {cost}"


def agent_line(agent: Agent) -> str:
    """One line for an agent (plain text): `agent 1a2b3c4d claude (run 1) completed: <first line of its final
    message> (4 turns, 400 in / 80 out tokens, $0.0032)`; a failed one shows its error instead."""
    line = f"agent {agent.id[:8]} {agent.agent_type} (run {agent.run}) {agent.status.value}"
    report = AgentReport.from_dict(agent.report)
    failed = agent.status.value == "failed" and agent.error
    said = first_line(agent.error) if failed else (report.headline() if report else first_line(agent.error))
    line += f": {terminal_safe(said)}" if said else ""
    line += f" (its process group ended by {agent.ended_by})" if agent.ended_by else ""  # a stop's signal
    line += f" [UNCONFINED: {terminal_safe(agent.sandbox[5:])}]" if (agent.sandbox or "").startswith("off:") else ""
    line += conversation_note(agent)
    return line + (f" ({report.usage()})" if report is not None and report.measured() else "")


def conversation_note(agent: Agent) -> str:
    """` [continued conversation 5f1c1d2e]`, ` [resume failed, ran afresh: …]`, or "" (docs/agents.md, resuming)."""
    if agent.resumed_from:
        return f" [continued conversation {terminal_safe(agent.resumed_from)}]"
    if agent.resume_failed:
        return f" [resume failed, ran afresh: {terminal_safe(first_line(agent.resume_failed))}]"
    return ""


def conversation_lines(agents: Sequence[Agent]) -> list[str]:
    """Per agent whose CLI named its conversation: `claude 1a2b3c4d (run 2): 5f1c… (continued from 5f1c…)`."""
    lines = []
    for agent in agents:
        if not (agent.conversation_id or agent.resumed_from or agent.resume_failed):
            continue
        line = f"{agent.agent_type} {agent.id[:8]} (run {agent.run}): {terminal_safe(agent.conversation_id or '-')}"
        lines.append(line + conversation_note(agent))
    return lines


def result_lines(agent: Agent) -> list[str]:
    """The agent's whole result (its final message), line by line, terminal-safe; none when it is one line that
    `agent_line` shows already."""
    result = terminal_safe(result_of(agent))
    lines = result.splitlines()
    return [] if len(lines) <= 1 and (not lines or lines[0].strip() == first_line(result)) else lines


LOG_VIEW_BYTES = 256 * 1024  # of an agent's log, the end the console shows read for a person


def readable_log(path: str | None, max_bytes: int = LOG_VIEW_BYTES) -> tuple[list[str], int]:
    """The end of an agent's log (its last `max_bytes`, from the first whole line) as lines a person reads
    (`transcripts.Transcript`, as `session logs` prints them), terminal-safe; and how many bytes before it were
    left out."""
    try:
        with open(path or "", "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - max_bytes))
            data = log.read()
    except OSError:
        return [], 0
    skipped = size - len(data)
    if skipped:  # the window starts inside a line: it starts at the next one
        cut = data.find(b"\n")
        skipped, data = (skipped + cut + 1, data[cut + 1 :]) if cut >= 0 else (skipped, data)
    transcript = Transcript()
    lines = transcript.feed(data.decode("utf-8", errors="replace")) + transcript.end()
    return [terminal_safe(line) for line in lines], skipped


def usage_lines(agents: Sequence[Agent]) -> list[tuple[str, str]]:
    """`usage` with the session's total, then `run N` for each run when it had more than one (none without
    agents)."""
    if not agents:
        return []
    runs = usage.by(agents, lambda a: a.run)
    shown = [("usage", usage.total(agents).line())]
    return shown + ([(f"run {run}", u.line()) for run, u in sorted(runs.items())] if len(runs) > 1 else [])


async def follow_agents(app: Any, session_id: str, *, until: Awaitable[Any], interval: float = 0.5) -> None:
    """A live Rich view of the session's agents, refreshed from the database until `until` completes."""
    import asyncio  # not at the top: `session show`'s fast path prints without the event loop

    from rich.live import Live

    done = asyncio.ensure_future(until)
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            session = await app.sessions.get(session_id)
            agents = await app.agents.agents(session_id)
            live.update(agents_table(agents, f"Session {session_id[:8]}: {session.state.value}"))
            if done.done():
                break
            await asyncio.wait({done}, timeout=interval)
    console.print()
    await done
