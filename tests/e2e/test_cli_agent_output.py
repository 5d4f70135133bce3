"""An agent's result and its log through the `taskgate` executable: a real agent process replays a REAL Claude Code
stream-json run (tests/data/agent_output/claude-stream.jsonl) whose result is a long, many-line plan. The plan step's
output, the next step's prompt, `session output`, `session status` and the manifest carry the plan whole (not the
tail of the raw stream, cut inside a line); the approval says how to read it; `session logs` reads as lines a
person reads, `--raw` gives the bytes as written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli, seed

DATA = Path(__file__).resolve().parents[1] / "data" / "agent_output"
PLAN = "# Plan\n\n" + "\n".join(f"{i}. change `src/module_{i}.py`: the approach, tests and risks" for i in range(90))
WORKFLOW = """
id: planned
description: plan, approve the plan, implement it
steps:
  - id: plan
    type: agent
    agent: planner
    prompt: plan it
  - id: approve-plan
    type: approval
    message: Read the plan.
  - id: implement
    type: agent
    agent: echo
    input: plan
    prompt: implement the plan
"""
# replays the real run with the plan as its result (JSON-encoded, as the CLI writes it), stderr noise first
REPLAY = """
import json, sys
print("warning: something on stderr", file=sys.stderr, flush=True)
plan = open(sys.argv[2], encoding="utf-8").read()
for line in open(sys.argv[1], encoding="utf-8"):
    event = json.loads(line)
    if event["type"] == "result":
        event["result"] = plan
    sys.stdout.write(json.dumps(event) + "\\n")
