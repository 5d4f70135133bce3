"""The policy framework on real git repositories and real test commands, on every backend (issue 5).

Each test wires the engine with a `PolicyBook` for project `repo` (the folder name of `git_repo`): require_tests
runs real Python commands in the session worktree, clean_worktree and commit_message_format read real git state.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from taskgate.application.sessions.commands import FireTrigger, StartTask
from taskgate.application.sessions.policy_book import PolicyBook, ProjectPolicies
from taskgate.domain.entities import Decision, DecisionKind, Operator, Session
from taskgate.domain.errors import PolicyViolation
from taskgate.domain.states import SessionState
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.test_runner import SubprocessTestRunner
from tests.builders import ACTOR, fire, seed, start
from tests.conftest import BACKENDS, Services, open_database, wire
from tests.fakes import FakeTestRunner

IDENTITY = ("-c", "user.name=agent", "-c", "user.email=agent@example.invalid")
PASS = (sys.executable, "-c", "print('3 passed')")
FAIL = (
    sys.executable,
    "-c",
    "import sys; print('collected 3 items'); print('FAILED test_api.py::test_get'); sys.exit(1)",
)

Build = Callable[..., Awaitable[Services]]


def commit(cwd: Path | str, name: str, message: str) -> str:
    (Path(cwd) / name).write_text(f"{name}\n")
    subprocess.run(["git", "add", "--", name], cwd=cwd, check=True, capture_output=True)
    subprocess.run(["git", *IDENTITY, "commit", "-q", "-m", message], cwd=cwd, check=True, capture_output=True)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def book(
    command: tuple[str, ...] = (), timeout_s: float = 60, project: dict | None = None, **defaults: dict
) -> PolicyBook:
    return PolicyBook(defaults, {"repo": ProjectPolicies(command, timeout_s, project or {})})


@pytest.fixture(params=BACKENDS)
async def build(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Build]:
    opened: list[object] = []

    async def make(policies: PolicyBook, tests=None) -> Services:
        database, url = await open_database(request.param, request, tmp_path)
        opened.append(database)
        return wire(request.param, database, url, policies=policies, tests=tests or SubprocessTestRunner())

    yield make
    for database in opened:
        if isinstance(database, Database):
            await database.dispose()


async def verifying(services: Services, repo: Path, message: str = "feat: add the api") -> Session:
    """A started session whose agent committed one file, in verifying."""
    seeded = await seed(services, repo, tasks=2)
    session = await start(services, seeded.tasks[0])
    commit(session.worktree_path, "api.py", message)
    return await fire(services, session, "plan_complete", "work_complete")


async def test_require_tests_blocks_a_failing_command_and_stores_exit_code_duration_and_tail(build, git_repo):
    services = await build(book(FAIL))
    session = await verifying(services, git_repo)
    with pytest.raises(PolicyViolation) as refused:
        await fire(services, session, "approve")
    [violation] = refused.value.violations
    assert violation.policy == "require_tests" and "exited with 1" in violation.message
    assert "FAILED test_api.py::test_get" in violation.message and violation.suggestion
    async with services.uow(write=False) as uow:
        [run] = await uow.test_runs.of_session(session.id)
    assert (run.exit_code, run.timed_out, run.command) == (1, False, FAIL) and run.duration_ms >= 0
    assert "FAILED test_api.py::test_get" in run.output_tail and run.session_version == session.version
    assert (
        run.head_commit
        == subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=session.worktree_path, capture_output=True, text=True
        ).stdout.strip()
    )
    [blocked] = (await services.sessions.history(session.id))[-1:]
    assert blocked.outcome == "blocked" and blocked.trigger == "approve"
    assert any(r["policy"] == "require_tests" and not r["passed"] for r in blocked.guard_results)
    assert (await services.sessions.get(session.id)).state == SessionState.VERIFYING


async def test_a_passing_run_is_stored_once_and_reused_for_an_unchanged_head(build, git_repo, tmp_path):
    counter = tmp_path / "runs.txt"
    counting = (sys.executable, "-c", f"open({str(counter)!r}, 'a').write('x'); print('ok')")
    services = await build(book(counting, review_approval={"min_approvals": 2}))
    session = await verifying(services, git_repo)
    with pytest.raises(PolicyViolation, match="1 of 2 required approvals"):
        await fire(services, session, "approve")  # tests pass (stored); review_approval wants a second approver
    check = await services.sessions.check(session.id, "approve", actor="operator:bob")
    assert check.slow.test_run_reused is True and check.slow.test_run.passed
    assert counter.read_text() == "x"  # the command ran once; the dry run reused the stored run
    commit(session.worktree_path, "more.py", "feat: more")
    check = await services.sessions.check(session.id, "approve", actor="operator:bob")
    assert check.slow.test_run_reused is False and counter.read_text() == "xx"  # a new head runs the tests again


async def test_a_command_that_outlives_its_timeout_is_killed_and_refused(build, git_repo):
    sleeper = (sys.executable, "-c", "import time; print('starting', flush=True); time.sleep(30)")
    services = await build(book(sleeper, timeout_s=0.5))
    session = await verifying(services, git_repo)
    with pytest.raises(PolicyViolation) as refused:
        await fire(services, session, "approve")
    [violation] = refused.value.violations
    assert "timed out after 0.5 s" in violation.message and "starting" in violation.message
    async with services.uow(write=False) as uow:
        [run] = await uow.test_runs.of_session(session.id)
    assert run.timed_out and run.exit_code is None and run.duration_ms < 10_000


async def test_review_approval_needs_two_distinct_approvers(build, git_repo):
    services = await build(book(review_approval={"min_approvals": 2}))
    session = await verifying(services, git_repo)
    with pytest.raises(PolicyViolation, match=r"1 of 2 required approvals \(alice\)"):
        await fire(services, session, "approve")
    await services.tracker.ensure_operator("bob")  # the decision row needs the operator
    async with services.uow(write=True) as uow:
        approval = Decision(session.id, "bob", DecisionKind.APPROVE, session.version, session.updated_at)
        await uow.decisions.add(approval)
        await uow.commit()
    approved = await fire(services, session, "approve")
    assert approved.state == SessionState.AWAITING_MERGE


async def test_clean_worktree_refuses_approve_and_merge_before_any_git_work(build, git_repo):
    services = await build(book())
    session = await verifying(services, git_repo)
    (Path(session.worktree_path) / "notes.txt").write_text("scratch\n")
    with pytest.raises(PolicyViolation, match=r"untracked notes\.txt"):
        await fire(services, session, "approve")
    (Path(session.worktree_path) / "notes.txt").unlink()
    session = await fire(services, session, "approve")
    main_before = subprocess.run(["git", "rev-parse", "main"], cwd=git_repo, capture_output=True, text=True).stdout
    (Path(session.worktree_path) / "api.py").write_text("changed after approval\n")
    with pytest.raises(PolicyViolation, match=r"modified api\.py"):
        await fire(services, session, "merge")
    assert (
        subprocess.run(["git", "rev-parse", "main"], cwd=git_repo, capture_output=True, text=True).stdout == main_before
    )
    assert (await services.sessions.get(session.id)).state == SessionState.AWAITING_MERGE
    [row] = (await services.sessions.history(session.id))[-1:]
    assert (row.trigger, row.outcome) == ("merge", "blocked")


async def test_branch_naming_refuses_a_branch_outside_the_pattern(build, git_repo):
    services = await build(book(branch_naming={"pattern": r"release/.+"}))
    session = await verifying(services, git_repo)
    with pytest.raises(PolicyViolation, match=f"branch '{session.branch_name}' does not match release/"):
        await fire(services, session, "approve")


async def test_commit_message_format_names_a_bad_subject_on_the_branch(build, git_repo):
    services = await build(book(commit_message_format={"enabled": True}))
    session = await verifying(services, git_repo, message="did some stuff")
    with pytest.raises(PolicyViolation, match=r"1 commit subject.*'did some stuff'"):
        await fire(services, session, "approve")


async def test_operator_capacity_refuses_a_start_beyond_the_operators_maximum(build, git_repo):
    services = await build(book())
    seeded = await seed(services, git_repo, tasks=2)
    async with services.uow(write=True) as uow:
        await uow.operators.add(Operator("bob", "Bob", None, [], [], 1, seeded.project.created_at))
        await uow.commit()
    await services.sessions.start_task(StartTask(seeded.tasks[0].id, "operator:bob", "bob"))
    with pytest.raises(PolicyViolation, match="operator bob already has 1 of 1 sessions in progress"):
        await services.sessions.start_task(StartTask(seeded.tasks[1].id, "operator:bob", "bob"))


async def test_a_project_can_disable_a_policy_and_lower_another_to_a_recorded_warning(build, git_repo):
    project = {"clean_worktree": {"severity": "warning"}, "review_approval": {"enabled": False}}
    services = await build(book(project=project, review_approval={"min_approvals": 5}))
    session = await verifying(services, git_repo)
    (Path(session.worktree_path) / "notes.txt").write_text("scratch\n")
    result = await services.sessions.fire(FireTrigger(session.id, "approve", "system"))
    assert result.session.state == SessionState.AWAITING_MERGE
    [warning] = [r for r in result.record.guard_results if not r["passed"] and r["policy"] == "clean_worktree"]
    assert warning["severity"] == "warning" and "notes.txt" in warning["message"]
    assert "review_approval" not in {r["policy"] for r in result.record.guard_results}


async def test_an_override_lets_a_refusing_policy_through_and_records_what_it_bypassed(build, git_repo):
    services = await build(book(FAIL))
    session = await verifying(services, git_repo)
    (Path(session.worktree_path) / "notes.txt").write_text("scratch\n")
    cmd = FireTrigger(session.id, "approve", ACTOR, "hotfix", overrides=frozenset({"require_tests"}))
    with pytest.raises(PolicyViolation) as refused:  # clean_worktree is not overridden: still refused
        await services.sessions.fire(cmd)
    assert [v.policy for v in refused.value.violations] == ["clean_worktree"]
    result = await services.sessions.fire(replace(cmd, overrides=frozenset({"require_tests", "clean_worktree"})))
    assert result.session.state == SessionState.AWAITING_MERGE
    bypassed = [r for r in result.record.guard_results if r.get("overridden")]
    assert {r["policy"] for r in bypassed} == {"require_tests", "clean_worktree"}
    assert all(not r["passed"] and r["message"] for r in bypassed)
    async with services.uow(write=False) as uow:
        moved = [e for e in await uow.events.list(session.id) if e["kind"] == "session.transition"][-1]
    assert any("require_tests: " in text for text in moved["payload"]["bypassed"])


async def test_override_all_bypasses_every_policy(build, git_repo):
    services = await build(book(FAIL, review_approval={"min_approvals": 3}))
    session = await verifying(services, git_repo)
    result = await services.sessions.fire(FireTrigger(session.id, "approve", ACTOR, overrides=frozenset({"*"})))
    assert result.session.state == SessionState.AWAITING_MERGE
    assert {r["policy"] for r in result.record.guard_results if r.get("overridden")} == {
        "require_tests",
        "review_approval",
    }


async def test_a_dry_run_evaluates_everything_and_writes_nothing(build, git_repo):
    services = await build(book(FAIL, review_approval={"min_approvals": 2}))
    session = await verifying(services, git_repo)
    before = await services.snapshot()
    check = await services.sessions.check(session.id, "approve", actor=ACTOR)
    assert await services.snapshot() == before
    assert not check.allowed and check.to_state == "awaiting_merge"
    assert {v.policy for v in check.verdict.blocking()} == {"require_tests", "review_approval"}
    assert check.slow.test_run.exit_code == 1 and check.slow.test_run.id is None  # ran, not stored
    assert check.slow.test_run_reused is False
    assert check.policies == ("branch_naming", "clean_worktree", "review_approval", "require_tests")
    skipped = await services.sessions.check(session.id, "approve", actor=ACTOR, run_tests=False)
    assert skipped.slow.test_run is None and "not asked for" in skipped.slow.test_note


async def test_a_blocked_transition_is_logged_with_its_violations(build, git_repo, caplog):
    services = await build(book(FAIL), tests=FakeTestRunner(exit_code=2, output="E   assert 1 == 2"))
    session = await verifying(services, git_repo)
    with caplog.at_level(logging.INFO, logger="taskgate.policies"), pytest.raises(PolicyViolation):
        await fire(services, session, "approve")
    [blocked] = (await services.sessions.history(session.id))[-1:]
    [failed] = [r for r in blocked.guard_results if not r["passed"]]
    assert failed["policy"] == "require_tests" and "exited with 2" in failed["message"]
    assert "assert 1 == 2" in failed["message"]
    async with services.uow(write=False) as uow:
        event = [e for e in await uow.events.list(session.id) if e["kind"] == "session.blocked"][-1]
    assert "require_tests: " in event["payload"]["violations"][0]
    assert any(
        "'approve' blocked on session" in r.getMessage() and "require_tests" in r.getMessage() for r in caplog.records
    )


async def test_unguarded_triggers_never_touch_git_or_tests(build, git_repo):
    runner = FakeTestRunner()
    services = await build(book(PASS), tests=runner)
    session = await verifying(services, git_repo)
    session = await fire(services, session, "suspend", "resume")
    assert runner.calls == [] and session.state == SessionState.VERIFYING
    await fire(services, session, "approve")
    assert [call[0] for call in runner.calls] == [PASS]
