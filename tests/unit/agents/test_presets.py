"""Built-in agent presets, `[agents.NAME]` over them, the credential allow-list, and a prompt that must reach its
agent."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from taskgate.application.agents.ports import Watching
from taskgate.bootstrap import agent_types, load_settings, workflow_catalogue
from taskgate.domain.agents.presets import PRESETS
from taskgate.domain.errors import InvalidInput
from taskgate.infrastructure.agent_runner import SubprocessAgentRunner


def settings_of(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "taskgate.toml").write_text(text)
    monkeypatch.delenv("TASKGATE_CONFIG", raising=False)
    return load_settings(tmp_path)


def test_every_preset_is_an_agent_type_with_no_configuration(tmp_path, monkeypatch):
    types = agent_types(settings_of(tmp_path, "", monkeypatch))
    assert set(PRESETS) <= set(types) and {"claude", "codex", "aider", "coder", "tester", "reviewer"} <= set(types)
    assert all(t.takes_prompt for t in types.values())  # every preset passes a workflow step's prompt on
    assert (types["claude"].mcp, types["claude"].output_format) == ("claude", "claude-stream-json")
    assert (types["codex"].mcp, types["codex"].output_format) == ("codex", "codex-json")
    assert types["aider"].mcp == "none"  # aider has no MCP client
    assert "ANTHROPIC_API_KEY" in types["claude"].credentials and "OPENAI_API_KEY" in types["codex"].credentials


def test_a_table_named_like_a_preset_changes_only_the_keys_it_sets(tmp_path, monkeypatch):
    types = agent_types(settings_of(tmp_path, '[agents.claude]\ntimeout_s = 42\nenv = { X = "1" }\n', monkeypatch))
    assert types["claude"].timeout_s == 42 and types["claude"].env == {**PRESETS["claude"].env, "X": "1"}
    assert types["claude"].command == PRESETS["claude"].command


def test_a_table_may_start_from_a_named_preset(tmp_path, monkeypatch):
    text = '[agents.coder]\npreset = "codex"\ncredentials = ["OPENAI_API_KEY", "MY_PROXY"]\n'
    coder = agent_types(settings_of(tmp_path, text, monkeypatch))["coder"]
    assert coder.name == "coder" and coder.command == PRESETS["codex"].command
    assert coder.credentials == ("OPENAI_API_KEY", "MY_PROXY") and coder.output_format == "codex-json"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[agents.x]\npreset = "gpt"\n', "agents.x.preset: Value error, unknown preset 'gpt'; known: aider, claude"),
        ('[agents.claude]\ncolour = "red"\n', "agents.claude.colour: Extra inputs are not permitted"),
        ("[agents.mine]\ntimeout_s = 5\n", "agents.mine: give a command, or name a preset"),
        ('[agents.claude]\ncredentials = ["A-B"]\n', "not an environment variable name: 'A-B'"),
        ('[agents.claude]\nmcp = "smoke"\n', "agents.claude.mcp: Input should be"),
    ],
)
def test_bad_agent_tables_are_one_line_errors_naming_the_key(tmp_path, monkeypatch, text, message):
    with pytest.raises(InvalidInput) as refused:
        settings_of(tmp_path, text, monkeypatch)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_step_prompt_that_cannot_reach_its_agent_is_refused_at_validation(tmp_path, monkeypatch):
    settings = settings_of(tmp_path, '[agents.deaf]\ncommand = ["my-agent", "--task", "{task_title}"]\n', monkeypatch)
    folder = tmp_path / "config" / "workflows" / "ours"
    folder.mkdir(parents=True)
    (folder / "w.yaml").write_text("id: w\ndescription: d\nsteps:\n  - id: work\n    type: agent\n    agent: deaf\n"
                                   "    prompt: Do the work.\n")  # fmt: skip
    problems = [str(p) for p in workflow_catalogue(settings).catalogue().problems]
    assert any("agent type 'deaf' has no {prompt} in its command" in p and "w.yaml:6" in p for p in problems), problems


def test_only_the_named_credentials_pass_from_the_service_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", "k-123")
    monkeypatch.setenv("SERVICE_SECRET", "never-to-an-agent")
    out, log = tmp_path / "env.json", tmp_path / "agent.log"
    probe = f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"
    runner = SubprocessAgentRunner()

    async def run() -> None:
        pid = await runner.start([sys.executable, "-c", probe], str(tmp_path), {"GIVEN": "1"}, str(log),
                                 inherit=("MY_API_KEY", "UNSET_ONE"))  # fmt: skip
        stop = asyncio.Event()

        async def beat() -> None:
            return None

        await runner.wait(pid, output_path=str(log), watching=Watching(30, 10**6), stop=stop, beat=beat,
                          beat_every_s=5)  # fmt: skip

    asyncio.run(run())
    seen = json.loads(out.read_text())
    assert seen["MY_API_KEY"] == "k-123" and seen["GIVEN"] == "1"
    assert "SERVICE_SECRET" not in seen and "UNSET_ONE" not in seen


def test_a_table_may_name_the_folders_its_cli_leaves_in_the_worktree_and_bad_ones_are_refused(tmp_path, monkeypatch):
    text = '[agents.aider]\nignored = [".aider.tags.cache.v5"]\n'
    assert agent_types(settings_of(tmp_path, text, monkeypatch))["aider"].ignored == (".aider.tags.cache.v5",)
    with pytest.raises(InvalidInput, match=r"agents\.aider\.ignored: each entry must be a folder name"):
        agent_types(settings_of(tmp_path, '[agents.aider]\nignored = ["../out"]\n', monkeypatch))
