"""Policies that guard transitions (DESIGN §4): pure rules over a `GuardFacts` snapshot.

A policy has a name, a description, a priority (lower runs first), a severity (`error` blocks; `warning` and
`info` are recorded, not blocking), the triggers it applies to, and settings. `check(facts)` returns
violations, each with a message and a suggestion. Deny wins: any error-severity violation blocks, unless an
authorised operator overrode that policy, in which case its violations are recorded as `bypassed`.

Every rule here is a pure function of data. The application gathers the facts: database facts inside the
transition's transaction (with the relevant rows locked), slow facts (the worktree's git state, the test run
of `require_tests`) before it, and only when an applicable policy declares that it `needs` them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from taskgate.domain.entities import PlanStatus, TaskStatus
from taskgate.domain.errors import InvalidInput
from taskgate.domain.policies.facts import (
    NEEDS_APPROVALS,
    NEEDS_OPERATOR,
    NEEDS_TEST_RUN,
    NEEDS_TRACKER,
    NEEDS_WORKSPACE,
    GuardFacts,
    TestRun,
)
from taskgate.domain.policies.violations import Severity, Violation
from taskgate.domain.session_fsm import TransitionSpec
from taskgate.domain.states import Trigger

CONVENTIONAL_COMMIT = r"(build|chore|ci|docs|feat|fix|perf|refactor|revert|style|test)(\([A-Za-z0-9._/-]+\))?!?: \S.*"
ANY_BRANCH = r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*"


class Rule:
    """Behaviour shared by the built-in policies (a mixin: each dataclass declares its own fields)."""

    __slots__ = ()
    SETTINGS: ClassVar[tuple[str, ...]] = ()
    needs: ClassVar[frozenset[str]] = frozenset()
    name: str
    severity: Severity
    triggers: frozenset[Trigger]

    def applies_to(self, transition: TransitionSpec) -> bool:
        return transition.trigger in self.triggers

    @property
    def settings(self) -> dict[str, Any]:
        """The policy's own settings (not enabled/severity/priority/triggers), as configured."""
        return {key: getattr(self, key) for key in self.SETTINGS}

    def violation(self, message: str, suggestion: str = "") -> Violation:
        return Violation(self.name, message, self.severity, suggestion)


def _default(cls: type, key: str) -> Any:
    return cls.__dataclass_fields__[key].default  # type: ignore[attr-defined]


def _on(*triggers: Trigger) -> Any:
    return field(default_factory=lambda: frozenset(triggers))


@dataclass(slots=True)
class WipLimit(Rule):
    """At most `limit` sessions of one plan between planning and awaiting_merge."""

    SETTINGS: ClassVar[tuple[str, ...]] = ("limit",)
    limit: int = 3
    name: str = "wip_limit"
    description: str = "limits sessions in progress (planning..awaiting_merge) per plan"
    priority: int = 10
    severity: Severity = Severity.ERROR
    triggers: frozenset[Trigger] = _on(Trigger.START, Trigger.RETRY, Trigger.RESUME)

    def __post_init__(self) -> None:
        _at_least("limit", self.limit, 1)

    def applies_to(self, transition: TransitionSpec) -> bool:
        return transition.enters_wip and transition.trigger in self.triggers

    def check(self, facts: GuardFacts) -> list[Violation]:
        if facts.plan is None or facts.plan_sessions_in_wip < self.limit:
            return []
        return [
            self.violation(
                f"plan '{facts.plan.name}' already has {facts.plan_sessions_in_wip} of {self.limit} "
                "sessions in progress",
                "finish, suspend or cancel a session of this plan, then start again",
            )
        ]


@dataclass(slots=True)
class PlanOpen(Rule):
    """Work only starts on plans that are not closed."""

    name: str = "plan_open"
    description: str = "refuses new work on a closed plan"
    priority: int = 20
    severity: Severity = Severity.ERROR
    triggers: frozenset[Trigger] = _on(Trigger.CREATE, Trigger.START)

    def check(self, facts: GuardFacts) -> list[Violation]:
        if facts.plan is None or facts.plan.status != PlanStatus.CLOSED:
            return []
        return [self.violation(f"plan '{facts.plan.name}' is closed", "add the task to an open plan")]


@dataclass(slots=True)
class TaskUnblocked(Rule):
    """A task with an unfinished blocker is never started."""

    name: str = "task_unblocked"
    description: str = "every blocker of the task must be completed"
    priority: int = 30
    severity: Severity = Severity.ERROR
    triggers: frozenset[Trigger] = _on(Trigger.CREATE, Trigger.START)

    def check(self, facts: GuardFacts) -> list[Violation]:
        pending = [b for b in facts.blockers if b.status != TaskStatus.COMPLETED]
        if not pending:
            return []
        listed = ", ".join(f"{b.task_id} ({b.status.value})" for b in pending)
        return [
            self.violation(
                f"task {facts.task.id} is blocked by unfinished {listed}", "complete the blocking tasks first"
            )
        ]


