"""Dispatch's bounds: how many sessions it keeps running (per project, per task label, per agent preset), when it
stops because the operator's review queue is full, and how it retries a task whose sessions failed.

Pure rules over counts; application/trackers/dispatch.py reads the counts once per pass, adds each session it
starts, and asks `refusal` before each start. One process dispatches at a time (the sweeper's lease), so the
counts it holds are not raced by another dispatcher; a person's `session start` is not bound by these caps (the
`wip_limit` policy is the hard bound for everyone).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from taskgate.domain.states import SessionState

RUNNING = frozenset({SessionState.PLANNING, SessionState.EXECUTING})  # where agents work: what max_running counts
AWAITING_DECISION = frozenset({SessionState.VERIFYING})  # where a session waits for the operator's decision
FAILED = frozenset({SessionState.FAILED, SessionState.ROLLED_BACK})  # a dispatched attempt that did not finish
MAX_RETRY_DELAY = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class DispatchCaps:
    """`[dispatch]`'s bounds; 0 (or a label or preset left out) means no bound."""

    max_running: int = 0  # per project: sessions in planning or executing
    per_label: Mapping[str, int] = field(default_factory=dict)  # sessions running on tasks with the label
    per_agent: Mapping[str, int] = field(default_factory=dict)  # sessions running a workflow that uses the preset
    max_awaiting_decision: int = 0  # stop dispatching while this many sessions wait in verifying
    max_retries: int = 3  # a task whose dispatched sessions failed this many times + 1 is left to the operator
    retry_base_s: float = 60.0  # the wait after the first failure; doubled after each further one (a day at most)


@dataclass(slots=True)
class Load:
    """What runs now, as dispatch counts it: running sessions by project, by task label and by agent preset, and
    the sessions waiting for a decision."""

    running: Counter[int] = field(default_factory=Counter)
    labels: Counter[str] = field(default_factory=Counter)
    agents: Counter[str] = field(default_factory=Counter)
    awaiting: int = 0

    def add(self, project_id: int, labels: Iterable[str], agents: Iterable[str]) -> None:
        """One more running session (one just started, or one found running)."""
        self.running[project_id] += 1
        self.labels.update(set(labels))
        self.agents.update(set(agents))


def refusal(
    caps: DispatchCaps, load: Load, project_id: int, labels: Iterable[str], agents: Iterable[str]
) -> str | None:
    """Why a session for a task (its labels, its workflow's agent presets) may not start now, or None."""
    if caps.max_awaiting_decision and load.awaiting >= caps.max_awaiting_decision:
        return (f"review queue full: {load.awaiting} session(s) wait for a decision "
                f"(max_awaiting_decision {caps.max_awaiting_decision})")  # fmt: skip
    if caps.max_running and load.running[project_id] >= caps.max_running:
        return f"no slot: {load.running[project_id]} running in the project (max_running {caps.max_running})"
    for label in sorted(set(labels)):
        cap = caps.per_label.get(label, 0)
        if cap and load.labels[label] >= cap:
            return f"no slot for label {label}: {load.labels[label]} running (max_running_per_label {cap})"
    for agent in sorted(set(agents)):
        cap = caps.per_agent.get(agent, 0)
        if cap and load.agents[agent] >= cap:
            return f"no slot for agent {agent}: {load.agents[agent]} running (max_running_per_agent {cap})"
    return None


@dataclass(frozen=True, slots=True)
class RetryVerdict:
    """A task whose dispatched sessions failed: `gave_up` (left to the operator), or wait `until`, or go (both
    unset)."""

    failures: int
    gave_up: bool = False
    until: datetime | None = None

    def why(self) -> str:
        if self.gave_up:
            return (f"failed {self.failures} time(s), more than max_retries allows: dispatch stopped and leaves it to "
                    "the operator (look at why, then `taskgate session start` it)")  # fmt: skip
        if self.until is not None:
            return f"failed {self.failures} time(s): retried after {self.until.isoformat(timespec='seconds')}"
        return ""


def retry_verdict(caps: DispatchCaps, failures: int, last_failed_at: datetime | None, now: datetime) -> RetryVerdict:
    """Exponential back-off between dispatched attempts of one task, and a maximum: after `max_retries` retries
    (`max_retries + 1` failed attempts) dispatch stops and asks, instead of retrying forever."""
    if failures == 0 or last_failed_at is None:
        return RetryVerdict(failures)
    if failures > caps.max_retries:
        return RetryVerdict(failures, gave_up=True)
    delay = min(timedelta(seconds=caps.retry_base_s * 2 ** (failures - 1)), MAX_RETRY_DELAY)
    until = last_failed_at + delay
    return RetryVerdict(failures, until=until if until > now else None)
