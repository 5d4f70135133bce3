"""Structured outputs of the MCP tools. Each starts with a one-line `summary` a person or model can read."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from taskgate.application.operators.decisions import DecisionResult
from taskgate.application.operators.review_queue import ReviewItem
from taskgate.application.sessions.guards import PolicyCheck
from taskgate.application.sessions.policy_book import PolicyEntry
from taskgate.application.trackers.builtin import TaskAdded
from taskgate.application.workflows.views import StackView
from taskgate.application.workspaces.context import ProjectContext
from taskgate.application.workspaces.ports import WorkspaceContext
from taskgate.domain.agents.reports import AgentReport
from taskgate.domain.agents.usage import Usage, by, total
from taskgate.domain.entities import Agent, Plan, Project, Session, SessionSnapshot, Task, TransitionRecord
from taskgate.domain.outputs import OutputRecord
from taskgate.domain.policies.facts import TestRun
from taskgate.domain.session_fsm import allowed_triggers
from taskgate.domain.workflows.definitions import Checklist, Workflow


class ProjectOut(BaseModel):
    summary: str
    id: int
    name: str
    key: str = Field(description="Prefix of the project's task ids, e.g. SHOP in SHOP-12.")
    root_path: str
    archived: bool

    @classmethod
    def of(cls, p: Project, summary: str = "") -> ProjectOut:
        return cls(
            summary=summary or f"project {p.name} (key {p.key}) at {p.root_path}",
            id=p.id,
            name=p.name,
            key=p.key,
            root_path=p.root_path,
            archived=p.archived_at is not None,
        )


class PlanOut(BaseModel):
    summary: str
    id: int
    project_id: int
    name: str
    status: str

    @classmethod
    def of(cls, p: Plan) -> PlanOut:
        return cls(
            summary=f"plan {p.id} '{p.name}' is {p.status.value}",
            id=p.id,
            project_id=p.project_id,
            name=p.name,
            status=p.status.value,
        )


class PlanList(BaseModel):
    summary: str
    plans: list[PlanOut]


class TaskOut(BaseModel):
    summary: str
    id: str
    title: str
    description: str
    priority: int = Field(description="0 is most urgent, 4 least.")
    status: str
    plan_id: int | None
    blockers: list[str] = Field(description="Ids of tasks that must complete before this one can start.")
    labels: list[str] = Field(default_factory=list, description="Task labels (a workflow's label:<name> trigger).")
    plan_reopened: bool = Field(False, description="task_add only: the plan was closed and this task reopened it.")

    @classmethod
    def added(cls, added: TaskAdded) -> TaskOut:
        out = cls.of(added.task)
        if added.reopened is None:
            return out
        return out.model_copy(update={"summary": f"{out.summary}; {added.note()}", "plan_reopened": True})

    @classmethod
    def of(cls, t: Task) -> TaskOut:
        blocked = f", blocked by {', '.join(t.blockers)}" if t.blockers else ""
        return cls(
            summary=f"{t.id} [{t.status.value}, p{t.priority}] {t.title}{blocked}",
            id=t.id,
            title=t.title,
            description=t.description,
            priority=t.priority,
            status=t.status.value,
            plan_id=t.plan_id,
            blockers=t.blockers,
            labels=t.labels,
        )


class TaskList(BaseModel):
    summary: str
    tasks: list[TaskOut]

    @classmethod
    def of(cls, tasks: list[Task], what: str = "tasks") -> TaskList:
        return cls(summary=f"{len(tasks)} {what}", tasks=[TaskOut.of(t) for t in tasks])


class AgentReportOut(BaseModel):
    """What the agent's CLI said of its run (Claude Code's stream-json result, Codex's exec --json events)."""

    final_message: str = Field(
        description="Its result, whole (up to 100,000 characters): its CLI's last message, aider's reply, or a "
        "plain-text agent's last lines."
    )
    turns: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cost_usd: float | None = Field(description="As the CLI reported it; null when it reports none (Codex).")
    is_error: bool = Field(description="The CLI said its run failed.")
    error: str | None = Field(description="Its error, when it failed.")

    @classmethod
    def of(cls, stored: Any) -> AgentReportOut | None:
        report = AgentReport.from_dict(stored)
        return None if report is None else cls(**report.as_dict())


