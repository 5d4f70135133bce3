"""The tracker poll: every sweep, each project read from an external tracker is polled once for the cluster.

Who polls. The process holding the sweeper's lease (application/sweeper.py): one poller per cluster, so a tracker
is asked once per interval however many `serve` processes run, and dispatch after it reads what the poll mirrored
(one dispatcher per cluster too). A poll:

1. lists the candidates (GitHub: open issues with the label; Linear: the team's issues in the configured states;
   Beads: `bd ready`), mirrors them into the task table with why each is held (an issue edited while it is queued
   is re-read here: title, description, priority, labels), and
2. reconciles the sessions that run on tracker issues: each one's issue, from the list or read by itself, is
   checked for `lost` (closed, the label removed, assigned to someone else, archived, moved); what is lost is
   written into the poll's report,
3. and saves the poll (`tracker_polls`): when, what it cost (requests, 304s, seconds), its error, what is ready,
   held and why, claimed, lost; dispatch's decisions are added by `record_dispatch` after its pass.

Who acts on a lost issue. The node holding the session (its agents run there), in its own sweep (`act_on_lost`):
by `[tracker] on_issue_gone`, `ask` marks the session (`tracker_lost` in its state data, shown by `session show`,
the console and `tracker status`) with one `tracker.issue_lost` event, and the session carries on until the
operator decides; `stop` also fails the session with compensation manual_review: its agents are stopped, its
worktree and branch kept for review, nothing merged. The mark is written under the session's row lock after
checking it is not there yet, so two sweeps never write it twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.commands import SYSTEM_ACTOR, FireTrigger
from taskgate.application.sessions.engine import SessionService
from taskgate.application.trackers.dispatch import DispatchAction
from taskgate.application.trackers.ports import TrackerIssue, TrackerPoll, TrackerProvider
from taskgate.application.trackers.sync import TrackerSync
from taskgate.domain.entities import Compensation, Project, Session
from taskgate.domain.errors import ConcurrentModification, InvalidTransition, TaskgateError
from taskgate.domain.states import ACTIVE_STATES, SessionState, Trigger

LOST_MARK = "tracker_lost"  # state_data key: {"issue", "why", "at", "policy"}
LOST_EVENT = "tracker.issue_lost"
_STOPPABLE = frozenset({SessionState.PLANNING, SessionState.EXECUTING, SessionState.VERIFYING})
_log = logging.getLogger("taskgate.tracker")


@dataclass(slots=True)
class PollOutcome:
    """One project's poll, before it is saved with dispatch's decisions."""

    project: Project
    poll: TrackerPoll
    ids: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.poll.error is None


class TrackerPoller:
    """Polls each project's external tracker, reconciles the sessions on its issues, and records the poll."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        clock: Clock,
        sessions: SessionService,
        sync: TrackerSync,
        on_lost: str = "ask",
        on_lost_by_project: Mapping[str, str] | None = None,
    ) -> None:
        self._uow, self._clock, self._sessions, self._sync = uow, clock, sessions, sync
        self.on_lost, self._on_lost_by_project = on_lost, dict(on_lost_by_project or {})

    async def poll_all(self, projects: Iterable[Project]) -> list[PollOutcome]:
        """Poll every active project that reads an external tracker; a failing tracker is recorded, not raised."""
        return [await self.poll(p) for p in projects if p.archived_at is None and self._sync.trackers.spec(p)]

    async def poll(self, project: Project) -> PollOutcome:
        """One poll of the project's tracker: list, mirror, reconcile (see the module docstring)."""
        spec = self._sync.trackers.spec(project)
        assert spec is not None
        started, now = time.perf_counter(), self._clock.now()
        provider: TrackerProvider | None = None
        before = (0, 0)
        try:
            provider = self._sync.provider(project)
            assert provider is not None
            before = _cost(provider)
            found = await self._sync.polled(project)
            assert found is not None
            _, issues, ids = found
            report = await self._report(project, provider, issues, ids)
            error = None
        except TaskgateError as exc:
            report, error, ids = {}, str(exc), []
            _log.warning("tracker poll of project %s failed: %s", project.name, exc)
        calls, not_modified = (a - b for a, b in zip(_cost(provider), before, strict=True)) if provider else (0, 0)
        describe = provider.describe() if provider is not None and hasattr(provider, "describe") else spec.kind  # type: ignore[attr-defined]
        poll = TrackerPoll(project.id, spec.kind, describe, now, error, calls, not_modified,
                           round(time.perf_counter() - started, 4), report)  # fmt: skip
        return PollOutcome(project, poll, ids)

    async def save(self, outcomes: Sequence[PollOutcome], actions: Sequence[DispatchAction], dry_run: bool) -> None:
        """Record each poll with what dispatch did with its project's tasks (one row per project)."""
        by_task = {a.task_id: a for a in actions}
        async with self._uow(write=True) as uow:
            for outcome in outcomes:
                decided = [_decision(by_task[t]) for t in outcome.ids if t in by_task]
                report = {**outcome.poll.report, "dispatch": decided, "dry_run": dry_run}
                await uow.tracker_polls.save(replace(outcome.poll, report=report))
            await uow.commit()

    async def polls(self) -> list[TrackerPoll]:
        """Every project's last poll (for `tracker status` and the console)."""
        async with self._uow(write=False) as uow:
            return await uow.tracker_polls.list()

    async def _report(
        self, project: Project, provider: TrackerProvider, issues: list[TrackerIssue], ids: list[str]
    ) -> dict[str, Any]:
        """What the poll found: ready and held task ids (with why), the claimed ones, and the lost ones."""
        async with self._uow(write=False) as uow:
            running = [s for s in await uow.sessions.list(project_id=project.id, states=set(ACTIVE_STATES))]
            tasks = {t.id: t for t in await uow.tasks.get_many(sorted({s.task_id for s in running}))}
        by_task = dict(zip(ids, issues, strict=True))
        claimed = sorted(t for t in tasks if tasks[t].source == provider.name)
        lost: dict[str, str] = {}
        for task_id in claimed:
            issue = by_task.get(task_id)
            if issue is None:  # not a candidate any more (or moved to a state taskgate set): read it by itself
                try:
                    issue = await provider.show(project, tasks[task_id].external_id or task_id)
                except TaskgateError as exc:  # deleted, or transferred away: the tracker no longer has it here
                    lost[task_id] = f"cannot be read in {provider.name}: {exc}"
                    continue
            why = issue.lost or (f"closed in {provider.name}" if issue.closed else None)  # lost names the tracker
            if why is not None:
                lost[task_id] = why
        ready = [t for t, i in by_task.items() if i.hold is None and not i.closed and t not in tasks]
        held = {t: i.hold or f"closed in {provider.name}" for t, i in by_task.items() if i.hold or i.closed}
        return {"ready": ready, "held": held, "claimed": claimed, "lost": lost, "candidates": len(issues)}

    # -- the node holding a session acts on its lost issue ----------------------------------------------------------

    async def act_on_lost(self) -> list[str]:
        """On the sessions this node holds whose issue the last poll found lost: mark them (once) and, by policy,
        stop them. Returns one line per session acted on."""
        async with self._uow(write=False) as uow:
            lost = {t: why for p in await uow.tracker_polls.list() for t, why in (p.report.get("lost") or {}).items()}
            if not lost:
                return []
            sessions = [s for s in await uow.sessions.list(states=set(ACTIVE_STATES)) if s.task_id in lost]
            names = {p.id: p.name for p in await uow.projects.list()}
        lines = []
        for session in sessions:
            if not self._sessions.holds(session):
                continue
            policy = self._on_lost_by_project.get(names.get(session.project_id, ""), self.on_lost)
            line = await self._act(session, lost[session.task_id], policy)
            if line:
                lines.append(line)
        return lines

    async def _act(self, session: Session, why: str, policy: str) -> str | None:
        if not await self._mark(session, why, policy):
            return None
        if policy != "stop" or session.state not in _STOPPABLE:
            return f"{session.task_id} (session {session.id}): {why}; the operator is asked"
        reason = f"tracker: {session.task_id} {why} (on_issue_gone = stop): stopped, its work kept for review"
        cmd = FireTrigger(session.id, Trigger.FAIL.value, SYSTEM_ACTOR, reason,
                          changes={"compensation_plan": Compensation.MANUAL_REVIEW.value})  # fmt: skip
        try:
            await self._sessions.fire(cmd)
        except (ConcurrentModification, InvalidTransition) as exc:
            return f"{session.task_id} (session {session.id}): {why}; not stopped, it moved meanwhile: {exc}"
        return f"{session.task_id} (session {session.id}): {why}; stopped"

    async def _mark(self, session: Session, why: str, policy: str) -> bool:
        """The `tracker_lost` mark and one `tracker.issue_lost` event, under the session's row lock, unless the same
        loss is marked already (a note, not a transition). False when it was."""
        async with self._uow(write=True) as uow:
            current = await self._sessions.fence(uow, session.id, "the tracker.issue_lost event")
            if (current.state_data.get(LOST_MARK) or {}).get("why") == why:
                return False
            now = self._clock.now()
            mark = {"issue": current.task_id, "why": why, "at": now.isoformat(), "policy": policy}
            noted = replace(current, state_data={**current.state_data, LOST_MARK: mark})
            await uow.sessions.update(noted, expected_version=current.version)
            await uow.events.append(LOST_EVENT, now, {"task": current.task_id, **mark}, current.id)
            await uow.commit()
        _log.warning("%s: session %s: %s", LOST_EVENT, session.id, why)
        return True


def _cost(provider: TrackerProvider | None) -> tuple[int, int]:
    return (int(getattr(provider, "calls", 0)), int(getattr(provider, "not_modified", 0)))


def _decision(action: DispatchAction) -> dict[str, Any]:
    return {"task": action.task_id, "outcome": action.outcome, "detail": action.detail, "session": action.session_id,
            "workflow": action.workflow}  # fmt: skip
