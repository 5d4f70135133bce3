"""The workflow runtime: each step type, routes, retries on a fake clock, approvals answered by decisions,
checklists, nesting with each context mode, the loop guard, hand edits of the stack, and restart mid-step.

Every test runs on the in-memory fakes, SQLite and PostgreSQL (`services`), with real git worktrees and the
real AgentService; only the agent processes are scripted (tests/workflow_support.py)."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from taskgate.application.operators.decisions import Decide
from taskgate.application.sessions.commands import FireTrigger
from taskgate.domain.errors import ConflictError, InvalidInput, InvalidTransition
from taskgate.domain.states import SessionState
from taskgate.domain.workflows.definitions import WorkflowNotFound
from taskgate.domain.workflows.run import MAX_DEPTH, LoopLimits
from tests.builders import ACTOR, OPERATOR
from tests.conftest import wire
from tests.fakes import FakeClock
from tests.workflow_support import APPROVALS, planning_with, rig, run_until_idle

LINEAR = """
id: linear
description: two agents then done
variables:
  target: "{{task.title}} in {{place}}"
  place: src
steps:
  - id: first
    type: agent
    agent: ok
    prompt: "write {{target}}"
  - id: second
    type: agent
    agent: ok
    input: first
    prompt: check it
"""


async def _execute(services, r, session):
    await r.agents.execute(session.id, ACTOR)
    await run_until_idle(r, session.id)
    return await services.sessions.get(session.id)


async def _runs(r, session):
    return [(x.step_id, x.attempt, x.status.value) for x in await r.engine.step_runs(session.id)]


async def test_agent_steps_run_in_order_pass_outputs_and_complete_the_work(services, git_repo, tmp_path):
    r = rig(services, tmp_path, {"dev/linear.yaml": LINEAR})
    session = await planning_with(services, git_repo, r, "linear")
    done = await _execute(services, r, session)
    assert done.state == SessionState.VERIFYING and done.workflow_stack == []
    assert await _runs(r, session) == [("first", 1, "succeeded"), ("second", 1, "succeeded")]
    first, second = r.runner.prompts("ok")
    assert first == "write task 0 in src"  # workflow variables, resolved through the task's
    assert second.startswith("check it") and "Output of step 'first':\nwrite task 0 in src" in second
    history = [row.trigger for row in await services.sessions.history(session.id)]
    assert history[-1] == "work_complete"


async def test_a_step_starts_when_the_step_before_it_ended_so_followers_list_them_in_order(
    services, git_repo, tmp_path
):
    r = rig(services, tmp_path, {"dev/linear.yaml": LINEAR}, clock=FakeClock())  # every reading a microsecond on
    session = await planning_with(services, git_repo, r, "linear")
    await _execute(services, r, session)
    first, second = await r.engine.step_runs(session.id)
    # the end of `first` and the claim of `second` are one transaction: `second` is not stamped before it
    assert first.ended_at is not None and second.started_at >= first.ended_at


ROUTES = """
id: routes
description: errors route on_error, successes on_success
steps:
  - id: try
    type: agent
    agent: fail
    prompt: try
    on_error: recover
    on_success: done
  - id: recover
    type: agent
    agent: ok
    prompt: recover
    on_success: done
  - id: unreachable-in-practice
    type: agent
    agent: ok
    prompt: never
    next: done
  - id: done
    type: condition
    when: steps.recover.status == "succeeded"
    then: end
    else: unreachable-in-practice
"""


async def test_a_failure_routes_on_error_and_a_condition_reads_step_results(services, git_repo, tmp_path):
    r = rig(services, tmp_path, {"dev/routes.yaml": ROUTES})
    session = await planning_with(services, git_repo, r, "routes")
    done = await _execute(services, r, session)
    assert done.state == SessionState.VERIFYING
    assert await _runs(r, session) == [("try", 1, "failed"), ("recover", 1, "succeeded"), ("done", 1, "succeeded")]


RETRIES = """
id: retries
description: a flaky agent retried with backoff
steps:
  - id: flaky
    type: agent
    agent: flaky
    prompt: maybe
    max_retries: 3
    retry_delay_ms: 1000
    retry_max_delay_ms: 1500
