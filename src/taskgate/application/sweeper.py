"""The sweeper: time-based rules on sessions, applied every `interval_s` by `taskgate serve` (or once by
`taskgate sweep`). See docs/sweeper.md.

Rules, one action per session per sweep, in this order:

1. a session in `timed_out` (a sweep stopped half-way) is failed with compensation manual_review;
2. past its deadline, a session in `executing` fires `timeout` then `fail` (compensation manual_review). The
   deadline is `session.deadline` when set, else `started_at + session_deadline`. In `verifying` only an explicit
   `session.deadline` applies: there the session waits for an operator, and the decision timers below govern it
   (with the defaults, 24 h from start would otherwise always come before the 72 h escalation);
3. a session waiting in `verifying` (since its last applied transition into verifying) for
   `verification_timeout` fails with manual_review; for `verification_escalation` it gets one
   `session.escalated` event per verification (marked in `state_data`, not a transition);
4. a session with a running agent whose last heartbeat (else its start) is older than `heartbeat_timeout` is
   abandoned (`resume` makes it ready again); the silent agents are marked failed.

After the rules come the tracker's chores (owed write-backs, the live ready list), then, when `[dispatch]
auto_start` is on, dispatch: sessions started on ready tasks that a workflow's trigger takes (application/
dispatch.py). The sweep is where it runs because it is taskgate's one periodic loop, in every `serve` process,
with a one-shot form (`taskgate sweep`), and it has just refreshed the ready list dispatch reads.

Nodes (docs/nodes.md). Each node sweeps the sessions it holds (their worktrees and agents are on its disk) and
their silent agents. What is done once for all nodes (marking lapsed nodes down, the tracker's chores, dispatch) is
done by the holder of the `sweeper` lease only: each sweep takes or renews it for `[node] lease_s + interval_s`,
one compare-and-swap statement, so at most one process does that work at a time; when its holder dies, another
node takes the lease over once it has expired.

Races. Every transition is fired with the version the sweep read, so a session that moved meanwhile (an operator,
another sweeper) raises ConcurrentModification or InvalidTransition, and is reported as skipped. Escalation
re-reads the session under the row lock before marking it. Concurrent sweeps therefore never act twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from taskgate.application.nodes.heartbeats import SWEEPER_LEASE, NodeService
from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.commands import SYSTEM_ACTOR, FireTrigger
from taskgate.application.sessions.engine import SessionService
from taskgate.application.sessions.ports import TransitionQuery
from taskgate.application.trackers.builtin import TrackerService
from taskgate.application.trackers.dispatch import DispatchAction, Dispatcher
from taskgate.application.trackers.polling import PollOutcome, TrackerPoller
from taskgate.application.trackers.writebacks import WritebackService
from taskgate.domain.audit.checkpoints import Checkpoint
from taskgate.domain.entities import Agent, AgentStatus, Compensation, Session
from taskgate.domain.errors import ConcurrentModification, InvalidTransition, SessionNotFound, TaskgateError
from taskgate.domain.session_fsm import rows_for
from taskgate.domain.states import SessionState, Trigger

SWEEPER_ACTOR = SYSTEM_ACTOR
ESCALATED_EVENT = "session.escalated"
_MANUAL_REVIEW = {"compensation_plan": Compensation.MANUAL_REVIEW.value}
_ABANDONABLE = frozenset().union(*(row.sources for row in rows_for(Trigger.ABANDON)))
_SWEPT = _ABANDONABLE | {SessionState.TIMED_OUT}
_log = logging.getLogger("taskgate.sweeper")


@dataclass(frozen=True, slots=True)
class SweeperOptions:
    """The sweeper's intervals (settings `[sweeper]`)."""

    session_deadline: timedelta = timedelta(hours=24)
    verification_escalation: timedelta = timedelta(hours=72)
    verification_timeout: timedelta = timedelta(days=7)
    heartbeat_timeout: timedelta = timedelta(minutes=10)
    interval_s: float = 30.0


@dataclass(frozen=True, slots=True)
class SweepAction:
    """What the sweep did to one session. `action`: timed_out | expired (no decision in time) | escalated |
    abandoned | finished (a timed_out session failed). `to_state` is where the session ended up."""

    session_id: str
    action: str
    from_state: str
    to_state: str
    reason: str


