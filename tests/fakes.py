"""In-memory twins of every port, for fast tests of the application layer.

`tests/contract` runs the same checks against these and the SQLAlchemy adapters. The fake unit of work is
transactional like the real one: a write unit works on a private copy of the store, swapped in on commit,
and write units are serialised by a lock (as SQLite's write lock does), so "nothing written on refusal"
and the concurrency rules can be checked here too.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from taskgate.application.forge.ports import PullRequestRecord
from taskgate.application.nodes.ports import Lease, NodeRecord
from taskgate.application.notifications.ports import QueuedNotice
from taskgate.application.sessions.ports import TestOutcome, TransitionLocks, TransitionQuery
from taskgate.application.trackers.ports import TaskFacts, TrackerPoll
from taskgate.application.webhooks.ports import Delivery, OutboxEvent
from taskgate.application.workspaces.ports import (
    BranchChange,
    CommitInfo,
    FileStat,
    MergeOutcome,
    RepoContext,
    RepositoryInfo,
    WorkspaceContext,
    WorktreeCreated,
    WorktreeEntry,
    WorktreeState,
)
from taskgate.domain import writebacks as wb
from taskgate.domain.beads import WAITS_FOR_ANY
from taskgate.domain.entities import (
    OPEN_STEP_STATUSES,
    Agent,
    AgentStatus,
    ApiToken,
    Decision,
    Operator,
    Outcome,
    Plan,
    PlanStatus,
    Project,
    Session,
    SessionSnapshot,
    StepRun,
    StepStatus,
    Task,
    TaskStatus,
    TransitionRecord,
)
from taskgate.domain.errors import (
    AlreadyExists,
    BranchGone,
    ConcurrentModification,
    InvalidInput,
    OperatorNotFound,
    PlanNotFound,
    ProjectNotFound,
    SessionAlreadyActive,
    SessionNotFound,
    StepRunNotFound,
    TaskNotFound,
    VcsError,
    WorktreeMismatch,
    WritebackNotFound,
)
from taskgate.domain.notifications import Notice, is_ci_failure
from taskgate.domain.policies.facts import BlockerFact, TestRun
from taskgate.domain.questions import Question
from taskgate.domain.states import TERMINAL_STATES, SessionState
from taskgate.domain.writebacks import Writeback
from taskgate.infrastructure.db.unit_of_work import REPOSITORIES, Committed


@dataclass
class InMemoryStore:
    projects: dict[int, Project] = field(default_factory=dict)
    task_seq: dict[int, int] = field(default_factory=dict)
    plans: dict[int, Plan] = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)
    operators: dict[str, Operator] = field(default_factory=dict)
    sessions: dict[str, Session] = field(default_factory=dict)
    log: list[TransitionRecord] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    tokens: dict[str, ApiToken] = field(default_factory=dict)
    snapshots: list[SessionSnapshot] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    test_runs: list[TestRun] = field(default_factory=list)
    agents: dict[str, Agent] = field(default_factory=dict)
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    step_runs: dict[int, StepRun] = field(default_factory=dict)
    writebacks: dict[int, Writeback] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    pull_requests: dict[str, PullRequestRecord] = field(default_factory=dict)
    tracker_polls: dict[int, TrackerPoll] = field(default_factory=dict)
    questions: dict[str, Question] = field(default_factory=dict)
    notify_cursor: int | None = None
    notifications: dict[int, QueuedNotice] = field(default_factory=dict)
    forge_deliveries: dict[str, tuple[str, str, datetime]] = field(default_factory=dict)
    next_id: dict[str, int] = field(default_factory=dict)

    def allocate(self, kind: str) -> int:
        self.next_id[kind] = self.next_id.get(kind, 0) + 1
        return self.next_id[kind]


class _Repo:
    def __init__(self, store: InMemoryStore) -> None:
        self.store = store


class InMemoryProjectRepository(_Repo):
    async def add(self, name: str, key: str, root_path: str, created_at: datetime) -> Project:
        project = Project(
            id=self.store.allocate("project"), name=name, key=key, root_path=root_path, created_at=created_at
        )
        self.store.projects[project.id] = project
        return copy.deepcopy(project)

    async def get(self, project_id: int, *, lock: bool = False) -> Project:
        if project_id not in self.store.projects:
            raise ProjectNotFound(project_id)
        return copy.deepcopy(self.store.projects[project_id])

    async def find(self, *, name=None, root_path=None, key=None) -> Project | None:
        for p in self.store.projects.values():
            if (
                (name is not None and p.name == name)
                or (root_path and p.root_path == root_path)
                or (key is not None and name is None and not root_path and p.key == key)
            ):
                return copy.deepcopy(p)
        return None

    async def list(self) -> list[Project]:
        return [copy.deepcopy(p) for _, p in sorted(self.store.projects.items())]

    async def archive(self, project_id: int, at: datetime) -> None:
        self.store.projects[project_id].archived_at = at

    async def allocate_task_number(self, project_id: int) -> int:
        if project_id not in self.store.projects:
            raise ProjectNotFound(project_id)
        self.store.task_seq[project_id] = self.store.task_seq.get(project_id, 0) + 1
        return self.store.task_seq[project_id]


class InMemoryPlanRepository(_Repo):
    async def add(self, project_id: int, name: str, created_at: datetime) -> Plan:
        plan = Plan(self.store.allocate("plan"), project_id, name, PlanStatus.OPEN, created_at)
        self.store.plans[plan.id] = plan
        return copy.deepcopy(plan)

    async def get(self, plan_id: int, *, lock: bool = False) -> Plan:
        if plan_id not in self.store.plans:
            raise PlanNotFound(plan_id)
        return copy.deepcopy(self.store.plans[plan_id])

    async def list(self, project_id: int) -> list[Plan]:
        return [copy.deepcopy(p) for _, p in sorted(self.store.plans.items()) if p.project_id == project_id]

    async def set_status(self, plan_id: int, status: PlanStatus) -> None:
        self.store.plans[plan_id].status = status


class InMemoryTaskRepository(_Repo):
    async def add(self, task: Task) -> None:
        for blocker in task.blockers:
            if blocker not in self.store.tasks:
                raise TaskNotFound(blocker)
        self.store.tasks[task.id] = copy.deepcopy(replace(task, blockers=sorted(task.blockers)))

    async def get(self, task_id: str, *, lock: bool = False, with_blockers: bool = True) -> Task:
        if task_id not in self.store.tasks:
            raise TaskNotFound(task_id)
        task = copy.deepcopy(self.store.tasks[task_id])
        return task if with_blockers else replace(task, blockers=[])

    async def list(self, project_id: int, *, plan_id=None, status=None) -> list[Task]:
        found = [
            t
            for t in self.store.tasks.values()
            if t.project_id == project_id
            and (plan_id is None or t.plan_id == plan_id)
            and (status is None or t.status == status)
        ]
        return [copy.deepcopy(t) for t in sorted(found, key=lambda t: (t.created_at, t.id))]

    async def ready(self, project_id: int, limit: int | None = None) -> list[Task]:
        active = {s.task_id for s in self.store.sessions.values() if s.state not in TERMINAL_STATES}
        found = [
            t
            for t in self.store.tasks.values()
            if t.project_id == project_id
            and t.status == TaskStatus.OPEN
            and t.hold is None
            and t.id not in active
            and not self._blocked(t)
            and (t.plan_id is None or self.store.plans[t.plan_id].status != PlanStatus.CLOSED)
        ]
        ordered = sorted(found, key=lambda t: (t.priority, t.created_at, t.id))
        return [copy.deepcopy(t) for t in ordered[:limit]]

    def _blocked(self, task: Task) -> bool:
        """As the SQL: a waits-for-any row blocks only while none of the task's waits-for-any rows is done."""
        types = self._dependency_types()
        done = {b for b in task.blockers if self.store.tasks[b].status == TaskStatus.COMPLETED}
        gate_open = any(types.get((task.id, b)) == WAITS_FOR_ANY for b in done)
        return any(b not in done and (types.get((task.id, b)) != WAITS_FOR_ANY or not gate_open) for b in task.blockers)

    async def facts(self, task_id: str, plan_id: int | None, states: frozenset[SessionState]) -> TaskFacts:
        task = await self.get(task_id, with_blockers=False)
        in_states = sum(1 for s in self.store.sessions.values() if plan_id is not None and s.plan_id == plan_id
                        and s.state in states)  # fmt: skip
        project = copy.deepcopy(self.store.projects[task.project_id])
        return TaskFacts(task, project, tuple(await self.blockers_of(task_id)), in_states)

    async def blockers_of(self, task_id: str) -> list[BlockerFact]:
        task = self.store.tasks[task_id]
        return [BlockerFact(b, self.store.tasks[b].status) for b in sorted(task.blockers)]

    async def set_status(self, task_id: str, status: TaskStatus) -> None:
        self.store.tasks[task_id].status = status

    async def count_unfinished(self, plan_id: int) -> int:
        return sum(1 for t in self.store.tasks.values() if t.plan_id == plan_id and t.status != TaskStatus.COMPLETED)

    async def get_many(self, task_ids: list[str]) -> list[Task]:
        return [copy.deepcopy(self.store.tasks[i]) for i in sorted(set(task_ids)) if i in self.store.tasks]

    async def update_details(self, task_id: str, *, title: str, description: str, priority: int, labels=None) -> None:
        task = self.store.tasks[task_id]
        task.title, task.description, task.priority = title, description, priority
        if labels is not None:
            task.labels = list(labels)

    async def set_tracker_facts(self, task_id: str, *, tracker_status, hold) -> None:
        task = self.store.tasks[task_id]
        task.tracker_status, task.hold = tracker_status, hold

    async def of_source(self, project_id: int, source: str) -> list[Task]:
        found = [t for t in self.store.tasks.values() if t.project_id == project_id and t.source == source]
        return [replace(copy.deepcopy(t), blockers=[]) for t in sorted(found, key=lambda t: t.id)]

    async def add_many(self, tasks) -> None:
        for task in tasks:
            await self.add(replace(task, blockers=[]))

    async def add_links(self, links) -> None:
        by_task: dict[str, list[tuple[str, str]]] = {}
        for task_id, target, kind in links:
            by_task.setdefault(task_id, []).append((target, kind))
        for task_id, rows in by_task.items():
            await self.set_blockers(task_id, rows + await self._links_of(task_id))

    async def _links_of(self, task_id: str) -> list[tuple[str, str]]:
        return (await self.blocker_links([task_id])).get(task_id, [])

    async def set_blockers(self, task_id: str, blockers: list[tuple[str, str]]) -> None:
        for blocker, _ in blockers:
            if blocker not in self.store.tasks:
                raise TaskNotFound(blocker)
        self.store.tasks[task_id].blockers = sorted(b for b, _ in blockers)
        types = self._dependency_types()
        for key in [k for k in types if k[0] == task_id]:
            del types[key]
        types.update({(task_id, b): kind for b, kind in blockers})

    async def blocker_links(self, task_ids: list[str]) -> dict[str, list[tuple[str, str]]]:
        types = self._dependency_types()
        return {
            i: [(b, types.get((i, b), "blocks")) for b in self.store.tasks[i].blockers]
            for i in task_ids
            if i in self.store.tasks and self.store.tasks[i].blockers
        }

    def _dependency_types(self) -> dict[tuple[str, str], str]:
        """The type of each (task, blocker) row; `add` writes none, and those read as `blocks` (as the SQL does)."""
        return self.store.__dict__.setdefault("dependency_types", {})