class UsageOut(BaseModel):
    """Turns, tokens and cost as the agents' CLIs reported them, summed (domain/agents/usage.py)."""

    agents: int = Field(description="Agents summed.")
    measured: int = Field(description="Of them, those whose CLI reported usage (plain-text agents report none).")
    turns: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cost_usd: float | None = Field(description="The costs reported, summed; null when no agent reported one.")
    uncosted: int = Field(description="Agents that reported usage but no cost (Codex): the cost is not the whole.")

    @classmethod
    def of(cls, usage: Usage) -> UsageOut:
        return cls(**usage.as_dict())


class SessionUsageOut(BaseModel):
    """A session's usage: in all, per run (each launch, relaunch and workflow step is a run) and per agent."""

    summary: str = Field(description="The total in words.")
    total: UsageOut
    runs: dict[str, UsageOut] = Field(description="Run number → the usage of that run's agents.")
    agents: dict[str, UsageOut] = Field(description="Agent id → its usage.")

    @classmethod
    def of(cls, agents: Sequence[Agent]) -> SessionUsageOut:
        runs = by(agents, lambda a: a.run)
        return cls(summary=total(agents).line(), total=UsageOut.of(total(agents)),
                   runs={str(r): UsageOut.of(u) for r, u in sorted(runs.items())},
                   agents={a.id: UsageOut.of(Usage.of(a.report)) for a in agents})  # fmt: skip


class AgentOut(BaseModel):
    id: str
    type: str
    status: str = Field(
        description="queued, running, completed, failed or cancelled; lost while its node is down (docs/nodes.md)."
    )
    node: str | None = Field(default=None, description="The node that launched it and supervises it.")
    run: int = Field(description="1, then one more per request_changes relaunch.")
    exit_code: int | None
    started_at: datetime | None
    completed_at: datetime | None
    heartbeat_at: datetime | None
    output_path: str | None
    error: str | None
    output_tail: str = Field(description="The last lines of its output.")
    ended_by: str | None = Field(
        default=None, description="SIGTERM or SIGKILL: the signal a stop ended its process group with; else null."
    )
    sandbox: str | None = Field(
        default=None, description="How its process was confined: `bwrap; network …` or `off: why` (docs/agents.md)."
    )
    report: AgentReportOut | None = Field(
        default=None,
        description="What its CLI said of its run, once it ended (a plain-text agent: its result only, counts 0).",
    )
    conversation_id: str | None = Field(
        default=None, description="Its CLI's own conversation (Claude Code's session id, Codex's thread id), if named."
    )
    resumed_from: str | None = Field(
        default=None, description="The earlier run's conversation this run continued (docs/agents.md, resuming)."
    )
    resume_failed: str | None = Field(
        default=None, description="Why continuing the earlier conversation failed; it then ran afresh."
    )

    @classmethod
    def of(cls, a: Agent) -> AgentOut:
        return cls(
            id=a.id, type=a.agent_type, status=a.status.value, run=a.run, exit_code=a.exit_code,
            started_at=a.started_at, completed_at=a.completed_at, heartbeat_at=a.heartbeat_at,
            output_path=a.output_path, error=a.error, output_tail=a.output_tail[-1000:],
            report=AgentReportOut.of(a.report), node=a.node_id, ended_by=a.ended_by, sandbox=a.sandbox,
            conversation_id=a.conversation_id, resumed_from=a.resumed_from, resume_failed=a.resume_failed,
        )  # fmt: skip


class WaitingOut(BaseModel):
    """What the top frame of a workflow stack waits for from a person."""

    kind: str = Field(description="approval (answer it with project_decide) or checklist (tick with checklist_check).")
    step_id: str | None = Field(description="The waiting step; null for a checklist pushed onto the stack.")
    message: str = Field(description="The approval's message, or the checklist's name or description.")
    items: list[dict[str, Any]] = Field(description="The checklist's items: id, text, required.")
    missing: list[str] = Field(description="Required checklist items not ticked yet.")
    since_version: int = Field(description="The session version the wait was read at.")
    output_of: str | None = Field(
        default=None,
        description="An approval: the step before it whose output it asks to read (resource "
        "taskgate://sessions/{id}/steps/{step}/output; `taskgate session output`).",
    )


