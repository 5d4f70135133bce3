"""The forge loop's rules (docs/forge.md): what a pull request's state means for its session.

A session of a project with a `[forge]` is pushed and opened as a pull request when it is approved. From then on
the forge's view of the pull request (its head, its checks, its reviews, whether it merges) is *observed*, and each
observation is *decided* here into one step: wait, send the agents back (a failed check, a review asking for
changes, a conflict with the base), ask the operator (a head the operator has not approved is green, the rounds are
spent, the pull request was closed or moved by someone else), merge it, or record that it was merged on the forge.

Pure data and functions: the application layer observes, stores, decides with `decide` and fires the trigger the
step names, with the step's `reason` as the transition's reason (so the audit trail reads "CI failed (lint): sent
back"). The sub-states of `awaiting_merge` a pull request passes through are `PrStatus`; `SUBSTATES` is their
table, drawn by `taskgate fsm` inside `awaiting_merge`.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from enum import StrEnum

FAILED_CONCLUSIONS = frozenset({"failure", "timed_out", "cancelled", "action_required", "startup_failure", "stale"})
PASSED_CONCLUSIONS = frozenset({"success", "neutral", "skipped"})
MAX_LOG_TAIL = 8000  # characters of a failed check's log tail sent to the agent: its end is where the error is


@dataclass(frozen=True, slots=True)
class CheckRun:
    """One check on a commit (a CI job). `conclusion` is None until it completed."""

    id: int
    name: str
    status: str  # queued | in_progress | completed
    conclusion: str | None = None
    details_url: str = ""
    summary: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "completed" and (self.conclusion or "") in FAILED_CONCLUSIONS

    @property
    def passed(self) -> bool:
        return self.status == "completed" and (self.conclusion or "") in PASSED_CONCLUSIONS


@dataclass(frozen=True, slots=True)
class Review:
    """A review as the forge reports it, on the commit it reviewed."""

    id: int
    author: str
    state: str  # APPROVED | CHANGES_REQUESTED | COMMENTED | DISMISSED | PENDING
    body: str
    commit: str


@dataclass(frozen=True, slots=True)
class LineComment:
    """A review comment on a line of a file, on the commit it was made on."""

    id: int
    author: str
    path: str
    line: int | None
    body: str
    commit: str


@dataclass(frozen=True, slots=True)
class PullRequest:
    """The forge's pull request: where it stands."""

    number: int
    url: str
    state: str  # open | closed
    head: str  # the head commit on the forge now
    head_branch: str
    base_branch: str
    merged: bool = False
    merged_by: str | None = None
    merge_commit: str | None = None
    mergeable: bool | None = None  # None: the forge has not computed it yet
    draft: bool = False
    closed_by: str | None = None


@dataclass(frozen=True, slots=True)
class Observation:
    """What one look at the forge saw of a pull request: it, the checks on its head, its reviews and line comments."""

    pull: PullRequest
    checks: tuple[CheckRun, ...] = ()
    reviews: tuple[Review, ...] = ()
    comments: tuple[LineComment, ...] = ()


class PrStatus(StrEnum):
    """The sub-states of `awaiting_merge` (and what the operator sees of a pull request in verifying)."""

    PUSHING = "pushing"  # approved: the branch is being pushed and the pull request opened
    CHECKS_PENDING = "checks_pending"
    CHECKS_FAILED = "checks_failed"
    CHANGES_REQUESTED = "changes_requested"
    CONFLICT = "conflict"
    CHECKS_GREEN = "checks_green"  # green on a head the operator has not approved yet
    MERGEABLE = "mergeable"  # green on the approved head: taskgate merges it through the forge
    MERGED = "merged"
    CLOSED = "closed"
    HEAD_MOVED = "head_moved"  # someone else pushed to the branch: never merged by taskgate