"""


async def test_retries_wait_with_exponential_backoff_and_a_cap_on_the_clock(services, git_repo, tmp_path):
    clock = FakeClock()
    r = rig(services, tmp_path, {"dev/retries.yaml": RETRIES}, clock=clock)
    session = await planning_with(services, git_repo, r, "retries")
    done = await _execute(services, r, session)
    assert done.state == SessionState.VERIFYING
    assert await _runs(r, session) == [("flaky", 1, "failed"), ("flaky", 2, "failed"), ("flaky", 3, "succeeded")]
    assert clock.slept == pytest.approx([1.0, 1.5], abs=1e-3)  # 1000 ms, then 2000 ms capped at 1500 ms


async def test_retries_used_up_without_on_error_fail_the_session_with_the_reason(services, git_repo, tmp_path):
    clock = FakeClock()
    text = RETRIES.replace("max_retries: 3", "max_retries: 1")
    r = rig(services, tmp_path, {"dev/retries.yaml": text}, clock=clock)
    session = await planning_with(services, git_repo, r, "retries")
    failed = await _execute(services, r, session)
    assert failed.state == SessionState.FAILED and failed.compensation_plan == "manual_review"
    assert await _runs(r, session) == [("flaky", 1, "failed"), ("flaky", 2, "failed")]
    last = (await services.sessions.history(session.id))[-1]
    assert last.trigger == "fail" and "step 'flaky' of retries failed" in (last.reason or "")
    assert clock.slept == pytest.approx([1.0], abs=1e-3)


PARALLEL = """
id: parallel
description: three agents, two must succeed
steps:
  - id: validate
    type: parallel
    prompt: validate
    agents: [ok, fail, ok]
    min_success: {min}
    on_error: fixup
    on_success: end
  - id: fixup
    type: agent
    agent: ok
    prompt: fix
