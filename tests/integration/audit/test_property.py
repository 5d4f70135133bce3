"""Any sequence of valid operations leaves an audit log that verifies (issue 21), as a hypothesis state machine on
a real database and real git repositories: sessions started and moved by triggers their state allows (a guard may
refuse: the blocked row is chained too), operators' decisions on verifications, tokens issued and revoked,
operators added and granted roles, checkpoints, prunes of finished sessions and recorded verifications, in any
order. After each sequence the database verifies with every record linked, and an export of it verifies offline
with the same record count."""

from __future__ import annotations

import asyncio
import itertools
import shutil
from collections.abc import Awaitable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from taskgate.application.audit.export import verify_export
from taskgate.application.audit.ledger import Scope
from taskgate.application.operators.decisions import Decide
from taskgate.application.operators.roster import AddOperator
from taskgate.application.sessions.commands import FireTrigger, StartTask
from taskgate.application.trackers.builtin import AddTask
from taskgate.domain.entities import DecisionKind, Role, Session
from taskgate.domain.errors import StorageError, TaskgateError
from taskgate.domain.session_fsm import allowed_triggers
from taskgate.domain.states import TERMINAL_STATES, SessionState
from taskgate.infrastructure.audit.keys import AuditSigner
from taskgate.infrastructure.db.engine import Database
from tests.audit_support import export_lines, ledger_of, new_signer, problems, record_count
from tests.builders import ACTOR, OPERATOR
from tests.conftest import Services, make_git_repo, open_database, wire
from tests.fakes import FakeClock

T = TypeVar("T")
DECISIONS = {kind.value for kind in DecisionKind}  # fired through DecisionService, never as plain triggers
MAX_SESSIONS = 4
STEPS = 12
COMPENSATIONS = [None, "manual_review", "auto_revert", "approve_and_merge"]
# Free text the chain encodes as ASCII with escapes, whatever it holds (NUL aside: PostgreSQL's text refuses it).
REASONS = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=12)
FORWARD = {"start", "plan_complete", "work_complete", "merge", "retry", "resume", "compensate", "reverify"}