class InMemoryOperatorRepository(_Repo):
    async def add(self, operator: Operator) -> None:
        self.store.operators[operator.id] = copy.deepcopy(operator)

    async def get(self, operator_id: str) -> Operator:
        found = await self.find(operator_id)
        if found is None:
            raise OperatorNotFound(operator_id)
        return found

    async def find(self, operator_id: str) -> Operator | None:
        found = self.store.operators.get(operator_id)
        return copy.deepcopy(found) if found else None

    async def list(self) -> list[Operator]:
        return [copy.deepcopy(o) for _, o in sorted(self.store.operators.items())]

    async def update(self, operator: Operator) -> None:
        if operator.id not in self.store.operators:
            raise OperatorNotFound(operator.id)
        self.store.operators[operator.id] = copy.deepcopy(operator)

    async def lock(self, operator_id: str) -> None:
        await self.get(operator_id)  # the fake's write units are serialised already


class InMemorySessionRepository(_Repo):
    async def add(self, session: Session) -> None:
        if session.state not in TERMINAL_STATES and await self.active_for_task(session.task_id):
            raise SessionAlreadyActive(f"task {session.task_id} already has an active session")
        self.store.sessions[session.id] = copy.deepcopy(session)

    async def get(self, session_id: str, *, lock: bool = False) -> Session:
        if session_id not in self.store.sessions:
            raise SessionNotFound(session_id)
        return copy.deepcopy(self.store.sessions[session_id])

    async def lock_for_transition(
        self, session_id: str, operator_id: str | None, *, session_operator: bool, plan: bool
    ) -> TransitionLocks:
        session = await self.get(session_id)  # the fake's write units are serialised already
        wanted = operator_id or (session.operator_id if session_operator else None)
        found = wanted is None or wanted in self.store.operators
        locked = self.store.plans.get(session.plan_id) if plan and session.plan_id is not None else None
        return TransitionLocks(session, found, copy.deepcopy(locked))

    async def update(self, session: Session, expected_version: int) -> None:
        stored = self.store.sessions.get(session.id)
        if stored is None or stored.version != expected_version:
            raise ConcurrentModification(f"session {session.id} changed concurrently")
        self.store.sessions[session.id] = copy.deepcopy(session)

    async def list(self, *, project_id=None, plan_id=None, states=None) -> list[Session]:
        found = [
            s
            for s in self.store.sessions.values()
            if (project_id is None or s.project_id == project_id)
            and (plan_id is None or s.plan_id == plan_id)
            and (states is None or s.state in states)
        ]
        return [copy.deepcopy(s) for s in sorted(found, key=lambda s: (s.created_at, s.id))]

    async def active_for_task(self, task_id: str) -> list[str]:
        return [s.id for s in self.store.sessions.values() if s.task_id == task_id and s.state not in TERMINAL_STATES]

    async def active_of_node(self, node_id: str) -> list[str]:
        found = [s for s in self.store.sessions.values() if s.node_id == node_id and s.state not in TERMINAL_STATES]
        return [s.id for s in sorted(found, key=lambda s: (s.created_at, s.id))]

    async def ids_with_prefix(self, prefix: str, limit: int) -> list[str]:
        return sorted(i for i in self.store.sessions if i.startswith(prefix))[:limit]

    async def count_in_states(self, plan_id: int, states: frozenset[SessionState]) -> int:
        return sum(1 for s in self.store.sessions.values() if s.plan_id == plan_id and s.state in states)

    async def count_of_operator(self, operator_id: str, states: frozenset[SessionState]) -> int:
        return sum(1 for x in self.store.sessions.values() if x.operator_id == operator_id and x.state in states)

    async def count_by_state(self, project_id, *, plan_id=None, operator_id=None) -> dict[SessionState, int]:
        return dict(Counter(s.state for s in self._narrowed(project_id, plan_id, operator_id)))

    async def page_in_states(
        self, project_id, states, *, offset, limit, plan_id=None, operator_id=None
    ) -> list[Session]:
        found = [s for s in self._narrowed(project_id, plan_id, operator_id) if s.state in states]
        found.sort(key=lambda s: (s.updated_at, s.id), reverse=True)
        return [copy.deepcopy(s) for s in found[offset : offset + limit]]

    async def count_by_plan(self, project_id, states) -> dict[int, int]:
        mine = self._narrowed(project_id, None, None)
        return dict(Counter(s.plan_id for s in mine if s.plan_id is not None and s.state in states))

    async def operators_of_project(self, project_id) -> list[str]:
        return sorted({s.operator_id for s in self._narrowed(project_id, None, None) if s.operator_id})

    def _narrowed(self, project_id, plan_id, operator_id) -> list[Session]:
        return [
            s
            for s in self.store.sessions.values()
            if s.project_id == project_id
            and (plan_id is None or s.plan_id == plan_id)
            and (operator_id is None or s.operator_id == operator_id)
        ]


