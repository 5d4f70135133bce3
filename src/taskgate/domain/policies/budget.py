"""The `budget` policy: a start (or a retry, a resume) reserves the session's expected spend under every cap that
applies to it, or is refused with the cap it would exceed (`domain/budgets.py` holds the arithmetic)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from taskgate.domain.budgets import NO_BUDGETS, Budgets, Subject, lines, refusals
from taskgate.domain.policies.facts import NEEDS_SPEND, GuardFacts
from taskgate.domain.policies.rules import Rule, _on
from taskgate.domain.policies.violations import Severity, Violation
from taskgate.domain.session_fsm import TransitionSpec
from taskgate.domain.states import Trigger


@dataclass(slots=True)
class BudgetCap(Rule):
    """Refuses a transition into progress when a budget cannot cover the session's expected spend. Configured by
    `[budgets]` (not `[policies.budget]`); `presets` maps agent types to their presets for the per-preset caps."""

    needs: ClassVar[frozenset[str]] = frozenset({NEEDS_SPEND})
    budgets: Budgets = NO_BUDGETS
    presets: Mapping[str, str] = field(default_factory=dict)
    name: str = "budget"
    description: str = "a start reserves the session's expected spend within the configured budgets"
    priority: int = 15
    severity: Severity = Severity.ERROR
    triggers: frozenset[Trigger] = _on(Trigger.START, Trigger.RETRY, Trigger.RESUME)

    def applies_to(self, transition: TransitionSpec) -> bool:
        return self.budgets.set and transition.enters_wip and transition.trigger in self.triggers

    def check(self, facts: GuardFacts) -> list[Violation]:
        spend = facts.spend
        if spend is None or spend.today is None or facts.session is None:
            return []
        config = self.budgets.of(facts.project.name)
        subject = Subject(facts.session.id, facts.task.id, facts.project.name)
        caps = lines(config, subject, spend.spent, spend.reserving, spend.today, self._preset)
        suggestion = "raise the budget in [budgets] (or the project's), or wait for the day's spend to reset"
        return [self.violation(reason, suggestion) for reason in refusals(config, caps)]

    def _preset(self, agent_type: str) -> str:
        return self.presets.get(agent_type, agent_type)