@dataclass(frozen=True, slots=True)
class SweepSkip:
    """A session the sweep meant to act on but left alone, and why (usually: it moved meanwhile)."""

    session_id: str
    action: str
    why: str


@dataclass
class SweepReport:
    at: datetime
    examined: int = 0
    actions: list[SweepAction] = field(default_factory=list)
    skipped: list[SweepSkip] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    silent_agents: list[str] = field(default_factory=list)  # agents marked failed for missing heartbeats
    writebacks: list[str] = field(default_factory=list)  # tracker write-backs tried, one line each
    dispatched: list[DispatchAction] = field(default_factory=list)  # what dispatch did, one per task it took up
    polls: list[str] = field(default_factory=list)  # one line per tracker poll: what it found and cost
    lost: list[str] = field(default_factory=list)  # sessions whose tracker issue was found lost, acted on here
    turn: str = "held"  # the sweeper lease: "held" by this process, else who holds it and until when
    nodes_down: list[str] = field(default_factory=list)  # nodes this sweep found down, one line each
    checkpoint: int | None = None  # the audit checkpoint this sweep signed, if one was due (docs/audit.md)
    questions: list[str] = field(default_factory=list)  # agents' questions this sweep timed out (docs/questions.md)

    def count(self, action: str) -> int:
        return sum(1 for a in self.actions if a.action == action)

    def dispatch_summary(self) -> str:
        """`dispatch: 1 started, 2 waiting`, or "" when dispatch did nothing."""
        kinds = ("started", "waiting", "skipped", "error")
        counts = [f"{n} {k}" for k in kinds if (n := sum(1 for d in self.dispatched if d.outcome == k))]
        return f"dispatch: {', '.join(counts)}" if counts else ""

    def summary(self) -> str:
        kinds = ("timed_out", "finished", "expired", "escalated", "abandoned")
        done = ", ".join(f"{self.count(k)} {k}" for k in kinds if self.count(k)) or "nothing to do"
        tail = f"; {len(self.skipped)} skipped" if self.skipped else ""
        tail += f"; {len(self.writebacks)} tracker write-backs tried" if self.writebacks else ""
        tail += f"; {self.dispatch_summary()}" if self.dispatched else ""
        tail += f"; {len(self.nodes_down)} node(s) found down" if self.nodes_down else ""
        tail += f"; signed audit checkpoint #{self.checkpoint}" if self.checkpoint else ""
        tail += f"; {len(self.questions)} question(s) timed out" if self.questions else ""
        tail += f"; {len(self.errors)} errors" if self.errors else ""
        if self.turn != "held":
            tail += f"; the sweeper's turn is {self.turn}: no dispatch, tracker or node checks here"
        return f"swept {self.examined} sessions: {done}{tail}"


@dataclass(frozen=True, slots=True)
class _Plan:
    """One action decided from a read of the session (at `session.version`)."""

    action: str
    reason: str
    deadline: datetime | None = None
    waiting_since: datetime | None = None
    agents: tuple[Agent, ...] = ()


