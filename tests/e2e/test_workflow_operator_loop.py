"""The operator's loop on workflow sessions, end to end, on SQLite and PostgreSQL (issue 14, workflow sessions).

A real `taskgate serve --http` runs the shipped workflows (copied from the built-in catalogue) with the shipped
scripted agents as real processes (the coder commits in the session's worktree, `fix: address review` when it is
given instructions), driven over MCP as an operator would. What the operator does not see is read where it
lives: agents, step runs and decisions in the database, commits and files in git, the agents' logs in the
session folder.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_crash_recovery import Service, connect, wait_for_session
from tests.e2e.test_mcp_transports import ok
from tests.support.served import db_rows, served_on

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "src" / "taskgate" / "catalogue" / "agents"
INSTRUCTIONS = "Rename the helper to parse_total and cover the empty input with a test."

# A workflow of the test's own: an approval with no on_reject, so a reject rejects the session (manual_review).
ONCE = """\
id: reviewed-once
description: The coder works, a person approves; a rejection fails the session for manual review.
steps:
  - id: work
    type: agent
    agent: coder
    prompt: Do the task "{{task.title}}" and commit the result.
  - id: approve
    type: approval
    message: Approve the work, or reject it.
    on_request_changes: work
"""
# An approval followed by an agent step: the work changes after the approval, so it is verified on its own.
NOTES = """\
id: approve-then-notes
description: The coder works, a person approves, the coder writes the release notes.
steps:
  - id: work
    type: agent
    agent: coder
    prompt: Do the task "{{task.title}}" and commit the result.
  - id: approve
    type: approval
    message: Approve the work.
    on_reject: work
  - id: notes
    type: agent
    agent: coder
    prompt: Write the release notes.
"""


class WorkflowService(Service):
    """The crash tests' deployment with the shipped workflows, checklists and scripted agents."""

    def __init__(self, root: Path, database_url: str | None) -> None:
        super().__init__(root)
        config = root / "config"
        for folder in ("workflows", "checklists"):
            shutil.copytree(ROOT / "src" / "taskgate" / "catalogue" / folder, config / folder)
        (config / "workflows" / "custom").mkdir()
        (config / "workflows" / "custom" / "reviewed-once.yaml").write_text(ONCE)
        (config / "workflows" / "custom" / "approve-then-notes.yaml").write_text(NOTES)
        python = sys.executable
        commands = {
            "coder": [
                python,
                str(AGENTS / "scripted_coder.py"),
                "{task_title}",
                "--instructions",
                "{instructions}",
                "--prompt",
                "{prompt}",
            ],
            "tester": [
                python,
                str(AGENTS / "scripted_tester.py"),
                "--prompt",
                "{prompt}",
                "--",
                python,
                "-c",
                "print('1 passed')",
            ],
            "reviewer": [python, str(AGENTS / "scripted_reviewer.py"), "--prompt", "{prompt}"],
        }
        toml = "".join(f"\n[agents.{name}]\ncommand = {json.dumps(c)}\n" for name, c in commands.items())
        (config / "taskgate.toml").write_text((config / "taskgate.toml").read_text() + toml)
        if database_url:
            self.env["TASKGATE_DATABASE_URL"] = database_url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkflowService]:
    root = tmp_path_factory.mktemp(f"wf-loop-{request.param}")
    titles = ["Parse totals", "Import orders", "Export reports", "Archive invoices"]
    with served_on(request.param, lambda url: WorkflowService(root, url), titles) as svc:
        yield svc


async def rows(svc: WorkflowService, sql: str, session_id: str) -> list[tuple[Any, ...]]:
    return await db_rows(svc, sql, session_id)


async def step_runs(svc: WorkflowService, sid: str) -> list[tuple[str, str]]:
    return [
        (step, status)
        for step, status in await rows(
            svc, "SELECT step_id, status FROM step_runs WHERE session_id = {} ORDER BY id", sid
        )
    ]


async def agents(svc: WorkflowService, sid: str) -> list[tuple[str, list[str], str]]:
    """(type, command, log path) of every agent of the session, by run (a step's), then type."""
    found = await rows(svc, "SELECT agent_type, command, output_path, run FROM agents WHERE session_id = {}", sid)
    ordered = sorted(found, key=lambda r: (r[3], r[0]))
    return [(kind, json.loads(c) if isinstance(c, str) else c, path) for kind, c, path, _ in ordered]


async def decisions(svc: WorkflowService, sid: str) -> list[tuple[str, str, str]]:
    sql = "SELECT decision, operator_id, to_state FROM decisions WHERE session_id = {} ORDER BY id"
    return await rows(svc, sql, sid)