class WorkflowStackOut(BaseModel):
    """A session's workflow stack: the top frame runs; finishing it pops back to the one below."""

    summary: str
    session_id: str
    state: str = Field(description="The session's state (frames run while it is executing).")
    version: int = Field(description="The session's version now (every stack edit moves it on).")
    depth: int = Field(description="Frames on the stack; 0: no workflow.")
    breadcrumb: str = Field(description="Root frame first, then each nested frame and the current step.")
    frames: list[dict[str, Any]] = Field(
        description="Bottom to top: kind, name, step, status, attempt, context_mode, iterations."
    )
    waiting: WaitingOut | None = Field(description="What a person must do for the top frame to go on; null: nothing.")

    @classmethod
    def of(cls, view: StackView, done: str = "") -> WorkflowStackOut:
        w = view.waiting
        waiting = None if w is None else WaitingOut(
            kind=w.kind, step_id=w.step_id, message=w.message, items=[dict(i) for i in w.items],
            missing=list(w.missing), since_version=w.since_version, output_of=w.output_of,
        )  # fmt: skip
        where = f"{view.breadcrumb} (depth {view.depth})" if view.depth else "no workflow (the stack is empty)"
        return cls(
            summary=f"{done + '; ' if done else ''}session {view.session_id} ({view.state}): {where}"
            f"{_waiting_note(waiting)}",
            session_id=view.session_id,
            state=view.state,
            version=view.version,
            depth=view.depth,
            breadcrumb=view.breadcrumb,
            frames=[dict(f) for f in view.frames],
            waiting=waiting,
        )


def _waiting_note(waiting: WaitingOut | None) -> str:
    if waiting is None:
        return ""
    if waiting.kind == "approval":
        return f"; waits for approval of step '{waiting.step_id}': {waiting.message} (answer with project_decide)"
    if waiting.missing:
        return f"; waits for checklist {waiting.message}: tick {', '.join(waiting.missing)} (checklist_check)"
    return f"; checklist {waiting.message}: every required item is ticked"


class SessionOut(BaseModel):
    summary: str
    id: str
    task_id: str
    state: str
    prior_state: str | None = Field(description="Where `resume` returns to, while suspended.")
    version: int = Field(description="Increases by one with every applied transition.")
    operator_id: str | None
    allowed_triggers: list[str] = Field(description="Triggers that can fire from the current state.")
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    branch: str | None = Field(default=None, description="The session's git branch.")
    worktree: str | None = Field(default=None, description="The session's worktree folder.")
    node: str | None = Field(
        default=None, description="The node holding its worktree: only that node changes it (docs/nodes.md)."
    )
    workspace: dict[str, Any] = Field(
        default_factory=dict,
        description="Base branch and commit, the last merge, merge conflicts, and worktree_missing when the "
        "folder was deleted by hand (merge restores it from the branch).",
    )

    agents: list[AgentOut] = Field(default_factory=list, description="The session's agents, oldest first.")
    workflow: WorkflowStackOut | None = Field(
        default=None, description="The session's workflow stack (depth, breadcrumb, frames, waiting); null: none."
    )
    escalated_at: datetime | None = Field(
        default=None,
        description="When the sweeper escalated the verification the session waits in (waiting too long for a "
        "decision, see [sweeper] verification_escalation_hours); null: not escalated.",
    )
    usage: SessionUsageOut | None = Field(
        default=None, description="The tokens and cost its agents reported: in all, per run, per agent."
    )
    pull_request: dict[str, Any] | None = Field(
        default=None,
        description="Its pull request on the forge (docs/forge.md): number, url, branch, what taskgate pushed, its "
        "sub-state of awaiting_merge (status), what happened last (note), the last error; null: none.",
    )
    sandbox: list[dict[str, Any]] = Field(
        default_factory=list,
        description="What the sandbox refused its agents (`sandbox.refused`/`sandbox.breach` events: what, target, "
        "source, agent), oldest first; shown to operators only.",
    )
    waiting_for_operator: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The sub-state waiting_for_operator: its agents' open questions and permission prompts (id, kind, "
        "text, choices, tool and input, deadline); answer with session_answer (docs/questions.md).",
    )

    @classmethod
    def of(cls, s: Session, agents: Sequence[Agent] = (), workflow: StackView | None = None) -> SessionOut:
        nxt = allowed_triggers(s.state, s.prior_state)
        flags = [f"; ESCALATED at {s.escalated_at.isoformat(timespec='seconds')}"] if s.escalated_at else []
        if "worktree_missing" in s.state_data:
            flags.append(f"; worktree missing since {s.state_data['worktree_missing']}")
        if s.state_data.get("merge_conflicts"):
            flags.append(f"; last merge conflicted in {', '.join(s.state_data['merge_conflicts'])}")
        stack = WorkflowStackOut.of(workflow) if workflow is not None and workflow.depth else None
        if stack is not None:
            flags.append(f"; workflow {stack.breadcrumb}{_waiting_note(stack.waiting)}")
        return cls(
            summary=f"session {s.id} for {s.task_id} is {s.state.value} (version {s.version}); "
            f"next: {', '.join(nxt) or 'nothing, it is finished'}" + "".join(flags),
            branch=s.branch_name,
            worktree=s.worktree_path,
            node=s.node_id,
            agents=[AgentOut.of(a) for a in agents],
            workflow=stack,
            workspace=dict(s.state_data),
            id=s.id,
            task_id=s.task_id,
            state=s.state.value,
            prior_state=s.prior_state.value if s.prior_state else None,
            version=s.version,
            operator_id=s.operator_id,
            allowed_triggers=nxt,
            created_at=s.created_at,
            updated_at=s.updated_at,
            started_at=s.started_at,
            completed_at=s.completed_at,
            escalated_at=s.escalated_at,
            usage=SessionUsageOut.of(agents) if agents else None,
        )


