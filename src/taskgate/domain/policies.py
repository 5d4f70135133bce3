"""Policy rules that guard transitions: a pure seam the full policy framework (issue 5) builds on.

A policy looks only at a `GuardFacts` snapshot that the application gathered inside the transition's
transaction (with the relevant rows locked), so every rule here is a pure function of data.
Deny wins: any violation of `error` severity blocks; warnings and info are recorded, not blocking.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from taskgate.domain.entities import GuardResult, Plan, PlanStatus, Project, Session, Task, TaskStatus
from taskgate.domain.session_fsm import TransitionSpec
from taskgate.domain.states import Trigger


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class Violation:
    """One reason a policy objects, with what the caller can do about it."""

    policy: str
    message: str
    severity: Severity = Severity.ERROR
    suggestion: str = ""

    def describe(self) -> str:
        tail = f" (suggestion: {self.suggestion})" if self.suggestion else ""
        return f"{self.policy}: {self.message}{tail}"


@dataclass(frozen=True, slots=True)
class BlockerFact:
    """A task that blocks the guarded task, with its current status."""

    task_id: str
    status: TaskStatus


@dataclass(frozen=True, slots=True)
class GuardFacts:
    """Everything a built-in policy may look at, read under the transaction's locks."""

    transition: TransitionSpec
    task: Task
    plan: Plan | None
    project: Project
    session: Session | None = None
    blockers: tuple[BlockerFact, ...] = ()
    plan_sessions_in_wip: int = 0
    other_active_sessions: tuple[str, ...] = ()
    actor: str = "system"


@runtime_checkable
class Policy(Protocol):
    """A guard. `check` may be sync (pure rules) or async (rules that need I/O, e.g. running tests)."""

    name: str
    description: str
    priority: int
    severity: Severity

    def applies_to(self, transition: TransitionSpec) -> bool: ...

    def check(self, facts: GuardFacts) -> Sequence[Violation] | Awaitable[Sequence[Violation]]: ...


@dataclass(slots=True)
class WipLimit:
    """At most `limit` sessions of one plan between planning and awaiting_merge."""

    limit: int = 3
    name: str = "wip_limit"
    description: str = "limits sessions in progress (planning..awaiting_merge) per plan"
    priority: int = 10
    severity: Severity = Severity.ERROR

    def applies_to(self, transition: TransitionSpec) -> bool:
        return transition.enters_wip

    def check(self, facts: GuardFacts) -> list[Violation]:
        if facts.plan is None or facts.plan_sessions_in_wip < self.limit:
            return []
        return [
            Violation(
                self.name,
                f"plan '{facts.plan.name}' already has {facts.plan_sessions_in_wip} of {self.limit} "
                "sessions in progress",
                self.severity,
                "finish, suspend or cancel a session of this plan, then start again",
            )
        ]


@dataclass(slots=True)
class PlanOpen:
    """Work only starts on plans that are not closed."""

    name: str = "plan_open"
    description: str = "refuses new work on a closed plan"
    priority: int = 20
    severity: Severity = Severity.ERROR

    def applies_to(self, transition: TransitionSpec) -> bool:
        return transition.trigger in (Trigger.CREATE, Trigger.START)

    def check(self, facts: GuardFacts) -> list[Violation]:
        if facts.plan is None or facts.plan.status != PlanStatus.CLOSED:
            return []
        return [
            Violation(self.name, f"plan '{facts.plan.name}' is closed", self.severity, "add the task to an open plan")
        ]


@dataclass(slots=True)
class TaskUnblocked:
    """A task with an unfinished blocker is never started."""

    name: str = "task_unblocked"
    description: str = "every blocker of the task must be completed"
    priority: int = 30
    severity: Severity = Severity.ERROR

    def applies_to(self, transition: TransitionSpec) -> bool:
        return transition.trigger in (Trigger.CREATE, Trigger.START)

    def check(self, facts: GuardFacts) -> list[Violation]:
        pending = [b for b in facts.blockers if b.status != TaskStatus.COMPLETED]
        if not pending:
            return []
        listed = ", ".join(f"{b.task_id} ({b.status.value})" for b in pending)
        return [
            Violation(
                self.name,
                f"task {facts.task.id} is blocked by unfinished {listed}",
                self.severity,
                "complete the blocking tasks first",
            )
        ]


@dataclass(slots=True)
class OneActiveSessionPerTask:
    """A task has at most one session that is not completed or cancelled."""

    name: str = "one_active_session_per_task"
    description: str = "a task has at most one non-terminal session"
    priority: int = 5
    severity: Severity = Severity.ERROR

    def applies_to(self, transition: TransitionSpec) -> bool:
        return transition.trigger == Trigger.CREATE

    def check(self, facts: GuardFacts) -> list[Violation]:
        if not facts.other_active_sessions:
            return []
        return [
            Violation(
                self.name,
                f"task {facts.task.id} already has active session {facts.other_active_sessions[0]}",
                self.severity,
                "continue that session, or cancel it before starting a new one",
            )
        ]


def default_policies(wip_limit: int = 3) -> list[Policy]:
    """The built-in guards shipped with the session engine, in priority order."""
    return sorted([WipLimit(limit=wip_limit), PlanOpen(), TaskUnblocked(), OneActiveSessionPerTask()], key=_priority)


def _priority(policy: Policy) -> int:
    return policy.priority


@dataclass(slots=True)
class Verdict:
    """The outcome of evaluating every applicable policy on one transition."""

    results: list[GuardResult] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        """Deny wins: any error-severity violation blocks."""
        return not any(v.severity == Severity.ERROR for v in self.violations)

    def record(self, policy: Policy, violations: Iterable[Violation]) -> None:
        found = list(violations)
        self.violations.extend(found)
        if not found:
            self.results.append(GuardResult(policy.name, True, policy.severity.value))
        for v in found:
            self.results.append(GuardResult(v.policy, False, v.severity.value, v.message, v.suggestion))

    def blocking(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == Severity.ERROR]
