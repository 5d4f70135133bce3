"""`taskgate usage`: the tokens and cost agents reported, summed by task, by agent type and by preset, and the spend
held against the budgets (`[budgets]`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from taskgate.application.agents.usage import UsageQuery
from taskgate.domain.agents.presets import PRESETS
from taskgate.domain.agents.usage import Usage, by, total
from taskgate.domain.budgets import Line
from taskgate.domain.entities import Agent
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import JsonOpt, ProjectOpt, _timestamp_or_fail, command, run
from taskgate.entrypoints.render import console

if TYPE_CHECKING:
    from taskgate.bootstrap import App, Settings

SinceOpt = Annotated[
    str | None, typer.Option("--since", help="Only agents that ended at or after this time (ISO 8601: 2026-11-01).")
]


def preset_of(settings: Settings | None, agent_type: str) -> str:
    """The preset an agent type is built on: the one its `[agents.NAME]` table names, the preset of that name, else
    `custom` (configured with a command of its own)."""
    table = settings.agents.get(agent_type) if settings is not None else None
    if table is not None and table.preset:
        return table.preset
    if agent_type in PRESETS and (table is None or table.command is None):
        return agent_type
    return "custom"


def _rows(sums: dict[Any, Usage]) -> list[tuple[Any, ...]]:
    return [(key, u.agents, u.measured, u.turns, u.input_tokens, u.output_tokens, u.cache_read_tokens,
             "-" if u.cost_usd is None else f"${u.cost_usd:.4f}", f"{u.uncosted} without a cost" if u.uncosted else "")
            for key, u in sums.items()]  # fmt: skip


_COLUMNS = ["agents", "reported", "turns", "in", "out", "cached", "cost", "note"]


@command("usage")
def usage(project: ProjectOpt = None, since: SinceOpt = None, as_json: JsonOpt = False) -> None:
    """Sum the tokens and cost agents reported (Claude Code and aider a cost too, Codex tokens only, plain-text
    agents none) by task, by agent type and by preset, over every project or one (--project), for the agents that
    ended since --since. `reported` counts the agents whose CLI reported usage. With `[budgets]` configured, a
    budgets table: each cap's scope and key, what was spent, what sessions in progress reserve, the cap, and the share
    used."""
    after = _timestamp_or_fail(since)

    async def work(services: App) -> tuple[str, list[tuple[Agent, str]], Settings | None, list[Line]]:
        assert services.uow is not None, "the app was not built by bootstrap()"
        found = await services.tracker.resolve_project(project) if project is not None else None
        query = UsageQuery(services.uow)
        rows = await query.ended(found.id if found else None, after)
        caps: list[Line] = []
        if services.settings is not None:
            preset = lambda name: preset_of(services.settings, name)  # noqa: E731
            budgets = services.settings.budget_book()
            now = services.clock.now() if services.clock is not None else datetime.now(UTC)
            caps = await query.budgets(budgets, now, preset, found.id if found else None)
        return (found.name if found else "every project"), rows, services.settings, caps

    where, rows, settings, caps = run(work)
    agents = [a for a, _ in rows]
    task_of = {a.id: task for a, task in rows}
    groups = {
        "task": by(agents, lambda a: task_of[a.id]),
        "agent": by(agents, lambda a: a.agent_type),
        "preset": by(agents, lambda a: preset_of(settings, a.agent_type)),
    }
    if as_json:
        render.print_json({"project": where, "since": after, "total": total(agents).as_dict(),
                           **{f"by_{name}": {k: u.as_dict() for k, u in sums.items()}
                              for name, sums in groups.items()},
                           "budgets": [line.as_dict() for line in caps]})  # fmt: skip
        return
    scope = f"{where}" + (f", agents ended since {after.isoformat()}" if after else "")
    console.print(f"Usage of {scope}: {total(agents).line()}", markup=False, highlight=False, soft_wrap=True)
    for name, sums in groups.items():
        if sums:
            console.print(render.table(f"by {name}", [name, *_COLUMNS], _rows(sums), markup=False))
    if caps:
        console.print(render.table("budgets", ["scope", "key", "spent", "reserved", "limit", "used"], _caps(caps),
                                   markup=False))  # fmt: skip


def _caps(caps: list[Line]) -> list[tuple[Any, ...]]:
    def amount(unit: str, value: float) -> str:
        return f"${value:.2f}" if unit == "usd" else f"{int(value)} tokens"

    return [(c.scope, c.key, amount(c.unit, c.spent), amount(c.unit, c.reserved), amount(c.unit, c.limit),
             f"{c.share:.0%}") for c in caps]  # fmt: skip