"""


@pytest.mark.parametrize(("min_success", "expected"), [(2, "succeeded"), (3, "failed")])
async def test_parallel_steps_join_on_min_success(services, git_repo, tmp_path, min_success, expected):
    r = rig(services, tmp_path, {"dev/parallel.yaml": PARALLEL.format(min=min_success)})
    session = await planning_with(services, git_repo, r, "parallel")
    done = await _execute(services, r, session)
    assert done.state == SessionState.VERIFYING
    runs = await r.engine.step_runs(session.id)
    assert (runs[0].step_id, runs[0].status.value, len(runs[0].agent_ids)) == ("validate", expected, 3)
    assert [x.step_id for x in runs[1:]] == ([] if expected == "succeeded" else ["fixup"])


async def _decide(services, session_id, decision, **fields):
    return await services.decisions.decide(Decide(session_id, OPERATOR, decision, **fields))


async def test_an_approval_step_pauses_and_is_answered_by_a_decision(services, git_repo, tmp_path):
    r = rig(services, tmp_path, {"dev/approvals.yaml": APPROVALS})
    session = await planning_with(services, git_repo, r, "approvals")
    paused = await _execute(services, r, session)
    assert paused.state == SessionState.EXECUTING
    view = r.engine.view(paused)
    assert view.waiting is not None and view.waiting.kind == "approval"
    assert view.waiting.message == "Read the plan and approve it."
    assert view.breadcrumb == "approvals › approve-plan" and view.depth == 1

    result = await _decide(services, session.id, "approve", reason="good plan")
    assert result.decision.decision.value == "approve" and result.decision.to_state == "executing"
    again = await _decide(services, session.id, "approve", reason="good plan")
    assert again.replayed  # the same decision again: its first result, nothing new
    with pytest.raises(ConflictError):  # a different decision on the answered step is refused, naming it
        await _decide(services, session.id, "reject")
    await run_until_idle(r, session.id)
    done = await services.sessions.get(session.id)
    assert done.state == SessionState.VERIFYING
    assert [s for s, _, _ in await _runs(r, session)] == ["plan", "approve-plan", "build"]
    assert (await _runs(r, session))[1] == ("approve-plan", 1, "approved")


async def test_request_changes_on_an_approval_goes_back_with_instructions_and_reject_routes(
    services, git_repo, tmp_path
):
    r = rig(services, tmp_path, {"dev/approvals.yaml": APPROVALS})
    session = await planning_with(services, git_repo, r, "approvals")
    paused = await _execute(services, r, session)
    assert r.engine.view(paused).waiting.output_of == "plan"  # what the approval asks to read
    await _decide(services, session.id, "request_changes", instructions="split it in two")
    await run_until_idle(r, session.id)
    assert r.runner.prompts("ok")[-1].endswith("The operator's instructions:\nsplit it in two")
    # waiting again: the plan redone is what to read, not the approval's own note (the instructions)
    assert r.engine.view(await services.sessions.get(session.id)).waiting.output_of == "plan"
    assert "This is a revision, not a fresh start" in r.runner.prompts("ok")[-1]
    await _decide(services, session.id, "reject", reason="still wrong")  # on_reject: plan
    await run_until_idle(r, session.id)
    steps = [(s, st) for s, _, st in await _runs(r, session)]
    assert steps == [
        ("plan", "succeeded"), ("approve-plan", "changes_requested"), ("plan", "succeeded"),
        ("approve-plan", "rejected"), ("plan", "succeeded"), ("approve-plan", "waiting"),
    ]  # fmt: skip
    assert (await services.sessions.get(session.id)).state == SessionState.EXECUTING


async def test_a_rejection_without_on_reject_fails_the_session_and_retry_sends_the_work_back_told_why(
    services, git_repo, tmp_path
):
    r = rig(services, tmp_path, {"dev/approvals.yaml": APPROVALS.replace("    on_reject: plan\n", "")})
    session = await planning_with(services, git_repo, r, "approvals")
    await _execute(services, r, session)
    result = await _decide(services, session.id, "reject", reason="wrong approach")
    assert result.session.state == SessionState.FAILED
    why = f"The previous attempt was stopped (reject by operator:{OPERATOR}): wrong approach"
    [rejected] = [x for x in await r.engine.step_runs(session.id) if x.step_id == "approve-plan"]
    assert (rejected.status.value, rejected.error) == ("rejected", why)
    await services.sessions.fire(FireTrigger(session.id, "retry", ACTOR))  # manual_review chose to try again
    await run_until_idle(r, session.id)
    assert await _runs(r, session) == [
        ("plan", 1, "succeeded"), ("approve-plan", 1, "rejected"), ("plan", 1, "succeeded"),
        ("approve-plan", 1, "waiting"),
    ]  # fmt: skip
    assert r.runner.prompts("ok")[-1].endswith(f"The operator's instructions:\n{why}")  # the plan is redone
    await _decide(services, session.id, "approve")
    await run_until_idle(r, session.id)
    assert r.runner.prompts("ok")[-1] == "build it"  # an approval clears the instructions
    done = await services.sessions.get(session.id)  # an agent ran after the approval: verified on its own
    assert done.state == SessionState.VERIFYING


async def test_a_retry_after_a_reject_while_agents_ran_runs_their_step_again_told_why(services, git_repo, tmp_path):
    r = rig(services, tmp_path, {"dev/held.yaml": HELD})
    session = await planning_with(services, git_repo, r, "held")
    await r.agents.execute(session.id, ACTOR)
    await asyncio.wait_for(_until_running(r, session.id), timeout=10)
    result = await _decide(services, session.id, "reject", reason="stop that")
    assert result.session.state == SessionState.FAILED
    await run_until_idle(r, session.id)
    await services.sessions.fire(FireTrigger(session.id, "retry", ACTOR))
    r.runner.release()
    await run_until_idle(r, session.id)
    assert await _runs(r, session) == [("work", 1, "rejected"), ("work", 1, "succeeded")]
    why = f"The previous attempt was stopped (reject by operator:{OPERATOR}): stop that"
    assert r.runner.prompts("hold")[-1].endswith(f"The operator's instructions:\n{why}")
    assert (await services.sessions.get(session.id)).state == SessionState.VERIFYING


HELD = """
id: held
description: one agent that runs until released
steps:
  - id: work
    type: agent
    agent: hold
    prompt: work on it
