"""Evaluates the configured policies for one transition, and gathers the slow facts some of them need.

Two phases, because no I/O may happen inside the transition's database transaction (SQLite holds its one
write lock there):

1. `prepare` (before the transaction, only when an applicable policy `needs` slow facts): read the worktree's
   git state, and for `require_tests` run the project's test command in the worktree through the `TestRunner`
   port, or reuse a stored run of the same command on the same head of a clean worktree. Each run is stored in
   `test_runs` in its own short transaction (never in a dry run).
2. `evaluate` (inside the transaction): load the database facts the applicable policies need (the operator,
   approvals, counts) under the transaction's locks, add the prepared slow facts, and run every policy.

Overrides: the policies named in `overrides` (or `*` for all) still run; their violations are recorded with
`overridden: true` and returned as `Verdict.bypassed`, and never block. Who may override is the decision use
case's business (application/operators/decisions.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.policy_book import PolicyBook
from taskgate.application.sessions.ports import TestRunner
from taskgate.application.workspaces.ports import VcsProvider
from taskgate.domain.entities import Project, Session
from taskgate.domain.errors import VcsError
from taskgate.domain.policies.facts import (
    NEEDS_TEST_RUN,
    NO_SLOW_FACTS,
    SLOW_NEEDS,
    GuardFacts,
    Policy,
    SlowFacts,
    TestRun,
    Verdict,
    WorkspaceFacts,
    needs_of,
    triggers_of,
)
from taskgate.domain.session_fsm import TransitionSpec
from taskgate.domain.states import Trigger

FactsLoader = Callable[[frozenset[str]], Awaitable[GuardFacts]]
"""Loads the facts for a set of needs (`domain/policies/facts.py` NEEDS_*); called once, only if a policy applies."""

OVERRIDE_ALL = "*"


@dataclass(frozen=True, slots=True)
class PolicyCheck:
    """A dry run (`SessionService.check`): what firing `trigger` now would meet. Nothing was written."""

    session: Session
    trigger: str
    to_state: str
    policies: tuple[str, ...]  # the applicable policies, in the order they ran
    verdict: Verdict
    slow: SlowFacts

    @property
    def allowed(self) -> bool:
        return self.verdict.allowed


class GuardEvaluator:
    """Runs every policy that applies to a transition, in priority order, and collects a `Verdict`.

    `policies` is a fixed list (every project alike) or a `PolicyBook` (per-project configuration). The ports
    are only needed for slow facts: without `vcs` no workspace facts are gathered, without `tests` no test runs.
    """

    def __init__(
        self,
        policies: Sequence[Policy] | PolicyBook,
        *,
        uow: UnitOfWorkFactory | None = None,
        vcs: VcsProvider | None = None,
        tests: TestRunner | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.book = policies if isinstance(policies, PolicyBook) else PolicyBook.fixed(policies)
        self._uow, self._vcs, self._tests, self._clock = uow, vcs, tests, clock
        self._needs_by_trigger: dict[Trigger, frozenset[str]] = {}

    @property
    def policies(self) -> list[Policy]:
        """The global set (every project's, unless a project has its own)."""
        return self.book.active(None)

    def policies_for(self, project: str | None) -> list[Policy]:
        return self.book.active(project)

    def applicable(self, transition: TransitionSpec, project: str | None = None) -> list[Policy]:
        """Policies that guard `transition` in `project`."""
        return [p for p in self.book.active(project) if p.applies_to(transition)]

    def may_need(self, trigger: Trigger) -> frozenset[str]:
        """Everything any project's policies could need for `trigger` (plus "guarded" when any policy might
        apply): a cheap, conservative test that lets unguarded triggers skip the prepare phase entirely."""
        if trigger not in self._needs_by_trigger:
            found: set[str] = set()
            for policies in self.book.all_sets():
                for policy in policies:
                    triggers = triggers_of(policy)
                    if triggers is None or trigger in triggers:
                        found |= {"guarded", *needs_of(policy)}
            self._needs_by_trigger[trigger] = frozenset(found)
        return self._needs_by_trigger[trigger]

    async def evaluate(
        self,
        transition: TransitionSpec,
        load_facts: FactsLoader,
        *,
        project: str | None = None,
        overrides: frozenset[str] = frozenset(),
    ) -> Verdict:
        """Check every applicable policy. Facts are loaded only when some policy applies (most triggers have
        none), and only the facts those policies need. All policies run even after a denial, so the log and the
        error list every reason at once.
        """
        verdict = Verdict()
        policies = self.applicable(transition, project)
        if not policies:
            return verdict
        facts = await load_facts(frozenset().union(*(needs_of(p) for p in policies)))
        for policy in policies:
            found = policy.check(facts)
            if inspect.isawaitable(found):
                found = await found
            verdict.record(policy, found, overridden=OVERRIDE_ALL in overrides or policy.name in overrides)
        return verdict

    async def prepare(
        self,
        transition: TransitionSpec,
        session: Session,
        project: Project,
        *,
        dry_run: bool = False,
        run_tests: bool = True,
    ) -> SlowFacts:
        """Gather the slow facts the applicable policies need, outside any transaction.

        A dry run stores no test run; `run_tests=False` only reuses a stored one.
        Raises: nothing for git or test failures (they become facts the policies report).
        """
        needs = frozenset().union(*(needs_of(p) for p in self.applicable(transition, project.name)))
        if not needs & SLOW_NEEDS:
            return NO_SLOW_FACTS
        tests = self.book.tests(project.name)
        slow = SlowFacts(test_command=tests.test_command, test_timeout_s=tests.test_timeout_s)
        slow = await self._workspace(slow, session, project)
        if NEEDS_TEST_RUN not in needs or not slow.test_command:
            return slow
        if slow.workspace is None:
            return replace(slow, test_note=slow.test_note or "the session has no worktree")
        reuse = any(getattr(p, "reuse", False) for p in self.applicable(transition, project.name))
        return await self._test_run(slow, session, slow.workspace, reuse=reuse, store=not dry_run, run=run_tests)

    async def _workspace(self, slow: SlowFacts, session: Session, project: Project) -> SlowFacts:
        if self._vcs is None or not session.worktree_path or not session.branch_name:
            return slow
        if session.state_data.get("worktree_missing"):  # merge restores it from the branch; nothing to inspect
            return replace(slow, test_note="the worktree folder is missing")
        base = str(session.state_data.get("base_ref") or session.state_data.get("base_branch") or "main")
        try:
            ctx = await self._vcs.worktree_state(project.root_path, session.worktree_path, session.branch_name, base)
        except VcsError as exc:
            return replace(slow, test_note=f"the worktree could not be read: {exc}")
        commits = tuple((c.sha, c.subject) for c in ctx.commits)
        workspace = WorkspaceFacts(
            ctx.branch, ctx.head_commit, tuple(ctx.dirty), tuple(ctx.untracked), tuple(ctx.conflicts), commits
        )
        return replace(slow, workspace=workspace)

    async def _test_run(
        self, slow: SlowFacts, session: Session, workspace: WorkspaceFacts, *, reuse: bool, store: bool, run: bool
    ) -> SlowFacts:
        assert self._uow is not None and session.worktree_path is not None
        if reuse and workspace.clean:  # uncommitted changes are not part of the head: never reuse over them
            async with self._uow(write=False) as uow:
                stored = await uow.test_runs.latest(session.id, workspace.head_commit, slow.test_command)
            if stored is not None:
                return replace(slow, test_run=stored, test_run_reused=True)
        if not run or self._tests is None:
            return replace(slow, test_note="no stored run for this head, and running the tests was not asked for")
        outcome = await self._tests.run(slow.test_command, session.worktree_path, timeout_s=slow.test_timeout_s)
        assert self._clock is not None
        result = TestRun(
            session.id,
            session.version,
            slow.test_command,
            outcome.exit_code,
            outcome.timed_out,
            outcome.duration_ms,
            outcome.output_tail,
            workspace.head_commit,
            self._clock.now(),
        )
        if store:
            result = await self._store(result)
        return replace(slow, test_run=result, test_run_reused=False)

    async def _store(self, run: TestRun) -> TestRun:
        assert self._uow is not None
        payload = {
            "command": list(run.command),
            "exit_code": run.exit_code,
            "timed_out": run.timed_out,
            "duration_ms": run.duration_ms,
            "head_commit": run.head_commit,
        }
        async with self._uow(write=True) as uow:
            run = replace(run, id=await uow.test_runs.add(run))
            await uow.events.append("tests.run", run.at, payload, run.session_id)
            await uow.commit()
        return run