class SessionList(BaseModel):
    summary: str
    sessions: list[SessionOut]


class TransitionOut(BaseModel):
    seq: int | None
    at: datetime
    session_id: str
    trigger: str
    from_state: str | None
    to_state: str
    outcome: str = Field(description="applied, or blocked when a guard refused it.")
    actor: str
    reason: str | None
    session_version: int
    guard_results: list[dict[str, Any]]

    @classmethod
    def of(cls, r: TransitionRecord) -> TransitionOut:
        return cls(
            seq=r.seq,
            at=r.at,
            session_id=r.session_id,
            trigger=r.trigger,
            from_state=r.from_state,
            to_state=r.to_state,
            outcome=r.outcome.value,
            actor=r.actor,
            reason=r.reason,
            session_version=r.session_version,
            guard_results=r.guard_results,
        )


class TransitionList(BaseModel):
    summary: str
    transitions: list[TransitionOut]

    @classmethod
    def of(cls, records: list[TransitionRecord]) -> TransitionList:
        blocked = sum(1 for r in records if r.outcome.value == "blocked")
        return cls(
            summary=f"{len(records)} transition(s), {blocked} blocked",
            transitions=[TransitionOut.of(r) for r in records],
        )


class FireOut(BaseModel):
    """One fired trigger: the transition and the session state it left. Flat on purpose: clients validate every
    result against this schema, and nesting (with $refs) made that cost more than the transition itself."""

    summary: str
    session_id: str
    trigger: str
    from_state: str | None
    to_state: str
    state: str = Field(
        description="The session's state now: to_state, or further on after automatic follow-ups (see `then`)."
    )
    prior_state: str | None = Field(description="Where `resume` returns to, while suspended.")
    version: int = Field(description="The session's version now.")
    allowed_triggers: list[str] = Field(description="Triggers that can fire next.")
    seq: int | None = Field(description="The transition log row.")
    at: datetime
    actor: str
    reason: str | None
    guard_results: list[dict[str, Any]]
    then: list[str] = Field(
        default_factory=list,
        description="Automatic transitions that followed, e.g. 'cleanup_done: merged → completed'.",
    )
    warnings: list[str] = Field(default_factory=list, description="Automatic follow-ups that failed, and why.")

    @classmethod
    def of(
        cls,
        session: Session,
        record: TransitionRecord,
        follow_ups: Sequence[TransitionRecord] = (),
        warnings: Sequence[str] = (),
    ) -> FireOut:
        then = [f"{r.trigger}: {r.from_state} → {r.to_state}" for r in follow_ups]
        return cls(
            summary=f"{record.trigger}: {record.from_state} → {record.to_state}"
            + "".join(f"; then {t}" for t in then)
            + f" (session {session.id}, version {session.version})"
            + "".join(f"; warning: {w}" for w in warnings),
            then=then,
            warnings=list(warnings),
            session_id=session.id,
            trigger=record.trigger,
            from_state=record.from_state,
            to_state=record.to_state,
            state=session.state.value,
            prior_state=session.prior_state.value if session.prior_state else None,
            version=session.version,
            allowed_triggers=allowed_triggers(session.state, session.prior_state),
            seq=record.seq,
            at=record.at,
            actor=record.actor,
            reason=record.reason,
            guard_results=record.guard_results,
        )