class AuditedOperations(RuleBasedStateMachine):
    """One example: a fresh database (SQLite copied from the template, or PostgreSQL truncated) and git repository,
    operated on by the rules in the order hypothesis draws; `teardown` checks the whole log and closes it."""

    backend: str
    request: pytest.FixtureRequest
    root: Path
    signer: AuditSigner
    examples = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.folder = self.root / f"example-{next(self.examples)}"
        self.clock = FakeClock()
        self.sessions: dict[str, Any] = {}  # id -> Session, refreshed after every rule
        self.tokens: list[str] = []
        self.operators = [OPERATOR]
        self.svc = self.run(self._open())
        self.ledger = ledger_of(self.svc, self.signer, self.clock)

    def run(self, call: Awaitable[T]) -> T:
        return self.loop.run_until_complete(call)

    async def _open(self) -> Services:
        self.folder.mkdir(parents=True)
        if self.backend == "sqlite":
            shutil.copy(self.request.getfixturevalue("sqlite_template"), self.folder / "taskgate.db")
            url = f"sqlite:///{self.folder / 'taskgate.db'}"
            database: Any = Database(url, synchronous="NORMAL")
        else:
            database, url = await open_database("postgresql", self.request, self.folder)
        svc = wire(self.backend, database, url, clock=self.clock)
        self.project = await svc.tracker.init_project(str(make_git_repo(self.folder / "repo")))
        await svc.tracker.ensure_operator(OPERATOR)  # an admin: may decide and override
        self.plan = await svc.tracker.add_plan(self.project.id, "Phase 1")
        task = await svc.tracker.add_task(AddTask(self.project.id, "work", plan_id=self.plan.id))
        started = await svc.sessions.start_task(StartTask(task.id, ACTOR, OPERATOR))  # every example has one
        self.sessions[started.session.id] = started.session
        return svc

    def act(self, call: Awaitable[T]) -> T | None:
        """Run one operation a second after the last; a refusal (a guard, a state, a conflict) is an outcome, not a
        failure, but a storage error is: the chaining broke a write."""
        self.clock.advance(seconds=1)
        try:
            return self.run(call)
        except StorageError:
            raise
        except TaskgateError:
            return None
        finally:
            self.sessions = {s.id: s for s in self.run(self.svc.sessions.list_sessions())}

    def live(self, *states: SessionState) -> list[str]:
        """The ids of sessions not finished (in one of `states`, if given), oldest first."""
        return [s for s in self.made() if self.sessions[s].state not in TERMINAL_STATES
                and (not states or self.sessions[s].state in states)]  # fmt: skip

    def made(self) -> list[str]:
        """Every session's id, oldest first: an order that replays (ids are random, the fake clock's times are not),
        so that hypothesis draws the same session again when it replays a sequence."""
        return sorted(self.sessions, key=lambda s: self.sessions[s].created_at)

    # -- sessions ---------------------------------------------------------------------------------------------

    @precondition(lambda self: len(self.sessions) < MAX_SESSIONS)
    @rule()
    def start_a_session(self) -> None:
        async def start() -> None:
            task = await self.svc.tracker.add_task(AddTask(self.project.id, "work", plan_id=self.plan.id))
            await self.svc.sessions.start_task(StartTask(task.id, ACTOR, OPERATOR))

        self.act(start())

    @precondition(lambda self: self.live())
    @rule(data=st.data(), steps=st.integers(1, 5))
    def move_a_session(self, data: st.DataObject, steps: int) -> None:
        """A few moves in a row of one session: a trigger its state allows, or in verifying an operator's decision."""
        session_id = data.draw(st.sampled_from(self.live()), label="session")
        for _ in range(steps):
            session = self.sessions[session_id]
            if session.state in TERMINAL_STATES:
                return
            if session.state == SessionState.VERIFYING:
                self.decide(data, session_id)
            else:
                self.fire(data, session)

    def fire(self, data: st.DataObject, session: Session) -> None:
        triggers = [t for t in allowed_triggers(session.state, session.prior_state) if t not in DECISIONS]
        forward = [t for t in triggers if t in FORWARD]  # toward decisions and merges: first (the simplest
        weighted = forward * 8 + triggers  # choice, where shrinking goes) and mostly
        trigger = data.draw(st.sampled_from(weighted), label="trigger")
        reason = data.draw(REASONS, label="reason")
        self.act(self.svc.sessions.fire(FireTrigger(session.id, trigger, ACTOR, reason=reason)))

    def decide(self, data: st.DataObject, session_id: str) -> None:
        """Approve, request changes, or reject with a compensation (approve_and_merge overrides the review)."""
        kind = data.draw(st.sampled_from(sorted(DECISIONS)), label="decision")
        compensation = data.draw(st.sampled_from(COMPENSATIONS), label="compensation") if kind == "reject" else None
        instructions = "add tests" if kind == "request_changes" else None
        reason = data.draw(REASONS, label="reason") or "reviewed"  # approve_and_merge needs one
        decide = Decide(session_id, OPERATOR, kind, reason=reason, instructions=instructions,
                        compensation=compensation)  # fmt: skip
        self.act(self.svc.decisions.decide(decide))

    # -- tokens, operators, the ledger: each one rule, so that hypothesis picks them as often as a session's move --

    @rule(
        data=st.data(), change=st.sampled_from(["issue a token", "revoke a token", "add an operator", "grant a role"])
    )
    def change_access(self, data: st.DataObject, change: str) -> None:
        role = data.draw(st.sampled_from([r.value for r in Role]), label="role")
        if change == "issue a token":
            self.issue_a_token(data)
        elif change == "revoke a token" and self.tokens:
            self.act(self.svc.access.revoke(data.draw(st.sampled_from(self.tokens), label="token")))
        elif change == "add an operator":
            operator_id = f"op{len(self.operators)}"
            if self.act(self.svc.operators.add(AddOperator(operator_id, [role], actor=ACTOR))) is not None:
                self.operators.append(operator_id)
        elif change == "grant a role":
            operator_id = data.draw(st.sampled_from(self.operators), label="operator")
            self.act(self.svc.operators.grant(operator_id, roles=[role], actor=ACTOR))

    def issue_a_token(self, data: st.DataObject) -> None:
        """An operator's token, or a token for one session (finished or not)."""
        if data.draw(st.booleans(), label="for a session") and self.sessions:
            session_id = data.draw(st.sampled_from(self.made()), label="session")
            issued = self.act(self.svc.access.create_agent_token(session_id, "agent"))
        else:
            issued = self.act(self.svc.access.create_operator_token(OPERATOR, "ci"))
        if issued is not None:
            self.tokens.append(issued.token.id)

    @rule(action=st.sampled_from(["checkpoint", "prune", "verify"]), seconds_ago=st.integers(0, 4))
    def use_the_ledger(self, action: str, seconds_ago: int) -> None:
        """Sign a checkpoint; prune finished sessions' records older than a few seconds; or verify (recorded as an
        audit.verified event), which must find nothing at any point of the sequence."""
        if action == "checkpoint":
            self.act(self.ledger.checkpoint())
        elif action == "prune":
            self.act(self.ledger.prune(self.clock.now() - timedelta(seconds=seconds_ago)))
        else:
            report = self.act(self.ledger.verify(Scope()))
            assert report is not None and report.ok, problems(report) if report else "refused"

    # -- after the sequence -----------------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self.run(self._check_everything())
        finally:
            self.run(self.svc.database.dispose())
            self.loop.close()

    async def _check_everything(self) -> None:
        report = await self.ledger.verify(Scope(), record=False)
        assert report.ok, problems(report)
        assert report.records == await record_count(self.svc)  # every record linked, none left out
        lines = await export_lines(self.svc, Scope(), self.signer.key_id, self.clock)
        offline = verify_export(lines, self.signer.public, "export.jsonl")
        assert offline.ok, problems(offline)
        assert (offline.records, offline.checkpoints) == (report.records, report.checkpoints)


def run_machine(backend: str, request: pytest.FixtureRequest, tmp_path: Path, examples: int) -> None:
    machine = type(f"AuditedOperationsOn{backend.title()}", (AuditedOperations,), {
        "backend": backend, "request": request, "root": tmp_path, "signer": new_signer(tmp_path / "keys"),
    })  # fmt: skip
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=examples, stateful_step_count=STEPS, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )  # fmt: skip


@pytest.mark.timeout(240)
def test_any_sequence_of_valid_operations_verifies_on_sqlite(request, tmp_path, sqlite_template):
    run_machine("sqlite", request, tmp_path, examples=15)


@pytest.mark.timeout(240)
def test_any_sequence_of_valid_operations_verifies_on_postgresql(request, tmp_path, pg_url):
    run_machine("postgresql", request, tmp_path, examples=5)