def at_approval(step: str, after: int = 0):
    """A session_status predicate: the workflow waits at approval `step`, at a version past `after`."""

    def waiting(status: dict[str, Any]) -> bool:
        stack = status.get("workflow") or {}
        wait = stack.get("waiting") or {}
        return wait.get("step_id") == step and status["version"] > after

    return waiting


def instructions(command: list[str]) -> str:
    """What a coder's command line passed as `--instructions` (the operator's words, empty on a first run)."""
    return command[command.index("--instructions") + 1]


async def started(client, task: str, workflow: str) -> str:
    sid = (await ok(client, "project_session_start", task_id=task, workflow=workflow))["id"]
    await ok(client, "session_execute", session_id=sid)
    return sid


async def test_request_changes_reaches_the_coder_whose_fix_is_validated_and_one_approval_then_merges(served):
    """Points 1 and 3 on feature-development: request_changes at approve-result runs the coder (fix) with the
    instructions, its commit `fix: address review` carries them, tester and reviewer run again, and the session
    waits at approve-result again; its approval is the verification decision (awaiting_merge, no second one)."""
    svc = served
    async with connect(svc) as client:
        sid = await started(client, "DEMO-1", "feature-development")
        await wait_for_session(client, sid, "wait at approve-plan", at_approval("approve-plan"))
        await ok(client, "project_decide", session_id=sid, decision="approve", reason="good plan")
        first = await wait_for_session(client, sid, "wait at approve-result", at_approval("approve-result"))
        branch = first["branch"]
        changed = await ok(client, "project_decide", session_id=sid, decision="request_changes",
                           instructions=INSTRUCTIONS)  # fmt: skip
        assert (changed["state"], changed["replayed"]) == ("executing", False)
        again = await wait_for_session(client, sid, "come back to approve-result",
                                       at_approval("approve-result", first["version"]))  # fmt: skip
        assert again["state"] == "executing"

        ran = await agents(svc, sid)
        assert [kind for kind, _, _ in ran] == ["coder", "coder", "reviewer", "tester", "coder", "reviewer", "tester"]
        fix_command, fix_log = ran[4][1], ran[4][2]
        assert instructions(fix_command) == INSTRUCTIONS  # the fix step's coder was told
        assert all(instructions(c) == "" for kind, c, _ in ran[:2] if kind == "coder")  # plan and implement were not
        assert "fix: address review" in Path(fix_log).read_text()  # its log in the session folder
        assert svc.git("log", "-1", "--format=%s", branch).strip() == "fix: address review"
        work = svc.git("show", f"{branch}:work/parse-totals.md")
        assert f"## Changes requested\n\n{INSTRUCTIONS}" in work
        assert await step_runs(svc, sid) == [
            ("plan", "succeeded"), ("approve-plan", "approved"), ("implement", "succeeded"),
            ("validate", "succeeded"), ("approve-result", "changes_requested"), ("fix", "succeeded"),
            ("validate", "succeeded"), ("approve-result", "waiting"),
        ]  # fmt: skip

        await ok(client, "project_decide", session_id=sid, decision="approve", reason="ship it")
        done = await wait_for_session(client, sid, "await the merge", lambda s: s["state"] == "awaiting_merge")
        assert done["workflow"] is None
    assert await decisions(svc, sid) == [
        ("approve", "alice", "executing"), ("request_changes", "alice", "executing"),
        ("approve", "alice", "executing"), ("approve", "alice", "awaiting_merge"),
    ]  # fmt: skip