class StateAtOut(BaseModel):
    summary: str
    session_id: str
    at: datetime
    state: str


class Pong(BaseModel):
    summary: str = "pong"


class FileStatOut(BaseModel):
    path: str
    added: int = Field(description="Lines added; -1 for a binary file.")
    deleted: int


class CommitOut(BaseModel):
    sha: str
    subject: str
    author: str
    at: datetime


class ReviewOut(BaseModel):
    """What changed on a session's branch against its base, and the state of its worktree."""

    summary: str
    session_id: str
    branch: str
    base: str
    base_commit: str
    head_commit: str
    ahead: int = Field(description="Commits on the branch that the base lacks.")
    behind: int = Field(description="Commits on the base since the branch forked (a merge will rebase).")
    files: list[FileStatOut]
    commits: list[CommitOut]
    dirty: list[str] = Field(description="Tracked files with uncommitted changes (a merge refuses them).")
    untracked: list[str]
    conflicts: list[str]
    patch: str | None = Field(default=None, description="The diff against the base, when asked for.")
    patch_truncated: bool = False

    @classmethod
    def of(cls, session_id: str, ctx: WorkspaceContext, *, with_patch: bool) -> ReviewOut:
        added = sum(max(f.added, 0) for f in ctx.diff_stat)
        deleted = sum(max(f.deleted, 0) for f in ctx.diff_stat)
        state = (
            "clean"
            if not (ctx.dirty or ctx.untracked or ctx.conflicts)
            else (f"{len(ctx.dirty)} dirty, {len(ctx.untracked)} untracked, {len(ctx.conflicts)} conflicted file(s)")
        )
        return cls(
            summary=f"{ctx.branch}: {ctx.ahead} commit(s) ahead of {ctx.base_ref}, {ctx.behind} behind; "
            f"{len(ctx.diff_stat)} file(s) changed, +{added} -{deleted}; worktree {state}",
            session_id=session_id,
            branch=ctx.branch,
            base=ctx.base_ref,
            base_commit=ctx.base_commit,
            head_commit=ctx.head_commit,
            ahead=ctx.ahead,
            behind=ctx.behind,
            files=[FileStatOut(path=f.path, added=f.added, deleted=f.deleted) for f in ctx.diff_stat],
            commits=[CommitOut(sha=c.sha, subject=c.subject, author=c.author, at=c.at) for c in ctx.commits],
            dirty=ctx.dirty,
            untracked=ctx.untracked,
            conflicts=ctx.conflicts,
            patch=ctx.patch if with_patch else None,
            patch_truncated=ctx.patch_truncated if with_patch else False,
        )


class CheckpointOut(BaseModel):
    """A stored review checkpoint: the review as it was, with the operator's note."""

    summary: str
    id: int | None
    session_id: str
    at: datetime
    actor: str
    note: str | None
    review: ReviewOut

    @classmethod
    def of(cls, snapshot: SessionSnapshot, ctx: WorkspaceContext) -> CheckpointOut:
        review = ReviewOut.of(snapshot.session_id, ctx, with_patch=False)
        return cls(
            summary=f"checkpoint {snapshot.id} of session {snapshot.session_id} recorded by {snapshot.actor}: "
            f"{review.summary}",
            id=snapshot.id,
            session_id=snapshot.session_id,
            at=snapshot.at,
            actor=snapshot.actor,
            note=snapshot.note,
            review=review,
        )


