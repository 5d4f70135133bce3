"""Usage that adds up (pure): the turns, tokens and cost agents reported, summed per agent, per run, per session, and
by any key (task, agent type, preset) for `taskgate usage`.

An agent's usage is what its CLI reported (`AgentReport`, stored with the agent when it ended): Claude Code reports
a cost, Codex and aider tokens only (aider's cost when it prints one), plain-text agents nothing. A sum says how many
of its agents reported usage and how many of those reported no cost, so `$0.0064` is never read as the whole bill
when some agents' costs are unknown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from taskgate.domain.agents.reports import AgentReport
from taskgate.domain.entities import Agent


@dataclass(frozen=True, slots=True)
class Usage:
    """A sum of agents' reported usage."""

    agents: int = 0  # agents summed
    measured: int = 0  # of them, those whose CLI reported usage
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cost_usd: float | None = None  # the sum of the costs reported; None when no agent reported one
    uncosted: int = 0  # agents that reported usage but no cost (Codex)

    @classmethod
    def of(cls, report: Mapping[str, Any] | None) -> Usage:
        """One agent's usage, from its stored report (None or a report without usage: an agent that reported
        none)."""
        parsed = AgentReport.from_dict(report)
        if parsed is None or not parsed.measured():
            return cls(agents=1)
        return cls(1, 1, parsed.turns, parsed.input_tokens, parsed.output_tokens, parsed.cache_read_tokens,
                   parsed.cost_usd, int(parsed.cost_usd is None))  # fmt: skip

    def __add__(self, other: Usage) -> Usage:
        costs = [c for c in (self.cost_usd, other.cost_usd) if c is not None]
        return Usage(
            self.agents + other.agents, self.measured + other.measured, self.turns + other.turns,
            self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens, sum(costs) if costs else None,
            self.uncosted + other.uncosted,
        )  # fmt: skip

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """`2 agents, 5 turns, 800 in / 160 out tokens, $0.0064 (1 reported no cost)`; `1 agent, no usage
        reported` when none did."""
        agents = f"{self.agents} agent{'' if self.agents == 1 else 's'}"
        if not self.measured:
            return f"{agents}, no usage reported"
        tokens = f"{self.input_tokens} in / {self.output_tokens} out tokens"
        if self.cache_read_tokens:
            tokens += f" ({self.cache_read_tokens} cached)"
        cost = f", ${self.cost_usd:.4f}" if self.cost_usd is not None else ", cost not reported"
        unknown = f" ({self.uncosted} reported no cost)" if self.uncosted and self.cost_usd is not None else ""
        silent = f"; {self.agents - self.measured} reported none" if self.measured < self.agents else ""
        return f"{agents}, {self.turns} turns, {tokens}{cost}{unknown}{silent}"


def total(agents: Iterable[Agent]) -> Usage:
    """The usage of all `agents`, summed."""
    return sum((Usage.of(a.report) for a in agents), Usage())


def by(agents: Iterable[Agent], key: Callable[[Agent], Any]) -> dict[Any, Usage]:
    """The agents' usage summed per `key(agent)`, keys in the order first seen."""
    sums: dict[Any, Usage] = {}
    for agent in agents:
        k = key(agent)
        sums[k] = sums.get(k, Usage()) + Usage.of(agent.report)
    return sums


def session_usage(agents: Iterable[Agent]) -> dict[str, Any]:
    """A session's usage as plain data: `total`, `runs` (run number → usage) and `agents` (agent id → usage)."""
    listed = list(agents)
    return {
        "total": total(listed).as_dict(),
        "runs": {str(run): u.as_dict() for run, u in sorted(by(listed, lambda a: a.run).items())},
        "agents": {a.id: Usage.of(a.report).as_dict() for a in listed},
    }
