"""An agent continues its own conversation on request_changes and retry (its type's `resume`), and runs afresh,
recorded, when the conversation is gone: a real subprocess speaking Claude Code's stream-json, in a real worktree."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from taskgate.application.operators.decisions import Decide
from taskgate.application.sessions.commands import FireTrigger
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.entities import AgentStatus
from taskgate.domain.states import SessionState, Trigger
from tests.builders import ACTOR, OPERATOR, fire
from tests.integration.agents.test_supervisor import planning_session, supervisor

# Keeps its conversations as files in CONVERSATIONS (as Claude Code does under HOME); `--resume ID` continues one
# (refused like Claude Code when it is not there), else a new one begins. Prints stream-json events, records argv.
CLI = """
import json, os, sys, uuid
folder = os.environ["TASKGATE_SESSION_FOLDER"]; me = os.environ["TASKGATE_AGENT_ID"]
store = os.environ["CONVERSATIONS"]; os.makedirs(store, exist_ok=True)
args = sys.argv[1:]
json.dump(args, open(os.path.join(folder, me + ".argv.json"), "w"))
if args[0] == "--resume":
    conversation = args[1]
    if not os.path.exists(os.path.join(store, conversation)):
        print(json.dumps({"type": "result", "subtype": "error_during_execution", "is_error": True, "num_turns": 0,
                          "session_id": conversation,
                          "errors": [f"No conversation found with session ID: {conversation}"]}))
        sys.exit(1)
else:
    conversation = str(uuid.uuid4())
with open(os.path.join(store, conversation), "a") as kept:
    kept.write(args[-1] + "\\n")
print(json.dumps({"type": "system", "subtype": "init", "session_id": conversation}))
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "num_turns": 1, "result": "done",
                  "session_id": conversation, "usage": {"input_tokens": 10, "output_tokens": 2}}))
"""


def cli_types(tmp_path: Path) -> dict[str, AgentType]:
    script = tmp_path / "cli.py"
    script.write_text(CLI)
    env = {"CONVERSATIONS": str(tmp_path / "conversations")}
    command, shape = (sys.executable, str(script), "{prompt}"), "claude-stream-json"
    return {
        "cli": AgentType("cli", command, env, output_format=shape, resume=("--resume", "{conversation_id}")),
        "plain": AgentType("plain", command, env, output_format=shape),
    }


def argv_of(tmp_path: Path, session_id: str, agent_id: str) -> list[str]:
    return json.loads((tmp_path / "agent-outputs" / session_id / f"{agent_id}.argv.json").read_text())


async def run_then_request_changes(services, git_repo, tmp_path, agent: str = "cli"):
    agents = supervisor(services, tmp_path, types=cli_types(tmp_path))
    session = await planning_session(services, git_repo)
    await agents.execute(session.id, ACTOR, [agent])
    await agents.wait(session.id)
    await services.decisions.decide(
        Decide(session.id, OPERATOR, "request_changes", reason="tests", instructions="rename the file")
    )
    await agents.wait(session.id)
    first, second = sorted(await agents.agents(session.id), key=lambda a: a.run)
    return agents, session, first, second


async def test_request_changes_continues_the_agents_own_conversation_told_only_what_changed(
    sql_services, git_repo, tmp_path
):
    _, session, first, second = await run_then_request_changes(sql_services, git_repo, tmp_path)
    assert first.conversation_id and first.resumed_from is None  # the first run began it
    assert second.resumed_from == first.conversation_id == second.conversation_id  # the run record names it
    argv = argv_of(tmp_path, session.id, second.id)
    assert argv[:2] == ["--resume", first.conversation_id]
    assert "continuing your earlier work" in argv[-1] and "rename the file" in argv[-1]
    assert "Build the API" not in argv[-1]  # not the whole task again
    assert second.status == AgentStatus.COMPLETED and second.resume_failed is None
    assert (await sql_services.sessions.get(session.id)).state == SessionState.VERIFYING


async def test_a_type_that_cannot_resume_runs_afresh_with_the_whole_task(sql_services, git_repo, tmp_path):
    _, session, first, second = await run_then_request_changes(sql_services, git_repo, tmp_path, agent="plain")
    assert second.resumed_from is None and second.conversation_id != first.conversation_id
    argv = argv_of(tmp_path, session.id, second.id)
    assert "--resume" not in argv and "Build the API" in argv[-1] and "rename the file" in argv[-1]


async def test_a_conversation_gone_falls_back_to_a_fresh_run_and_the_record_says_so(sql_services, git_repo, tmp_path):
    agents = supervisor(sql_services, tmp_path, types=cli_types(tmp_path))
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["cli"])
    await agents.wait(session.id)
    (first,) = await agents.agents(session.id)
    (tmp_path / "conversations" / str(first.conversation_id)).unlink()  # its CLI's home lost meanwhile
    await sql_services.decisions.decide(Decide(session.id, OPERATOR, "request_changes", reason="t", instructions="x"))
    await agents.wait(session.id)
    second = next(a for a in await agents.agents(session.id) if a.run == 2)
    assert second.status == AgentStatus.COMPLETED and second.resumed_from is None
    assert second.resume_failed and f"No conversation found with session ID: {first.conversation_id}" in (
        second.resume_failed
    )
    assert second.conversation_id not in (None, first.conversation_id)  # a new conversation, afresh
    assert "--resume" not in argv_of(tmp_path, session.id, second.id)
    assert second.output_path.endswith(".fresh.log")
    assert (await sql_services.sessions.get(session.id)).state == SessionState.VERIFYING


async def test_a_retry_continues_the_conversation_told_why_the_session_failed(sql_services, git_repo, tmp_path):
    agents = supervisor(sql_services, tmp_path, types=cli_types(tmp_path))
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["cli"])
    await agents.wait(session.id)
    current = await sql_services.sessions.get(session.id)
    await fire(sql_services, current, Trigger.FAIL.value, reason="the tests are red")
    await fire(sql_services, await sql_services.sessions.get(session.id), Trigger.RETRY.value)
    await agents.wait(session.id)
    first, second = sorted(await agents.agents(session.id), key=lambda a: a.run)
    assert second.resumed_from == first.conversation_id
    argv = argv_of(tmp_path, session.id, second.id)
    assert argv[:2] == ["--resume", first.conversation_id] and "the tests are red" in argv[-1]


async def test_a_ci_round_from_the_forge_continues_the_conversation_told_what_failed(sql_services, git_repo, tmp_path):
    agents = supervisor(sql_services, tmp_path, types=cli_types(tmp_path))
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["cli"])
    await agents.wait(session.id)
    await sql_services.decisions.decide(Decide(session.id, OPERATOR, "approve", reason="looks right"))
    waiting = await sql_services.sessions.get(session.id)
    assert waiting.state == SessionState.AWAITING_MERGE
    said = "CI failed on the pull request: check `tests` (exit 1): test_hello expected 'hello'"
    round_ = FireTrigger(session.id, Trigger.CI_FAILED.value, "forge", "a check failed",
                         changes={"state_data": {"instructions": said}})  # fmt: skip
    await sql_services.sessions.fire(round_)
    await agents.wait(session.id)
    first, second = sorted(await agents.agents(session.id), key=lambda a: a.run)
    assert second.resumed_from == first.conversation_id
    argv = argv_of(tmp_path, session.id, second.id)
    assert argv[:2] == ["--resume", first.conversation_id] and said in argv[-1]