class Sweeper:
    """Applies the time-based rules to every session that needs it. Uses only the clock it is given."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        sessions: SessionService,
        clock: Clock,
        options: SweeperOptions | None = None,
        on_sweep: Callable[[SweepReport], None] | None = None,
        writebacks: WritebackService | None = None,
        tracker: TrackerService | None = None,
        dispatcher: Dispatcher | None = None,
        poller: TrackerPoller | None = None,
        nodes: NodeService | None = None,
        checkpoints: Callable[[], Awaitable[Checkpoint | None]] | None = None,
        expire_questions: Callable[[], Awaitable[list[Any]]] | None = None,
    ) -> None:
        self._uow, self._sessions, self._clock = uow, sessions, clock
        self._checkpoints = checkpoints  # the periodic audit checkpoint, signed by the turn's holder
        self._nodes = nodes  # None: no lease, this process does the once-for-all work (tests, one machine)
        self.options = options or SweeperOptions()
        self._on_sweep = on_sweep
        self._writebacks, self._tracker = writebacks, tracker  # the tracker's chores: owed writes, live ready
        self._dispatcher = dispatcher  # None: [dispatch] auto_start is off
        self._poller = poller  # None: no project reads a tracker over an API or bd
        # agents' questions past their deadline whose waiting call is gone (its process died): timed out here
        self._expire_questions = expire_questions

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep, then wait `interval_s` (or until `stop` is set), until `stop` is set. A failed sweep (say the
        database is briefly unreachable) is logged and the loop carries on. Stopping (or being cancelled) gives the
        sweeper's turn up at once; a crash leaves it to expire."""
        try:
            while not stop.is_set():
                await self._sweep_logged()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.options.interval_s)
        finally:
            with contextlib.suppress(TaskgateError):
                await self.release_turn()

    async def _sweep_logged(self) -> None:
        try:
            report = await self.sweep_once()
        except Exception:  # a background loop must outlive one bad sweep; CancelledError still ends it
            _log.exception("sweep failed")
            return
        if report.actions or report.errors or report.nodes_down:
            _log.warning("%s", report.summary())
        for line in report.lost:
            _log.warning("tracker: issue lost: %s", line)
        for line in report.nodes_down:
            _log.warning("nodes: %s", line)
        for error in report.errors:
            _log.warning("sweep: %s", error)
        for done in report.dispatched:
            if done.outcome in ("started", "error"):  # a wait is logged once, when it begins
                _log.warning("dispatch: %s", done.line())
        if self._on_sweep is not None:
            self._on_sweep(report)

    async def release_turn(self) -> None:
        """Give up the sweeper lease if this process holds it."""
        if self._nodes is not None:
            await self._nodes.release(SWEEPER_LEASE)

    async def sweep_once(self) -> SweepReport:
        """One pass over the sessions: decide from one read, then act on each session separately."""
        now = self._clock.now()
        report = SweepReport(at=now)
        sessions, waiting, stale = await self._scan(now)
        report.examined = len(sessions)
        for session in sessions:
            plan = self._decide(session, now, waiting.get(session.id), stale.get(session.id, ()))
            if plan is None:
                continue
            try:
                await self._act(session, plan, now, report)
            except (ConcurrentModification, InvalidTransition, SessionNotFound) as exc:
                report.skipped.append(SweepSkip(session.id, plan.action, f"moved meanwhile: {exc}"))
            except TaskgateError as exc:
                report.errors.append(f"session {session.id}: {plan.action}: {exc}")
        # Silent agents of sessions no rule acts on (abandoned, failed, ...), e.g. a crash came between an abandon
        # and the marking of its agents: marked too, or a resumed session would be abandoned again.
        scanned = {s.id for s in sessions}
        leftovers = tuple(a for sid, agents in stale.items() if sid not in scanned for a in agents)
        if leftovers:
            await self._mark_silent(leftovers, now, report)
        if self._poller is not None:  # every node acts on the sessions it holds whose issue the last poll lost
            try:
                report.lost = await self._poller.act_on_lost()
            except TaskgateError as exc:
                report.errors.append(f"tracker: {exc}")
        if not await self._take_turn(report):
            return report
        polls = await self._tracker_chores(report)
        await self._checkpoint(report)
        if self._expire_questions is not None:
            try:
                report.questions = [f"{q.id} (session {q.session_id})" for q in await self._expire_questions()]
            except TaskgateError as exc:
                report.errors.append(f"questions: {exc}")
        if self._dispatcher is not None:
            try:
                report.dispatched = await self._dispatcher.dispatch_once({o.project.id for o in polls if o.ok})
            except TaskgateError as exc:  # say a live tracker's ready list cannot be read: the next sweep tries again
                report.errors.append(f"dispatch: {exc}")
        if self._poller is not None and polls:
            dry_run = self._dispatcher is not None and self._dispatcher.options.dry_run
            await self._poller.save(polls, report.dispatched, dry_run)
        return report

    async def _take_turn(self, report: SweepReport) -> bool:
        """Take or renew the sweeper lease; holding it, mark lapsed nodes down. False when another holds it."""
        if self._nodes is None:
            return True
        lease = await self._nodes.hold(SWEEPER_LEASE, self._nodes.lease_s + self.options.interval_s)
        if lease.holder != self._nodes.holder:
            report.turn = f"held by {lease.holder} until {_iso(lease.expires_at)}"
            return False
        report.nodes_down = await self._nodes.reap()
        return True

    async def _checkpoint(self, report: SweepReport) -> None:
        """Sign an audit checkpoint when one is due; a failure is reported, and the next sweep tries again."""
        if self._checkpoints is None:
            return
        try:
            signed = await self._checkpoints()
        except TaskgateError as exc:
            report.errors.append(f"audit checkpoint: {exc}")
            return
        report.checkpoint = signed.number if signed is not None else None

    async def _tracker_chores(self, report: SweepReport) -> list[PollOutcome]:
        """Write-backs due for a retry, then each external tracker polled (its ready list mirrored for the board and
        dispatch, the sessions on its issues reconciled); returns the polls, saved after dispatch."""
        if self._writebacks is not None:
            for attempt in await self._writebacks.run_due():
                row = attempt.writeback
                report.writebacks.append(f"{row.task_id} → {row.status}: {'written' if attempt.ok else attempt.error}")
        if self._poller is not None and self._tracker is not None:
            polls = await self._poller.poll_all(await self._tracker.list_projects())
            for outcome in polls:
                poll = outcome.poll
                if poll.error is not None:
                    report.errors.append(f"tracker {poll.describe}: {poll.error}")
                found = f"{len(poll.report.get('ready', []))} ready of {poll.report.get('candidates', 0)}"
                report.polls.append(f"{outcome.project.name}: {poll.describe}: {found}, {poll.calls} requests "
                                    f"({poll.not_modified} not modified)")  # fmt: skip
            return polls
        if self._tracker is not None:
            try:
                await self._tracker.refresh_ready()
            except TaskgateError as exc:
                report.errors.append(f"tracker: {exc}")
        return []

    # -- reading and deciding ------------------------------------------------------------------------------------

    async def _scan(self, now: datetime) -> tuple[list[Session], dict[str, datetime], dict[str, tuple[Agent, ...]]]:
        async with self._uow(write=False) as uow:
            # this node's sessions only: another node's are its own sweeper's (their worktrees are on its disk)
            sessions = [s for s in await uow.sessions.list(states=set(_SWEPT)) if self._sessions.holds(s)]
            waiting: dict[str, datetime] = {}
            for s in sessions:
                if s.state == SessionState.VERIFYING:
                    query = TransitionQuery(session_id=s.id, state=SessionState.VERIFYING.value, outcome="applied")
                    rows = await uow.transitions.query(query)
                    waiting[s.id] = rows[-1].at if rows else s.updated_at
            stale: dict[str, list[Agent]] = {}
            for agent in await uow.agents.stale(now - self.options.heartbeat_timeout):
                if self._supervised_here(agent):
                    stale.setdefault(agent.session_id, []).append(agent)
        return sessions, waiting, {k: tuple(v) for k, v in stale.items()}

    def _supervised_here(self, agent: Agent) -> bool:
        here = self._sessions.node_id
        return here is None or agent.node_id is None or agent.node_id == here

    def _decide(
        self, session: Session, now: datetime, waiting_since: datetime | None, stale: tuple[Agent, ...]
    ) -> _Plan | None:
        opts, state = self.options, session.state
        if state == SessionState.TIMED_OUT:
            return _Plan("finished", "sweeper: a timed-out session fails; compensation manual_review")
        deadline = self._deadline(session)
        if deadline is not None and now >= deadline:
            source = "set on the session" if session.deadline else f"started_at + {_span(opts.session_deadline)}"
            return _Plan("timed_out", f"sweeper: deadline {_iso(deadline)} passed ({source})", deadline=deadline)
        if state == SessionState.VERIFYING and waiting_since is not None:
            waited = now - waiting_since
            if waited >= opts.verification_timeout:
                reason = (
                    f"sweeper: no operator decision for {_span(waited)} since {_iso(waiting_since)} "
                    f"(limit {_span(opts.verification_timeout)}); compensation manual_review"
                )
                return _Plan("expired", reason, waiting_since=waiting_since)
            if waited >= opts.verification_escalation and not _escalated(session):
                reason = f"waiting for an operator decision for {_span(waited)} since {_iso(waiting_since)}"
                return _Plan("escalated", reason, waiting_since=waiting_since)
        if stale and state in _ABANDONABLE:
            agent = stale[0]
            seen = agent.heartbeat_at or agent.started_at
            others = f" (and {len(stale) - 1} more)" if len(stale) > 1 else ""
            reason = (
                f"sweeper: agent {agent.id} ({agent.agent_type}){others} missed heartbeats: last seen {_iso(seen)}, "
                f"limit {_span(opts.heartbeat_timeout)}"
            )
            return _Plan("abandoned", reason, agents=stale)
        return None

    def _deadline(self, session: Session) -> datetime | None:
        if session.state == SessionState.VERIFYING:
            return session.deadline  # waiting for an operator: the decision timers apply, not the default deadline
        if session.state != SessionState.EXECUTING:
            return None
        if session.deadline is not None:
            return session.deadline
        return session.started_at + self.options.session_deadline if session.started_at else None

    # -- acting --------------------------------------------------------------------------------------------------

    async def _act(self, session: Session, plan: _Plan, now: datetime, report: SweepReport) -> None:
        if plan.action == "escalated":
            if await self._escalate(session, plan, now):
                state = session.state.value
                report.actions.append(SweepAction(session.id, plan.action, state, state, plan.reason))
            else:
                report.skipped.append(SweepSkip(session.id, plan.action, "already escalated or moved meanwhile"))
            return
        version = session.version
        if plan.action == "timed_out":
            version = (await self._fire(session.id, Trigger.TIMEOUT, plan.reason, version)).version
            reason = f"sweeper: timed out (deadline {_iso(plan.deadline)}); compensation manual_review"
            try:
                after = await self._fire(session.id, Trigger.FAIL, reason, version, _MANUAL_REVIEW)
            except (ConcurrentModification, InvalidTransition) as exc:  # the next sweep finishes it if need be
                report.actions.append(
                    SweepAction(session.id, plan.action, session.state.value, SessionState.TIMED_OUT.value, plan.reason)
                )
                report.skipped.append(SweepSkip(session.id, "finished", f"moved meanwhile: {exc}"))
                return
        elif plan.action in ("finished", "expired"):
            after = await self._fire(session.id, Trigger.FAIL, plan.reason, version, _MANUAL_REVIEW)
        else:
            after = await self._fire(session.id, Trigger.ABANDON, plan.reason, version)
            await self._mark_silent(plan.agents, now, report)
        report.actions.append(SweepAction(session.id, plan.action, session.state.value, after.state.value, plan.reason))

    async def _fire(
        self, session_id: str, trigger: Trigger, reason: str, version: int, changes: dict[str, Any] | None = None
    ) -> Session:
        cmd = FireTrigger(session_id, trigger.value, SWEEPER_ACTOR, reason, expected_version=version, changes=changes)
        return (await self._sessions.fire(cmd)).session

    async def _escalate(self, seen: Session, plan: _Plan, now: datetime) -> bool:
        """Append `session.escalated` once per verification; the mark in `state_data` is not a transition."""
        async with self._uow(write=True) as uow:
            current = await self._sessions.fence(uow, seen.id, "the session.escalated event")
            if current.version != seen.version or current.state != SessionState.VERIFYING or _escalated(current):
                return False
            mark = {"escalated_at": now.isoformat(), "escalated_version": current.version}
            await uow.sessions.update(
                replace(current, state_data={**current.state_data, **mark}), expected_version=current.version
            )
            assert plan.waiting_since is not None
            payload = {
                "reason": plan.reason,
                "waiting_since": plan.waiting_since.isoformat(),
                "escalate_after": _span(self.options.verification_escalation),
                "fails_at": (plan.waiting_since + self.options.verification_timeout).isoformat(),
            }
            await uow.events.append(ESCALATED_EVENT, now, payload, seen.id)
            await uow.commit()
        return True

    async def _mark_silent(self, agents: tuple[Agent, ...], now: datetime, report: SweepReport) -> None:
        """Silent agents are marked failed, so that a resumed session is not abandoned again for them."""
        async with self._uow(write=True) as uow:
            for agent in agents:
                await uow.agents.set_status(agent.id, AgentStatus.FAILED, now)
                payload = {"agent": agent.id, "from": agent.status.value, "to": AgentStatus.FAILED.value,
                           "reason": "missed heartbeats"}  # fmt: skip
                await uow.events.append("agent.status", now, payload, agent.session_id)
            await uow.commit()
        report.silent_agents.extend(a.id for a in agents)


def _escalated(session: Session) -> bool:
    """Escalated during this verification: the mark carries the version, which only transitions change."""
    return session.escalated_at is not None


def _iso(at: datetime | None) -> str:
    return at.isoformat(timespec="seconds") if at else "never"


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    return "".join(parts) or f"{seconds}s"
