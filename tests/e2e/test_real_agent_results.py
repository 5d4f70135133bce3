"""An agent's result and its readable log, read from the REAL Claude Code, Codex and aider runs (offline, against the
scripted model server) whose model ends with a long, many-line plan: `final_message` gives the plan whole and the
`Transcript` shows each tool call with its command. `TASKGATE_CAPTURE_AGENT_OUTPUT=1` writes the runs' output to
tests/data/agent_output/*-plan.* (the fixtures of tests/unit/agents/test_transcripts.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskgate.domain.agents.presets import PRESETS
from taskgate.domain.agents.transcripts import Transcript, final_message
from tests.e2e.test_real_agent_clis import COMMANDS, TOKEN, Workspace, make_workspace, run
from tests.support.agent_clis import require_cli
from tests.support.mcp_peer import McpPeer
from tests.support.model_server import ModelServer

DATA = Path(__file__).resolve().parents[1] / "data" / "agent_output"
PLAN = "# Plan\n\n" + "\n".join(f"{i}. `src/part_{i}.py`: change it, test it; risk: {i % 3}" for i in range(1, 120))
FORMATS = {"claude": ("claude-stream-json", "claude-plan.jsonl"), "codex": ("codex-json", "codex-plan.jsonl")}


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    return make_workspace(tmp_path)


@pytest.fixture
def peer() -> Iterator[McpPeer]:
    with McpPeer(TOKEN) as served:
        yield served


def captured(name: str, text: str) -> None:
    if os.environ.get("TASKGATE_CAPTURE_AGENT_OUTPUT"):
        (DATA / name).write_text(text)


def lines_of(text: str) -> list[str]:
    transcript = Transcript()
    return transcript.feed(text) + transcript.end()


@pytest.mark.parametrize("cli", ["claude", "codex"])
def test_a_real_clis_long_final_message_is_its_result_whole(cli: str, workspace: Workspace, peer: McpPeer) -> None:
    assert len(PLAN) > 4000
    with ModelServer("ok", final_text=PLAN) as server:
        argv, env = COMMANDS[cli](workspace, server, peer)
        result = run(argv, env, workspace.repo)
    assert result.returncode == 0, result.stderr[-2000:]
    output_format, fixture = FORMATS[cli]
    assert final_message(output_format, result.stdout) == PLAN
    readable = lines_of(result.stdout)
    assert any(line.endswith("printf hello > hello.txt") or "hello.txt" in line for line in readable)
    assert any('git commit -m "feat: hello"' in line for line in readable)
    assert "99. `src/part_99.py`: change it, test it; risk: 0" in readable  # its text, as it is
    assert not any(line.startswith('{"type"') for line in readable)
    captured(fixture, result.stdout)


def test_a_real_aider_runs_reply_is_its_result(tmp_path: Path) -> None:
    aider = require_cli("aider")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for key, value in (("user.name", "T"), ("user.email", "t@example.invalid")):
        subprocess.run(["git", "-C", str(repo), "config", key, value], check=True)
    (tmp_path / "home").mkdir()
    with ModelServer("ok") as server:
        preset = [str(aider) if part == "aider" else part.replace("{prompt}", "Write hello.txt.")
                  for part in PRESETS["aider"].command]  # fmt: skip
        command = [*preset, "--model", "openai/gpt-4o", "--edit-format", "whole"]
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "OPENAI_API_KEY": "test",
               "OPENAI_API_BASE": f"{server.url}/v1", **PRESETS["aider"].env}  # fmt: skip
        done = subprocess.run(command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=300, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    reply = final_message("text", done.stdout)
    assert reply == "I will create hello.txt.\n\nhello.txt\n\n```\nhello\n\n```", done.stdout
    assert lines_of(done.stdout) == done.stdout.splitlines()  # plain lines: as written
    captured("aider-whole.log", done.stdout)
