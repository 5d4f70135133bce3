"""Usage adds up: what agents' CLIs reported, summed per agent, per run and in all, saying what is unknown."""

from __future__ import annotations

from taskgate.domain.agents.usage import Usage, by, session_usage, total
from taskgate.domain.entities import Agent, AgentStatus

CLAUDE = {"final_message": "done", "turns": 4, "input_tokens": 400, "output_tokens": 80, "cache_read_tokens": 10,
          "cost_usd": 0.0032}  # fmt: skip
CODEX = {"final_message": "done", "turns": 1, "input_tokens": 300, "output_tokens": 20, "cost_usd": None}
SCRIPT = {"final_message": "wrote work/a.md"}  # a plain-text agent: its result, no usage


def agent(ident: str, run: int, report: dict | None) -> Agent:
    return Agent(ident, "s", "t", ["t"], AgentStatus.COMPLETED, run=run, report=report)


def test_a_sessions_usage_is_summed_per_run_and_in_all():
    agents = [agent("a", 1, CLAUDE), agent("b", 1, CODEX), agent("c", 2, SCRIPT), agent("d", 2, None)]
    summed = total(agents)
    assert summed == Usage(agents=4, measured=2, turns=5, input_tokens=700, output_tokens=100, cache_read_tokens=10,
                           cost_usd=0.0032, uncosted=1)  # fmt: skip
    assert summed.line() == ("4 agents, 5 turns, 700 in / 100 out tokens (10 cached), $0.0032 (1 reported no cost); "
                             "2 reported none")  # fmt: skip
    runs = by(agents, lambda a: a.run)
    assert runs[1].turns == 5 and runs[2] == Usage(agents=2)
    assert runs[2].line() == "2 agents, no usage reported"
    data = session_usage(agents)
    assert data["total"] == summed.as_dict() and set(data["runs"]) == {"1", "2"} and data["agents"]["c"]["agents"] == 1


def test_costs_add_only_where_reported():
    assert (Usage.of(CODEX) + Usage.of(CODEX)).line() == "2 agents, 2 turns, 600 in / 40 out tokens, cost not reported"
    assert (Usage.of(CLAUDE) + Usage.of(CLAUDE)).cost_usd == 0.0064
    assert Usage.of({"turns": "many", "cost_usd": -1}) == Usage(agents=1)  # nothing valid reported
