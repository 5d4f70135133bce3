"""parse_report: what Claude Code and Codex say about their own run, read from their JSON event logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskgate.domain.agents.reports import MAX_FINAL_MESSAGE, AgentReport, parse_report

DATA = Path(__file__).resolve().parents[2] / "data" / "agent_output"
FORMATS = ("claude-stream-json", "codex-json", "text")


def lines(*events: object) -> str:
    return "\n".join(e if isinstance(e, str) else json.dumps(e) for e in events) + "\n"


def assistant(message_id: str, *blocks: dict, usage: dict | None = None) -> dict:
    message = {"id": message_id, "role": "assistant", "content": list(blocks), "usage": usage or {}}
    return {"type": "assistant", "message": message}


def test_a_real_claude_code_stream_json_run():
    report = parse_report("claude-stream-json", (DATA / "claude-stream.jsonl").read_text())
    assert report == AgentReport(final_message="done", turns=4, input_tokens=400, output_tokens=80,
                                 cache_read_tokens=0, cost_usd=0.0032, is_error=False, error=None)  # fmt: skip
    assert report.usage() == "4 turns, 400 in / 80 out tokens, $0.0032"


def test_a_real_claude_code_run_cut_off_before_its_result_counts_its_assistant_messages():
    text = (DATA / "claude-stream.jsonl").read_text()
    cut = "\n".join(line for line in text.splitlines() if json.loads(line)["type"] != "result")
    report = parse_report("claude-stream-json", cut)
    assert report is not None
    assert (report.final_message, report.turns, report.input_tokens, report.cost_usd) == ("done", 4, 400, None)
    assert not report.is_error


def test_a_real_codex_exec_json_run():
    report = parse_report("codex-json", (DATA / "codex-exec.jsonl").read_text())
    assert report == AgentReport(final_message="done", turns=1, input_tokens=400, output_tokens=80,
                                 cache_read_tokens=0, cost_usd=None, is_error=False, error=None)  # fmt: skip
    assert report.usage() == "1 turn, 400 in / 80 out tokens"


def test_claude_reports_the_last_result_and_its_usage():
    text = lines(
        "npm WARN something on stderr",
        {"type": "system", "subtype": "init"},
        assistant("m1", {"type": "text", "text": "thinking"}),
        {"type": "result", "subtype": "success", "is_error": False, "num_turns": 7, "result": "All done.\nDetails",
         "total_cost_usd": 0.25, "usage": {"input_tokens": 12, "output_tokens": 34, "cache_read_input_tokens": 56}},
    )  # fmt: skip
    report = parse_report("claude-stream-json", text)
    assert report is not None and report.as_dict() == {
        "final_message": "All done.\nDetails", "turns": 7, "input_tokens": 12, "output_tokens": 34,
        "cache_read_tokens": 56, "cost_usd": 0.25, "is_error": False, "error": None,
    }  # fmt: skip
    assert report.headline() == "All done." and report.usage() == "7 turns, 12 in / 34 out tokens (56 cached), $0.2500"
    assert AgentReport.from_dict(report.as_dict()) == report


@pytest.mark.parametrize(
    ("result", "error"),
    [
        ({"subtype": "success", "is_error": True, "result": "API Error: 500 overloaded"}, "API Error: 500 overloaded"),
        ({"subtype": "error_max_turns", "is_error": True}, "error_max_turns"),
        ({"subtype": "error_during_execution", "errors": ["tool crashed", 3]}, "tool crashed"),
    ],
)
def test_claude_errors_say_what_failed(result, error):
    report = parse_report("claude-stream-json", lines({"type": "result", "num_turns": 2, **result}))
    assert report is not None and report.is_error and report.error == error and report.turns == 2


def test_claude_without_a_result_counts_each_assistant_message_once_and_keeps_its_last_text():
    text = lines(
        assistant("m1", {"type": "text", "text": "first"}, usage={"input_tokens": 10, "output_tokens": 1}),
        assistant("m1", {"type": "tool_use", "name": "Bash"}, usage={"input_tokens": 10, "output_tokens": 5}),
        {"type": "user", "message": {"content": [{"type": "tool_result"}]}},
        assistant("m2", {"type": "text", "text": "second"}, {"type": "text", "text": "third"},
                  usage={"input_tokens": 20, "output_tokens": 7, "cache_read_input_tokens": 4}),
        '{"type":"assistant","message":{"id":"m3","content":[{"type":"te',  # the kill cut the last line
    )  # fmt: skip
    report = parse_report("claude-stream-json", text)
    assert report == AgentReport(final_message="second\nthird", turns=2, input_tokens=30, output_tokens=12,
                                 cache_read_tokens=4)  # fmt: skip


def test_codex_sums_its_turns_and_keeps_the_last_agent_message():
    usage = {"input_tokens": 100, "cached_input_tokens": 40, "output_tokens": 10}
    text = lines(
        {"type": "thread.started", "thread_id": "t"},
        {"type": "item.completed", "item": {"type": "agent_message", "text": "first"}},
        {"type": "turn.completed", "usage": usage},
        {"type": "error", "message": "Reconnecting... 1/5"},
        {"type": "item.completed", "item": {"type": "agent_message", "text": "second"}},
        {"type": "turn.completed", "usage": usage},
    )
    report = parse_report("codex-json", text)
    assert report == AgentReport(final_message="second", turns=2, input_tokens=200, output_tokens=20,
                                 cache_read_tokens=80)  # fmt: skip


@pytest.mark.parametrize(
    ("event", "error"),
    [
        ({"type": "turn.failed", "error": {"message": "unexpected status 401 Unauthorized"}},
         "unexpected status 401 Unauthorized"),
        ({"type": "error", "message": "stream disconnected before completion"},
         "stream disconnected before completion"),
    ],
)  # fmt: skip
def test_codex_failures_after_the_last_completed_turn_are_its_error(event, error):
    text = lines({"type": "thread.started"}, {"type": "turn.started"}, event)
    report = parse_report("codex-json", text)
    assert report is not None and report.is_error and report.error == error


def test_text_and_logs_without_events_report_nothing():
    assert parse_report("text", (DATA / "claude-stream.jsonl").read_text()) is None
    assert parse_report("claude-stream-json", "claude: command not found\n") is None
    assert parse_report("codex-json", lines({"type": "result"}, "[1, 2]", "{}", "")) is None
    assert parse_report("claude-stream-json", lines({"type": "system", "subtype": "init"})) is None


def test_fields_of_the_wrong_type_count_as_absent_and_long_messages_are_cut():
    text = lines({"type": "result", "num_turns": "many", "result": "x" * (MAX_FINAL_MESSAGE + 5), "is_error": "yes",
                  "total_cost_usd": "free", "usage": [1, 2]})  # fmt: skip
    report = parse_report("claude-stream-json", text)
    assert report is not None and len(report.final_message) == MAX_FINAL_MESSAGE
    assert (report.turns, report.input_tokens, report.cost_usd, report.is_error) == (0, 0, None, False)
    assert AgentReport.from_dict("not a report") is None


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
_typed_event = st.fixed_dictionaries(
    {"type": st.sampled_from(["result", "assistant", "item.completed", "turn.completed", "turn.failed", "error"])},
    optional={key: _json for key in ("result", "num_turns", "usage", "message", "item", "is_error", "error",
                                     "total_cost_usd", "subtype", "errors")},
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(), st.sampled_from(FORMATS))
def test_arbitrary_text_never_raises(text, output_format):
    report = parse_report(output_format, text)
    assert report is None or isinstance(report, AgentReport)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_typed_event | _json, max_size=8), st.sampled_from(FORMATS))
def test_arbitrary_json_events_never_raise_and_report_plain_values(events, output_format):
    report = parse_report(output_format, "\n".join(json.dumps(e) for e in events))
    if report is not None:
        data = report.as_dict()
        assert json.loads(json.dumps(data, allow_nan=False)) == data  # storable as JSON as it is
        assert min(report.turns, report.input_tokens, report.output_tokens, report.cache_read_tokens) >= 0