"""


async def _until_running(r, session_id):
    while not [x for x in await r.engine.step_runs(session_id) if x.status.value == "running"]:
        await asyncio.sleep(0.01)


FINAL = """
id: final
description: build, then a person approves; optionally an agent step after the approval
steps:
  - id: build
    type: agent
    agent: ok
    prompt: build it
  - id: approve
    type: approval
    message: Approve the build.
    on_reject: build
  - id: gate
    type: condition
    when: "true"
    then: end
"""


@pytest.mark.parametrize("after", ["nothing", "an agent step"])
async def test_the_last_approval_is_the_verification_decision_unless_an_agent_runs_after_it(
    services, git_repo, tmp_path, after
):
    text = FINAL if after == "nothing" else FINAL.replace("then: end", "then: notes") + NOTES
    r = rig(services, tmp_path, {"dev/final.yaml": text})
    session = await planning_with(services, git_repo, r, "final")
    await _execute(services, r, session)
    await _decide(services, session.id, "approve", reason="looks right")
    await run_until_idle(r, session.id)
    done = await services.sessions.get(session.id)
    triggers = [(x.trigger, x.actor) for x in await services.sessions.history(session.id)][-2:]
    async with services.uow(write=False) as uow:
        decisions = [(d.decision.value, d.operator_id, d.to_state) for d in await uow.decisions.of_session(session.id)]
    if after == "nothing":
        assert done.state == SessionState.AWAITING_MERGE
        assert triggers == [("work_complete", "system"), ("approve", f"operator:{OPERATOR}")]
        assert decisions == [("approve", OPERATOR, "executing"), ("approve", OPERATOR, "awaiting_merge")]
    else:
        assert done.state == SessionState.VERIFYING and triggers[-1] == ("work_complete", "system")
        assert decisions == [("approve", OPERATOR, "executing")]


async def test_a_guard_that_refuses_the_last_approval_as_verification_leaves_the_session_verifying_saying_why(
    services, git_repo, tmp_path
):
    from tests.integration.operators.test_decisions import product_services  # require_tests runs the project's tests

    failing = [sys.executable, "-c", "import sys; print('2 tests failed'); sys.exit(3)"]
    services = product_services(services, repo={"test_command": failing, "test_timeout_s": 30})
    r = rig(services, tmp_path, {"dev/final.yaml": FINAL})
    session = await planning_with(services, git_repo, r, "final")
    await _execute(services, r, session)
    await _decide(services, session.id, "approve", reason="looks right")
    await run_until_idle(r, session.id)
    assert (await services.sessions.get(session.id)).state == SessionState.VERIFYING
    blocked = (await services.sessions.history(session.id, limit=1))[0]
    assert (blocked.trigger, blocked.outcome.value, blocked.actor) == ("approve", "blocked", ACTOR)
    assert any(g["policy"] == "require_tests" and not g["passed"] for g in blocked.guard_results)
    async with services.uow(write=False) as uow:
        assert [d.to_state for d in await uow.decisions.of_session(session.id)] == ["executing"]


NOTES = """  - id: notes
    type: agent
    agent: ok
    prompt: write the release notes
"""


CHECKLIST_STEP = """
id: checked
description: a checklist step
steps:
  - id: check
    type: checklist
    items:
      - {id: tests, text: Tests pass}
      - {id: docs, text: Docs updated, required: false}
"""


async def test_a_checklist_step_waits_for_its_required_items(services, git_repo, tmp_path):
    r = rig(services, tmp_path, {"dev/checked.yaml": CHECKLIST_STEP})
    session = await planning_with(services, git_repo, r, "checked")
    paused = await _execute(services, r, session)
    waiting = r.engine.view(paused).waiting
    assert waiting is not None and waiting.kind == "checklist" and waiting.missing == ("tests",)
    with pytest.raises(InvalidInput, match="'nope' is not on the list; items: tests, docs"):
        await r.engine.check_item(session.id, "nope", ACTOR)
    await r.engine.check_item(session.id, "tests", ACTOR)
    await run_until_idle(r, session.id)
    assert (await services.sessions.get(session.id)).state == SessionState.VERIFYING


NESTED = """
id: nested
description: groups three deep, one per context mode
steps:
  - id: seed
    type: agent
    agent: ok
    prompt: seed
  - id: shared-group
    type: group
    context_mode: shared
    steps:
      - id: s1
        type: agent
        agent: ok
        prompt: s1
      - id: inherited-group
        type: group
        context_mode: inherited
        steps:
          - id: sees-parent
            type: condition
            when: steps.s1.status == "succeeded" and steps.seed.status == "succeeded"
            then: i1
            else: end
          - id: i1
            type: agent
            agent: ok
            prompt: i1
          - id: isolated-group
            type: group
            context_mode: isolated
            summarize: true
            steps:
              - id: blind
                type: condition
                when: steps.i1.status == "succeeded"
                then: end
                else: iso
              - id: iso
                type: agent
                agent: ok
                prompt: iso
  - id: after
    type: condition
    when: steps.s1.status == "succeeded" and steps.i1.status == null
    then: end
    else: broken
  - id: broken
    type: agent
    agent: fail
    prompt: the context modes leaked
