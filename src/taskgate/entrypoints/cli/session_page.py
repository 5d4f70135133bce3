"""What `session show` prints: the session's fields, what it waits for, its pull request, usage and conversations.

Shared by the command (sessions.py) and the read commands' fast path (fast_reads.py), so both print alike; it
loads neither Typer nor the database layer.
"""

from __future__ import annotations

from rich.markup import escape

from taskgate.application.forge.ports import PullRequestRecord
from taskgate.domain import session_fsm
from taskgate.domain.agents.usage import session_usage
from taskgate.domain.entities import Agent, Session
from taskgate.domain.questions import Question
from taskgate.entrypoints import agent_lines, render
from taskgate.entrypoints.render import console, question_json, question_line


def print_session(
    session: Session, agents: list[Agent], pull: PullRequestRecord | None, asked: list[Question], *, as_json: bool
) -> None:
    """Print one session (as JSON with `as_json`): its fields, next triggers, what it waits for, its pull request,
    its agents' usage and the conversations they continued."""
    if as_json:
        extra = {"usage": session_usage(agents), "pull_request": render.pull_request_json(pull),
                 "waiting_for_operator": [question_json(q) for q in asked]}  # fmt: skip
        render.print_json({**render.session_json(session), **extra})
        return
    allowed = session_fsm.allowed_triggers(session.state, session.prior_state)
    for key, value in render.jsonable(session).items():
        shown = escape(str(value)) if value not in (None, {}, []) else "-"  # state_data holds people's text
        console.print(f"[bold]{key:>17}[/bold]  {shown}", highlight=False)
    if session.escalated_at is not None:
        at, short = session.escalated_at.isoformat(timespec="seconds"), session.id[:8]
        note = f"waiting too long for a decision: taskgate session decide {short} approve|request_changes|reject"
        console.print(f"[bold]{'escalated':>17}[/bold]  [bold red]{at}[/bold red] ({note})", highlight=False)
    if lost := session.state_data.get("tracker_lost"):
        note = f"{lost.get('issue')} {lost.get('why')} (on_issue_gone = {lost.get('policy')})"
        console.print(f"[bold]{'tracker':>17}[/bold]  [bold red]{escape(note)}[/bold red]", highlight=False)
    console.print(f"[bold]{'next triggers':>17}[/bold]  {', '.join(allowed) or '-'}", highlight=False)
    for q in asked:  # the sub-state waiting_for_operator (docs/questions.md)
        line = f"{question_line(q)} (taskgate session answer {session.id[:8]} <answer>)"
        console.print(f"[bold]{'waiting_for_operator':>17}[/bold]  [bold yellow]{escape(line)}[/bold yellow]",
                      highlight=False)  # fmt: skip
    if pull is not None:
        console.print(f"[bold]{'pull request':>17}[/bold]  {escape(render.pull_request_line(pull))}", highlight=False)
    for label, line in agent_lines.usage_lines(agents):
        console.print(f"[bold]{label:>17}[/bold]  {escape(line)}", highlight=False)
    for index, line in enumerate(agent_lines.conversation_lines(agents)):  # what each run continued (resuming)
        console.print(f"[bold]{'conversation' if index == 0 else '':>17}[/bold]  {escape(line)}", highlight=False)
