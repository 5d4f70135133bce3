"""Entities of DESIGN §2 as plain dataclasses, and the rule that task status follows its session."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from taskgate.domain.states import SessionState


class ProjectStatus(StrEnum):
    ACTIVE = "active"
    ARCHIVED = "archived"


class PlanStatus(StrEnum):
    OPEN = "open"
    IN_PROGRESS = "in_progress"
    CLOSED = "closed"


class TaskStatus(StrEnum):
    OPEN = "open"
    IN_PROGRESS = "in_progress"
    PENDING_REVIEW = "pending_review"
    APPROVED = "approved"
    MERGED = "merged"
    COMPLETED = "completed"


class AgentStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Its node stopped beating (docs/nodes.md): a surviving node cannot see the process, so it is neither running
    # nor ended as far as anyone knows. The node, when it comes back, finds it running, ended or gone.
    LOST = "lost"


class Role(StrEnum):
    ARCHITECT = "architect"
    DEVELOPER = "developer"
    REVIEWER = "reviewer"
    QA = "qa"
    ADMIN = "admin"


class Permission(StrEnum):
    READ = "read"
    WRITE = "write"
    APPROVE = "approve"
    OVERRIDE = "override"
    ADMIN = "admin"


class Outcome(StrEnum):
    """What became of a fired trigger: applied (state changed) or blocked (a guard refused)."""

    APPLIED = "applied"
    BLOCKED = "blocked"


@dataclass(slots=True)
class Project:
    id: int
    name: str
    key: str
    root_path: str
    created_at: datetime
    config: dict[str, Any] = field(default_factory=dict)
    archived_at: datetime | None = None

    @property
    def status(self) -> ProjectStatus:
        return ProjectStatus.ARCHIVED if self.archived_at else ProjectStatus.ACTIVE


@dataclass(slots=True)
class Plan:
    id: int
    project_id: int
    name: str
    status: PlanStatus
    created_at: datetime


@dataclass(slots=True)
class Task:
    id: str
    project_id: int
    plan_id: int | None
    title: str
    description: str
    priority: int
    status: TaskStatus
    created_at: datetime
    blockers: list[str] = field(default_factory=list)
    source: str = "builtin"  # the tracker the task came from: builtin | beads
    external_id: str | None = None  # its id in that tracker (a task id is qualified when another project has it)
    tracker_status: str | None = None  # its status there, in the tracker's words
    hold: str | None = None  # why the tracker keeps it out of ready (status, type, ephemeral, …); None: nothing
    labels: list[str] = field(
        default_factory=list
    )  # task labels (domain/workflows/triggers.py LABEL), as given, each once


@dataclass(slots=True)
class Operator:
    id: str
    name: str
    email: str | None
    roles: list[str]
    permissions: list[str]
    max_active_sessions: int
    created_at: datetime


@dataclass(slots=True)
class Agent:
    id: str
    session_id: str
    agent_type: str
    command: list[str]
    status: AgentStatus
    exit_code: int | None = None
    output_path: str | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    heartbeat_at: datetime | None = None
    run: int = 1
    pid: int | None = None
    output_tail: str = ""
    error: str | None = None
    report: dict | None = None  # what the agent CLI said of its run (agent_reports.AgentReport.as_dict()), if it did
    node_id: str | None = None  # the node (service process's machine and data dir) that launched and supervises it
    # Its process: `pid` leads its own process group (pgid); `process_start` is the leader's start time (clock ticks
    # since boot, /proc/<pid>/stat field 22), so a stop never signals a process that reused the pid.
    pgid: int | None = None
    process_start: int | None = None
    ended_by: str | None = None  # the signal a stop ended its process group with: SIGTERM or SIGKILL
    sandbox: str | None = None  # how its process was confined: "bwrap; network …" or "off: why" (None: before 0019)
    # Its CLI's own conversation (Claude Code's session id, Codex's thread id; None: it reported none), the earlier
    # conversation this run continued (its type's `resume`), and why continuing it failed (it then ran afresh)
    conversation_id: str | None = None
    resumed_from: str | None = None
    resume_failed: str | None = None


class StepStatus(StrEnum):
    """How one run (attempt) of a workflow step stands or ended."""

    RUNNING = "running"
    WAITING = "waiting"  # an approval or a checklist waits for a person (or an agent ticking items)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    APPROVED = "approved"
    REJECTED = "rejected"
    CHANGES_REQUESTED = "changes_requested"
    SKIPPED = "skipped"  # moved past by hand (workflow_advance, workflow_break)
    CANCELLED = "cancelled"  # the session left executing, or workflow_back / workflow_restart


OPEN_STEP_STATUSES = frozenset({StepStatus.RUNNING, StepStatus.WAITING})


@dataclass(frozen=True, slots=True)
class StepRun:
    """One attempt of one workflow step of a session (the `step_runs` table, append and update only).

    `depth` is the frame's depth on the session's workflow stack (1 = the root workflow); `frame` names the
    frame (a workflow id, `checklist:<id>`, or `<workflow id>/<group step id>` for a group).
    """

    session_id: str
    depth: int
    frame: str
    step_id: str
    attempt: int
    status: StepStatus
    started_at: datetime
    ended_at: datetime | None = None
    output_summary: str = ""
    agent_ids: tuple[str, ...] = ()
    error: str | None = None
    id: int | None = None


@dataclass(slots=True)
class Session:
    """A persisted state machine for one task. `version` increases by one with every applied transition."""

    id: str
    task_id: str
    project_id: int
    plan_id: int | None
    operator_id: str | None
    state: SessionState
    version: int
    created_at: datetime
    updated_at: datetime
    prior_state: SessionState | None = None
    state_data: dict[str, Any] = field(default_factory=dict)
    workflow_stack: list[dict[str, Any]] = field(default_factory=list)
    branch_name: str | None = None
    worktree_path: str | None = None
    compensation_plan: str | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    deadline: datetime | None = None
    node_id: str | None = None  # the node holding its worktree, which alone changes it (None: before migration 0013)

    @property
    def escalated_at(self) -> datetime | None:
        """When the sweeper escalated the verification this session waits in, else None. The mark
        (`state_data.escalated_at`, `escalated_version`) counts only while the session is still verifying at the
        version it was escalated at: every transition moves the version on, so leaving verifying clears it."""
        data = self.state_data
        if self.state != SessionState.VERIFYING or data.get("escalated_version") != self.version:
            return None
        at = data.get("escalated_at")
        return datetime.fromisoformat(at) if isinstance(at, str) else None


@dataclass(frozen=True, slots=True)
class GuardResult:
    """The verdict of one policy on one transition, stored with the log row."""

    policy: str
    passed: bool
    severity: str
    message: str = ""
    suggestion: str = ""
    overridden: bool = False  # an operator overrode the policy: recorded, not blocking

    def as_dict(self) -> dict[str, Any]:
        found = {
            "policy": self.policy,
            "passed": self.passed,
            "severity": self.severity,
            "message": self.message,
            "suggestion": self.suggestion,
        }
        return {**found, "overridden": True} if self.overridden else found


@dataclass(frozen=True, slots=True)
class TransitionRecord:
    """One row of the append-only transition log."""

    seq: int | None
    session_id: str
    trigger: str
    from_state: str | None
    to_state: str
    outcome: Outcome
    actor: str
    reason: str | None
    guard_results: list[dict[str, Any]]
    session_version: int
    at: datetime


_ENDED_AS = {"cancelled": "cancelled", "completed": "completed", "failed": "failed", "merged": "merged"}


def how_it_got_there(row: TransitionRecord) -> str:
    """What an applied row did, as a refusal names it to a caller who lost the race to it: "was cancelled (cancel
    by operator:bob at 2026-11-28T10:00:01+00:00: not needed)"."""
    verb = _ENDED_AS.get(row.to_state, f"moved to '{row.to_state}'")
    reason = f": {row.reason[:200]}" if row.reason else ""
    return f"was {verb} ({row.trigger} by {row.actor} at {row.at.isoformat(timespec='seconds')}{reason})"