"""


async def test_nesting_three_deep_with_each_context_mode(services, git_repo, tmp_path):
    r = rig(services, tmp_path, {"dev/nested.yaml": NESTED})
    session = await planning_with(services, git_repo, r, "nested")
    done = await _execute(services, r, session)
    runs = await _runs(r, session)
    assert done.state == SessionState.VERIFYING, runs
    order = [s for s, _, _ in runs]  # by start: a group's run starts before its steps'
    # the inherited group sees the shared writes (s1) and the root's (seed); the isolated one sees neither
    # (so it ran `iso`); after the groups the root sees s1 (shared) but not i1 (inherited stays in its group)
    assert order == ["seed", "shared-group", "s1", "inherited-group", "sees-parent", "i1", "isolated-group",
                     "blind", "iso", "after"]  # fmt: skip
    frames = {x.step_id: x.frame for x in await r.engine.step_runs(session.id)}
    assert frames["iso"] == "nested/isolated-group" and frames["after"] == "nested"
    summary = next(x for x in await r.engine.step_runs(session.id) if x.step_id == "isolated-group").output_summary
    assert "- blind: succeeded: false" in summary and "- iso: succeeded: iso" in summary


PARENT = """
id: parent
description: calls child
steps:
  - id: call
    type: workflow
    workflow: child
  - id: last
    type: agent
    agent: ok
    prompt: last
"""
CHILD = """
id: child
description: waits for approval
steps:
  - id: gate
    type: approval
    message: child gate
"""


async def test_a_nested_workflow_step_pushes_a_frame_and_pops_back(services, git_repo, tmp_path):
    r = rig(services, tmp_path, {"dev/parent.yaml": PARENT, "dev/child.yaml": CHILD})
    session = await planning_with(services, git_repo, r, "parent")
    paused = await _execute(services, r, session)
    view = r.engine.view(paused)
    assert (view.depth, view.breadcrumb) == (2, "parent › call › child › gate")
    await _decide(services, session.id, "approve")
    await run_until_idle(r, session.id)
    assert (await services.sessions.get(session.id)).state == SessionState.VERIFYING
    assert [s for s, _, _ in await _runs(r, session)] == ["call", "gate", "last"]


LOOP = """
id: loop
description: goes round
max_iterations: {cap}
steps:
  - id: a
    type: agent
    agent: ok
    prompt: same every time
    next: a