P = PrStatus
SUBSTATES: tuple[tuple[PrStatus, PrStatus, str], ...] = (
    (P.PUSHING, P.CHECKS_PENDING, "pushed, pull request open"),
    (P.CHECKS_PENDING, P.CHECKS_FAILED, "a check failed"),
    (P.CHECKS_PENDING, P.CONFLICT, "conflicts with the base"),
    (P.CHECKS_PENDING, P.CHANGES_REQUESTED, "a review asks for changes"),
    (P.CHECKS_PENDING, P.CHECKS_GREEN, "checks passed, head not approved"),
    (P.CHECKS_PENDING, P.MERGEABLE, "checks passed on the approved head"),
    (P.CHECKS_PENDING, P.HEAD_MOVED, "someone else pushed"),
    (P.CHECKS_PENDING, P.CLOSED, "closed on the forge"),
    (P.CHECKS_PENDING, P.MERGED, "merged on the forge"),
    (P.MERGEABLE, P.MERGED, "merged through the forge"),
)
"""The sub-states of `awaiting_merge` as rows (from, to, what happened), for the diagram. What each leads to
outside `awaiting_merge` is the session table's: ci_failed, review_changes and rebase (→ executing), reverify
(→ verifying: the operator decides), merge and forge_merged (→ merged)."""


class StepKind(StrEnum):
    """What a session does about an observation."""

    WAIT = "wait"
    MERGE = "merge"  # fire `merge`: through the forge, compare-and-swap on the approved head
    FORGE_MERGED = "forge_merged"
    CI_FAILED = "ci_failed"
    REVIEW_CHANGES = "review_changes"
    REBASE = "rebase"
    ASK_OPERATOR = "reverify"  # fire `reverify`: back to verifying, the reason says what to decide


