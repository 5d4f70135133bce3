"""What an agent CLI reports of its run, kept with its row: real subprocesses print canned Claude Code and Codex
transcripts (the captured real runs), the supervisor parses the end of their logs when they end, on SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.agents.reports import AgentReport
from taskgate.domain.entities import AgentStatus
from taskgate.domain.states import SessionState
from tests.builders import ACTOR
from tests.integration.agents.test_supervisor import planning_session, supervisor

DATA = Path(__file__).resolve().parents[2] / "data" / "agent_output"
# Prints the transcript file it is given line by line (stderr noise first, as a CLI's warnings), exits with argv[2].
REPLAY = """
import sys, time
print("warning: something on stderr", file=sys.stderr, flush=True)
for line in open(sys.argv[1], encoding="utf-8"):
    sys.stdout.write(line); sys.stdout.flush()
sys.exit(int(sys.argv[2]))
"""
API_ERROR = {"type": "result", "subtype": "success", "is_error": True, "num_turns": 1,
             "result": "API Error: 500 {\"type\":\"error\",\"error\":{\"type\":\"api_error\"}}",
             "total_cost_usd": 0, "usage": {"input_tokens": 10, "output_tokens": 0}}  # fmt: skip


def replaying(tmp_path: Path, name: str, output_format: str, transcript: Path, exit_code: int = 0) -> AgentType:
    script = tmp_path / "replay.py"
    script.write_text(REPLAY)
    return AgentType(name, (sys.executable, str(script), str(transcript), str(exit_code)), output_format=output_format)


async def test_claude_and_codex_runs_leave_their_report_with_the_agent(sql_services, git_repo, tmp_path):
    types = {
        "claude": replaying(tmp_path, "claude", "claude-stream-json", DATA / "claude-stream.jsonl"),
        "codex": replaying(tmp_path, "codex", "codex-json", DATA / "codex-exec.jsonl"),
        "plain": replaying(tmp_path, "plain", "text", DATA / "claude-stream.jsonl"),
    }
    agents = supervisor(sql_services, tmp_path, types=types)
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["claude", "codex", "plain"])
    await agents.wait(session.id)

    rows = {a.agent_type: a for a in await agents.agents(session.id)}
    assert {a.status for a in rows.values()} == {AgentStatus.COMPLETED}
    assert (await sql_services.sessions.get(session.id)).state == SessionState.VERIFYING
    said = {"final_message": "done", "input_tokens": 400, "output_tokens": 80, "cache_read_tokens": 0,
            "is_error": False, "error": None}  # fmt: skip
    assert rows["claude"].report == {**said, "turns": 4, "cost_usd": 0.0032}
    assert rows["codex"].report == {**said, "turns": 1, "cost_usd": None}
    # a text agent reports no usage, whatever it prints: its report holds only its result, the whole output here
    printed = "warning: something on stderr\n" + (DATA / "claude-stream.jsonl").read_text()
    plain = AgentReport.from_dict(rows["plain"].report)
    assert plain is not None and plain.final_message == printed.strip() and not plain.measured()
    assert all(a.error is None for a in rows.values())


async def test_a_cli_error_is_appended_to_the_bare_exit_and_fails_the_session_with_it(sql_services, git_repo, tmp_path):
    transcript = tmp_path / "api-error.jsonl"
    transcript.write_text(json.dumps({"type": "system", "subtype": "init"}) + "\n" + json.dumps(API_ERROR) + "\n")
    types = {"claude": replaying(tmp_path, "claude", "claude-stream-json", transcript, exit_code=1)}
    agents = supervisor(sql_services, tmp_path, types=types)
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["claude"])
    await agents.wait(session.id)

    [agent] = await agents.agents(session.id)
    assert agent.status == AgentStatus.FAILED and agent.exit_code == 1
    assert agent.error == f"exited with 1: {API_ERROR['result']}"
    assert agent.report is not None and agent.report["is_error"] and agent.report["turns"] == 1
    failed = await sql_services.sessions.get(session.id)
    assert failed.state == SessionState.FAILED
    history = await sql_services.sessions.history(session.id, limit=1)
    assert "API Error: 500" in (history[0].reason or "")


async def test_a_run_killed_at_its_timeout_keeps_what_it_said_so_far_and_its_own_reason(sql_services, git_repo,
                                                                                        tmp_path):  # fmt: skip
    script = tmp_path / "slow.py"
    message = {"type": "assistant", "message": {"id": "m1", "content": [{"type": "text", "text": "half way"}],
                                                "usage": {"input_tokens": 5, "output_tokens": 2}}}  # fmt: skip
    script.write_text(f"import json, time\nprint(json.dumps({message!r}), flush=True)\ntime.sleep(60)\n")
    types = {"claude": AgentType("claude", (sys.executable, str(script)), timeout_s=1.0,
                                 output_format="claude-stream-json")}  # fmt: skip
    agents = supervisor(sql_services, tmp_path, types=types)
    session = await planning_session(sql_services, git_repo)
    await agents.execute(session.id, ACTOR, ["claude"])
    await agents.wait(session.id)

    [agent] = await agents.agents(session.id)
    assert agent.status == AgentStatus.FAILED and agent.error == "killed at its timeout"
    assert agent.report is not None
    assert (agent.report["final_message"], agent.report["turns"], agent.report["is_error"]) == ("half way", 1, False)