"""


async def test_the_loop_guard_fails_a_step_repeating_without_progress(services, git_repo, tmp_path):
    r = rig(services, tmp_path, {"dev/loop.yaml": LOOP.format(cap=50)})
    session = await planning_with(services, git_repo, r, "loop")
    failed = await _execute(services, r, session)
    assert failed.state == SessionState.FAILED
    reason = (await services.sessions.history(session.id))[-1].reason or ""
    assert "loop guard: step 'a' of loop ended the same way 3 times" in reason
    assert len(await _runs(r, session)) == 3


async def test_the_loop_guard_caps_iterations(services, git_repo, tmp_path):
    r = rig(services, tmp_path, {"dev/loop.yaml": LOOP.format(cap=4)}, limits=LoopLimits(repeats=100, window=100))
    session = await planning_with(services, git_repo, r, "loop")
    failed = await _execute(services, r, session)
    assert failed.state == SessionState.FAILED
    reason = (await services.sessions.history(session.id))[-1].reason or ""
    assert "ran 4 steps, its limit is 4 (max_iterations)" in reason


async def test_the_stack_is_refused_past_its_depth_limit_and_nothing_is_written(services, git_repo, tmp_path):
    release = "id: rel\ndescription: r\nitems:\n  - {id: a, text: A}\n"
    files = {"dev/approvals.yaml": APPROVALS, "dev/child.yaml": CHILD, "checklists/rel.yaml": release}
    r = rig(services, tmp_path, files)
    session = await planning_with(services, git_repo, r, "approvals")  # depth 1
    for _ in range(MAX_DEPTH - 1):
        view = await r.engine.add_checklist(session.id, "rel", ACTOR)
    assert view.depth == MAX_DEPTH
    before = await services.sessions.get(session.id)
    for push in (r.engine.add_checklist(session.id, "rel", ACTOR), r.engine.add_workflow(session.id, "child", ACTOR)):
        with pytest.raises(InvalidInput, match=f"stack is {MAX_DEPTH} frames deep"):
            await push
    assert await services.sessions.get(session.id) == before


async def test_stack_edits_push_break_advance_back_restart(services, git_repo, tmp_path):
    release = "id: rel\ndescription: r\nitems:\n  - {id: a, text: A}\n"
    files = {"dev/approvals.yaml": APPROVALS, "dev/child.yaml": CHILD, "checklists/rel.yaml": release}
    r = rig(services, tmp_path, files)
    session = await planning_with(services, git_repo, r, "approvals")
    with pytest.raises(WorkflowNotFound):
        await r.engine.add_workflow(session.id, "nope", ACTOR)
    with pytest.raises(InvalidInput, match="already on session"):
        await r.engine.add_workflow(session.id, "approvals", ACTOR)
    with pytest.raises(InvalidInput, match="depth 1"):
        await r.engine.break_frame(session.id, ACTOR)
    await _execute(services, r, session)  # waits at approve-plan
    decide = r"approval: answer it with a decision \(MCP project_decide, CLI `taskgate session decide`\)"
    with pytest.raises(InvalidInput, match=decide):
        await r.engine.advance(session.id, ACTOR)
    view = await r.engine.add_checklist(session.id, "rel", ACTOR)
    assert view.depth == 2 and view.waiting is not None and view.waiting.missing == ("a",)
    with pytest.raises(InvalidInput, match="required items first: a"):
        await r.engine.advance(session.id, ACTOR)
    view = await r.engine.break_frame(session.id, ACTOR)
    assert view.depth == 1 and view.waiting is not None and view.waiting.kind == "approval"
    view = await r.engine.back(session.id, ACTOR)  # back to plan: it runs again, then waits again
    await run_until_idle(r, session.id)
    view = await r.engine.restart(session.id, ACTOR)
    await run_until_idle(r, session.id)
    steps = [(s, st) for s, _, st in await _runs(r, session)]
    assert steps == [
        ("plan", "succeeded"), ("approve-plan", "cancelled"), ("plan", "succeeded"), ("approve-plan", "cancelled"),
        ("plan", "succeeded"), ("approve-plan", "waiting"),
    ]  # fmt: skip
    await _decide(services, session.id, "approve")
    await run_until_idle(r, session.id)
    assert (await services.sessions.get(session.id)).state == SessionState.VERIFYING
    with pytest.raises(InvalidTransition):
        await r.engine.add_workflow(session.id, "child", ACTOR)


async def test_restart_mid_step_resumes_at_the_step_in_progress(services, git_repo, tmp_path):
    """A service that dies while a step's agent runs: the next one finds the agent gone, fails it, retries."""
    text = LINEAR.replace('agent: ok\n    prompt: "write', 'agent: hold\n    max_retries: 1\n    prompt: "write')
    text = text.replace("max_retries: 1\n", "max_retries: 1\n    retry_delay_ms: 10\n")
    first = rig(services, tmp_path, {"dev/linear.yaml": text})
    session = await planning_with(services, git_repo, first, "linear")
    await first.agents.execute(session.id, ACTOR)
    while not any(run.agent_ids for run in await first.engine.step_runs(session.id)):
        await asyncio.sleep(0.01)  # until the first service launched the step's agent
    # the first service is gone: its supervising tasks die with it (cancelled here), the agent row stays running
    for task in [t for tasks in first.agents._tasks.values() for t in tasks]:
        task.cancel()
    restarted = wire(services.backend, services.database, services.url)  # a new service on the same database
    second = rig(restarted, tmp_path / "again", {"dev/linear.yaml": text.replace("agent: hold", "agent: ok")})
    await second.agents.recover()  # its process is gone: marked failed, which kicks the workflow
    await second.engine.recover()
    await run_until_idle(second, session.id)
    assert (await restarted.sessions.get(session.id)).state == SessionState.VERIFYING
    runs = await _runs(second, session)
    assert runs == [("first", 1, "failed"), ("first", 2, "succeeded"), ("second", 1, "succeeded")]