class ContextOut(BaseModel):
    """A project's git and tracker context, with how old the snapshot is."""

    summary: str
    project: str
    taken_at: datetime
    age_seconds: float
    cached: bool
    git: dict[str, Any]
    tracker: dict[str, Any]

    @classmethod
    def of(cls, context: ProjectContext) -> ContextOut:
        git, tracker = context.git, context.tracker
        where = (
            "error: " + git["error"]
            if "error" in git
            else (
                f"on {git.get('branch') or 'a detached HEAD'}, {'clean' if git.get('clean') else 'dirty'}, "
                f"{git.get('state')}, {len(git.get('worktrees', [])) - 1} session worktree(s)"
            )
        )
        return cls(
            summary=f"{context.project_name}: git {where}; tasks {tracker['open']} open, {tracker['ready']} ready, "
            f"{tracker['blocked']} blocked, {tracker['in_progress']} in progress; snapshot {context.age_seconds:.1f}s "
            f"old{' (cached)' if context.cached else ''}",
            project=context.project_name,
            taken_at=context.taken_at,
            age_seconds=context.age_seconds,
            cached=context.cached,
            git=git,
            tracker=tracker,
        )


class DecisionOut(BaseModel):
    """What a decision did: the session's state after it (and after any compensation or merge it caused)."""

    summary: str
    session_id: str
    decision: str
    operator: str
    outcome: str = Field(description="applied, or pending (an approval counted; review_approval wants more).")
    replayed: bool = Field(description="True when this exact decision was taken before: its first result.")
    state: str
    version: int
    reason: str | None
    compensation: str | None
    then: list[str] = Field(default_factory=list, description="Transitions that followed (compensation, merge).")
    bypassed: list[dict[str, Any]] = Field(default_factory=list, description="Violations an override bypassed.")
    warnings: list[str] = Field(default_factory=list)
    at: datetime

    @classmethod
    def of(cls, result: DecisionResult) -> DecisionOut:
        d, s = result.decision, result.session
        return cls(
            summary=f"session {s.id}: {result.summary()}",
            session_id=s.id,
            decision=d.decision.value,
            operator=d.operator_id,
            outcome=d.outcome,
            replayed=result.replayed,
            state=s.state.value,
            version=s.version,
            reason=d.reason,
            compensation=d.compensation.value if d.compensation else None,
            then=[f"{r.trigger}: {r.from_state} → {r.to_state}" for r in result.follow_ups],
            bypassed=result.bypassed,
            warnings=list(result.warnings),
            at=d.at,
        )


class PolicyOut(BaseModel):
    name: str
    description: str
    priority: int = Field(description="Lower runs first.")
    severity: str = Field(description="error blocks; warning and info are recorded, not blocking.")
    triggers: list[str]
    enabled: bool
    settings: dict[str, Any]


class PolicyList(BaseModel):
    summary: str
    project: str | None = Field(description="The project whose configuration this is; null: the global set.")
    test_command: list[str] = Field(description="require_tests' command for the project (empty: none set).")
    policies: list[PolicyOut]

    @classmethod
    def of(cls, project: str | None, entries: Sequence[PolicyEntry], test_command: Sequence[str]) -> PolicyList:
        enabled = sum(1 for e in entries if e.enabled)
        where = f"project {project}" if project else "the global configuration"
        return cls(
            summary=f"{enabled} of {len(entries)} policies enabled in {where}",
            project=project,
            test_command=list(test_command),
            policies=[PolicyOut(**e.as_dict()) for e in entries],
        )


class ViolationOut(BaseModel):
    policy: str
    message: str
    severity: str
    suggestion: str


class TestRunOut(BaseModel):
    command: list[str]
    exit_code: int | None = Field(description="null when it timed out or could not start.")
    timed_out: bool
    duration_ms: int
    head_commit: str | None
    output_tail: str
    reused: bool = Field(description="True: a stored run on the same head was used; the command did not run.")
    stored: bool = Field(description="Whether the run is in the database (a dry run stores nothing).")

    @classmethod
    def of(cls, run: TestRun, reused: bool) -> TestRunOut:
        return cls(
            command=list(run.command),
            exit_code=run.exit_code,
            timed_out=run.timed_out,
            duration_ms=run.duration_ms,
            head_commit=run.head_commit,
            output_tail=run.output_tail,
            reused=reused,
            stored=run.id is not None,
        )


