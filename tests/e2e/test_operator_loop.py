"""The operator's loop on plain sessions, end to end, on SQLite and PostgreSQL (issue 14, points 2-5 and 7).

A real `taskgate serve --http` is driven over MCP as an operator would, with a real agent (the appender: it
commits each run's instructions) in real git worktrees. What the operator does not see is read where it lives:
the decision rows in the database, the agents' runs and commits in git, what each run was told in the file it
committed. The CLI's side of the same paths runs in tests/e2e/test_cli_decisions.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_crash_points import CrashService
from tests.e2e.test_crash_recovery import connect, wait_for_session
from tests.e2e.test_mcp_transports import ok
from tests.support.served import db_rows, served_on

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashService]:
    root = tmp_path_factory.mktemp(f"loop-{request.param}")
    with served_on(request.param, lambda url: CrashService(root, url), [f"Loop {i}" for i in range(1, 7)]) as svc:
        yield svc


async def decisions(deployment: Any, session_id: str) -> list[tuple[str, str, int]]:
    """(decision, operator, session version) rows of the session, oldest first, from the database itself."""
    sql = "SELECT decision, operator_id, session_version FROM decisions WHERE session_id = {} ORDER BY id"
    return await db_rows(deployment, sql, session_id)


async def verifying(client, task: str) -> dict[str, Any]:
    """The task's session after one run of the appender: verifying, its work committed."""
    sid = (await ok(client, "project_session_start", task_id=task))["id"]
    await ok(client, "session_execute", session_id=sid, agents=["appender"])
    return await wait_for_session(client, sid, "reach verifying", lambda s: s["state"] == "verifying")


def told(svc: CrashService, branch: str, task: str) -> list[str]:
    """What each run of the appender was told, as committed on the branch."""
    return svc.git("show", f"{branch}:work/{task}.md").splitlines()


async def test_retry_after_manual_review_relaunches_the_work_and_a_new_round_takes_a_new_decision(served):
    """Points 2 and 3: reject (manual_review) → retry launches the agents again, told why; the next reject is a
    new decision of a new round (not a replay of the first), and a resend within that round replays it."""
    svc = served
    async with connect(svc) as client:
        first = await verifying(client, "DEMO-1")
        sid, branch = first["id"], first["branch"]
        rejected = await ok(client, "project_decide", session_id=sid, decision="reject", reason="wrong approach")
        assert (rejected["state"], rejected["replayed"]) == ("failed", False)

        retried = await ok(client, "session_fire", session_id=sid, trigger="retry")
        assert retried["state"] == "executing"
        again = await wait_for_session(client, sid, "verify again", lambda s: s["state"] == "verifying")
        assert sorted({a["run"] for a in again["agents"]}) == [1, 2]
        assert told(svc, branch, "DEMO-1")[-1].endswith("(reject by operator:alice): wrong approach")
        assert svc.git("log", "-1", "--format=%s", branch).strip() == "fix: address review"

        second = await ok(client, "project_decide", session_id=sid, decision="reject", reason="still wrong")
        assert (second["state"], second["replayed"], second["reason"]) == ("failed", False, "still wrong")
        resent = await ok(client, "project_decide", session_id=sid, decision="reject", reason="still wrong")
        assert (resent["replayed"], resent["at"]) == (True, second["at"])
        changes = await client.call_tool("project_decide", {"session_id": sid, "decision": "request_changes"})
        assert changes.is_error and "already decided: reject by alice" in changes.content[0].text
    rows = await decisions(svc, sid)
    assert [(d, o) for d, o, _ in rows] == [("reject", "alice"), ("reject", "alice")]
    assert rows[0][2] < rows[1][2]  # two rounds, two versions


async def test_approve_fired_as_a_trigger_is_a_decision_that_project_decide_replays(served):
    """Point 4: session_fire approve records the operator's decision; project_decide approve resent is its
    replay, not an InvalidTransition."""
    svc = served
    async with connect(svc) as client:
        sid = (await verifying(client, "DEMO-2"))["id"]
        fired = await ok(client, "session_fire", session_id=sid, trigger="approve", reason="fine")
        assert (fired["trigger"], fired["to_state"], fired["actor"]) == ("approve", "awaiting_merge",
                                                                         "operator:alice")  # fmt: skip
        resent = await ok(client, "project_decide", session_id=sid, decision="approve", reason="fine")
        assert (resent["replayed"], resent["state"]) == (True, "awaiting_merge")
        refired = await ok(client, "session_fire", session_id=sid, trigger="approve", reason="fine")
        assert refired["seq"] == fired["seq"] and any("taken before" in w for w in refired["warnings"])
        merged = await ok(client, "project_session_merge", session_id=sid)
        assert merged["state"] == "completed"
    assert [(d, o) for d, o, _ in await decisions(svc, sid)] == [("approve", "alice")]