@dataclass(slots=True)
class OneActiveSessionPerTask(Rule):
    """A task has at most one session that is not completed or cancelled (a partial unique index backs it)."""

    name: str = "one_active_session_per_task"
    description: str = "a task has at most one non-terminal session"
    priority: int = 5
    severity: Severity = Severity.ERROR
    triggers: frozenset[Trigger] = _on(Trigger.CREATE)

    def check(self, facts: GuardFacts) -> list[Violation]:
        if not facts.other_active_sessions:
            return []
        return [
            self.violation(
                f"task {facts.task.id} already has active session {facts.other_active_sessions[0]}",
                "continue that session, or cancel it before starting a new one",
            )
        ]


@dataclass(slots=True)
class OperatorCapacity(Rule):
    """An operator owns at most `max_active_sessions` sessions in progress (their operator record says how many)."""

    needs: ClassVar[frozenset[str]] = frozenset({NEEDS_OPERATOR})
    name: str = "operator_capacity"
    description: str = "an operator's sessions in progress stay within the operator's max_active_sessions"
    priority: int = 15
    severity: Severity = Severity.ERROR
    triggers: frozenset[Trigger] = _on(Trigger.START)

    def check(self, facts: GuardFacts) -> list[Violation]:
        operator = facts.operator
        if operator is None or facts.operator_sessions_in_wip < operator.max_active_sessions:
            return []
        return [
            self.violation(
                f"operator {operator.id} already has {facts.operator_sessions_in_wip} of "
                f"{operator.max_active_sessions} sessions in progress",
                "finish or suspend one of the operator's sessions, or raise the operator's max_active_sessions",
            )
        ]


@dataclass(slots=True)
class RequireTests(Rule):
    """The project's test command passed in the worktree on its current head commit.

    The command runs before the transition's transaction (see application/sessions/guards.py); a stored run of the same
    command on the same head of a clean worktree is reused when `reuse` is on. `message_lines` caps how many
    lines of the output's tail the violation quotes, joined with " | " to keep the message one line (the stored
    tail is longer).
    """

    SETTINGS: ClassVar[tuple[str, ...]] = ("reuse", "message_lines")
    needs: ClassVar[frozenset[str]] = frozenset({NEEDS_WORKSPACE, NEEDS_TEST_RUN})
    reuse: bool = True
    message_lines: int = 20
    name: str = "require_tests"
    description: str = "the project's test command passes in the worktree on the head commit"
    priority: int = 60
    severity: Severity = Severity.ERROR
    triggers: frozenset[Trigger] = _on(Trigger.APPROVE)

    def __post_init__(self) -> None:
        _at_least("message_lines", self.message_lines, 0)

    def check(self, facts: GuardFacts) -> list[Violation]:
        slow = facts.slow
        if not slow.test_command:
            note = f"no test command is configured for project '{facts.project.name}'; no tests were run"
            where = f"set test_command under [projects.{facts.project.name}] in config/taskgate.toml"
            return [Violation(self.name, note, Severity.INFO, where)]
        run, shown = slow.test_run, " ".join(slow.test_command)
        if run is None:
            return [
                self.violation(
                    f"`{shown}` was not run: {slow.test_note or 'no worktree'}",
                    "run the check again where the session has a worktree",
                )
            ]
        head = (run.head_commit or "?")[:12]
        if run.timed_out:
            return [
                self.violation(
                    f"`{shown}` timed out after {slow.test_timeout_s:g} s on {head} and was killed{self._tail(run)}",
                    "make the tests faster or raise test_timeout_s",
                )
            ]
        if run.exit_code != 0:
            status = "could not start" if run.exit_code is None else f"exited with {run.exit_code}"
            return [
                self.violation(
                    f"`{shown}` {status} on {head} after {run.duration_ms / 1000:.1f} s{self._tail(run)}",
                    "fix the failing tests on the branch, then approve again",
                )
            ]
        if slow.workspace is not None and run.head_commit != slow.workspace.head_commit:
            return [
                self.violation(
                    f"the tests passed on {head}, not on the current head {slow.workspace.head_commit[:12]}",
                    "check again to run them on the head",
                )
            ]
        return []

    def _tail(self, run: TestRun) -> str:
        lines = run.output_tail.rstrip().splitlines()[-self.message_lines :] if self.message_lines else []
        return ("; last lines of output: " + " | ".join(line.strip() for line in lines)) if lines else ""


@dataclass(slots=True)
class ReviewApproval(Rule):
    """At least `min_approvals` operators approved this verification (the approving operator counts)."""

    SETTINGS: ClassVar[tuple[str, ...]] = ("min_approvals",)
    needs: ClassVar[frozenset[str]] = frozenset({NEEDS_APPROVALS})
    min_approvals: int = 1
    name: str = "review_approval"
    description: str = "a minimum number of operators approve the verification"
    priority: int = 50
    severity: Severity = Severity.ERROR
    triggers: frozenset[Trigger] = _on(Trigger.APPROVE)

    def __post_init__(self) -> None:
        _at_least("min_approvals", self.min_approvals, 1)

    def check(self, facts: GuardFacts) -> list[Violation]:
        approvers = sorted(set(facts.approvals))
        if len(approvers) >= self.min_approvals:
            return []
        who = f" ({', '.join(approvers)})" if approvers else ""
        return [
            self.violation(
                f"{len(approvers)} of {self.min_approvals} required approvals{who}",
                "another operator with the approve permission must approve this verification",
            )
        ]


