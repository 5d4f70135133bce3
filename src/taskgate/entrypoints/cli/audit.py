"""The audit log and the state machine: `audit transitions`, `fsm`."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from taskgate.application.sessions.ports import TransitionQuery
from taskgate.domain import session_fsm
from taskgate.domain.forge import SUBSTATES
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import (
    JsonOpt,
    _timestamp_or_fail,
    audit_app,
    command,
    run,
)
from taskgate.entrypoints.render import console

if TYPE_CHECKING:
    from taskgate.bootstrap import App


class AuditFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


@audit_app.command("transitions")
def audit_transitions(
    session: Annotated[str | None, typer.Option("--session", help="Session id or prefix.")] = None,
    actor: Annotated[str | None, typer.Option("--actor", help="e.g. operator:alice or system.")] = None,
    state: Annotated[str | None, typer.Option("--state", help="Transitions that entered this state.")] = None,
    outcome: Annotated[str | None, typer.Option("--outcome", help="applied or blocked.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="ISO 8601, inclusive.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="ISO 8601, inclusive.")] = None,
    limit: Annotated[int, typer.Option("--limit")] = 1000,
    fmt: Annotated[AuditFormat, typer.Option("--format")] = AuditFormat.table,
    as_json: JsonOpt = False,
) -> None:
    """Query the transition log: who moved which session where, when, and what the guards said."""
    since_at, until_at = _timestamp_or_fail(since), _timestamp_or_fail(until)

    async def work(services: App):
        session_id = await services.sessions.resolve_id(session) if session else None
        return await services.audit.transitions(
            TransitionQuery(session_id, actor, state, outcome, since_at, until_at, limit)
        )

    records = run(work)
    if as_json or fmt == AuditFormat.json:
        render.print_json(records)
    elif fmt == AuditFormat.csv:
        print(render.transitions_csv(records), end="")
    else:
        console.print(render.transitions_table(records))


class FsmFormat(StrEnum):
    table = "table"
    mermaid = "mermaid"
    json = "json"


@command("fsm")
def fsm(fmt: Annotated[FsmFormat, typer.Option("--format")] = FsmFormat.table) -> None:
    """The session state machine, generated from the transition table."""
    if fmt == FsmFormat.mermaid:
        print(session_fsm.to_mermaid())
        return
    rows = [
        (
            r.trigger.value,
            ", ".join(sorted(s.value for s in r.sources)) or "(new)",
            r.dest.value,
            r.when_prior.value if r.when_prior else "",
            r.initiator.value,
            r.description,
        )
        for r in session_fsm.TRANSITIONS
    ]
    if fmt == FsmFormat.json:
        keys = ["trigger", "sources", "dest", "when_prior", "initiator", "description"]
        render.print_json([dict(zip(keys, row, strict=True)) for row in rows])
        return
    console.print(render.table("Session transitions", ["trigger", "from", "to", "when prior", "by", "what"], rows))
    subs = [(a.value, b.value, what) for a, b, what in SUBSTATES]
    console.print(
        render.table("awaiting_merge with a forge: the pull request's sub-states", ["from", "to", "when"], subs)
    )