class InMemoryTransitionLog(_Repo):
    async def append(self, record: TransitionRecord) -> int:
        seq = self.store.allocate("log")
        self.store.log.append(replace(record, seq=seq, guard_results=copy.deepcopy(record.guard_results)))
        return seq

    async def history(self, session_id: str, *, limit: int) -> list[TransitionRecord]:
        return [r for r in self.store.log if r.session_id == session_id][-limit:]

    async def applied_until(self, session_id: str, at: datetime) -> list[TransitionRecord]:
        return [r for r in self.store.log if r.session_id == session_id and r.at <= at and r.outcome == Outcome.APPLIED]

    async def query(self, query: TransitionQuery) -> list[TransitionRecord]:
        def keep(r: TransitionRecord) -> bool:
            return (
                (query.session_id is None or r.session_id == query.session_id)
                and (query.actor is None or r.actor == query.actor)
                and (query.state is None or r.to_state == query.state)
                and (query.outcome is None or r.outcome.value == query.outcome)
                and (query.since is None or r.at >= query.since)
                and (query.until is None or r.at <= query.until)
            )

        return sorted((r for r in self.store.log if keep(r)), key=lambda r: (r.at, r.seq))[: query.limit]


class InMemoryEventLog(_Repo):
    async def append(self, kind: str, at: datetime, payload: dict[str, Any], session_id: str | None = None) -> None:
        self.store.events.append(
            {
                "id": self.store.allocate("event"),
                "kind": kind,
                "at": at,
                "payload": copy.deepcopy(payload),
                "session_id": session_id,
            }
        )

    async def list(self, session_id=None, limit=100, *, kind=None, since=None, until=None) -> list[dict[str, Any]]:
        def wanted(e: dict[str, Any]) -> bool:
            if kind is not None and not (e["kind"].startswith(kind) if kind.endswith(".") else e["kind"] == kind):
                return False
            return (since is None or e["at"] >= since) and (until is None or e["at"] <= until)

        return [e for e in self.store.events if session_id in (None, e["session_id"]) and wanted(e)][-limit:]

    async def high_water(self) -> int:
        return self.store.events[-1]["id"] if self.store.events else 0


class InMemoryDecisionRepository(_Repo):
    async def add(self, decision: Decision) -> int:
        if decision.session_id not in self.store.sessions:
            raise SessionNotFound(decision.session_id)
        key = (decision.session_id, decision.session_version, decision.operator_id)
        if any((d.session_id, d.session_version, d.operator_id) == key for d in self.store.decisions):
            raise AlreadyExists(
                f"operator {decision.operator_id} already decided session {decision.session_id} "
                f"at version {decision.session_version}"
            )
        stored = replace(decision, id=self.store.allocate("decision"))
        self.store.decisions.append(copy.deepcopy(stored))
        return stored.id

    async def for_verification(self, session_id: str, session_version: int) -> list[Decision]:
        key = (session_id, session_version)
        return [copy.deepcopy(d) for d in self.store.decisions if (d.session_id, d.session_version) == key]

    async def of_session(self, session_id: str, limit: int = 100) -> list[Decision]:
        return [copy.deepcopy(d) for d in self.store.decisions if d.session_id == session_id][-limit:]

    async def approvals(self, session_id: str, session_version: int) -> list[str]:
        found = await self.for_verification(session_id, session_version)
        return sorted(d.operator_id for d in found if d.decision == "approve")


class InMemorySnapshotRepository(_Repo):
    async def add(self, snapshot: SessionSnapshot) -> int:
        if snapshot.session_id not in self.store.sessions:
            raise SessionNotFound(snapshot.session_id)
        stored = replace(snapshot, id=self.store.allocate("snapshot"), data=copy.deepcopy(snapshot.data))
        self.store.snapshots.append(stored)
        return stored.id

    async def list(self, session_id: str, *, kind: str | None = None, limit: int = 50) -> list[SessionSnapshot]:
        found = [s for s in self.store.snapshots if s.session_id == session_id and kind in (None, s.kind)]
        return [copy.deepcopy(s) for s in reversed(found)][:limit]


class InMemoryTokenRepository(_Repo):
    async def add(self, token: ApiToken) -> None:
        if any(t.token_hash == token.token_hash for t in self.store.tokens.values()):
            raise InvalidInput("duplicate token hash")
        self.store.tokens[token.id] = token

    async def find_by_hash(self, token_hash: str) -> ApiToken | None:
        return next((t for t in self.store.tokens.values() if t.token_hash == token_hash), None)

    async def get(self, token_id: str) -> ApiToken | None:
        return self.store.tokens.get(token_id)

    async def list(self) -> list[ApiToken]:
        return sorted(self.store.tokens.values(), key=lambda t: (t.created_at, t.id))

    async def revoke(self, token_id: str, at: datetime) -> bool:
        if token_id not in self.store.tokens:
            return False
        self.store.tokens[token_id] = replace(self.store.tokens[token_id], revoked_at=at)
        return True

    async def revoke_for_agent(self, agent_id: str, at: datetime) -> int:
        return self._revoke_where(lambda tok: tok.agent_id == agent_id, at)

    async def revoke_for_session(self, session_id: str, at: datetime) -> int:
        return self._revoke_where(lambda tok: tok.session_id == session_id, at)

    async def revoke_dangling(self, at: datetime) -> list[str]:
        live = {a.id for a in self.store.agents.values() if a.status.value in ("queued", "running", "lost")}
        ended = {s.id for s in self.store.sessions.values() if s.state.value in ("completed", "cancelled")}
        doomed = [
            tok.id
            for tok in self.store.tokens.values()
            if tok.kind == "agent"
            and tok.revoked_at is None
            and ((tok.agent_id is not None and tok.agent_id not in live) or tok.session_id in ended)
        ]
        for token_id in doomed:
            self.store.tokens[token_id] = replace(self.store.tokens[token_id], revoked_at=at)
        return doomed

    def _revoke_where(self, match, at: datetime) -> int:
        doomed = [tok.id for tok in self.store.tokens.values() if tok.revoked_at is None and match(tok)]
        for token_id in doomed:
            self.store.tokens[token_id] = replace(self.store.tokens[token_id], revoked_at=at)
        return len(doomed)


class InMemoryNodeRepository(_Repo):
    async def beat(self, node: NodeRecord) -> None:
        self.store.nodes[node.id] = replace(node, down_at=None)

    async def get(self, node_id: str) -> NodeRecord | None:
        return self.store.nodes.get(node_id)

    async def list(self) -> list[NodeRecord]:
        return [self.store.nodes[k] for k in sorted(self.store.nodes)]

    async def live_agents(self) -> dict[str | None, int]:
        counts: dict[str | None, int] = {}
        for agent in self.store.agents.values():
            if agent.status.value in ("queued", "running"):
                counts[agent.node_id] = counts.get(agent.node_id, 0) + 1
        return counts

    async def live_sessions(self) -> dict[str | None, int]:
        counts: dict[str | None, int] = {}
        for session in self.store.sessions.values():
            if session.state not in TERMINAL_STATES:
                counts[session.node_id] = counts.get(session.node_id, 0) + 1
        return counts

    async def mark_down(self, node_id: str, beat_before: datetime, at: datetime) -> bool:
        node = self.store.nodes.get(node_id)
        if node is None or node.down_at is not None or node.heartbeat_at >= beat_before:
            return False
        self.store.nodes[node_id] = replace(node, down_at=at)
        return True


class InMemoryLeaseRepository(_Repo):
    async def acquire(self, name: str, holder: str, node_id: str, now: datetime, until: datetime) -> Lease:
        held = self.store.leases.get(name)
        if held is None or held.holder == holder or held.expires_at < now:
            acquired = held.acquired_at if held is not None and held.holder == holder else now
            self.store.leases[name] = Lease(name, holder, node_id, acquired, until)
        return self.store.leases[name]

    async def release(self, name: str, holder: str) -> None:
        if name in self.store.leases and self.store.leases[name].holder == holder:
            del self.store.leases[name]


class InMemoryTrackerPollRepository(_Repo):
    async def save(self, poll: TrackerPoll) -> None:
        self.store.tracker_polls[poll.project_id] = replace(poll, report=copy.deepcopy(poll.report))

    async def list(self) -> list[TrackerPoll]:
        return [replace(p, report=copy.deepcopy(p.report)) for _, p in sorted(self.store.tracker_polls.items())]


