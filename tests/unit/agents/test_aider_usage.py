"""aider's usage, read from its plain output (`output_format = "aider"`): its `Tokens: … Cost: …` lines."""

from __future__ import annotations

from pathlib import Path

from taskgate.domain.agents.reports import AgentReport, parse_report

DATA = Path(__file__).resolve().parents[2] / "data" / "agent_output"


def test_a_real_aider_run_reports_its_one_turn_its_tokens_and_its_cost():
    report = parse_report("aider", (DATA / "aider.txt").read_text())  # aider 0.86.1, the e2e test's run
    assert report == AgentReport(turns=1, input_tokens=100, output_tokens=20, cost_usd=0.00045)
    assert report.usage() == "1 turn, 100 in / 20 out tokens, $0.0004"


def test_several_replies_sum_their_tokens_and_keep_the_last_session_cost():
    text = (
        "Tokens: 2.4k sent, 1.1k cache write, 300 cache hit, 25 received. Cost: $0.0012 message, $0.0012 session.\n"
        "Applied edit to app.py\n"
        "Tokens: 12k sent, 3 received. Cost: $0.03 message, $0.0312 session.\n"
    )
    report = parse_report("aider", text)
    assert report == AgentReport(turns=2, input_tokens=14_400, output_tokens=28, cache_read_tokens=300,
                                 cost_usd=0.0312)  # fmt: skip


def test_a_model_aider_has_no_price_for_reports_tokens_without_a_cost():
    report = parse_report("aider", "Tokens: 150 sent, 30 received.\n")
    assert report is not None and (report.turns, report.input_tokens, report.cost_usd) == (1, 150, None)


def test_output_with_no_usage_line_reports_nothing():
    assert parse_report("aider", "Aider v0.86.1\nMain model: gpt-4o\nTokens: are fun\n") is None
    assert parse_report("aider", "") is None
