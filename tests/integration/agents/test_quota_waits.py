"""Quota waits under the supervisor (application/agents/quotas.py): a stop during the back-off launches nothing, and
a run cut off in its wait is not taken for done when the session is resumed after a restart."""

from __future__ import annotations

import asyncio
import json
import sys

from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.agents.presets import PRESETS
from taskgate.domain.entities import AgentStatus
from taskgate.domain.states import SessionState
from tests.builders import ACTOR
from tests.integration.agents.test_supervisor import planning_session, supervisor

REFUSED = json.dumps({"type": "result", "is_error": True, "api_error_status": 429, "result": "API Error: 429"})


def limited(tmp_path, wait_s: float) -> dict[str, AgentType]:
    script = tmp_path / "limited.py"  # in a file: a command's braces are placeholders
    script.write_text(f"import sys\nprint({REFUSED!r})\nsys.exit(1)\n")
    command = (sys.executable, str(script))
    kind = AgentType("limited", command, output_format="claude-stream-json",
                     quota_patterns=PRESETS["claude"].quota_patterns, quota_retries=2, quota_wait_s=wait_s)  # fmt: skip
    return {"limited": kind}


async def waiting_for_quota(services, agents, session_id: str) -> None:
    for _ in range(200):
        async with services.uow(write=False) as uow:
            if await uow.events.list(session_id, 50, kind="agent.quota_wait"):
                return
        await asyncio.sleep(0.05)
    raise AssertionError("no quota wait")


async def test_a_stop_during_the_wait_launches_nothing_and_a_resume_after_a_restart_fails_the_run(
    sql_services, git_repo, tmp_path
):
    agents = supervisor(sql_services, tmp_path, types=limited(tmp_path, wait_s=60))
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["limited"])
    await waiting_for_quota(sql_services, agents, session.id)

    await agents.stop(session.id)  # as a restart would: the wait ends, nothing is launched
    await asyncio.wait_for(agents.wait(session.id), timeout=10)
    (only,) = await agents.agents(session.id)
    assert only.status == AgentStatus.CANCELLED and only.error.startswith("quota: retried")
    current = await sql_services.sessions.get(session.id)
    assert current.state == SessionState.EXECUTING

    after_restart = supervisor(sql_services, tmp_path, types=limited(tmp_path, wait_s=60))
    aftermath = await after_restart.resume(current)
    assert aftermath.follow_up is not None and aftermath.follow_up.trigger == "fail"
    assert "429" in aftermath.follow_up.reason