@dataclass(slots=True)
class CleanWorktree(Rule):
    """Nothing uncommitted, untracked or conflicted in the worktree: what is approved is what gets merged."""

    needs: ClassVar[frozenset[str]] = frozenset({NEEDS_WORKSPACE})
    name: str = "clean_worktree"
    description: str = "no modified, untracked or conflicted files in the session worktree"
    priority: int = 40
    severity: Severity = Severity.ERROR
    triggers: frozenset[Trigger] = _on(Trigger.APPROVE, Trigger.MERGE)

    def check(self, facts: GuardFacts) -> list[Violation]:
        ws = facts.slow.workspace
        if ws is None or ws.clean:
            return []
        parts = [
            f"{label} {_listed(files)}"
            for label, files in (("modified", ws.dirty), ("untracked", ws.untracked), ("conflicted", ws.conflicts))
            if files
        ]
        return [
            self.violation(
                f"the worktree is not clean: {'; '.join(parts)}", "commit or discard the changes in the worktree"
            )
        ]


@dataclass(slots=True)
class BranchNaming(Rule):
    """The session branch matches `pattern` (a regex; by default the shape of the configured branch pattern)."""

    SETTINGS: ClassVar[tuple[str, ...]] = ("pattern",)
    pattern: str = ANY_BRANCH
    name: str = "branch_naming"
    description: str = "the session branch name matches a regular expression"
    priority: int = 35
    severity: Severity = Severity.ERROR
    triggers: frozenset[Trigger] = _on(Trigger.APPROVE, Trigger.MERGE)
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._regex = _compile("pattern", self.pattern)

    def check(self, facts: GuardFacts) -> list[Violation]:
        branch = facts.session.branch_name if facts.session else None
        if branch is None or self._regex.fullmatch(branch):
            return []
        return [
            self.violation(
                f"branch '{branch}' does not match {self.pattern}",
                "rename the branch, or adjust policies.branch_naming.pattern",
            )
        ]


@dataclass(slots=True)
class CommitMessageFormat(Rule):
    """Every commit subject on the branch matches `pattern` (Conventional Commits by default)."""

    SETTINGS: ClassVar[tuple[str, ...]] = ("pattern", "allow_merge_commits")
    needs: ClassVar[frozenset[str]] = frozenset({NEEDS_WORKSPACE})
    pattern: str = CONVENTIONAL_COMMIT
    allow_merge_commits: bool = True
    name: str = "commit_message_format"
    description: str = "commit subjects on the branch follow Conventional Commits (type(scope): subject)"
    priority: int = 45
    severity: Severity = Severity.ERROR
    triggers: frozenset[Trigger] = _on(Trigger.APPROVE)
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._regex = _compile("pattern", self.pattern)

    def check(self, facts: GuardFacts) -> list[Violation]:
        ws = facts.slow.workspace
        commits = ws.commits if ws is not None else ()
        bad = [
            (sha, subject)
            for sha, subject in commits
            if not self._regex.fullmatch(subject) and not (self.allow_merge_commits and subject.startswith("Merge "))
        ]
        if not bad:
            return []
        listed = "; ".join(f"{sha[:8]} '{subject[:80]}'" for sha, subject in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        return [
            self.violation(
                f"{len(bad)} commit subject(s) do not match the format: {listed}{more}",
                "reword them (git rebase -i), e.g. 'feat(api): add the endpoint'",
            )
        ]


@dataclass(slots=True)
class TrackerInSync(Rule):
    """No merge while the external tracker (Beads) still shows an older status than taskgate: a write-back of the
    task is pending or failed (see `taskgate tracker status`)."""

    needs: ClassVar[frozenset[str]] = frozenset({NEEDS_TRACKER})
    name: str = "tracker_in_sync"
    description: str = "the external tracker has every status taskgate wrote for the task"
    priority: int = 60
    severity: Severity = Severity.ERROR
    triggers: frozenset[Trigger] = _on(Trigger.MERGE)

    def check(self, facts: GuardFacts) -> list[Violation]:
        if not facts.tracker_owed:
            return []
        return [self.violation(f"the tracker is behind: {'; '.join(facts.tracker_owed)}",
                               "taskgate tracker retry N once the tracker can take it, or dismiss it")]  # fmt: skip


"""The configurable built-ins, by name (`one_active_session_per_task` is always on: an index enforces it)."""


def _listed(files: Sequence[str], limit: int = 10) -> str:
    more = f" and {len(files) - limit} more" if len(files) > limit else ""
    return ", ".join(files[:limit]) + more


def _at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise InvalidInput(f"{key}: must be at least {low}, got {value}")


def _compile(key: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InvalidInput(f"{key}: invalid regular expression {pattern!r}: {exc}") from None