async def test_a_running_step_whose_run_names_no_agents_is_launched_again(services, git_repo, tmp_path):
    """A claim always carries its agents now (one transaction); a running frame without them (a stack written
    by an older release, or edited by hand) must not count as a step whose agents all succeeded: it is
    launched again."""
    first = rig(services, tmp_path, {"dev/linear.yaml": LINEAR.replace("agent: ok", "agent: hold", 1)})
    session = await planning_with(services, git_repo, first, "linear")
    await first.agents.execute(session.id, ACTOR)
    while not any(run.agent_ids for run in await first.engine.step_runs(session.id)):
        await asyncio.sleep(0.01)
    for task in [t for tasks in first.agents._tasks.values() for t in tasks]:
        task.cancel()  # the first service is gone
    async with services.uow(write=True) as uow:
        stored = await uow.sessions.get(session.id)
        stack = [{k: v for k, v in frame.items() if k != "agents"} for frame in stored.workflow_stack]
        await uow.sessions.update(replace(stored, workflow_stack=stack, version=stored.version + 1),
                                  expected_version=stored.version)  # fmt: skip
        await uow.commit()
    restarted = wire(services.backend, services.database, services.url)
    second = rig(restarted, tmp_path / "again", {"dev/linear.yaml": LINEAR})
    await second.agents.recover()
    await second.engine.recover()
    await run_until_idle(second, session.id)
    assert (await restarted.sessions.get(session.id)).state == SessionState.VERIFYING
    runs = await _runs(second, session)
    assert runs == [("first", 1, "cancelled"), ("first", 1, "succeeded"), ("second", 1, "succeeded")]


async def test_many_concurrent_answers_act_once(services, git_repo, tmp_path):
    """20 identical approvals at once: one decision row, the step approved once (the operator's lock, the
    engine's per-session lock and the version-checked save serialise them; the rest are replays)."""
    r = rig(services, tmp_path, {"dev/approvals.yaml": APPROVALS})
    session = await planning_with(services, git_repo, r, "approvals")
    shown = await _execute(services, r, session)  # the version the operator read, waiting at approve-plan
    decide = [_decide(services, session.id, "approve", expected_version=shown.version) for _ in range(20)]
    results = await asyncio.gather(*decide)
    assert sum(1 for x in results if not x.replayed) == 1
    await run_until_idle(r, session.id)
    async with services.uow(write=False) as uow:
        assert len(await uow.decisions.of_session(session.id)) == 1
    assert [st for s, _, st in await _runs(r, session) if s == "approve-plan"] == ["approved"]
    # the work went on to verifying meanwhile: the resent approval is still recognised, not taken as a new one
    assert (await services.sessions.get(session.id)).state == SessionState.VERIFYING
    late = await _decide(services, session.id, "approve", expected_version=shown.version)
    assert late.replayed and late.decision.session_version == shown.version
    with pytest.raises(ConflictError, match="moved on"):
        await _decide(services, session.id, "approve", expected_version=shown.version - 1)


async def test_many_concurrent_ticks_of_one_item_tick_it_once(services, git_repo, tmp_path):
    r = rig(services, tmp_path, {"dev/checked.yaml": CHECKLIST_STEP})
    other = await planning_with(services, git_repo, r, "checked")
    await _execute(services, r, other)
    await asyncio.gather(*(r.engine.check_item(other.id, "tests", ACTOR) for _ in range(20)))
    await run_until_idle(r, other.id)
    async with services.uow(write=False) as uow:
        ticks = [e for e in await uow.events.list(other.id, limit=500) if e["kind"] == "checklist.checked"]
    assert len(ticks) == 1
    assert (await services.sessions.get(other.id)).state == SessionState.VERIFYING