async def test_a_refusal_never_lists_the_decision_it_refuses_and_says_how_to_decide_again(served):
    """Point 5: `reject` in awaiting_merge was refused as not allowed while the same message listed it as allowed.
    Now: the approval of this round is named with the way to decide again (reverify), after which the reject is
    decided; and a decision the state does not allow is refused listing only the decisions it does allow."""
    svc = served
    async with connect(svc) as client:
        sid = (await verifying(client, "DEMO-3"))["id"]
        await ok(client, "project_decide", session_id=sid, decision="approve", reason="fine")
        refused = await client.call_tool("project_decide", {"session_id": sid, "decision": "reject"})
        text = refused.content[0].text
        assert refused.is_error and "already decided: approve by alice" in text and "reverify" in text, text
        await ok(client, "session_fire", session_id=sid, trigger="reverify", reason="found a problem")
        rejected = await ok(client, "project_decide", session_id=sid, decision="reject", reason="not after all")
        assert (rejected["state"], rejected["replayed"]) == ("failed", False)
        planning = (await ok(client, "project_session_start", task_id="DEMO-5"))["id"]
        refused = await client.call_tool("project_decide", {"session_id": planning, "decision": "approve"})
        text = refused.content[0].text
        assert refused.is_error and "'approve' is not allowed" in text and text.rstrip(". ").endswith(
            "allowed: reject. Nothing was changed"
        ), text  # fmt: skip
    assert [d for d, _, _ in await decisions(svc, sid)] == ["approve", "reject"]
    assert await decisions(svc, planning) == []


async def test_a_branch_changed_after_approval_is_not_merged_until_it_is_reviewed_again(served):
    """Point 7: a commit after the approval that changes the work (a conflict fixed by hand) makes the merge
    refuse; reverify and a new approval let it through, and both approvals are on record. (A commit that changes
    none of the branch's lines, like taskgate's own rebase onto a moved base, keeps the approval.)"""
    svc = served
    async with connect(svc) as client:
        status = await verifying(client, "DEMO-4")
        sid, worktree = status["id"], status["worktree"]
        await ok(client, "project_decide", session_id=sid, decision="approve", reason="fine")
        Path(worktree, "work", "DEMO-4.md").write_text("- resolved by hand\n")
        identity = ("-c", "user.name=op", "-c", "user.email=op@x.invalid")
        svc.git("-C", worktree, *identity, "commit", "-q", "-am", "fix: conflict resolved by hand")
        main = svc.git("rev-parse", "main").strip()

        refused = await client.call_tool("project_session_merge", {"session_id": sid})
        text = refused.content[0].text
        assert refused.is_error and "changed after it was approved" in text and "reverify" in text, text
        assert svc.git("rev-parse", "main").strip() == main
        assert (await ok(client, "session_status", session_id=sid))["state"] == "awaiting_merge"

        await ok(client, "session_fire", session_id=sid, trigger="reverify", reason="look at the fix")
        await ok(client, "project_decide", session_id=sid, decision="approve", reason="fix is fine")
        merged = await ok(client, "project_session_merge", session_id=sid)
        assert merged["state"] == "completed"
        assert "fix: conflict resolved by hand" in svc.git("log", "--format=%s", "main")
    assert [d for d, _, _ in await decisions(svc, sid)] == ["approve", "approve"]


async def test_request_changes_reaches_the_agent_that_makes_the_change_and_the_loop_comes_back(served):
    """Point 1 on a plain session: the run's agents go again with the operator's instructions; their commit
    carries them and the session waits for a decision again, a new round."""
    svc = served
    async with connect(svc) as client:
        status = await verifying(client, "DEMO-6")
        sid, branch = status["id"], status["branch"]
        asked = await ok(client, "project_decide", session_id=sid, decision="request_changes",
                         instructions="rename the helper")  # fmt: skip
        assert asked["state"] == "executing"
        again = await wait_for_session(client, sid, "verify again", lambda s: s["state"] == "verifying")
        assert sorted({a["run"] for a in again["agents"]}) == [1, 2]
        assert told(svc, branch, "DEMO-6")[-1] == "- rename the helper"
        assert svc.git("log", "-1", "--format=%s", branch).strip() == "fix: address review"
        approved = await ok(client, "project_decide", session_id=sid, decision="approve", reason="now fine")
        assert (approved["state"], approved["replayed"]) == ("awaiting_merge", False)
    assert [d for d, _, _ in await decisions(svc, sid)] == ["request_changes", "approve"]