class InMemoryQuestionRepository(_Repo):
    async def add(self, question: Question) -> None:
        self.store.questions[question.id] = question

    async def get(self, question_id: str) -> Question | None:
        return self.store.questions.get(question_id)

    async def open(self, session_ids: Sequence[str] | None = None) -> list[Question]:
        found = [q for q in self.store.questions.values() if q.is_open]
        if session_ids is not None:
            found = [q for q in found if q.session_id in set(session_ids)]
        return sorted(found, key=lambda q: (q.asked_at, q.id))

    async def of_session(self, session_id: str, limit: int = 50) -> list[Question]:
        found = [q for q in self.store.questions.values() if q.session_id == session_id]
        return sorted(found, key=lambda q: (q.asked_at, q.id), reverse=True)[:limit]

    async def settle(self, question: Question) -> bool:
        current = self.store.questions.get(question.id)
        if current is None or not current.is_open:
            return False
        self.store.questions[question.id] = question
        return True

    async def due(self, now: datetime) -> list[Question]:
        return sorted((q for q in self.store.questions.values() if q.is_open and q.deadline <= now),
                      key=lambda q: q.deadline)  # fmt: skip


class InMemoryNotificationRepository(_Repo):
    async def cursor(self) -> int | None:
        return self.store.notify_cursor

    async def move_cursor(self, event_id: int) -> None:
        self.store.notify_cursor = event_id

    async def queue(self, channel: str, notices: Sequence[Notice], at: datetime) -> int:
        taken = {(q.channel, q.notice.event_id) for q in self.store.notifications.values()}
        added = 0
        for notice in notices:
            if (channel, notice.event_id) not in taken:
                row_id = self.store.allocate("notification")
                self.store.notifications[row_id] = QueuedNotice(row_id, channel, notice, at)
                taken.add((channel, notice.event_id))
                added += 1
        return added

    async def pending(self, channel: str, limit: int = 100) -> list[QueuedNotice]:
        rows = [q for q in self.store.notifications.values() if q.channel == channel and q.status == "pending"]
        return sorted(rows, key=lambda q: q.notice.event_id)[:limit]

    async def mark_sent(self, ids: Sequence[int], at: datetime) -> None:
        self._change(ids, lambda q: replace(q, status="sent", sent_at=at))

    async def mark_retry(self, ids: Sequence[int], error: str, next_attempt_at: datetime) -> None:
        self._change(
            ids, lambda q: replace(q, attempts=q.attempts + 1, last_error=error, next_attempt_at=next_attempt_at)
        )

    async def mark_failed(self, ids: Sequence[int], error: str) -> None:
        self._change(ids, lambda q: replace(q, attempts=q.attempts + 1, last_error=error, status="failed",
                                            next_attempt_at=None))  # fmt: skip

    def _change(self, ids: Sequence[int], how: Any) -> None:
        for row_id in ids:
            if row_id in self.store.notifications:
                self.store.notifications[row_id] = how(self.store.notifications[row_id])

    async def counts(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for q in self.store.notifications.values():
            counts[(q.channel, q.status)] = counts.get((q.channel, q.status), 0) + 1
        return counts

    async def last_error(self, channel: str) -> tuple[datetime | None, str | None]:
        rows = [q for q in self.store.notifications.values()
                if q.channel == channel and q.status in ("pending", "failed") and q.last_error is not None]  # fmt: skip
        newest = max(rows, key=lambda q: (q.status == "pending", q.id), default=None)
        return (None, None) if newest is None else (newest.next_attempt_at, newest.last_error)

    async def session_projects(self, session_ids: Sequence[str]) -> dict[str, str]:
        found = {}
        for sid in session_ids:
            session = self.store.sessions.get(sid)
            if session is not None and session.project_id in self.store.projects:
                found[sid] = self.store.projects[session.project_id].name
        return found

    async def ci_failures(self, session_id: str, up_to_event_id: int) -> int:
        return sum(
            1
            for e in self.store.events
            if e["session_id"] == session_id and e["id"] <= up_to_event_id and is_ci_failure(e["kind"], e["payload"])
        )


class InMemoryPullRequestRepository(_Repo):
    async def get(self, session_id: str) -> PullRequestRecord | None:
        found = self.store.pull_requests.get(session_id)
        return replace(found) if found is not None else None

    async def save(self, record: PullRequestRecord) -> None:
        self.store.pull_requests[record.session_id] = replace(record)

    async def following(self) -> list[PullRequestRecord]:
        live = {sid for sid, s in self.store.sessions.items() if s.state not in TERMINAL_STATES}
        return [replace(r) for sid, r in sorted(self.store.pull_requests.items()) if sid in live]

    async def store_observation(self, session_id, pushed_at, observation, status, at) -> bool:
        record = self.store.pull_requests.get(session_id)
        if record is None or record.pushed_at != pushed_at:
            return False
        self.store.pull_requests[session_id] = replace(
            record, observation=observation, status=status, observed_at=at, error=None, updated_at=at
        )
        return True

    async def unpoke(self, session_id: str) -> None:
        if (record := self.store.pull_requests.get(session_id)) is not None:
            self.store.pull_requests[session_id] = replace(record, poke=False)

    async def note(self, session_id: str, note: str, at: datetime) -> None:
        if (record := self.store.pull_requests.get(session_id)) is not None:
            self.store.pull_requests[session_id] = replace(record, note=note, updated_at=at)

    async def poke(self, branch: str | None, number: int | None) -> int:
        if branch:
            hit = [sid for sid, r in self.store.pull_requests.items() if r.branch == branch]
        elif number is not None:
            hit = [sid for sid, r in self.store.pull_requests.items() if r.number == number]
        else:
            hit = []
        for sid in hit:
            self.store.pull_requests[sid] = replace(self.store.pull_requests[sid], poke=True)
        return len(hit)

    async def record_delivery(self, delivery: str, event: str, outcome: str, at: datetime) -> bool:
        if delivery in self.store.forge_deliveries:
            return False
        self.store.forge_deliveries[delivery] = (event, outcome, at)
        return True

    async def delivery_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, outcome, _ in self.store.forge_deliveries.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts


class InMemoryWritebackRepository(_Repo):
    async def enqueue_for_task(self, task_id, sources, status, session_id, reason, now) -> None:
        task = self.store.tasks.get(task_id)
        if task is None or task.source not in sources:
            return
        row_id = self.store.allocate("writeback")
        self.store.writebacks[row_id] = Writeback(
            row_id,
            task.project_id,
            task_id,
            session_id,
            task.source,
            status,
            reason,
            wb.PENDING,
            0,
            now,
            None,
            now,
            now,
        )

    async def get(self, writeback_id: int) -> Writeback:
        if writeback_id not in self.store.writebacks:
            raise WritebackNotFound(writeback_id)
        return self.store.writebacks[writeback_id]

    async def due(self, now, limit=100) -> list[Writeback]:
        rows = [w for w in self.store.writebacks.values()
                if w.state == wb.PENDING and (w.next_attempt_at is None or w.next_attempt_at <= now)]  # fmt: skip
        return sorted(rows, key=lambda w: w.id)[:limit]

    async def list(self, *, states=None, task_ids=None, limit=100) -> list[Writeback]:
        wanted_states = set(states) if states is not None else None
        wanted_tasks = set(task_ids) if task_ids is not None else None
        rows = [w for w in self.store.writebacks.values()
                if (wanted_states is None or w.state in wanted_states)
                and (wanted_tasks is None or w.task_id in wanted_tasks)]  # fmt: skip
        return sorted(rows, key=lambda w: -w.id)[:limit]

    async def claim(self, writeback_id, attempts, lease_until, now) -> bool:
        return self._cas(writeback_id, attempts, attempts=attempts + 1, next_attempt_at=lease_until, updated_at=now)

    async def finish(self, writeback_id, attempts, state, error, next_attempt_at, now) -> bool:
        return self._cas(writeback_id, attempts, state=state, last_error=error, next_attempt_at=next_attempt_at,
                         updated_at=now)  # fmt: skip

    async def set_state(self, writeback_id, from_states, state, now, *, actor=None) -> bool:
        row = self.store.writebacks.get(writeback_id)
        if row is None or row.state not in set(from_states):
            return False
        extra = {"next_attempt_at": now, "attempts": 0} if state == wb.PENDING else {}
        self.store.writebacks[writeback_id] = replace(row, state=state, updated_at=now, resolved_by=actor, **extra)
        return True

    async def supersede_older(self, task_id, newest_id, now) -> int:
        older = [w for w in self.store.writebacks.values()
                 if w.task_id == task_id and w.id < newest_id and w.state in wb.OPEN_STATES]  # fmt: skip
        for row in older:
            self.store.writebacks[row.id] = replace(row, state=wb.SUPERSEDED, updated_at=now, next_attempt_at=None)
        return len(older)

    def _cas(self, writeback_id: int, expected: int, **values: Any) -> bool:
        row = self.store.writebacks.get(writeback_id)
        if row is None or row.state != wb.PENDING or row.attempts != expected:
            return False
        self.store.writebacks[writeback_id] = replace(row, **values)
        return True


class InMemoryUnitOfWork:
    """A transaction over an `InMemoryStore`: writes go to a copy that replaces the store on commit."""

    def __init__(self, database: InMemoryDatabase, *, write: bool) -> None:
        self._db, self._write = database, write

    async def __aenter__(self) -> InMemoryUnitOfWork:
        if self._write:
            await self._db.write_lock.acquire()
        store = copy.deepcopy(self._db.store) if self._write else self._db.store
        self._store = store
        self.projects = InMemoryProjectRepository(store)
        self.plans = InMemoryPlanRepository(store)
        self.tasks = InMemoryTaskRepository(store)
        self.operators = InMemoryOperatorRepository(store)
        self.sessions = InMemorySessionRepository(store)
        self.transitions = InMemoryTransitionLog(store)
        self.events = InMemoryEventLog(store)
        self.tokens = InMemoryTokenRepository(store)
        self.snapshots = InMemorySnapshotRepository(store)
        self.decisions = InMemoryDecisionRepository(store)
        self.test_runs = InMemoryTestRunRepository(store)
        self.agents = InMemoryAgentRepository(store)
        self.deliveries = InMemoryDeliveryRepository(store)
        self.step_runs = InMemoryStepRunRepository(store)
        self.writebacks = InMemoryWritebackRepository(store)
        self.nodes = InMemoryNodeRepository(store)
        self.leases = InMemoryLeaseRepository(store)
        self.pull_requests = InMemoryPullRequestRepository(store)
        self.tracker_polls = InMemoryTrackerPollRepository(store)
        self.questions = InMemoryQuestionRepository(store)
        self.notifications = InMemoryNotificationRepository(store)
        return self

    async def commit(self) -> None:
        if not self._write:
            raise InvalidInput("commit on a read-only unit of work")
        self._db.store = self._store
        for name in REPOSITORIES:  # as the real unit of work: nothing goes through it after commit
            setattr(self, name, Committed(name))

    async def __aexit__(self, *exc_info: object) -> None:
        if self._write:
            self._db.write_lock.release()


class InMemoryDatabase:
    """Holds the committed store; `unit_of_work` is the `UnitOfWorkFactory`."""

    def __init__(self) -> None:
        self.store = InMemoryStore()
        self.write_lock = asyncio.Lock()

    def unit_of_work(self, *, write: bool) -> InMemoryUnitOfWork:
        return InMemoryUnitOfWork(self, write=write)


class FakeClock:
    """A clock that moves only when told to (and by a microsecond per reading, so timestamps stay ordered)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.current = start or datetime(2026, 1, 1, tzinfo=UTC)
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        """Record the wait and move the time by it at once, then yield once so other tasks run."""
        self.slept.append(seconds)
        self.current += timedelta(seconds=seconds)
        await asyncio.sleep(0)

    def now(self) -> datetime:
        self.current += timedelta(microseconds=1)
        return self.current

    def advance(self, **delta: float) -> None:
        self.current += timedelta(**delta)


class SequentialIds:
    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def new_session_id(self) -> str:
        return f"00000000-0000-4000-8000-{next(self._counter):012d}"


@dataclass(frozen=True)
class _FakeCommit:
    sha: str
    subject: str
    files: frozenset[str]  # the files this commit changed
    at: datetime


@dataclass
class _FakeWorktree:
    branch: str
    dirty: list[str] = field(default_factory=list)
    untracked: list[str] = field(default_factory=list)
    missing: bool = False  # the folder was deleted by hand; git still lists it until `prune`
    replaced: str | None = None  # what the folder is now when it is no longer the worktree ("an empty folder")
    reflog_head: str | None = None  # its HEAD's last commit, kept (as git's worktree reflog) once its branch is gone


@dataclass
class _FakeRepo:
    branches: dict[str, list[str]]  # name -> commit shas, oldest first
    worktrees: dict[str, _FakeWorktree]  # path -> worktree; the repository root is the main worktree


class FakeVcs:
    """The VcsProvider in memory: nothing touches the disk but `inspect_repository`'s existence check.

    Model: each repository root (created on first use with `main` holding one commit, "init") has branches
    as linear commit lists, and every commit records the set of files it changed. A branch created from base
    starts as a copy of base's list, so their fork point is the last commit they share, "ahead" is the
    branch's commits missing from base and "behind" the reverse. Worktrees map a path to its branch, with
    dirty and untracked file lists, a `missing` flag for a folder deleted by hand (merge recreates it) and a
    `replaced` note for a folder that is there but is no longer the worktree (every call on it refuses).

    Merge: when base moved, the files changed on the branch since the fork that base also changed since the
    fork are the conflicts (nothing changes); otherwise the branch is rebased (its own commits copied on top of
    base, new ids) or base is merged in (base's commits plus a merge commit), then base fast-forwards to the
    branch (ff-only) or gets the branch's commits plus a merge commit (no-ff). Commit ids are sequential
    40-digit hex strings.

    Test helpers: `commit`, `advance_base`, `make_dirty`, `make_untracked`, `delete_folder`, `replace_folder`,
    `delete_branch_by_hand`, and the readers
    `head`, `files_on`, `contains`.
    """

    MAIN = "main"

    def __init__(self) -> None:
        self._repos: dict[str, _FakeRepo] = {}
        self._commits: dict[str, _FakeCommit] = {}
        self._clock = datetime(2026, 1, 1, tzinfo=UTC)

    # -- the port ----------------------------------------------------------------------------------------------

    async def inspect_repository(self, path: str) -> RepositoryInfo:
        target = Path(path).resolve()
        if not target.is_dir():
            raise InvalidInput(f"path {target} does not exist")
        return RepositoryInfo(root=str(target), head_branch=self.MAIN)

    async def create_worktree(self, repo_root: str, path: str, branch: str, base: str) -> WorktreeCreated:
        repo = self._repo(repo_root)
        existing = repo.worktrees.get(path)
        if existing is not None and not existing.missing:
            if existing.branch != branch:
                raise VcsError(f"{path} is already a worktree of branch '{existing.branch}', not '{branch}'")
            return WorktreeCreated(path, branch, base, self._fork(repo, self._history(repo, base), branch))
        base_history = self._history(repo, base)
        if not base_history:
            raise VcsError(f"base '{base}' does not exist in {repo_root}; set git.base_branch")
        if branch in repo.branches:
            raise VcsError(f"a branch named '{branch}' already exists")
        if existing is not None:
            raise VcsError(f"'{path}' is a missing but already registered worktree")
        repo.branches[branch] = list(base_history)
        repo.worktrees[path] = _FakeWorktree(branch)
        return WorktreeCreated(path, branch, base, base_history[-1])

    async def remove_worktree(self, repo_root: str, path: str, branch: str | None) -> None:
        repo = self._repo(repo_root)
        if path == repo_root:
            raise VcsError(f"refusing to remove {path!r}: not a worktree folder")
        repo.worktrees.pop(path, None)
        if branch:
            self._delete_branch(repo, branch)

    async def delete_branch(self, repo_root: str, branch: str) -> None:
        self._delete_branch(self._repo(repo_root), branch)

    async def reset_worktree(
        self, path: str, commit: str, *, repo_root: str | None = None, branch: str | None = None
    ) -> None:
        found = self._find_worktree(path)
        if found is None or found[1].missing:
            return
        repo, worktree = found
        self._refuse_replaced(path, worktree, branch or worktree.branch)
        history = repo.branches[worktree.branch]
        if commit != "HEAD":
            if commit in repo.branches:
                commit = repo.branches[commit][-1]
            source = next((h for h in repo.branches.values() if commit in h), None)
            if source is None:
                raise VcsError(f"git reset failed: unknown revision '{commit}'")
            history[:] = source[: source.index(commit) + 1]
        worktree.dirty.clear()
        worktree.untracked.clear()

    async def worktree_state(self, repo_root: str, path: str, branch: str, base: str) -> WorktreeState:
        ctx = await self.workspace_context(repo_root, path, branch, base)
        return WorktreeState(branch, ctx.head_commit, ctx.dirty, ctx.untracked, ctx.conflicts, ctx.commits)

    async def branch_change(
        self, repo_root: str, path: str, branch: str, base: str, *, max_patch_bytes: int = 200_000
    ) -> BranchChange:
        ctx = await self.workspace_context(repo_root, path, branch, base, max_patch_bytes=max_patch_bytes)
        return BranchChange(ctx.head_commit, ctx.diff_stat, ctx.patch, ctx.patch_truncated)

    async def workspace_context(
        self, repo_root: str, path: str, branch: str, base: str, *, max_patch_bytes: int = 200_000
    ) -> WorkspaceContext:
        repo = self._repo(repo_root)
        if branch not in repo.branches:
            raise self._gone(repo, branch, path, repo_root)
        worktree = repo.worktrees.get(path)
        live = worktree is not None and not worktree.missing
        if live:
            self._refuse_replaced(path, worktree, branch)
        base_history = self._history(repo, base)
        if not base_history:
            raise VcsError(f"base '{base}' does not exist in {repo_root}")
        history = repo.branches[branch]
        own = [c for c in history if c not in set(base_history)]
        files = sorted(self._files(own))
        patch = "".join(f"diff --git a/{f} b/{f}\n" for f in files)
        return WorkspaceContext(
            branch=branch,
            base_ref=base,
            base_commit=base_history[-1],
            head_commit=history[-1],
            ahead=len(own),
            behind=sum(1 for c in base_history if c not in set(history)),
            diff_stat=[FileStat(f, 1, 0) for f in files],
            patch=patch[:max_patch_bytes],
            patch_truncated=len(patch) > max_patch_bytes,
            commits=[self._info(c) for c in reversed(own)],
            dirty=list(worktree.dirty) if live else [],
            untracked=list(worktree.untracked) if live else [],
            conflicts=[],
        )

    async def merge(
        self, repo_root: str, path: str, branch: str, base: str, *, strategy: str, mode: str
    ) -> MergeOutcome:
        repo = self._repo(repo_root)
        if branch not in repo.branches:
            raise self._gone(repo, branch, path, repo_root)
        worktree = repo.worktrees.get(path)
        if worktree is None or worktree.missing:  # recreated from its branch
            worktree = repo.worktrees[path] = _FakeWorktree(branch)
        self._refuse_replaced(path, worktree, branch)
        if worktree.dirty or worktree.untracked:
            raise VcsError(f"the worktree has uncommitted changes ({', '.join(worktree.dirty + worktree.untracked)})")
        if base not in repo.branches:
            raise VcsError(f"base branch '{base}' does not exist in {repo_root}")
        history, base_history = repo.branches[branch], repo.branches[base]
        rebased = False
        if base_history[-1] not in history:
            own = [c for c in history if c not in set(base_history)]
            theirs = [c for c in base_history if c not in set(history)]
            conflicts = sorted(self._files(own) & self._files(theirs))
            if conflicts:
                return MergeOutcome(False, base, conflicts=conflicts, detail=f"{strategy} onto '{base}' conflicted")
            if strategy == "rebase":
                copies = [self._new_commit(self._commits[c].subject, self._commits[c].files) for c in own]
                history[:] = [*base_history, *copies]
            else:
                merge = self._new_commit(f"Merge '{base}' into '{branch}'", frozenset())
                history[:] = [*history, *theirs, merge]
            rebased = True
        before = base_history[-1]
        if mode == "ff-only":
            base_history[:] = history
        else:
            new = [c for c in history if c not in set(base_history)]
            merge = self._new_commit(f"Merge branch '{branch}' (taskgate)", frozenset())
            base_history[:] = [*base_history, *new, merge]
        return MergeOutcome(True, base, merged_commit=base_history[-1], rebased=rebased, base_before=before)

    async def merged_context(
        self, repo_root: str, base: str, before: str, merged: str, *, max_patch_bytes: int = 200_000
    ) -> WorkspaceContext:
        history = self._history(self._repo(repo_root), merged)
        if before not in history or not history:
            raise VcsError(f"commit {before[:12]} of the merge into '{base}' is not in {repo_root}")
        own = history[history.index(before) + 1 :]
        files = sorted(self._files(own))
        patch = "".join(f"diff --git a/{f} b/{f}\n" for f in files)
        return WorkspaceContext(
            branch=base, base_ref=base, base_commit=before, head_commit=merged, ahead=len(own), behind=0,
            diff_stat=[FileStat(f, 1, 0) for f in files], patch=patch[:max_patch_bytes],
            patch_truncated=len(patch) > max_patch_bytes, commits=[self._info(c) for c in reversed(own)],
            dirty=[], untracked=[], conflicts=[],
        )  # fmt: skip

    async def base_exists(self, repo_root: str, base: str) -> bool:
        return base in self._repo(repo_root).branches

    async def is_merged(self, repo_root: str, commit: str, base: str) -> bool:
        return commit in self._repo(repo_root).branches.get(base, [])

    async def repo_context(self, repo_root: str, *, recent: int = 10) -> RepoContext:
        repo = self._repo(repo_root)
        root = repo.worktrees[repo_root]
        history = repo.branches[root.branch]
        return RepoContext(
            branch=root.branch,
            head=history[-1],
            clean=not (root.dirty or root.untracked),
            staged=len(root.dirty),
            unstaged=0,
            untracked=len(root.untracked),
            conflicted=0,
            state="clean",
            recent_commits=[self._info(c) for c in reversed(history[-recent:])] if recent > 0 else [],
            worktrees=await self.worktrees(repo_root),
        )

    async def worktrees(self, repo_root: str) -> list[WorktreeEntry]:
        repo = self._repo(repo_root)
        return [
            WorktreeEntry(path, w.branch, repo.branches[w.branch][-1] if w.branch in repo.branches else None, w.missing)
            for path, w in repo.worktrees.items()
        ]

    async def branches(self, repo_root: str, prefix: str) -> list[str]:
        return sorted(b for b in self._repo(repo_root).branches if b.startswith(prefix))

    async def prune(self, repo_root: str) -> None:
        repo = self._repo(repo_root)
        repo.worktrees = {p: w for p, w in repo.worktrees.items() if not w.missing}

    async def disk_usage(self, path: str) -> int:
        """A nominal kilobyte per worktree file (0 when the worktree does not exist)."""
        found = self._find_worktree(path)
        if found is None or found[1].missing:
            return 0
        repo, worktree = found
        files = self._files(repo.branches.get(worktree.branch, []))
        return 1024 * len(files | set(worktree.dirty) | set(worktree.untracked))

    # -- test helpers ------------------------------------------------------------------------------------------

    def commit(self, path: str, files: list[str], message: str) -> str:
        """Commit `files` on the branch checked out at worktree `path` (a repository root means its `main`)."""
        found = self._find_worktree(path)
        if found is None:
            raise VcsError(f"{path} is not a worktree")
        repo, worktree = found
        sha = self._new_commit(message, frozenset(files))
        repo.branches[worktree.branch].append(sha)
        worktree.dirty = [f for f in worktree.dirty if f not in files]
        worktree.untracked = [f for f in worktree.untracked if f not in files]
        return sha

    def advance_base(self, repo_root: str, files: list[str], message: str, base: str = MAIN) -> str:
        """Move `base` on by one commit changing `files`, as another session's merge would."""
        sha = self._new_commit(message, frozenset(files))
        self._repo(repo_root).branches[base].append(sha)
        return sha

    def make_dirty(self, path: str, files: list[str]) -> None:
        self._worktree(path).dirty.extend(files)

    def make_untracked(self, path: str, files: list[str]) -> None:
        self._worktree(path).untracked.extend(files)

    def delete_folder(self, path: str) -> None:
        """The worktree folder is deleted by hand: git keeps listing it (missing) until a prune."""
        worktree = self._worktree(path)
        worktree.missing, worktree.dirty, worktree.untracked = True, [], []

    def replace_folder(self, path: str, what: str = "an empty folder") -> None:
        """The worktree folder is still there but is no longer the worktree (emptied, a link, another repository)."""
        self._worktree(path).replaced = what

    def delete_branch_by_hand(self, repo_root: str, branch: str) -> None:
        """`git update-ref -d refs/heads/<branch>`: the branch goes even though a worktree has it checked out (whose
        reflog keeps its last commit)."""
        repo = self._repo(repo_root)
        head = repo.branches.pop(branch)[-1]
        for worktree in repo.worktrees.values():
            if worktree.branch == branch:
                worktree.reflog_head = head

    def _gone(self, repo: _FakeRepo, branch: str, path: str, repo_root: str) -> BranchGone:
        worktree = repo.worktrees.get(path)
        return BranchGone(branch, path, repo_root, last_commit=worktree.reflog_head if worktree else None)

    def head(self, repo_root: str, branch: str) -> str | None:
        history = self._repo(repo_root).branches.get(branch)
        return history[-1] if history else None

    def files_on(self, repo_root: str, branch: str) -> set[str]:
        """Every file some commit of the branch's history changed (the tree, as nothing is ever deleted)."""
        return self._files(self._repo(repo_root).branches[branch])

    def contains(self, repo_root: str, branch: str, sha: str) -> bool:
        return sha in self._repo(repo_root).branches.get(branch, [])

    # -- internals ---------------------------------------------------------------------------------------------

    def _repo(self, root: str) -> _FakeRepo:
        if root not in self._repos:
            init = self._new_commit("init", frozenset({"README.md"}))
            self._repos[root] = _FakeRepo({self.MAIN: [init]}, {root: _FakeWorktree(self.MAIN)})
        return self._repos[root]

    def _new_commit(self, subject: str, files: frozenset[str]) -> str:
        sha = f"{len(self._commits) + 1:040x}"
        self._clock += timedelta(seconds=1)
        self._commits[sha] = _FakeCommit(sha, subject, files, self._clock)
        return sha

    def _files(self, shas: list[str]) -> set[str]:
        return set().union(*(self._commits[c].files for c in shas))

    def _info(self, sha: str) -> CommitInfo:
        commit = self._commits[sha]
        return CommitInfo(sha, commit.subject, "taskgate", commit.at)

    def _history(self, repo: _FakeRepo, ref: str) -> list[str]:
        """The commits `ref` (a branch or a commit id) names, oldest first; [] when there is none."""
        if ref in repo.branches:
            return repo.branches[ref]
        source = next((h for h in repo.branches.values() if ref in h), None)
        return source[: source.index(ref) + 1] if source else []

    def _fork(self, repo: _FakeRepo, base_history: list[str], branch: str) -> str:
        if not base_history:
            raise VcsError("git merge-base failed: base does not exist")
        return next(c for c in reversed(base_history) if c in set(repo.branches[branch]))

    def _delete_branch(self, repo: _FakeRepo, branch: str) -> None:
        if any(w.branch == branch and not w.missing for w in repo.worktrees.values()):
            raise VcsError(f"branch '{branch}' could not be deleted")
        repo.branches.pop(branch, None)

    def _refuse_replaced(self, path: str, worktree: _FakeWorktree, branch: str) -> None:
        found = worktree.replaced
        if found is None and worktree.branch != branch:
            found = f"a worktree of branch '{worktree.branch}'"
        if found is not None:
            advice = "move it away and taskgate recreates the worktree from its branch at the next merge"
            raise WorktreeMismatch(path, f"the worktree of branch '{branch}'", found, advice)

    def _find_worktree(self, path: str) -> tuple[_FakeRepo, _FakeWorktree] | None:
        return next(((r, r.worktrees[path]) for r in self._repos.values() if path in r.worktrees), None)

    def _worktree(self, path: str) -> _FakeWorktree:
        found = self._find_worktree(path)
        if found is None:
            raise VcsError(f"{path} is not a worktree")
        return found[1]


_UNENDED = (AgentStatus.QUEUED, AgentStatus.RUNNING, AgentStatus.LOST)


class InMemoryAgentRepository(_Repo):
    async def add(self, agent: Agent) -> None:
        self.store.agents[agent.id] = copy.deepcopy(agent)

    async def of_session(self, session_id: str) -> list[Agent]:
        found = [a for a in self.store.agents.values() if a.session_id == session_id]
        return [copy.deepcopy(a) for a in sorted(found, key=lambda a: a.id)]

    async def many(self, agent_ids: Sequence[str]) -> list[Agent]:
        return [copy.deepcopy(self.store.agents[i]) for i in agent_ids if i in self.store.agents]

    async def last_run(self, session_id: str) -> int:
        return max((a.run for a in self.store.agents.values() if a.session_id == session_id), default=0)

    async def heartbeat(self, agent_id: str, at: datetime) -> bool:
        agent = self.store.agents.get(agent_id)
        if agent is None or agent.status not in _UNENDED:
            return False
        agent.heartbeat_at = at
        return True

    async def record_signal(self, agent_id: str, signal: str) -> bool:
        agent = self.store.agents.get(agent_id)
        if agent is None or agent.ended_by is not None:
            return False
        agent.ended_by = signal
        return True

    async def set_status(self, agent_id: str, status: AgentStatus, at: datetime) -> None:
        agent = self.store.agents.get(agent_id)
        if agent is not None:
            agent.status = status
            agent.completed_at = None if status in (AgentStatus.QUEUED, AgentStatus.RUNNING) else at

    async def update(self, agent: Agent, *, only_unended: bool = False) -> bool:
        current = self.store.agents.get(agent.id)
        if current is None or (only_unended and current.status not in _UNENDED):
            return False
        self.store.agents[agent.id] = copy.deepcopy(agent)
        return True

    async def active(self) -> list[Agent]:
        live = (AgentStatus.QUEUED, AgentStatus.RUNNING)
        return [copy.deepcopy(a) for a in sorted(self.store.agents.values(), key=lambda a: a.id) if a.status in live]

    async def of_node(self, node_id: str, statuses: frozenset[AgentStatus]) -> list[Agent]:
        found = [a for a in self.store.agents.values() if a.node_id == node_id and a.status in statuses]
        return [copy.deepcopy(a) for a in sorted(found, key=lambda a: (a.session_id, a.id))]

    async def stale(self, before: datetime) -> list[Agent]:
        def last_seen(a: Agent) -> datetime | None:
            return a.heartbeat_at or a.started_at

        found = [
            a
            for a in self.store.agents.values()
            if a.status == AgentStatus.RUNNING and (seen := last_seen(a)) is not None and seen < before
        ]
        return [copy.deepcopy(a) for a in sorted(found, key=lambda a: (a.session_id, a.id))]

    async def of_project(self, project_id: int) -> list[tuple[Agent, str]]:
        sessions = self.store.sessions
        found = [a for a in self.store.agents.values()
                 if a.session_id in sessions and sessions[a.session_id].project_id == project_id]  # fmt: skip
        return [(copy.deepcopy(a), sessions[a.session_id].task_id) for a in sorted(found, key=lambda a: a.id)]

    async def ended(self, *, project_id: int | None = None, since: datetime | None = None) -> list[tuple[Agent, str]]:
        sessions = self.store.sessions
        found = [a for a in self.store.agents.values() if a.completed_at is not None and a.session_id in sessions
                 and (project_id is None or sessions[a.session_id].project_id == project_id)
                 and (since is None or a.completed_at >= since)]  # fmt: skip
        found.sort(key=lambda a: (a.completed_at, a.id))
        return [(copy.deepcopy(a), sessions[a.session_id].task_id) for a in found]


_DELIVERY_MARKERS = ("skipped", "start")


class InMemoryDeliveryRepository(_Repo):
    """Webhook delivery rows as dicts (the SQL table's columns); `skipped` and `start` rows are cursor markers."""

    async def committed_high_water(self) -> int:
        return self.store.events[-1]["id"] if self.store.events else 0  # write units are serialised

    async def cursor(self, subscriber: str) -> int:
        return max((d["event_id"] for d in self.store.deliveries if d["subscriber"] == subscriber), default=0)

    async def events_after(self, after_id: int, upto_id: int, limit: int) -> list[OutboxEvent]:
        found = [e for e in self.store.events if after_id < e["id"] <= upto_id][:limit]
        return [_outbox_event(e) for e in found]

    async def enqueue(self, subscriber: str, event_ids: list[int], at: datetime) -> int:
        added = [i for i in event_ids if self._find(i, subscriber) is None]
        for event_id in added:
            self._add(event_id, subscriber, "pending", at)
        return len(added)

    async def move_cursor(self, subscriber: str, event_id: int) -> None:
        self.store.deliveries = [
            d for d in self.store.deliveries if not (d["subscriber"] == subscriber and d["status"] == "skipped")
        ]
        if self._find(event_id, subscriber) is None:
            self._add(event_id, subscriber, "skipped", None)

    async def mark_start(self, subscriber: str, event_id: int) -> None:
        if self._find(event_id, subscriber) is None:
            self._add(event_id, subscriber, "start", None)

    async def start(self, subscriber: str) -> int | None:
        found = [d for d in self.store.deliveries if d["subscriber"] == subscriber and d["status"] == "start"]
        return found[0]["event_id"] if found else None

    async def head(self, subscriber: str) -> Delivery | None:
        pending = [d for d in self.store.deliveries if d["subscriber"] == subscriber and d["status"] == "pending"]
        if not pending:
            return None
        row = min(pending, key=lambda d: d["event_id"])
        event = next(e for e in self.store.events if e["id"] == row["event_id"])
        return Delivery(**copy.deepcopy(row), event=_outbox_event(event))

    async def claim(self, delivery_id: int, attempts: int, now: datetime, lease_until: datetime) -> bool:
        row = self._row(delivery_id)
        due = row is not None and (row["next_attempt_at"] is None or row["next_attempt_at"] <= now)
        if not due or row["status"] != "pending" or row["attempts"] != attempts:
            return False
        row.update(attempts=attempts + 1, next_attempt_at=lease_until)
        return True

    async def mark_delivered(self, delivery_id: int, at: datetime) -> bool:
        row = self._row(delivery_id)
        if row is None or row["status"] != "pending":
            return False
        row.update(status="delivered", delivered_at=at, next_attempt_at=None, last_error=None)
        return True

    async def mark_retry(self, delivery_id: int, attempts: int, error: str, next_attempt_at: datetime) -> bool:
        return self._finish(delivery_id, attempts, last_error=error, next_attempt_at=next_attempt_at)

    async def mark_failed(self, delivery_id: int, attempts: int, error: str) -> bool:
        return self._finish(delivery_id, attempts, status="failed", last_error=error, next_attempt_at=None)

    async def counts(self) -> dict[tuple[str, str], int]:
        found: dict[tuple[str, str], int] = {}
        for d in self.store.deliveries:
            if d["status"] not in _DELIVERY_MARKERS:
                key = (d["subscriber"], d["status"])
                found[key] = found.get(key, 0) + 1
        return found

    async def list(self, subscriber: str | None = None, status: str | None = None, limit: int = 100) -> list[Delivery]:
        found = [
            d
            for d in self.store.deliveries
            if d["status"] not in _DELIVERY_MARKERS
            and subscriber in (None, d["subscriber"])
            and status in (None, d["status"])
        ]
        found.sort(key=lambda d: (d["event_id"], d["subscriber"]))
        return [Delivery(**copy.deepcopy(d)) for d in found[:limit]]

    def _finish(self, delivery_id: int, attempts: int, **values: Any) -> bool:
        row = self._row(delivery_id)
        if row is None or row["status"] != "pending" or row["attempts"] != attempts:
            return False
        row.update(values)
        return True

    def _add(self, event_id: int, subscriber: str, status: str, at: datetime | None) -> None:
        if not any(e["id"] == event_id for e in self.store.events):
            raise InvalidInput(f"no event {event_id}")  # the SQL table's foreign key
        self.store.deliveries.append(
            {
                "id": self.store.allocate("delivery"),
                "event_id": event_id,
                "subscriber": subscriber,
                "status": status,
                "attempts": 0,
                "next_attempt_at": at,
                "last_error": None,
                "delivered_at": None,
            }
        )

    def _find(self, event_id: int, subscriber: str) -> dict[str, Any] | None:
        return next(
            (d for d in self.store.deliveries if d["event_id"] == event_id and d["subscriber"] == subscriber), None
        )

    def _row(self, delivery_id: int) -> dict[str, Any] | None:
        return next((d for d in self.store.deliveries if d["id"] == delivery_id), None)


def _outbox_event(event: dict[str, Any]) -> OutboxEvent:
    return OutboxEvent(event["id"], event["kind"], event["session_id"], event["at"], copy.deepcopy(event["payload"]))


class InMemoryTestRunRepository(_Repo):
    __test__ = False  # not a pytest class

    async def add(self, run: TestRun) -> int:
        run = replace(run, id=self.store.allocate("test_run"))
        self.store.test_runs.append(run)
        return run.id

    async def latest(self, session_id: str, head_commit: str, command: tuple[str, ...]) -> TestRun | None:
        found = [r for r in self.store.test_runs
                 if (r.session_id, r.head_commit, r.command) == (session_id, head_commit, tuple(command))]  # fmt: skip
        return found[-1] if found else None

    async def of_session(self, session_id: str, limit: int = 20) -> list[TestRun]:
        return [r for r in reversed(self.store.test_runs) if r.session_id == session_id][:limit]


class FakeTestRunner:
    """A `TestRunner` that runs nothing: it answers `outcome` (exit 0 by default) and records each call."""

    __test__ = False  # not a pytest class

    def __init__(self, exit_code: int | None = 0, output: str = "1 passed", timed_out: bool = False) -> None:
        self.exit_code, self.output, self.timed_out = exit_code, output, timed_out
        self.calls: list[tuple[tuple[str, ...], str, float]] = []

    async def run(self, command: tuple[str, ...], cwd: str, *, timeout_s: float) -> TestOutcome:
        self.calls.append((tuple(command), cwd, timeout_s))
        return TestOutcome(None if self.timed_out else self.exit_code, self.timed_out, 3, self.output)


class InMemoryStepRunRepository(_Repo):
    """Runs are frozen dataclasses of immutable values, so they are stored and returned without copies."""

    _CHANGES = ("status", "ended_at", "output_summary", "agent_ids", "error")  # what `update` overwrites

    async def add(self, run: StepRun) -> int:
        if run.session_id not in self.store.sessions:
            raise SessionNotFound(run.session_id)
        stored = _normalised(replace(run, id=self.store.allocate("step_run")))
        self.store.step_runs[stored.id] = stored
        return stored.id

    async def update(self, run: StepRun) -> None:
        old = await self.get(run.id)
        changes = {name: getattr(run, name) for name in self._CHANGES}
        self.store.step_runs[old.id] = _normalised(replace(old, **changes))

    async def get(self, run_id: int | None) -> StepRun:
        if run_id not in self.store.step_runs:
            raise StepRunNotFound(run_id)
        return self.store.step_runs[run_id]

    async def finish(self, run_id: int, status: StepStatus, ended_at: datetime, output: str, error: str | None) -> bool:
        run = self.store.step_runs.get(run_id)
        if run is None or run.status not in OPEN_STEP_STATUSES:
            return False
        closed = replace(run, status=status, ended_at=ended_at, output_summary=output, error=error)
        self.store.step_runs[run_id] = _normalised(closed)
        return True

    async def of_session(self, session_id: str, limit: int = 200) -> list[StepRun]:
        found = [r for r in self.store.step_runs.values() if r.session_id == session_id]
        return found[max(len(found) - limit, 0) :]

    async def open_runs(self, session_id: str) -> list[StepRun]:
        runs = self.store.step_runs.values()
        return [r for r in runs if r.session_id == session_id and r.status in OPEN_STEP_STATUSES]


def _normalised(run: StepRun) -> StepRun:
    """As the database returns it: a StepStatus (not a bare string) and a tuple of agent ids (not a list)."""
    return replace(run, status=StepStatus(run.status), agent_ids=tuple(run.agent_ids))
