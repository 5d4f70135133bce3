"""The session transition table as data (DESIGN §3), plus what follows from it.

The `transitions` library runs this table in the application layer; everything here is plain data so that
the CLI can draw it, the audit replay can validate a log against it, and tests can reason about it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from taskgate.domain.forge import SUBSTATES
from taskgate.domain.questions import QUESTION_SUBSTATES
from taskgate.domain.states import (
    ACTIVE_STATES,
    SUSPENDABLE_STATES,
    TERMINAL_STATES,
    WIP_STATES,
    SessionState,
    Trigger,
)

S, T = SessionState, Trigger


class Initiator(StrEnum):
    """Who normally fires a trigger. Informative: authorisation comes with the policies issue."""

    AUTO = "auto"
    OPERATOR = "operator"
    DECISION = "decision"
    SWEEPER = "sweeper"
    SYSTEM = "system"
    FORGE = "forge"


@dataclass(frozen=True, slots=True)
class TransitionSpec:
    """One row of the table: `trigger` moves a session from any of `sources` to `dest`.

    `when_prior` restricts the row to sessions whose remembered prior state equals it (used by `resume`).
    """

    trigger: Trigger
    sources: frozenset[SessionState]
    dest: SessionState
    initiator: Initiator
    description: str
    when_prior: SessionState | None = None

    @property
    def enters_wip(self) -> bool:
        """True when the row moves a session into the WIP window from outside it (WIP limit applies)."""
        return self.dest in WIP_STATES and not self.sources <= WIP_STATES

    def allows(self, state: SessionState, prior: SessionState | None) -> bool:
        """True when this row can fire for a session in `state` whose prior state is `prior`."""
        return state in self.sources and (self.when_prior is None or self.when_prior == prior)


def _row(trigger, sources, dest, initiator, description, when_prior=None) -> TransitionSpec:
    srcs = frozenset(sources) if isinstance(sources, set | frozenset | list | tuple) else frozenset({sources})
    return TransitionSpec(trigger, srcs, dest, initiator, description, when_prior)


_REJECTABLE = {S.PLANNING, S.EXECUTING, S.VERIFYING, S.AWAITING_MERGE}
_FAILABLE = ACTIVE_STATES | {S.TIMED_OUT, S.ABANDONED}
_NON_TERMINAL = set(SessionState) - TERMINAL_STATES

TRANSITIONS: tuple[TransitionSpec, ...] = (
    _row(T.CREATE, set(), S.CREATED, Initiator.OPERATOR, "a session is created for a task"),
    _row(T.INITIALIZE, S.CREATED, S.INITIALIZING, Initiator.AUTO, "create worktree, branch and session folder"),
    _row(T.CONTEXT_DISCOVERED, S.INITIALIZING, S.READY, Initiator.AUTO, "context snapshot stored"),
    _row(T.START, S.READY, S.PLANNING, Initiator.OPERATOR, "operator starts work (WIP-limited)"),
    _row(T.PLAN_COMPLETE, S.PLANNING, S.EXECUTING, Initiator.OPERATOR, "plan accepted, agents execute"),
    _row(T.WORK_COMPLETE, S.EXECUTING, S.VERIFYING, Initiator.AUTO, "all agents/steps ended"),
    _row(T.APPROVE, S.VERIFYING, S.AWAITING_MERGE, Initiator.DECISION, "operator approves the work"),
    _row(T.REQUEST_CHANGES, S.VERIFYING, S.EXECUTING, Initiator.DECISION, "agents re-run with instructions"),
    _row(T.REVERIFY, S.AWAITING_MERGE, S.VERIFYING, Initiator.OPERATOR, "the branch changed after approval"),
    _row(T.REJECT, _REJECTABLE, S.FAILED, Initiator.DECISION, "operator rejects the work"),
    _row(T.FAIL, _FAILABLE, S.FAILED, Initiator.SYSTEM, "an error ends the attempt"),
    _row(T.COMPENSATE, S.FAILED, S.ROLLED_BACK, Initiator.SYSTEM, "auto_revert: worktree reset and discarded"),
    _row(T.RETRY, S.FAILED, S.EXECUTING, Initiator.OPERATOR, "manual review chose to try again"),
    _row(T.MERGE, S.AWAITING_MERGE, S.MERGED, Initiator.OPERATOR, "branch merged into base"),
    _row(T.CLEANUP_DONE, {S.MERGED, S.ROLLED_BACK}, S.COMPLETED, Initiator.AUTO, "worktree and branch removed"),
    _row(T.SUSPEND, SUSPENDABLE_STATES, S.SUSPENDED, Initiator.OPERATOR, "pause; resume returns here"),
    *(
        _row(T.RESUME, S.SUSPENDED, prior, Initiator.OPERATOR, f"resume into {prior}", when_prior=prior)
        for prior in sorted(SUSPENDABLE_STATES)
    ),
    _row(T.RESUME, S.ABANDONED, S.READY, Initiator.OPERATOR, "an abandoned session is made ready again"),
    _row(T.TIMEOUT, {S.EXECUTING, S.VERIFYING}, S.TIMED_OUT, Initiator.SWEEPER, "session deadline passed"),
    _row(T.ABANDON, ACTIVE_STATES - {S.CREATED}, S.ABANDONED, Initiator.SWEEPER, "heartbeats missed"),
    _row(T.CANCEL, _NON_TERMINAL, S.CANCELLED, Initiator.OPERATOR, "agents stopped, worktree removed"),
    # the forge loop (docs/forge.md): the pull request's checks, reviews and merge fed back
    _row(T.CI_FAILED, S.AWAITING_MERGE, S.EXECUTING, Initiator.FORGE, "a check failed: the agents fix it"),
    _row(
        T.REVIEW_CHANGES,
        {S.AWAITING_MERGE, S.VERIFYING},
        S.EXECUTING,
        Initiator.FORGE,
        "a review on the forge asks for changes",
    ),
    _row(T.REBASE, S.AWAITING_MERGE, S.EXECUTING, Initiator.FORGE, "the pull request conflicts with its base"),
    _row(T.UPDATE_PR, S.VERIFYING, S.AWAITING_MERGE, Initiator.FORGE, "a forge round's fix pushed to the pull request"),
    _row(
        T.FORGE_MERGED,
        {S.AWAITING_MERGE, S.VERIFYING},
        S.MERGED,
        Initiator.FORGE,
        "the pull request was merged on the forge",
    ),
)


def rows_for(trigger: Trigger) -> tuple[TransitionSpec, ...]:
    """All rows of `trigger`, in table order."""
    return tuple(row for row in TRANSITIONS if row.trigger == trigger)


def find_transition(state: SessionState | None, trigger: Trigger, prior: SessionState | None) -> TransitionSpec | None:
    """The row `trigger` would follow from `state` (None means: not yet created), or None if it cannot fire."""
    for row in rows_for(trigger):
        if state is None and not row.sources:
            return row
        if state is not None and row.allows(state, prior):
            return row
    return None


def allowed_triggers(state: SessionState, prior: SessionState | None) -> list[str]:
    """Triggers that can fire from `state`, sorted, each once."""
    return sorted({row.trigger.value for row in TRANSITIONS if row.allows(state, prior)})


def prior_state_after(spec: TransitionSpec, state_before: SessionState, prior_before: SessionState | None):
    """The prior state a session remembers after following `spec` (only `suspend` sets it; leaving clears it)."""
    if spec.trigger == Trigger.SUSPEND:
        return state_before
    if spec.dest == SessionState.SUSPENDED:
        return prior_before
    return None


def to_mermaid() -> str:
    """The state diagram, generated from the table, as a Mermaid `stateDiagram-v2`."""
    lines = ["stateDiagram-v2", f"    [*] --> {S.CREATED.value}: {T.CREATE.value}"]
    for row in TRANSITIONS:
        if not row.sources:
            continue
        label = row.trigger.value + (f" [prior={row.when_prior.value}]" if row.when_prior else "")
        lines.extend(f"    {src.value} --> {row.dest.value}: {label}" for src in sorted(row.sources))
    lines.extend(f"    {state.value} --> [*]" for state in sorted(TERMINAL_STATES))
    lines.extend(_pull_request_substates())
    lines.extend(_question_substates())
    return "\n".join(lines)


def _pull_request_substates() -> list[str]:
    """`awaiting_merge`'s sub-states with a forge: the pull request's (domain/forge.py SUBSTATES), nested."""
    first = SUBSTATES[0][0].value
    # prefixed: a sub-state may share a name with a state (merged), and Mermaid has one namespace
    lines = [f"    state {S.AWAITING_MERGE.value} {{", f"        [*] --> pr_{first}"]
    lines.extend(f"        pr_{a.value} --> pr_{b.value}: {what}" for a, b, what in SUBSTATES)
    return [*lines, "    }"]


def _question_substates() -> list[str]:
    """The sub-states of a state whose agents run (domain/questions.py QUESTION_SUBSTATES), drawn under `executing`:
    planning and verifying have the same two while their agents run."""
    first = QUESTION_SUBSTATES[0][0]
    lines = [f"    state {S.EXECUTING.value} {{", f"        [*] --> {first}"]
    lines.extend(f"        {a} --> {b}: {what}" for a, b, what in QUESTION_SUBSTATES)
    return [*lines, "    }"]


# The operator's loop: agents work, a person decides, the work comes back or lands (docs/operators.md).
LOOP_TRIGGERS = (T.WORK_COMPLETE, T.APPROVE, T.REQUEST_CHANGES, T.REJECT, T.RETRY, T.REVERIFY, T.MERGE,
                 T.COMPENSATE, T.CLEANUP_DONE)  # fmt: skip


def loop_to_mermaid() -> str:
    """The operator's loop (the rows of LOOP_TRIGGERS between its states), from the same table."""
    states = {S.EXECUTING, S.VERIFYING, S.AWAITING_MERGE, S.FAILED, S.ROLLED_BACK, S.MERGED, S.COMPLETED}
    lines = ["stateDiagram-v2", f"    [*] --> {S.EXECUTING.value}: {T.PLAN_COMPLETE.value}"]
    for row in TRANSITIONS:
        if row.trigger in LOOP_TRIGGERS and row.dest in states:
            lines.extend(f"    {src.value} --> {row.dest.value}: {row.trigger.value}"
                         for src in sorted(row.sources & states))  # fmt: skip
    lines.append(f"    {S.COMPLETED.value} --> [*]")
    return "\n".join(lines)
