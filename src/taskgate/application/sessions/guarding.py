"""What the guards of a transition see: the database facts read inside its transaction, the slow facts (git, tests)
gathered before it, the dry run of a trigger (`check`), and which policies guard a project."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from taskgate.application.ports import UnitOfWork
from taskgate.application.sessions.affinity import refuse_unless_held
from taskgate.application.sessions.commands import (
    SYSTEM_ACTOR,
    FireTrigger,
    parse_trigger,
)
from taskgate.application.sessions.guards import PolicyCheck
from taskgate.application.sessions.policy_book import PolicyEntry
from taskgate.domain import writebacks as wb
from taskgate.domain.agents.usage import Usage
from taskgate.domain.budgets import Amount, Spent, holds_reservation
from taskgate.domain.entities import (
    DecisionKind,
    Plan,
    Session,
)
from taskgate.domain.errors import (
    InvalidInput,
)
from taskgate.domain.policies.facts import (
    NEEDS_APPROVALS,
    NEEDS_OPERATOR,
    NEEDS_SPEND,
    NEEDS_TRACKER,
    NO_SLOW_FACTS,
    GuardFacts,
    SlowFacts,
    SpendFacts,
    Verdict,
)
from taskgate.domain.session_fsm import TransitionSpec
from taskgate.domain.states import WIP_STATES, Trigger


class SessionGuarding:
    """The guards' side of a fire: the facts policies read, the slow ones gathered outside any transaction, the dry run,
    and the policies a project has."""

    async def _fire_facts(
        self,
        uow: UnitOfWork,
        session: Session,
        plan: Plan | None,
        row: TransitionSpec,
        cmd: FireTrigger,
        needs: frozenset[str] = frozenset(),
        slow: SlowFacts | None = None,
        *,
        dry: bool = False,
    ) -> GuardFacts:
        if plan is None and session.plan_id is not None:  # not locked for this trigger: a plain read will do
            plan = await uow.plans.get(session.plan_id)
        # the task, its project, its blockers and the plan's WIP count: one statement
        known = await uow.tasks.facts(session.task_id, plan.id if plan is not None else None, WIP_STATES)
        operator, operator_wip = None, 0
        if NEEDS_OPERATOR in needs and session.operator_id is not None:
            operator = await uow.operators.find(session.operator_id)
            operator_wip = await uow.sessions.count_of_operator(session.operator_id, WIP_STATES)
        owed: tuple[str, ...] = ()
        if NEEDS_TRACKER in needs:
            rows = await uow.writebacks.list(states=wb.OPEN_STATES, task_ids=[session.task_id], limit=5)
            owed = tuple(row.describe() for row in rows)
        spend = await self._spend_facts(uow, session, lock=not dry) if NEEDS_SPEND in needs else None
        approvals: tuple[str, ...] = ()
        if NEEDS_APPROVALS in needs:
            stored = await uow.decisions.approvals(session.id, session.version)
            approvals = tuple(sorted({*stored, *_pending_approver(cmd, row)}))
        return GuardFacts(
            transition=row,
            task=known.task,
            plan=plan,
            project=known.project,
            session=session,
            blockers=known.blockers,
            plan_sessions_in_wip=known.plan_sessions_in,
            actor=cmd.actor,
            operator=operator,
            operator_sessions_in_wip=operator_wip,
            approvals=approvals,
            tracker_owed=owed,
            spend=spend,
            slow=slow or NO_SLOW_FACTS,
        )

    async def _spend_facts(self, uow: UnitOfWork, session: Session, *, lock: bool) -> SpendFacts:
        """The project's agents' spend and the sessions holding a reservation (`domain/budgets.py`).

        Why two concurrent starts cannot both take the last of a budget: a firing start locks the project's row
        here (after the session, operator and plan rows: the one lock order) before it reads the spend, and
        holds it until its transition commits, with the session in progress (so holding its reservation). A
        second start of the project waits on that lock and then reads the first one's reservation. On SQLite the
        write transaction (`BEGIN IMMEDIATE`) already serialises every start. A dry run (`lock` off) only reads.
        """
        await uow.projects.get(session.project_id, lock=lock)
        agents = await uow.agents.of_project(session.project_id)
        statuses: dict[str, list[str]] = {}
        spent = []
        for agent, task_id in agents:
            statuses.setdefault(agent.session_id, []).append(agent.status.value)
            used = Usage.of(agent.report)
            amount = Amount(used.tokens, used.cost_usd or 0.0)
            spent.append(Spent(agent.session_id, task_id, agent.agent_type, agent.completed_at or agent.started_at,
                               amount))  # fmt: skip
        in_progress = await uow.sessions.list(project_id=session.project_id, states=set(WIP_STATES))
        reserving = tuple((s.id, s.task_id) for s in in_progress
                          if s.id != session.id and holds_reservation(True, statuses.get(s.id, ())))  # fmt: skip
        return SpendFacts(tuple(spent), reserving, self._clock.now().date())

    async def _project_name(self, uow: UnitOfWork, project_id: int) -> str | None:
        """The project's name when some project has policies of its own (else every project shares one set)."""
        if not self._guards.book.per_project:
            return None
        if project_id not in self._project_names:
            self._project_names[project_id] = (await uow.projects.get(project_id)).name
        return self._project_names[project_id]

    async def _prepare(
        self, session_id: str, trigger: Trigger, expected_version: int | None, *, dry_run: bool = False,
        run_tests: bool = True, held: bool = False, by: Callable[[UnitOfWork], Awaitable[Any]] | None = None,
    ) -> _Prepared:  # fmt: skip
        """Read the session and gather the slow facts its policies need, outside any transaction (git, tests).

        Refuses a caller `by` does not authorise, an impossible trigger (and, `held`, a session another node
        holds) first, so no test runs for a transition that cannot happen here.
        """
        async with self._uow(write=False) as uow:
            if by is not None:
                await by(uow)
            session = await uow.sessions.get(session_id)
            if held:
                await refuse_unless_held(uow, session, self.node_id)
            project = await uow.projects.get(session.project_id)
            row = await self._row(uow, session, trigger, expected_version)
        slow = await self._guards.prepare(row, session, project, dry_run=dry_run, run_tests=run_tests)
        return _Prepared(session, row, project.name, slow)

    async def _dry_verdict(self, prepared: _Prepared, cmd: FireTrigger) -> Verdict:
        """Evaluate the policies on a read-only unit of work: nothing is locked or written."""
        async with self._uow(write=False) as uow:
            return await self._guards.evaluate(
                prepared.row,
                lambda needs: self._fire_facts(
                    uow, prepared.session, None, prepared.row, cmd, needs, prepared.slow, dry=True
                ),
                project=prepared.project,
                overrides=cmd.overrides,
            )

    def policies(self, project: str | None = None) -> list[PolicyEntry]:
        """Every policy configured for `project` (by name; None: the global set), enabled or not, by priority."""
        return self._guards.book.entries(project)

    def test_command(self, project: str | None) -> tuple[str, ...]:
        """require_tests' command for `project` (empty when none is configured)."""
        return self._guards.book.tests(project).test_command

    async def check(
        self,
        session_id: str,
        trigger: str,
        *,
        actor: str = SYSTEM_ACTOR,
        overrides: frozenset[str] = frozenset(),
        run_tests: bool = True,
    ) -> PolicyCheck:
        """Dry run of `trigger` on the session: every applicable policy, evaluated as `actor` would be when
        firing it now (an operator checking `approve` counts their own approval). Writes nothing, not even a
        test run: the test command runs if no stored run of the head can be reused and `run_tests` is on.

        Raises: InvalidInput, SessionNotFound, InvalidTransition (the trigger is not allowed from the state).
        """
        parsed = parse_trigger(trigger)
        if parsed == Trigger.CREATE:
            raise InvalidInput("'create' is not fired on a session; nothing to check")
        prepared = await self._prepare(session_id, parsed, None, dry_run=True, run_tests=run_tests)
        verdict = await self._dry_verdict(prepared, FireTrigger(session_id, parsed.value, actor, overrides=overrides))
        applicable = tuple(p.name for p in self._guards.applicable(prepared.row, prepared.project))
        return PolicyCheck(prepared.session, parsed.value, prepared.row.dest.value, applicable, verdict, prepared.slow)


class _Prepared(NamedTuple):
    session: Session
    row: TransitionSpec
    project: str
    slow: SlowFacts


def _pending_approver(cmd: FireTrigger, row: TransitionSpec) -> tuple[str, ...]:
    """The operator whose `approve` this is: it counts toward review_approval with the stored approvals."""
    if row.trigger != Trigger.APPROVE:
        return ()
    if cmd.decision is not None:
        return (cmd.decision.operator_id,) if cmd.decision.decision == DecisionKind.APPROVE else ()
    return (cmd.actor.removeprefix("operator:"),) if cmd.actor.startswith("operator:") else ()