class PolicyCheckOut(BaseModel):
    summary: str
    session_id: str
    trigger: str
    from_state: str
    to_state: str
    allowed: bool = Field(description="Whether firing the trigger now would pass every policy.")
    policies: list[str] = Field(description="The applicable policies, in the order they ran.")
    guard_results: list[dict[str, Any]]
    violations: list[ViolationOut]
    bypassed: list[ViolationOut] = Field(description="Violations of overridden policies (recorded, not blocking).")
    test_run: TestRunOut | None
    test_note: str = Field(description="Why there is no test run, when there is none.")

    @classmethod
    def of(cls, check: PolicyCheck) -> PolicyCheckOut:
        verdict, slow, s = check.verdict, check.slow, check.session
        refused_by = ", ".join(sorted({v.policy for v in verdict.blocking()}))
        outcome = "would be allowed" if check.allowed else f"would be refused by {refused_by}"
        return cls(
            summary=f"'{check.trigger}' on session {s.id} ({s.state.value} → {check.to_state}) {outcome}"
            f"{_tests_summary(check)}",
            session_id=s.id,
            trigger=check.trigger,
            from_state=s.state.value,
            to_state=check.to_state,
            allowed=check.allowed,
            policies=list(check.policies),
            guard_results=[r.as_dict() for r in verdict.results],
            violations=[ViolationOut(**v.as_dict()) for v in verdict.violations],
            bypassed=[ViolationOut(**v.as_dict()) for v in verdict.bypassed],
            test_run=TestRunOut.of(slow.test_run, bool(slow.test_run_reused)) if slow.test_run else None,
            test_note=slow.test_note,
        )


def _tests_summary(check: PolicyCheck) -> str:
    run = check.slow.test_run
    if run is None:
        return ""
    how = "stored run reused" if check.slow.test_run_reused else "ran now, not stored"
    return f"; tests {'passed' if run.passed else 'failed'} ({how})"


class ReadyOut(SessionOut):
    """One session waiting for a decision, in the shape every tool gives a session (`id`, `state`, … at the top
    level), with what the decision needs."""

    waiting_since: datetime
    files: list[FileStatOut] = Field(description="Diff stat of the branch against its base.")
    commits: list[CommitOut]
    review_error: str | None = Field(description="Why there is no diff (no worktree, branch gone), if so.")
    tests: dict[str, Any] | None = Field(description="The stored test run of the head: exit code, duration, tail.")
    policies: list[dict[str, Any]] = Field(description="The approve policies as the caller would meet them now.")
    would_approve: bool | None = Field(description="Whether approve would pass the policies now (dry run).")
    approvals: list[str] = Field(description="Operators whose approval is counted already.")
    approval_step: str | None = Field(
        default=None, description="The workflow approval step the session waits on (state executing), if so."
    )
    message: str | None = Field(default=None, description="That approval step's message to the reviewer.")
    escalated: bool = Field(
        default=False,
        description="The sweeper escalated this verification (waiting too long for a decision; listed first). "
        "When: escalated_at.",
    )

    @classmethod
    def of(cls, item: ReviewItem) -> ReadyOut:
        review, check = item.review, item.check
        run = check.slow.test_run if check else None
        tests = None if run is None else {"exit_code": run.exit_code, "timed_out": run.timed_out,
                                          "duration_ms": run.duration_ms, "head_commit": run.head_commit,
                                          "output_tail": run.output_tail[-2000:]}  # fmt: skip
        files = [FileStatOut(path=f.path, added=f.added, deleted=f.deleted) for f in review.diff_stat] if review else []
        verdict = "would pass" if check and check.allowed else ("would be refused" if check else "not checked")
        waits = (
            f"approve {verdict}"
            if item.approval_step is None
            else f"waits at workflow approval step '{item.approval_step}': {item.message or '(no message)'}"
        )
        escalated = item.session.escalated_at
        mark = f"ESCALATED at {escalated.isoformat(timespec='seconds')}: " if escalated else ""
        return cls(
            **SessionOut.of(item.session).model_dump(exclude={"summary"}),
            summary=f"{mark}{item.session.task_id} ({item.session.id[:8]}): {len(files)} file(s) changed, "
            f"{len(review.commits) if review else 0} commit(s); tests "
            f"{'not run yet' if run is None else ('passed' if run.exit_code == 0 else 'failed')}; {waits}",
            approval_step=item.approval_step,
            message=item.message,
            waiting_since=item.session.updated_at,
            files=files,
            commits=[CommitOut(sha=c.sha, subject=c.subject, author=c.author, at=c.at) for c in review.commits]
            if review
            else [],
            review_error=item.review_error,
            tests=tests,
            policies=[dict(r.as_dict()) for r in check.verdict.results] if check else [],
            would_approve=check.allowed if check else None,
            approvals=item.approvals,
            escalated=escalated is not None,
        )