async def test_two_services_driving_one_session_run_each_step_once(services, git_repo, tmp_path):
    """Two engines (as two processes would) kicked at once on one session: the version-checked claim lets
    one of them run each step; the other re-reads and finds nothing to do."""
    one = rig(services, tmp_path, {"dev/linear.yaml": LINEAR})
    twin = wire(services.backend, services.database, services.url)
    two = rig(twin, tmp_path / "two", {"dev/linear.yaml": LINEAR})
    session = await planning_with(services, git_repo, one, "linear")
    await services.sessions.transition(FireTrigger(session.id, "plan_complete", ACTOR))
    for _ in range(5):
        one.engine.kick(session.id)
        two.engine.kick(session.id)
    await asyncio.gather(run_until_idle(one, session.id), run_until_idle(two, session.id))
    assert (await services.sessions.get(session.id)).state == SessionState.VERIFYING
    assert await _runs(one, session) == [("first", 1, "succeeded"), ("second", 1, "succeeded")]


async def test_a_reject_with_a_compensation_rejects_the_session_even_where_the_step_routes_rejects(
    services, git_repo, tmp_path
):
    """The step's on_reject routes a plain reject back into the workflow; an operator who names a compensation
    means the session: it is rejected (manual_review here), not routed."""
    r = rig(services, tmp_path, {"dev/approvals.yaml": APPROVALS})
    session = await planning_with(services, git_repo, r, "approvals")
    await _execute(services, r, session)
    decided = await services.decisions.decide(
        Decide(session.id, OPERATOR, "reject", reason="wrong task", compensation="manual_review")
    )
    assert (decided.session.state, decided.decision.compensation.value) == (SessionState.FAILED, "manual_review")
    assert (await services.sessions.history(session.id, limit=1))[0].trigger == "reject"


STRUCTURED_PARENT = """
id: outer
description: a nested workflow whose structured result a condition and a prompt use
steps:
  - id: sub
    type: workflow
    workflow: inner
  - id: check
    type: condition
    when: >-
      steps.sub.success and steps.sub.children.build.status == "succeeded"
      and "notes.txt" in steps.sub.files_changed and steps.sub.usage.turns == null
    then: report
    else: end
  - id: report
    type: agent
    agent: ok
    prompt: "sub said: {{steps.sub.summary}}"
"""
STRUCTURED_CHILD = """
id: inner
description: builds, then waits at a gate
steps:
  - id: build
    type: agent
    agent: ok
    prompt: build it
  - id: gate
    type: approval
    message: inner gate
"""


async def test_a_nested_step_returns_a_structured_result_and_continue_ends_it_early(services, git_repo, tmp_path):
    files = {"dev/outer.yaml": STRUCTURED_PARENT, "dev/inner.yaml": STRUCTURED_CHILD}
    r = rig(services, tmp_path, files)
    r.engine.use_workspaces(services.workspaces)
    session = await planning_with(services, git_repo, r, "outer")
    with pytest.raises(InvalidInput, match=r"workflow_continue ends a nested frame; .* depth 1"):
        await r.engine.continue_frame(session.id, ACTOR)
    paused = await _execute(services, r, session)  # build ran; the inner gate waits
    assert r.engine.view(paused).breadcrumb == "outer › sub › inner › gate"
    worktree = (await services.sessions.get(session.id)).worktree_path
    (Path(worktree) / "notes.txt").write_text("written while the nested workflow ran\n")
    view = await r.engine.continue_frame(session.id, ACTOR)
    assert view.depth == 1
    await run_until_idle(r, session.id)
    done = await services.sessions.get(session.id)
    assert done.state == SessionState.VERIFYING
    runs = [(s, st) for s, _, st in await _runs(r, session)]
    assert runs == [("sub", "succeeded"), ("build", "succeeded"), ("gate", "cancelled"), ("check", "succeeded"),
                    ("report", "succeeded")]  # fmt: skip
    report = r.runner.prompts("ok")[-1]
    assert report.startswith("sub said: - build: succeeded: build it")
