"""The session resources (diff, log, manifest) and the review prompt over MCP (in-process client): what a client
reads about a session besides the tools, with the tools' permission checks (an agent reads its own session only)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from taskgate.application.agents.outputs import SaveOutput
from taskgate.domain.access import Principal
from tests.builders import fire, seed, start
from tests.mcp.conftest import connect

ALICE = Principal.operator("alice")


async def read(client, uri: str) -> str:
    return (await client.read_resource(uri)).contents[0].text


async def test_a_clients_resources_and_prompt_for_a_session(services, git_repo) -> None:
    seeded = await seed(services, git_repo, tasks=2)
    session = await fire(services, await start(services, seeded.tasks[0]), "plan_complete")
    worktree = Path((await services.sessions.get(session.id)).worktree_path)
    (worktree / "api.py").write_text("print('hi')\n")
    subprocess.run(["git", "-C", str(worktree), "add", "api.py"], check=True)
    subprocess.run(["git", "-C", str(worktree), "commit", "-qm", "feat: api"], check=True)
    await services.outputs.save_output(SaveOutput(session.id, "notes.md", "done", actor="operator:alice"))
    other = await start(services, seeded.tasks[1])
    async with connect(services, ALICE) as tools:
        templates = {t.uri_template for t in (await tools.client.list_resource_templates()).resource_templates}
        assert {f"taskgate://sessions/{{session_id}}/{k}" for k in ("diff", "log", "manifest")} <= templates
        diff = await read(tools.client, f"taskgate://sessions/{session.id}/diff")
        assert "+print('hi')" in diff and "api.py" in diff
        log = await read(tools.client, f"taskgate://sessions/{session.id[:8]}/log")
        assert "plan_complete" in log and "planning → executing" in log
        manifest = json.loads(await read(tools.client, f"taskgate://sessions/{session.id}/manifest"))
        assert [o["path"] for o in manifest["outputs"]] == ["notes.md"]
        prompt = await tools.client.get_prompt("review_session", {"session_id": session.id})
        text = prompt.messages[0].content.text
        assert f"task {seeded.tasks[0].id}" in text and "api.py +1 -0" in text and "project_decide" in text
    async with connect(services, Principal.agent("tok", other.id)) as agent:
        with pytest.raises(Exception, match="scoped to session"):
            await read(agent.client, f"taskgate://sessions/{session.id}/diff")


async def test_a_sessions_whole_outputs_are_resources(services, git_repo, tmp_path) -> None:
    from datetime import UTC, datetime

    from taskgate.domain.entities import Agent, AgentStatus, StepRun, StepStatus
    from tests.mcp.conftest import app_of
    from tests.workflow_support import rig

    seeded = await seed(services, git_repo, tasks=2)
    session = await fire(services, await start(services, seeded.tasks[0]), "plan_complete")
    plain = await fire(services, await start(services, seeded.tasks[1]), "plan_complete")
    plan = "# Plan\n" + "\n".join(f"{i}. step {i}" for i in range(500))  # longer than any tail kept
    at = datetime(2026, 11, 1, tzinfo=UTC)
    async with services.uow(write=True) as uow:
        await uow.agents.add(Agent("ag-1", session.id, "coder", ["c"], AgentStatus.COMPLETED, run=1,
                                   report={"final_message": plan}))  # fmt: skip
        await uow.agents.add(Agent("ag-2", plain.id, "coder", ["c"], AgentStatus.COMPLETED, run=1,
                                   report={"final_message": "wrote work/a.md"}))  # fmt: skip
        for step, output, agents in (("plan", plan, ("ag-1",)), ("gate", "", ()), ("when", "when → True", ())):
            await uow.step_runs.add(StepRun(session.id, 1, "feature", step, 1, StepStatus.SUCCEEDED, at, at,
                                            output_summary=output, agent_ids=agents))  # fmt: skip
        await uow.commit()
    r = rig(services, tmp_path, {})  # the workflow engine and agents of a served app
    async with connect(services, ALICE, app=app_of(services, workflows=r.engine, agents=r.agents)) as tools:
        base = f"taskgate://sessions/{session.id[:8]}"
        assert await read(tools.client, f"{base}/output") == plan  # the latest agent step's output, whole
        assert await read(tools.client, f"{base}/steps/plan/output") == plan
        assert await read(tools.client, f"{base}/steps/when/output") == "when → True"
        assert await read(tools.client, f"taskgate://sessions/{plain.id}/output") == "wrote work/a.md"
        with pytest.raises(Exception, match="has no run of step 'nope'; steps with an output: plan, when"):
            await read(tools.client, f"{base}/steps/nope/output")
    async with connect(services, Principal.agent("tok", plain.id)) as agent:
        with pytest.raises(Exception, match="scoped to session"):
            await read(agent.client, f"{base}/output")
