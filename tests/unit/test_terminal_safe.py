"""Agent output reaches the operator's terminal without anything a terminal acts on (render.terminal_safe), also
when it is read in pieces that cut escape sequences and UTF-8 characters (render.TerminalSafeStream); the agent
lines of `session status` and `session review` show what the CLI reported."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from taskgate.domain.entities import Agent, AgentStatus
from taskgate.entrypoints.agent_lines import agent_line, agents_table, last_line_read, report_cell
from taskgate.entrypoints.render import TerminalSafeStream, terminal_safe

NASTY = (
    "\x1b[31mred\x1b[0m \x1b[2J\x1b[H"  # colour, clear screen, cursor home
    "\x1b]0;owned title\x07\x1b]52;c;ZWNobyBvd25lZA==\x1b\\"  # window title (BEL), clipboard write (ST)
    "\x1bPq#0;2;0;0;0\x1b\\\x1b(B\x1bc"  # DCS (sixel), charset, full reset
    "bell\x07 back\x08space \rcarriage \x9b31mC1-CSI\x00\x7f\n\tok ✓"
)
CLEAN = "red bell backspace carriage 31mC1-CSI\n\tok ✓"


def test_escape_sequences_and_control_characters_are_dropped_newlines_and_tabs_stay():
    assert terminal_safe(NASTY) == CLEAN
    assert terminal_safe("plain [red]markup[/red] stays\n") == "plain [red]markup[/red] stays\n"


def test_pieces_cut_anywhere_come_out_as_the_whole_would():
    data = NASTY.encode()
    for cut in range(len(data) + 1):
        stream = TerminalSafeStream()
        out = stream.feed(data[:cut]) + stream.feed(data[cut:]) + stream.feed(b"", final=True)
        assert out == CLEAN, cut


def test_an_escape_that_never_ends_is_not_held_forever():
    stream = TerminalSafeStream()
    first = stream.feed(b"before \x1b]0;" + b"x" * 10_000)
    assert first.startswith("before 0;xxx")  # past the hold limit it is printed, without its escape
    assert stream.feed(b"\nafter\n") == "\nafter\n"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(min_value=0, max_value=300), max_size=5))
def test_nothing_a_terminal_acts_on_ever_comes_out(data, cuts):
    stream, out, last = TerminalSafeStream(), [], 0
    for cut in sorted(cuts):
        out.append(stream.feed(data[last:cut]))
        last = max(last, cut)
    out.append(stream.feed(data[last:], final=True))
    text = "".join(out)
    assert not any((ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in text)


def agent(**fields) -> Agent:
    return Agent(id="1a2b3c4d-0000", session_id="s", agent_type="claude", command=["claude"], **fields)


def test_agent_lines_and_cells_show_the_report():
    report = {"final_message": "Added /health\nand its test", "turns": 4, "input_tokens": 400, "output_tokens": 80,
              "cache_read_tokens": 0, "cost_usd": 0.0032, "is_error": False, "error": None}  # fmt: skip
    done = agent(status=AgentStatus.COMPLETED, report=report)
    assert agent_line(done) == (
        "agent 1a2b3c4d claude (run 1) completed: Added /health (4 turns, 400 in / 80 out tokens, $0.0032)"
    )
    assert report_cell(done) == "4 / 400 in, 80 out / $0.0032"
    failed = agent(status=AgentStatus.FAILED, error="exited with 1: API Error: 500\x1b[2J", report={
        **report, "is_error": True, "error": "API Error: 500", "cost_usd": None})  # fmt: skip
    assert agent_line(failed).startswith("agent 1a2b3c4d claude (run 1) failed: exited with 1: API Error: 500 (4 turns")
    assert report_cell(failed) == "4 / 400 in, 80 out / -"
    plain = agent(status=AgentStatus.RUNNING)
    assert agent_line(plain) == "agent 1a2b3c4d claude (run 1) running" and report_cell(plain) == ""
    assert [c.header for c in agents_table([done, plain]).columns][6] == "turns / tokens / cost"
    stopped = agent(status=AgentStatus.CANCELLED, error="stopped", ended_by="SIGKILL")
    assert agent_line(stopped).endswith("cancelled: stopped (its process group ended by SIGKILL)")


def test_an_agent_that_reported_only_its_result_shows_it_without_counts_and_its_last_line_reads_for_a_person():
    script = agent(status=AgentStatus.COMPLETED, report={"final_message": "wrote work/a.md\n"})
    assert (
        agent_line(script) == "agent 1a2b3c4d claude (run 1) completed: wrote work/a.md" and report_cell(script) == ""
    )
    event = {"type": "item.completed", "item": {"id": "i", "type": "command_execution", "command": "make",
                                                "exit_code": 2, "aggregated_output": "boom\x1b[2J"}}  # fmt: skip
    assert last_line_read(f"plain\n{json.dumps(event)}\n") == "✗ boom (exit 2)"  # not the raw event, no escape
    assert last_line_read("") == ""
