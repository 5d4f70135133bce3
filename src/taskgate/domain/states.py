"""Session states and triggers, and the groups of states the rules talk about."""

from __future__ import annotations

from enum import StrEnum


class SessionState(StrEnum):
    """Every state a session can be in (DESIGN §3)."""

    CREATED = "created"
    INITIALIZING = "initializing"
    READY = "ready"
    PLANNING = "planning"
    EXECUTING = "executing"
    VERIFYING = "verifying"
    AWAITING_MERGE = "awaiting_merge"
    MERGED = "merged"
    COMPLETED = "completed"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    SUSPENDED = "suspended"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    ABANDONED = "abandoned"


class Trigger(StrEnum):
    """Every event that can move a session. `create` is the birth of a session (no source state)."""

    CREATE = "create"
    INITIALIZE = "initialize"
    CONTEXT_DISCOVERED = "context_discovered"
    START = "start"
    PLAN_COMPLETE = "plan_complete"
    WORK_COMPLETE = "work_complete"
    APPROVE = "approve"
    REQUEST_CHANGES = "request_changes"
    REVERIFY = "reverify"
    REJECT = "reject"
    FAIL = "fail"
    COMPENSATE = "compensate"
    RETRY = "retry"
    MERGE = "merge"
    CLEANUP_DONE = "cleanup_done"
    SUSPEND = "suspend"
    RESUME = "resume"
    TIMEOUT = "timeout"
    ABANDON = "abandon"
    CANCEL = "cancel"
    CI_FAILED = "ci_failed"
    REVIEW_CHANGES = "review_changes"
    REBASE = "rebase"
    UPDATE_PR = "update_pr"
    FORGE_MERGED = "forge_merged"


S = SessionState

TERMINAL_STATES: frozenset[SessionState] = frozenset({S.COMPLETED, S.CANCELLED})
"""No trigger leaves these; a session here no longer holds its task."""

WIP_STATES: frozenset[SessionState] = frozenset({S.PLANNING, S.EXECUTING, S.VERIFYING, S.AWAITING_MERGE})
"""Sessions in these states count against their plan's WIP limit."""

SUSPENDABLE_STATES: frozenset[SessionState] = WIP_STATES
"""Suspend is allowed from exactly the WIP states, and resume returns to the one suspended from."""

ACTIVE_STATES: frozenset[SessionState] = frozenset({S.CREATED, S.INITIALIZING, S.READY, *WIP_STATES, S.SUSPENDED})
"""A session doing or waiting to do work: the sweeper may abandon it, an error may fail it."""


FORGE_ROUNDS: frozenset[Trigger] = frozenset({Trigger.CI_FAILED, Trigger.REVIEW_CHANGES, Trigger.REBASE})
"""The forge sends the agents back: a failed check, a review asking for changes, a conflict (docs/forge.md)."""


def is_terminal(state: SessionState) -> bool:
    """True when no trigger can leave `state`."""
    return state in TERMINAL_STATES
