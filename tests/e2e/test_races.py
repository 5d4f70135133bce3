"""Races between operators, over MCP, on a real `taskgate serve --http`, on SQLite and on PostgreSQL.

Several clients call at once on the same session or task, as operators in two terminals do. Whatever order the
server serialised them in, the outcome is one of those a serial order gives, and every refusal names the real
cause: the winner's outcome (already active, already cancelled, already decided), never a git error about a
branch the winner removed, never the state machine's refusal of a step the winner took, and never the SDK's bare
"Error executing tool" (issue 36).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.test_crash_points import CrashService, _pg_database
from tests.e2e.test_crash_recovery import connect, wait_for_session
from tests.e2e.test_mcp_transports import ok

pytestmark = pytest.mark.slow

STARTS, STARTERS = 6, 4  # tasks started concurrently, and callers per task
APPROVALS = 8  # sessions approved while cancelled
EXECUTIONS = 8  # sessions executed while cancelled
TASKS = STARTS + APPROVALS + EXECUTIONS


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashService]:
    """One running server per backend, seeded with a task per race (DEMO-1 …)."""
    databases = _pg_database() if request.param == "postgresql" else iter([None])
    url = next(databases)
    svc = CrashService(tmp_path_factory.mktemp(f"races-{request.param}"), url)
    config = svc.root / "config" / "taskgate.toml"
    config.write_text(
        config.read_text().replace("limit = 10", f"limit = {TASKS + 5}")
        + "\n[policies.operator_capacity]\nenabled = false\n"
    )
    svc.seed(*(f"Task {i}" for i in range(1, TASKS + 1)))
    svc.start()
    try:
        yield svc
        log = svc.log()
        assert "Traceback" not in log, f"the server crashed on a call (the SDK answers it with its bare error): {log}"
    finally:
        svc.stop()
        if url is None:
            svc.kill_agents()
        with pytest.raises(StopIteration):
            next(databases)


async def call(svc: CrashService, tool: str, **arguments: Any) -> tuple[bool, str, dict[str, Any] | None]:
    """One call on a client of its own: (succeeded, the error text, the structured output)."""
    async with connect(svc) as client:
        result = await client.call_tool(tool, arguments)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    return (not result.is_error), text, result.structured_content


def assert_named(text: str, *causes: str) -> None:
    """A refusal that names one of `causes`, and none of the things a race must never answer."""
    assert not re.fullmatch(r"Error executing tool \w+", text.strip()), f"the SDK's bare error: {text}"
    never = ("BranchGone", "reflog", "Traceback", "'initialize'", "'context_discovered'")
    assert not any(wrong in text for wrong in never), text
    assert any(cause in text for cause in causes), f"the refusal names none of {causes}: {text}"


async def test_concurrent_starts_of_one_task_start_it_once_and_tell_each_loser_it_is_already_active(
    deployment: CrashService,
):
    svc = deployment
    tasks = [f"DEMO-{i}" for i in range(1, STARTS + 1)]
    replies = await asyncio.gather(
        *(call(svc, "project_session_start", task_id=task) for task in tasks for _ in range(STARTERS))
    )
    for n, task in enumerate(tasks):
        mine = replies[n * STARTERS : (n + 1) * STARTERS]
        won = [out for good, _, out in mine if good]
        assert len(won) == 1, (task, mine)
        winner = won[0]["id"]
        for good, text, _ in mine:
            if not good:
                assert_named(text, f"SessionAlreadyActive: task {task} already has session {winner}")


async def verifying(svc: CrashService, tasks: list[str]) -> list[str]:
    """Sessions of `tasks` brought to verifying by the appender agent."""
    async with connect(svc) as client:
        sids = [(await ok(client, "project_session_start", task_id=task))["id"] for task in tasks]
        for sid in sids:
            await ok(client, "session_execute", session_id=sid, agents=["appender"])
        for sid in sids:
            await wait_for_session(client, sid, "reach verifying", lambda s: s["state"] == "verifying")
    return sids


async def test_an_approval_racing_a_cancel_is_applied_or_told_the_session_was_cancelled(deployment: CrashService):
    svc = deployment
    sids = await verifying(svc, [f"DEMO-{i}" for i in range(STARTS + 1, STARTS + APPROVALS + 1)])
    replies = await asyncio.gather(
        *(
            coro
            for sid in sids
            for coro in (
                call(svc, "project_decide", session_id=sid, decision="approve", reason="fine"),
                call(svc, "session_fire", session_id=sid, trigger="cancel", reason="not needed"),
            )
        )
    )
    outcomes = Counter()
    async with connect(svc) as client:
        for n, sid in enumerate(sids):
            (approved, approve_text, _), (cancelled, cancel_text, _) = replies[2 * n : 2 * n + 2]
            status = await ok(client, "session_status", session_id=sid)
            assert cancelled or approved, (approve_text, cancel_text)
            if not approved:
                assert_named(approve_text, f"session {sid} was cancelled", "cancel by operator:alice")
            if not cancelled:  # cancel is allowed from verifying and awaiting_merge: it can only have lost a lock
                pytest.fail(f"cancel of {sid} refused: {cancel_text}")
            assert status["state"] == "cancelled", status
            outcomes["approved, then cancelled" if approved else "cancelled first"] += 1
    assert sum(outcomes.values()) == APPROVALS


async def test_an_execute_racing_a_cancel_leaves_no_agent_failed_and_none_started_after_the_cancel(
    deployment: CrashService,
):
    svc = deployment
    first = STARTS + APPROVALS + 1
    async with connect(svc) as client:
        sids = [(await ok(client, "project_session_start", task_id=f"DEMO-{i}"))["id"]
                for i in range(first, first + EXECUTIONS)]  # fmt: skip
    replies = await asyncio.gather(
        *(
            coro
            for sid in sids
            for coro in (
                call(svc, "session_execute", session_id=sid, agents=["appender"]),
                call(svc, "session_fire", session_id=sid, trigger="cancel", reason="not needed"),
            )
        )
    )
    async with connect(svc) as client:
        for n, sid in enumerate(sids):
            (executed, execute_text, _), (cancelled, cancel_text, _) = replies[2 * n : 2 * n + 2]
            assert cancelled, cancel_text
            if not executed:
                assert_named(execute_text, f"session {sid} was cancelled", "cancel by operator:alice")
            status = await wait_for_session(
                client, sid, "settle", lambda s: all(a["status"] not in ("queued", "running") for a in s["agents"])
            )
            assert status["state"] == "cancelled", status
            for agent in status["agents"]:  # stopped by the cancel, or never started: cancelled, not failed
                assert agent["status"] in ("cancelled", "completed"), (agent, status["state"])