@dataclass(frozen=True, slots=True)
class Rounds:
    """How many times the forge has sent the agents back, per cause."""

    ci: int = 0
    review: int = 0
    rebase: int = 0

    def after(self, kind: StepKind) -> Rounds:
        """The counts once a round of `kind` was sent."""
        return Rounds(
            self.ci + (kind == StepKind.CI_FAILED),
            self.review + (kind == StepKind.REVIEW_CHANGES),
            self.rebase + (kind == StepKind.REBASE),
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """`[forge]`'s bounds: rounds per cause before the operator is asked, checks a head needs, merge on green."""

    max_ci_rounds: int = 3
    max_review_rounds: int = 3
    max_rebase_rounds: int = 2
    min_checks: int = 1
    auto_merge: bool = True


@dataclass(frozen=True, slots=True)
class Step:
    """One decision: the trigger to fire (by `kind`), why (the transition's reason), and the agents' instructions."""

    kind: StepKind
    status: PrStatus
    reason: str = ""
    instructions: str = ""
    failed_checks: tuple[CheckRun, ...] = field(default=())

    @property
    def acts(self) -> bool:
        return self.kind != StepKind.WAIT


def decide(
    seen: Observation, *, state: str, pushed: str | None, approved: str | None, rounds: Rounds, limits: Limits
) -> Step:
    """The step a session in `state` (awaiting_merge or verifying) takes on `seen`, given the head taskgate pushed,
    the head the operator approved, and the rounds already sent. In verifying the operator is deciding already:
    only a merge on the forge and a review's changes act there; the rest waits for the operator's decision."""
    pull = seen.pull
    status = status_of(seen, pushed=pushed, approved=approved, limits=limits)
    if pull.merged:
        by = f" by {pull.merged_by}" if pull.merged_by else ""
        return Step(StepKind.FORGE_MERGED, status, f"PR #{pull.number} merged on the forge{by}")
    if status == P.CHANGES_REQUESTED and (state == "verifying" or status_is_the_cause(seen, pushed)):
        return _review_round(seen, status, rounds, limits)
    if state != "awaiting_merge":
        return Step(StepKind.WAIT, status)
    if status == P.CLOSED:
        by = f" by {pull.closed_by}" if pull.closed_by else ""
        return _ask(status, f"PR #{pull.number} closed on the forge without merge{by}: the operator decides")
    if status == P.HEAD_MOVED:
        return _ask(status, f"PR #{pull.number}'s head moved to {pull.head[:12]} on the forge (taskgate pushed "
                            f"{(pushed or '')[:12]}): not merged, the operator decides")  # fmt: skip
    if status == P.CONFLICT:
        return _rebase_round(pull, status, rounds, limits)
    if status == P.CHECKS_FAILED:
        return _ci_round(seen, status, rounds, limits)
    if status == P.CHECKS_GREEN:
        return _ask(
            status, f"checks green on {pull.head[:12]} (not the approved head): the operator approves the merge"
        )
    if status == P.MERGEABLE and limits.auto_merge:
        return Step(
            StepKind.MERGE, status, f"checks green on the approved head {pull.head[:12]}: merged through the forge"
        )
    return Step(StepKind.WAIT, status)


def status_is_the_cause(seen: Observation, pushed: str | None) -> bool:
    """A review's changes act in awaiting_merge only on the head taskgate pushed (a moved head asks the operator)."""
    return pushed is None or seen.pull.head == pushed


def status_of(seen: Observation, *, pushed: str | None, approved: str | None, limits: Limits) -> PrStatus:
    """The pull request's sub-state, in order of precedence: merged, closed, moved by someone else, conflicting,
    a failed check, changes asked for, checks still running, green (on the approved head: mergeable)."""
    pull = seen.pull
    if pull.merged:
        return P.MERGED
    if pull.state != "open":
        return P.CLOSED
    if pushed is not None and pull.head != pushed:
        return P.HEAD_MOVED
    if pull.mergeable is False:
        return P.CONFLICT
    checks = head_checks(seen)
    if any(c.failed for c in checks):
        return P.CHECKS_FAILED
    if changes_asked(seen):
        return P.CHANGES_REQUESTED
    if len(checks) < limits.min_checks or not all(c.passed for c in checks) or pull.mergeable is None:
        return P.CHECKS_PENDING
    return P.MERGEABLE if approved == pull.head else P.CHECKS_GREEN


def head_checks(seen: Observation) -> tuple[CheckRun, ...]:
    """The checks of the head, the latest run of each name (a re-run replaces the earlier one)."""
    latest: dict[str, CheckRun] = {}
    for check in seen.checks:
        if check.name not in latest or check.id > latest[check.name].id:
            latest[check.name] = check
    return tuple(sorted(latest.values(), key=lambda c: c.name))


def changes_asked(seen: Observation) -> tuple[tuple[Review, ...], tuple[LineComment, ...]] | None:
    """The reviews asking for changes and the line comments, on the head the forge shows now (what was asked of an
    older head was answered by the round that pushed this one), or None when nothing is asked."""
    head = seen.pull.head
    latest: dict[str, Review] = {}
    for review in sorted(seen.reviews, key=lambda r: r.id):
        if review.state in ("APPROVED", "CHANGES_REQUESTED", "DISMISSED"):
            latest[review.author] = review
    asking = tuple(r for r in latest.values() if r.state == "CHANGES_REQUESTED" and r.commit == head)
    comments = tuple(c for c in seen.comments if c.commit == head)
    return (asking, comments) if asking or comments else None


def _ask(status: PrStatus, reason: str) -> Step:
    return Step(StepKind.ASK_OPERATOR, status, reason)


def _ci_round(seen: Observation, status: PrStatus, rounds: Rounds, limits: Limits) -> Step:
    failed = tuple(c for c in head_checks(seen) if c.failed)
    names = ", ".join(c.name for c in failed)
    if rounds.ci >= limits.max_ci_rounds:
        return _ask(status, f"CI failed ({names}) after {rounds.ci} rounds (max_ci_rounds {limits.max_ci_rounds}): "
                            f"the operator decides")  # fmt: skip
    reason = f"CI failed ({names}): sent back, round {rounds.ci + 1} of {limits.max_ci_rounds}"
    return Step(StepKind.CI_FAILED, status, reason, failed_checks=failed)


def _review_round(seen: Observation, status: PrStatus, rounds: Rounds, limits: Limits) -> Step:
    asked = changes_asked(seen)
    assert asked is not None
    reviews, comments = asked
    who = ", ".join(sorted({r.author for r in reviews} | {c.author for c in comments}))
    if rounds.review >= limits.max_review_rounds:
        return _ask(status, f"review by {who} asks for changes after {rounds.review} rounds (max_review_rounds "
                            f"{limits.max_review_rounds}): the operator decides")  # fmt: skip
    reason = f"review by {who} asks for changes: sent back, round {rounds.review + 1} of {limits.max_review_rounds}"
    return Step(StepKind.REVIEW_CHANGES, status, reason, review_instructions(seen.pull, reviews, comments))


def _rebase_round(pull: PullRequest, status: PrStatus, rounds: Rounds, limits: Limits) -> Step:
    if rounds.rebase >= limits.max_rebase_rounds:
        return _ask(status, f"PR #{pull.number} still conflicts with {pull.base_branch} after {rounds.rebase} "
                            f"rounds (max_rebase_rounds {limits.max_rebase_rounds}): the operator decides")  # fmt: skip
    reason = f"PR #{pull.number} conflicts with {pull.base_branch}: rebase round {rounds.rebase + 1}"
    return Step(StepKind.REBASE, status, reason)


def ci_instructions(pull: PullRequest, failed: tuple[tuple[CheckRun, str], ...]) -> str:
    """What the agents are told of failed checks: each check's name, its summary and the tail of its log."""
    parts = [f"CI failed on pull request #{pull.number} (head {pull.head[:12]}). Fix the cause, commit the fix."]
    for check, tail in failed:
        parts.append(f"\n## Check '{check.name}' ({check.conclusion})")
        if check.summary:
            parts.append(check.summary.strip())
        if tail:
            parts.append(f"The end of its log:\n```\n{tail[-MAX_LOG_TAIL:].rstrip()}\n```")
    return "\n".join(parts)


def review_instructions(pull: PullRequest, reviews: tuple[Review, ...], comments: tuple[LineComment, ...]) -> str:
    """What the agents are told of a review: each reviewer's words, then each line comment as `file:line`."""
    parts = [f"A review of pull request #{pull.number} asks for changes. Make them, commit the result."]
    parts += [f"\n{r.author}: {r.body.strip()}" for r in reviews if r.body.strip()]
    for c in sorted(comments, key=lambda c: (c.path, c.line or 0, c.id)):
        where = f"{c.path}:{c.line}" if c.line else c.path
        parts.append(f"\n- {where} ({c.author}): {c.body.strip()}")
    return "\n".join(parts)


def rebase_instructions(pull: PullRequest, base_commit: str) -> str:
    """What the agents are told of a conflict: merge the base's commit in, resolve, commit."""
    return (
        f"Pull request #{pull.number} conflicts with {pull.base_branch}, now at {base_commit}. Run "
        f"`git merge {base_commit}`, resolve every conflict (keep both sides' intent), and commit the merge."
    )


def log_tail(text: str, lines: int) -> str:
    """The last `lines` lines of a check's log (CI logs are long; the error is at the end), at most MAX_LOG_TAIL."""
    return "\n".join(text.splitlines()[-lines:])[-MAX_LOG_TAIL:]


def signature_valid(secret: str, body: bytes, header: str | None) -> bool:
    """Whether `header` (GitHub's `X-Hub-Signature-256: sha256=<hex>`) is the HMAC-SHA256 of `body` under `secret`.
    Compared in constant time; a missing or malformed header is invalid."""
    if not secret or not header or not header.startswith("sha256="):
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header.removeprefix("sha256="))


def pull_body(task_title: str, task_body: str, final_message: str, checklist: str, session_link: str) -> str:
    """The pull request's description: the task, what the agent said it did, the checklist, and the session."""
    parts = [task_body.strip() or task_title]
    if final_message.strip():
        parts.append(f"## What the agent did\n\n{final_message.strip()[:4000]}")
    if checklist.strip():
        parts.append(f"## Checklist\n\n{checklist.strip()}")
    parts.append(f"---\nOpened by taskgate for session {session_link}.")
    return "\n\n".join(parts)