"""


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    config = tmp_path / "config"
    (config / "workflows" / "e2e").mkdir(parents=True)
    (config / "workflows" / "e2e" / "planned.yaml").write_text(WORKFLOW)
    (tmp_path / "replay.py").write_text(REPLAY)
    (tmp_path / "plan.md").write_text(PLAN)
    replay, transcript, plan = tmp_path / "replay.py", DATA / "claude-stream.jsonl", tmp_path / "plan.md"
    planner = [sys.executable, str(replay), str(transcript), str(plan), "{prompt}"]
    echo = [sys.executable, "-c", "import sys; print('received:'); print(sys.argv[1])", "{prompt}"]
    (config / "taskgate.toml").write_text(
        f'[agents.planner]\ncommand = {json.dumps(planner)}\noutput_format = "claude-stream-json"\n\n'
        f"[agents.echo]\ncommand = {json.dumps(echo)}\n"
    )
    make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    seed(cli)
    return cli


def test_a_plan_is_carried_whole_from_the_agent_to_the_approval_the_next_step_and_the_operator(cli: Cli):
    assert len(PLAN) > 4000 and PLAN.count("\n") > 80  # longer than what the step output used to keep
    out = cli.ok("workflow", "run", "planned", "--task", "DEMO-1")
    sid = out.split()[1]
    assert "✓ planned › plan succeeded: # Plan" in out
    assert f"  read: taskgate session output {sid} --step plan" in out

    assert cli.ok("session", "output", sid[:8]) == PLAN + "\n"  # the latest step with an output: the plan
    done = cli.run("session", "output", sid[:8], "--step", "plan")
    assert done.stdout == PLAN + "\n" and done.stderr == "==> step plan of planned (succeeded) <==\n"
    assert cli.json("session", "output", sid, "--step", "plan") == [
        {"what": "step plan of planned (succeeded)", "output": PLAN}
    ]
    refused = cli.fails("session", "output", sid[:8], "--step", "nope")
    assert f"session {sid[:8]} has no run of step 'nope'; steps with an output: plan" in refused

    status = cli.ok("session", "status", sid[:8])
    assert "waits for approval at step 'approve-plan': Read the plan." in status
    assert f"  read: taskgate session output {sid} --step plan" in status
    assert "planner (run 1) completed: # Plan (4 turns, 400 in / 80 out tokens, $0.0032)" in status
    assert "    │ 89. change `src/module_89.py`: the approach, tests and risks" in status  # the whole result
    assert "  usage: 1 agent, 4 turns, 400 in / 80 out tokens, $0.0032" in status
    reported = cli.json("session", "status", sid)
    assert reported["agents"][0]["report"]["final_message"] == PLAN
    assert reported["workflow"]["waiting"]["output_of"] == "plan"
    assert reported["usage"]["total"] == {"agents": 1, "measured": 1, "turns": 4, "input_tokens": 400,
                                          "output_tokens": 80, "cache_read_tokens": 0, "cost_usd": 0.0032,
                                          "uncosted": 0}  # fmt: skip

    version = reported["version"]
    cli.ok("session", "decide", sid[:8], "approve", "--expected-version", str(version))
    implemented = cli.ok("session", "output", sid[:8], "--step", "implement")
    assert implemented.startswith("received:\nimplement the plan\n\nOutput of step 'plan':\n# Plan\n")
    assert implemented.endswith(PLAN.rsplit("\n", 1)[1] + "\n")  # the next step's prompt held the plan whole

    show = cli.ok("session", "show", sid[:8])
    assert "usage  2 agents, 4 turns, 400 in / 80 out tokens, $0.0032; 1 reported none" in show
    assert "run 1  1 agent, 4 turns" in show and "run 2  1 agent, no usage reported" in show
    manifest = json.loads((Path(cli.workdir) / "data" / "agent-outputs" / sid / "manifest.json").read_text())
    assert manifest["agents"][0]["result"] == PLAN


def test_session_logs_reads_as_text_tool_calls_and_tokens_and_raw_gives_the_bytes(cli: Cli):
    sid = cli.ok("workflow", "run", "planned", "--task", "DEMO-1").split()[1]
    readable = cli.ok("session", "logs", sid[:8], "--agent", "planner")
    header, *lines = readable.splitlines()
    assert header.startswith("==> agent ") and " planner (run 1, completed): " in header
    assert lines[:3] == ["warning: something on stderr",
                         "· claude code 2.1.330 started in /tmp/claude-t31pd337/repo (model claude-opus-5-5; MCP: "
                         "taskgate connected)", "→ Bash printf hello > hello.txt"]  # fmt: skip
    assert "  ← [master (root-commit) afd5499] feat: hello … 2 more lines" in lines
    assert lines[-2:] == ["done", "✓ done · 4 turns, 400 in / 80 out tokens, $0.0032"]  # its last text, its usage
    assert not any(line.startswith("{") for line in lines)

    [agent] = [a for a in cli.json("session", "status", sid)["agents"] if a["agent_type"] == "planner"]
    raw = cli.run("session", "logs", sid[:8], "--agent", "planner", "--raw")
    assert raw.returncode == 0 and raw.stdout == Path(agent["output_path"]).read_text()  # the bytes as written
    assert raw.stderr.startswith("==> agent ") and json.loads(raw.stdout.splitlines()[-1])["result"] == PLAN


def test_taskgate_usage_sums_what_agents_reported_by_task_agent_and_preset(cli: Cli):
    sid = cli.ok("workflow", "run", "planned", "--task", "DEMO-1").split()[1]
    version = cli.json("session", "status", sid)["version"]
    cli.ok("session", "decide", sid[:8], "approve", "--expected-version", str(version))
    summed = cli.json("usage")
    claude = {"agents": 1, "measured": 1, "turns": 4, "input_tokens": 400, "output_tokens": 80,
              "cache_read_tokens": 0, "cost_usd": 0.0032, "uncosted": 0}  # fmt: skip
    nothing = {**dict.fromkeys(claude, 0), "agents": 1, "cost_usd": None}
    assert summed["total"] == {**claude, "agents": 2} and summed["project"] == "every project"
    assert summed["by_task"] == {"DEMO-1": {**claude, "agents": 2}}
    assert summed["by_agent"] == {"planner": claude, "echo": nothing}
    assert summed["by_preset"] == {"custom": {**claude, "agents": 2}}  # both have a command of their own
    assert cli.json("usage", "--project", "demo", "--since", "2000-01-01")["total"] == summed["total"]
    assert cli.json("usage", "--since", "2999-01-01")["total"] == {**dict.fromkeys(claude, 0), "cost_usd": None}

    table = cli.ok("usage", "--project", "demo")
    assert table.splitlines()[0] == "Usage of demo: 2 agents, 4 turns, 400 in / 80 out tokens, $0.0032; 1 reported none"
    assert "by task" in table and "by agent" in table and "by preset" in table and "$0.0032" in table
    assert "malformed timestamp 'yesterday'" in cli.fails("usage", "--since", "yesterday")
    assert "nope" in cli.fails("usage", "--project", "nope")
