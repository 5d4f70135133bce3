"""What a policy sees and answers: the facts of a transition (gathered by the engine; the slow ones before its
transaction), the Policy protocol, and the verdict over every applicable policy."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import ClassVar, Protocol, runtime_checkable

from taskgate.domain.budgets import Spent
from taskgate.domain.entities import GuardResult, Operator, Plan, Project, Session, Task, TaskStatus
from taskgate.domain.policies.violations import Severity, Violation
from taskgate.domain.session_fsm import TransitionSpec
from taskgate.domain.states import Trigger

# What a policy may ask the application to gather besides the always-loaded task/plan/project facts.
NEEDS_OPERATOR = "operator"  # the session's operator and how many of its sessions are in WIP (database)


NEEDS_APPROVALS = "approvals"  # operators that approved this verification (database)


NEEDS_WORKSPACE = "workspace"  # the worktree's git state (slow: git, gathered before the transaction)


NEEDS_TEST_RUN = "test_run"  # the project's test command run in the worktree (slow: gathered before it too)


NEEDS_TRACKER = "tracker"  # status writes still owed to the external tracker for the task (database)


NEEDS_SPEND = "spend"  # the project's agents' reported spend and the sessions holding reservations (database)


SLOW_NEEDS = frozenset({NEEDS_WORKSPACE, NEEDS_TEST_RUN})


@dataclass(frozen=True, slots=True)
class BlockerFact:
    """A task that blocks the guarded task, with its current status."""

    task_id: str
    status: TaskStatus


@dataclass(frozen=True, slots=True)
class WorkspaceFacts:
    """The session worktree as git sees it: head of the branch, uncommitted files, commits on the branch."""

    branch: str
    head_commit: str
    dirty: tuple[str, ...] = ()
    untracked: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    commits: tuple[tuple[str, str], ...] = ()  # (sha, subject), newest first, branch commits not on base

    @property
    def clean(self) -> bool:
        return not (self.dirty or self.untracked or self.conflicts)


@dataclass(frozen=True, slots=True)
class TestRun:
    """One run of a project's test command in a session worktree (`require_tests`), as stored in `test_runs`.

    `exit_code` is None when the command timed out (its process group was killed) or could not start.
    """

    __test__: ClassVar[bool] = False  # not a pytest class

    session_id: str
    session_version: int
    command: tuple[str, ...]
    exit_code: int | None
    timed_out: bool
    duration_ms: int
    output_tail: str
    head_commit: str | None
    at: datetime
    id: int | None = None

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True, slots=True)
class SlowFacts:
    """Facts gathered before the transition's transaction (git and the test run), handed into it.

    `test_run_reused` says whether a stored run for the same head was used instead of running the command;
    `test_note` says why there is no run when there is none (no worktree, tests not run in a dry run).
    """

    workspace: WorkspaceFacts | None = None
    test_command: tuple[str, ...] = ()
    test_timeout_s: float = 0.0
    test_run: TestRun | None = None
    test_run_reused: bool | None = None
    test_note: str = ""


NO_SLOW_FACTS = SlowFacts()


@dataclass(frozen=True, slots=True)
class SpendFacts:
    """What the project's agents reported they spent, and the sessions holding a reservation (`domain/budgets.py`),
    read under the project's row lock."""

    spent: tuple[Spent, ...] = ()
    reserving: tuple[tuple[str, str], ...] = ()  # (session id, task id)
    today: date | None = None


@dataclass(frozen=True, slots=True)
class GuardFacts:
    """Everything a built-in policy may look at. Fields a policy does not `need` keep their defaults."""

    transition: TransitionSpec
    task: Task
    plan: Plan | None
    project: Project
    session: Session | None = None
    blockers: tuple[BlockerFact, ...] = ()
    plan_sessions_in_wip: int = 0
    other_active_sessions: tuple[str, ...] = ()
    actor: str = "system"
    operator: Operator | None = None
    operator_sessions_in_wip: int = 0
    approvals: tuple[str, ...] = ()
    spend: SpendFacts | None = None  # budgets' facts (NEEDS_SPEND)
    tracker_owed: tuple[str, ...] = ()  # write-backs still owed to the tracker, one line each (tracker_in_sync)
    slow: SlowFacts = NO_SLOW_FACTS


@runtime_checkable
class Policy(Protocol):
    """A guard. `check` may be sync (pure rules) or async. Built-ins also carry `triggers`, `settings` and
    `needs` (see `Rule`); the engine treats a policy without `needs` as needing nothing beyond the basics."""

    name: str
    description: str
    priority: int
    severity: Severity

    def applies_to(self, transition: TransitionSpec) -> bool: ...

    def check(self, facts: GuardFacts) -> Sequence[Violation] | Awaitable[Sequence[Violation]]: ...


def needs_of(policy: Policy) -> frozenset[str]:
    """What a policy asks the engine to gather (nothing beyond the basics for policies that do not say)."""
    return getattr(policy, "needs", frozenset())


def triggers_of(policy: Policy) -> frozenset[Trigger] | None:
    """The triggers a policy names, or None when it only answers `applies_to` (then assume any)."""
    return getattr(policy, "triggers", None)


@dataclass(slots=True)
class Verdict:
    """The outcome of evaluating every applicable policy on one transition.

    `violations` count (errors block); `bypassed` are the violations of policies an operator overrode: recorded
    in the results with `overridden: true`, never blocking.
    """

    results: list[GuardResult] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    bypassed: list[Violation] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        """Deny wins: any error-severity violation blocks."""
        return not any(v.severity == Severity.ERROR for v in self.violations)

    def record(self, policy: Policy, violations: Iterable[Violation], *, overridden: bool = False) -> None:
        found = list(violations)
        (self.bypassed if overridden else self.violations).extend(found)
        if not found:
            self.results.append(GuardResult(policy.name, True, policy.severity.value))
        for v in found:
            self.results.append(GuardResult(v.policy, False, v.severity.value, v.message, v.suggestion, overridden))

    def blocking(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == Severity.ERROR]
