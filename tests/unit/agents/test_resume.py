"""Continuing an agent's own conversation: the argv a preset's `resume` builds, what a custom type may set, the
conversation id each CLI's log names, and the prompt a continuing agent gets (docs/agents.md, resuming)."""

from __future__ import annotations

import json

import pytest

from taskgate.bootstrap import agent_types
from taskgate.domain.agents.kinds import AgentType, as_continuation, render_command, resuming
from taskgate.domain.agents.presets import PRESETS
from taskgate.domain.agents.reports import AgentReport, conversation_of, own_share
from taskgate.domain.errors import InvalidInput
from tests.unit.agents.test_presets import settings_of

VALUES = {"prompt": "PROMPT", "session_folder": "/f", "agent_id": "A", "git_dir": "/g/.git", "session_id": "S",
          "mcp_url": "http://mcp", "conversation_id": "c0ffee-1"}  # fmt: skip


def resumed(name: str) -> list[str]:
    kind = PRESETS[name].agent_type()
    return render_command(resuming(kind.command, kind.resume), VALUES)


def test_claude_resumes_with_its_session_id_before_the_prompt():
    argv = resumed("claude")
    assert argv[:5] == ["claude", "-p", "--resume", "c0ffee-1", "PROMPT"]
    assert argv[5:] == render_command(PRESETS["claude"].command, VALUES)[3:]  # every other option as it was


def test_codex_resumes_with_exec_resume_its_options_first_then_the_thread_and_the_prompt():
    argv = resumed("codex")
    assert argv[:3] == ["codex", "exec", "--json"] and argv[-3:] == ["resume", "c0ffee-1", "PROMPT"]
    assert "--sandbox" in argv[: argv.index("resume")]  # `exec resume` takes no --sandbox: exec's options go first


@pytest.mark.parametrize("name", ["aider", "coder", "tester", "reviewer"])
def test_presets_whose_cli_cannot_continue_a_conversation_say_so(name: str):
    assert not PRESETS[name].agent_type().can_resume


def test_a_command_without_a_prompt_argument_gets_the_resume_argv_at_its_end():
    argv = resuming(("cli", "run"), ("--continue", "{conversation_id}"))
    assert argv == ["cli", "run", "--continue", "{conversation_id}"]


def test_a_custom_type_may_set_resume_and_a_table_may_turn_a_presets_off(tmp_path, monkeypatch):
    text = ('[agents.mine]\ncommand = ["mine", "{prompt}"]\nresume = ["--session", "{conversation_id}"]\n'
            "[agents.claude]\nresume = []\n")  # fmt: skip
    types = agent_types(settings_of(tmp_path, text, monkeypatch))
    assert types["mine"].resume == ("--session", "{conversation_id}") and types["mine"].can_resume
    assert not types["claude"].can_resume and types["codex"].can_resume


@pytest.mark.parametrize(
    ("resume", "message"),
    [
        (("--resume",), "must hold {conversation_id}"),
        (("--resume", "{conversation}"), "unknown placeholder {conversation}"),
    ],
)
def test_a_resume_argv_without_the_conversation_or_with_an_unknown_placeholder_is_refused(resume, message):
    with pytest.raises(InvalidInput, match=message.replace("{", r"\{").replace("}", r"\}")):
        AgentType("mine", ("mine", "{prompt}"), resume=resume)


def test_the_conversation_placeholder_is_only_for_resume():
    with pytest.raises(InvalidInput, match="unknown placeholder"):
        AgentType("mine", ("mine", "--resume", "{conversation_id}"))


def lines(*events: dict) -> str:
    return "\n".join(json.dumps(e) for e in events)


def test_claude_code_names_its_conversation_in_its_init_event_and_its_result():
    init = {"type": "system", "subtype": "init", "session_id": "5f1c1d2e-0000-4000-8000-000000000001"}
    assert conversation_of("claude-stream-json", "stderr noise\n" + lines(init)) == init["session_id"]
    result = {"type": "result", "session_id": "5f1c1d2e-0000-4000-8000-000000000001", "num_turns": 2}
    assert conversation_of("claude-stream-json", lines(result)) == result["session_id"]  # the window's start cut


def test_codex_names_its_thread_in_thread_started():
    log = lines({"type": "thread.started", "thread_id": "0199a213-81c0-7800-8aa1-bbab2a035a53"},
                {"type": "turn.completed", "usage": {}})  # fmt: skip
    assert conversation_of("codex-json", log) == "0199a213-81c0-7800-8aa1-bbab2a035a53"


@pytest.mark.parametrize(
    ("output_format", "log"),
    [
        ("text", '{"type": "system", "session_id": "abc"}'),
        ("aider", "Tokens: 1 sent, 2 received."),
        ("claude-stream-json", '{"type": "system", "session_id": "--fork-session"}'),  # never an option
        ("claude-stream-json", '{"type": "system", "session_id": "../../etc"}'),  # never a path
        ("codex-json", '{"type": "item.completed", "thread_id": "abc"}'),
        ("claude-stream-json", "not json at all"),
    ],
)
def test_no_conversation_is_read_where_the_cli_names_none_or_names_something_odd(output_format, log):
    assert conversation_of(output_format, log) is None


def test_a_continuing_agent_is_told_what_changed_not_the_task_again():
    said = as_continuation("The operator's instructions:\nrename the file")
    assert "continuing your earlier work" in said and said.count("rename the file") == 1
    assert "without instructions" in as_continuation("  ")


def test_a_resumed_codex_run_is_charged_its_own_share_not_the_whole_threads():
    whole = AgentReport(final_message="done", turns=1, input_tokens=700, output_tokens=120, cache_read_tokens=50)
    earlier = [AgentReport(input_tokens=400, output_tokens=80), AgentReport(input_tokens=100, output_tokens=20)]
    own = own_share(whole, earlier)
    assert (own.input_tokens, own.output_tokens, own.cache_read_tokens, own.turns) == (200, 20, 50, 1)
    assert own_share(AgentReport(input_tokens=10), earlier).input_tokens == 0  # never below 0