async def test_retry_after_a_rejected_approval_sends_the_work_back_to_the_coder_told_why(served):
    """Point 2: reject (manual_review) at an approval with no on_reject fails the session; retry runs the step
    that makes the work again, told why it was rejected, and the approval is asked again."""
    svc = served
    async with connect(svc) as client:
        sid = await started(client, "DEMO-2", "reviewed-once")
        first = await wait_for_session(client, sid, "wait at approve", at_approval("approve"))
        rejected = await ok(client, "project_decide", session_id=sid, decision="reject", reason="wrong approach",
                            compensation="manual_review")  # fmt: skip
        assert rejected["state"] == "failed"
        assert await step_runs(svc, sid) == [("work", "succeeded"), ("approve", "rejected")]

        retried = await ok(client, "session_fire", session_id=sid, trigger="retry")
        assert retried["to_state"] == "executing"
        # right after the retry the stack still shows the old approval: wait for the coder's second run too
        back = at_approval("approve", first["version"])
        again = await wait_for_session(
            client, sid, "run the coder again and come back to approve",
            lambda s: back(s) and len(s["agents"]) == 2 and all(a["status"] == "completed" for a in s["agents"]),
        )  # fmt: skip
        branch = again["branch"]
        why = "The previous attempt was stopped (reject by operator:alice): wrong approach"
        ran = await agents(svc, sid)
        assert [(kind, instructions(c)) for kind, c, _ in ran] == [("coder", ""), ("coder", why)]
        assert svc.git("log", "-1", "--format=%s", branch).strip() == "fix: address review"
        assert why in svc.git("show", f"{branch}:work/import-orders.md")
        assert await step_runs(svc, sid) == [
            ("work", "succeeded"), ("approve", "rejected"), ("work", "succeeded"), ("approve", "waiting"),
        ]  # fmt: skip

        await ok(client, "project_decide", session_id=sid, decision="approve", reason="better")
        await wait_for_session(client, sid, "await the merge", lambda s: s["state"] == "awaiting_merge")
    assert [(d, s) for d, _, s in await decisions(svc, sid)] == [
        ("reject", "failed"), ("approve", "executing"), ("approve", "awaiting_merge"),
    ]  # fmt: skip


async def test_an_agent_step_after_the_last_approval_leaves_the_verification_to_be_decided(served):
    """Point 3's other side: the coder ran after the approval, so the session waits in verifying for a decision
    on what it did last; that approval takes it to awaiting_merge."""
    svc = served
    async with connect(svc) as client:
        sid = await started(client, "DEMO-3", "approve-then-notes")
        await wait_for_session(client, sid, "wait at approve", at_approval("approve"))
        await ok(client, "project_decide", session_id=sid, decision="approve", reason="fine")
        await wait_for_session(client, sid, "reach verifying", lambda s: s["state"] == "verifying")
        assert [(d, s) for d, _, s in await decisions(svc, sid)] == [("approve", "executing")]
        approved = await ok(client, "project_decide", session_id=sid, decision="approve", reason="notes fine")
        assert approved["state"] == "awaiting_merge"
    assert [s for _, s in await step_runs(svc, sid)] == ["succeeded", "approved", "succeeded"]


async def test_one_way_to_decide_and_the_approved_head_hold_on_workflow_sessions(served):
    """Points 4, 5 and 7 on a workflow session: session_fire approve answers the approval step as the operator's
    decision; at the verification it is a decision project_decide replays; a different decision in awaiting_merge
    names the approval and reverify; a branch changed after the approval is merged only after a new one."""
    svc = served
    async with connect(svc) as client:
        sid = await started(client, "DEMO-4", "approve-then-notes")
        await wait_for_session(client, sid, "wait at approve", at_approval("approve"))
        await ok(client, "session_fire", session_id=sid, trigger="approve", reason="plan fine")
        status = await wait_for_session(client, sid, "reach verifying", lambda s: s["state"] == "verifying")
        fired = await ok(client, "session_fire", session_id=sid, trigger="approve", reason="notes fine")
        assert (fired["trigger"], fired["to_state"]) == ("approve", "awaiting_merge")
        replay = await ok(client, "project_decide", session_id=sid, decision="approve", reason="notes fine")
        assert (replay["replayed"], replay["state"]) == (True, "awaiting_merge")
        refused = await client.call_tool("project_decide", {"session_id": sid, "decision": "reject"})
        text = refused.content[0].text
        assert refused.is_error and "already decided: approve" in text and "reverify" in text, text

        worktree = Path(status["worktree"])
        (worktree / "late.txt").write_text("a late change\n")
        for args in (["add", "late.txt"], ["commit", "-q", "-m", "fix: late change"]):
            svc.git("-C", str(worktree), "-c", "user.name=op", "-c", "user.email=op@x.invalid", *args)
        merge = await client.call_tool("project_session_merge", {"session_id": sid})
        assert merge.is_error and "changed after it was approved" in merge.content[0].text
        await ok(client, "session_fire", session_id=sid, trigger="reverify", reason="late change")
        await ok(client, "project_decide", session_id=sid, decision="approve", reason="late change fine")
        assert (await ok(client, "project_session_merge", session_id=sid))["state"] == "completed"
    assert [(d, s) for d, _, s in await decisions(svc, sid)] == [
        ("approve", "executing"), ("approve", "awaiting_merge"), ("approve", "awaiting_merge")
    ]  # fmt: skip
