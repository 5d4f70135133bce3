"""transcripts: an agent's result (its final message) and its log as readable lines, read from REAL runs of Claude Code
2.1.330, Codex 0.169.0 and aider 0.86.1 against the scripted model server (tests/data/agent_output/)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from taskgate.domain.agents.transcripts import (
    TEXT_RESULT_CHARS,
    Transcript,
    aider_reply,
    final_message,
    fold,
    last_lines,
    result_of,
)
from taskgate.domain.entities import Agent, AgentStatus

DATA = Path(__file__).resolve().parents[2] / "data" / "agent_output"


def rendered(text: str) -> list[str]:
    transcript = Transcript()
    return transcript.feed(text) + transcript.end()


def test_claude_codes_result_is_its_final_message():
    assert final_message("claude-stream-json", (DATA / "claude-stream.jsonl").read_text()) == "done"


def test_a_multi_line_claude_result_is_kept_whole():
    plan = "# Plan\n\n1. change `a.py`\n2. add tests\n" + "risk: none\n" * 2000
    text = (DATA / "claude-stream.jsonl").read_text().replace('"result":"done"', f'"result":{json.dumps(plan)}')
    assert final_message("claude-stream-json", text) == plan


PLAN_END = "119. `src/part_119.py`: change it, test it; risk: 2"


def test_a_real_claude_code_run_ending_with_a_long_plan_has_the_plan_whole_as_its_result():
    text = (DATA / "claude-plan.jsonl").read_text()  # tests/e2e/test_real_agent_results.py captured it
    result = final_message("claude-stream-json", text)
    assert result.startswith("# Plan\n\n1. `src/part_1.py`") and result.endswith(PLAN_END)
    assert len(result) > 4000 and result.count("\n") == 120
    assert rendered(text)[-2:] == [PLAN_END, "✓ done · 4 turns, 400 in / 80 out tokens, $0.0032"]


def test_a_real_codex_run_ending_with_a_long_plan_has_the_plan_whole_as_its_result():
    text = (DATA / "codex-plan.jsonl").read_text()
    result = final_message("codex-json", text)
    assert result == final_message("claude-stream-json", (DATA / "claude-plan.jsonl").read_text())
    assert rendered(text)[-2:] == [PLAN_END, "· tokens: 400 in / 80 out"]


def test_codex_final_message_is_its_last_agent_message():
    assert final_message("codex-json", (DATA / "codex-exec.jsonl").read_text()) == "done"


def test_aiders_reply_is_the_models_text_without_its_banner_token_and_edit_lines():
    log = (DATA / "aider-whole.log").read_text()
    reply = final_message("text", log)  # told by its banner, whatever format the agent type names
    assert reply == "I will create hello.txt.\n\nhello.txt\n\n```\nhello\n\n```"
    assert "Tokens:" not in reply and "Aider v" not in reply and "Applied edit" not in reply


def test_aiders_last_reply_is_the_one_after_the_previous_usage_line():
    log = "Aider v0.86.1\nMain model: x\n\nfirst answer\nTokens: 1 sent, 2 received.\nsecond answer\nTokens: 3 sent.\n"
    assert aider_reply(log) == "second answer"


def test_a_plain_text_agents_result_is_its_output_whole_or_its_end_never_cut_inside_a_line():
    assert final_message("text", "step one\nall done\n") == "step one\nall done"
    long = "".join(f"line {i:06d}\n" for i in range(5000))
    result = final_message("text", long)
    assert len(result) <= TEXT_RESULT_CHARS and result.startswith("line ") and result.endswith("line 004999")
    assert all(len(line) == len("line 000000") for line in result.splitlines())


@given(st.text(alphabet="ab \n", max_size=300), st.integers(min_value=1, max_value=50))
def test_last_lines_fits_and_starts_at_a_line(text, limit):
    kept = last_lines(text, limit)
    assert len(kept) <= max(limit, 1) and text.strip().endswith(kept.lstrip("…"))
    whole = text.strip()
    if len(whole) > limit and "\n" in whole[-limit:]:
        assert whole[: len(whole) - len(kept)].endswith("\n")


def test_an_agents_result_is_its_reports_final_message_else_its_output():
    agent = Agent("a", "s", "claude", ["claude"], AgentStatus.COMPLETED, output_tail="…raw tail\n")
    assert result_of(agent) == "…raw tail"
    agent.report = {"final_message": "The plan:\n1. x"}
    assert result_of(agent) == "The plan:\n1. x"


def test_a_real_claude_code_log_reads_as_text_tool_calls_folded_results_and_tokens():
    assert rendered((DATA / "claude-stream.jsonl").read_text()) == [
        "· claude code 2.1.330 started in /tmp/claude-t31pd337/repo (model claude-opus-5-5; MCP: taskgate connected)",
        "→ Bash printf hello > hello.txt",
        "  ← (Bash completed with no output)",
        '→ Bash git add hello.txt && git commit -m "feat: hello"',
        "  ← [master (root-commit) afd5499] feat: hello … 2 more lines",
        "→ mcp__taskgate__save_output notes.md",
        '  ← {"result":"saved notes.md (20 chars)"}',
        "done",
        "✓ done · 4 turns, 400 in / 80 out tokens, $0.0032",
    ]


def test_a_real_codex_log_reads_as_commands_with_their_exit_results_folded_and_tokens():
    assert rendered((DATA / "codex-exec.jsonl").read_text()) == [
        "· codex started (thread 01a20b10)",
        "! Model metadata for `gpt-5` not found. Defaulting to fallback metadata; this can degrade performance and "
        "cause issues.",
        "$ printf hello > hello.txt",
        "  ← (no output) (exit 0)",
        '$ git add hello.txt && git commit -m "feat: hello"',
        "  ← [master (root-commit) 30d3182] feat: hello … 2 more lines (exit 0)",
        "→ taskgate.save_output notes.md",
        "  ← saved notes.md (20 chars)",
        "done",
        "· tokens: 400 in / 80 out",
    ]


def test_a_real_aider_log_and_stderr_lines_are_kept_as_written():
    log = (DATA / "aider-whole.log").read_text()
    assert rendered(log) == log.splitlines()


def test_fed_in_pieces_a_log_renders_as_it_does_whole():
    text = (DATA / "claude-stream.jsonl").read_text() + "a last line without newline"
    transcript = Transcript()
    pieces = [text[i : i + 97] for i in range(0, len(text), 97)]
    lines = [line for piece in pieces for line in transcript.feed(piece)] + transcript.end()
    assert lines == rendered(text) and lines[-1] == "a last line without newline"


def test_a_codex_command_started_and_ended_is_shown_once_with_its_failure():
    start = {
        "type": "item.started",
        "item": {"id": "i1", "type": "command_execution", "command": "/bin/bash -lc 'make'"},
    }
    item = {"id": "i1", "type": "command_execution", "command": "/bin/bash -lc 'make'"}
    done = {"type": "item.completed", "item": {**item, "aggregated_output": "error: x\nline 2\n", "exit_code": 2}}
    assert rendered(f"{json.dumps(start)}\n{json.dumps(done)}\n") == ["$ make", "  ✗ error: x … 1 more line (exit 2)"]


def test_malformed_events_are_shown_as_written_never_raised():
    odd = [{"type": "assistant", "message": "not a dict"}, {"type": "item.completed", "item": [1]},
           {"type": "result", "usage": 5, "num_turns": "many"}, {"type": "unknown.kind"}]  # fmt: skip
    lines = rendered("\n".join(json.dumps(e) for e in odd) + "\n{not json\n")
    assert lines[-1] == "{not json" and '{"type": "unknown.kind"}' in lines


def test_fold_keeps_the_first_line_and_counts_the_rest():
    assert fold("first\n\nsecond\nthird") == "first … 2 more lines"
    assert fold("") == "(no output)"
    assert fold("x" * 500, width=10) == "x" * 9 + "…"
