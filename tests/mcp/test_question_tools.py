"""ask_operator, permission_prompt, question_list and session_answer through the real MCP server (in-process SDK
clients): an agent's call blocks until an operator's call answers it; what each side may do."""

from __future__ import annotations

import asyncio
import json

from taskgate.application.operators.questions import OperatorQuestions, QuestionOptions
from taskgate.domain.access import Principal
from taskgate.infrastructure.system import SystemClock
from tests.builders import seed, start
from tests.mcp.conftest import app_of, connect

ALICE = Principal.operator("alice")


async def _rig(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    issued = await services.access.create_agent_token(session.id, "agent")
    app = app_of(services)
    app.questions = OperatorQuestions(services.uow, SystemClock(), QuestionOptions(timeout_s=30, poll_s=0.05))
    return session, Principal.agent(issued.token.id, session.id), app


async def _open_question(operator, session_id: str) -> dict:
    for _ in range(200):
        status = await operator.ok("session_status", session_id=session_id)
        if status["waiting_for_operator"]:
            return status["waiting_for_operator"][0] | {"summary": status["summary"]}
        await asyncio.sleep(0.02)
    raise AssertionError("the question never showed")


async def test_an_agents_question_blocks_until_an_operator_answers_it_over_mcp(services, git_repo):
    session, agent_principal, app = await _rig(services, git_repo)
    async with connect(services, agent_principal, app=app) as agent, connect(services, ALICE, app=app) as operator:
        asking = asyncio.create_task(agent.ok("ask_operator", question="Which colour?", choices=["red", "blue"]))
        shown = await _open_question(operator, session.id)
        assert (shown["kind"], shown["text"], shown["choices"]) == ("question", "Which colour?", ["red", "blue"])
        assert "waiting_for_operator: 1 question(s)" in shown["summary"]
        listed = await operator.ok("question_list")
        assert [q["id"] for q in listed["questions"]] == [shown["id"]]
        refused = await operator.refused("session_answer", session_id=session.id, answer="green")
        assert "takes one of 'red', 'blue'" in refused
        assert not asking.done()
        answered = await operator.ok("session_answer", session_id=session.id[:8], answer="blue")
        told = await asyncio.wait_for(asking, 5)
        refused_agent = await agent.refused("session_answer", session_id=session.id, answer="red")
    assert (answered["status"], answered["answered_by"]) == ("answered", "operator:alice")
    assert (told["answer"], told["status"], told["answered_by"]) == ("blue", "answered", "operator:alice")
    assert "agent tokens may not" in refused_agent


async def test_a_permission_prompt_returns_claude_codes_json_as_text(services, git_repo):
    session, agent_principal, app = await _rig(services, git_repo)
    async with connect(services, agent_principal, app=app) as agent, connect(services, ALICE, app=app) as operator:
        asking = asyncio.create_task(
            agent.client.call_tool("permission_prompt", {"tool_name": "Bash", "input": {"command": "make deploy"}})
        )
        shown = await _open_question(operator, session.id)
        assert (shown["kind"], shown["tool_name"]) == ("permission", "Bash")
        assert json.loads(shown["tool_input"]) == {"command": "make deploy"}
        await operator.ok("session_answer", session_id=session.id, answer="deny", message="not from a session")
        result = await asyncio.wait_for(asking, 5)
    assert result.structured_content is None and len(result.content) == 1  # a single text block, as Claude reads
    reply = json.loads(result.content[0].text)
    assert reply == {"behavior": "deny", "message": "not from a session (denied by operator:alice)"}


async def test_operators_cannot_ask_and_agents_see_only_the_asking_tools(services, git_repo):
    _session, agent_principal, app = await _rig(services, git_repo)
    async with connect(services, agent_principal, app=app) as agent, connect(services, ALICE, app=app) as operator:
        refused = await operator.refused("ask_operator", question="Me?")
        names = {t.name for t in (await agent.client.list_tools()).tools}
    assert "only an agent asks the operator" in refused
    assert {"ask_operator", "permission_prompt"} <= names
    assert not {"session_answer", "question_list"} & names
