"""Evaluates the configured policies for one transition (the seam issue 5's policy framework plugs into)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence

from taskgate.domain.policies import GuardFacts, Policy, Verdict
from taskgate.domain.session_fsm import TransitionSpec

FactsLoader = Callable[[], Awaitable[GuardFacts]]


class GuardEvaluator:
    """Runs every policy that applies to a transition, in priority order, and collects a `Verdict`."""

    def __init__(self, policies: Sequence[Policy]) -> None:
        self._policies = sorted(policies, key=lambda p: p.priority)

    @property
    def policies(self) -> list[Policy]:
        return list(self._policies)

    def applicable(self, transition: TransitionSpec) -> list[Policy]:
        """Policies that guard `transition`."""
        return [p for p in self._policies if p.applies_to(transition)]

    async def evaluate(self, transition: TransitionSpec, load_facts: FactsLoader) -> Verdict:
        """Check every applicable policy. Facts are loaded only when some policy applies (most triggers have none).

        All policies run even after a denial, so the log and the error list every reason at once.
        """
        verdict = Verdict()
        policies = self.applicable(transition)
        if not policies:
            return verdict
        facts = await load_facts()
        for policy in policies:
            found = policy.check(facts)
            if inspect.isawaitable(found):
                found = await found
            verdict.record(policy, found)
        return verdict