class ReadyList(BaseModel):
    summary: str
    sessions: list[ReadyOut]

    @classmethod
    def of(cls, items: list[ReviewItem]) -> ReadyList:
        escalated = sum(1 for i in items if i.session.escalated_at)
        note = f" ({escalated} escalated, listed first)" if escalated else ""
        return cls(
            summary=f"{len(items)} session(s) waiting for your decision{note}",
            sessions=[ReadyOut.of(i) for i in items],
        )


class OutputOut(BaseModel):
    """A file saved into a session folder, as its manifest now lists it."""

    summary: str
    session_id: str
    path: str = Field(description="Relative to the session folder.")
    bytes: int
    sha256: str
    at: str
    by: str

    @classmethod
    def of(cls, session_id: str, record: OutputRecord) -> OutputOut:
        return cls(
            summary=f"saved {record.path} ({record.bytes} bytes) in the folder of session {session_id}",
            session_id=session_id,
            **record.to_dict(),
        )


class WorkflowInfo(BaseModel):
    id: str
    description: str
    category: str | None = Field(description="The folder under workflows/ it lives in (built-in or the project's own).")
    steps: int = Field(description="How many top-level steps it has.")
    step_ids: list[str] = Field(description="Its top-level steps, in file order (the first runs first).")
    triggers: list[str] = Field(description="Events that may start it, as the file lists them.")
    max_iterations: int = Field(description="The loop guard: at most this many steps per run of the workflow.")
    visible_to: list[str] = Field(default_factory=list, description="Who may run it (empty: everyone).")
    format: str = Field("taskgate", description="How its file was read: taskgate, or openagents (OpenAgents-style).")

    @classmethod
    def of(cls, w: Workflow) -> WorkflowInfo:
        return cls(
            id=w.id, description=w.description, category=w.category, steps=len(w.steps),
            step_ids=[s.id for s in w.steps], triggers=list(w.triggers), max_iterations=w.max_iterations,
            visible_to=list(w.visible_to), format=w.format,
        )  # fmt: skip


class WorkflowList(BaseModel):
    summary: str
    workflows: list[WorkflowInfo]

    @classmethod
    def of(cls, workflows: Sequence[Workflow], pattern: str | None, category: str | None) -> WorkflowList:
        filters = [f"matching '{pattern}'"] if pattern else []
        filters += [f"in category {category}"] if category else []
        return cls(
            summary=f"{len(workflows)} workflow(s){' ' + ' '.join(filters) if filters else ''}",
            workflows=[WorkflowInfo.of(w) for w in workflows],
        )


class ChecklistItemOut(BaseModel):
    id: str
    text: str
    required: bool = Field(description="Whether the checklist waits for it.")


class ChecklistInfo(BaseModel):
    id: str
    description: str
    items: list[ChecklistItemOut]

    @classmethod
    def of(cls, c: Checklist) -> ChecklistInfo:
        items = [ChecklistItemOut(id=i.id, text=i.text, required=i.required) for i in c.items]
        return cls(id=c.id, description=c.description, items=items)


class ChecklistList(BaseModel):
    summary: str
    checklists: list[ChecklistInfo]

    @classmethod
    def of(cls, checklists: Sequence[Checklist], pattern: str | None) -> ChecklistList:
        matching = f" matching '{pattern}'" if pattern else ""
        return cls(
            summary=f"{len(checklists)} checklist(s){matching}", checklists=[ChecklistInfo.of(c) for c in checklists]
        )