_TASK_STATUS_BY_SESSION_STATE: dict[SessionState, TaskStatus] = {
    SessionState.PLANNING: TaskStatus.IN_PROGRESS,
    SessionState.EXECUTING: TaskStatus.IN_PROGRESS,
    SessionState.VERIFYING: TaskStatus.PENDING_REVIEW,
    SessionState.AWAITING_MERGE: TaskStatus.APPROVED,
    SessionState.MERGED: TaskStatus.MERGED,
    SessionState.FAILED: TaskStatus.OPEN,
    SessionState.CANCELLED: TaskStatus.OPEN,
    SessionState.ROLLED_BACK: TaskStatus.OPEN,
}


def task_status_for(state: SessionState, previous: SessionState | None) -> TaskStatus | None:
    """The task status implied by its session entering `state` (DESIGN §2), or None to leave it as it is.

    `completed` completes the task only when the session got there through a merge; a rolled-back session
    that finishes its cleanup leaves the task open for another attempt. States not in the mapping
    (suspended, timed_out, abandoned, ...) leave the task unchanged.
    """
    if state == SessionState.COMPLETED:
        return TaskStatus.COMPLETED if previous == SessionState.MERGED else None
    return _TASK_STATUS_BY_SESSION_STATE.get(state)


class DecisionKind(StrEnum):
    APPROVE = "approve"
    REQUEST_CHANGES = "request_changes"
    REJECT = "reject"


class Compensation(StrEnum):
    AUTO_REVERT = "auto_revert"
    MANUAL_REVIEW = "manual_review"
    APPROVE_AND_MERGE = "approve_and_merge"


@dataclass(frozen=True, slots=True)
class Decision:
    """An operator's decision on one verification (the session at `session_version`, in verifying).

    `outcome`: applied (it moved the session), pending (an approval counted; review_approval wants more),
    or blocked (a guard refused). `override_policies` holds the policies overridden and the violations bypassed.
    """

    session_id: str
    operator_id: str
    decision: DecisionKind
    session_version: int
    at: datetime
    reason: str | None = None
    instructions: str | None = None
    override_policies: dict[str, Any] = field(default_factory=dict)
    compensation: Compensation | None = None
    policy_results: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = "applied"
    to_state: str | None = None
    id: int | None = None


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """A stored picture of a session's workspace: `context` (taken at context_discovered) or `checkpoint`
    (an operator's review checkpoint with a note)."""

    session_id: str
    kind: str
    actor: str
    data: dict[str, Any]
    at: datetime
    note: str | None = None
    id: int | None = None


@dataclass(frozen=True, slots=True)
class ApiToken:
    """An issued bearer token. Only its SHA-256 is stored; the token itself is shown once."""

    id: str
    token_hash: str
    kind: str
    created_at: datetime
    operator_id: str | None = None
    session_id: str | None = None
    label: str = ""
    revoked_at: datetime | None = None
    agent_id: str | None = None  # an agent's own token: it dies with that agent
