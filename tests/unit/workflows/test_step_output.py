"""A step's output is its agents' results whole (their final messages, never the raw tail of a log), and the
context keeps it whole up to OUTPUT_LIMIT, else cut at a line with a note."""

from __future__ import annotations

from taskgate.application.workflows.passes import agents_outcome
from taskgate.domain.entities import Agent, AgentStatus, StepStatus
from taskgate.domain.workflows.definitions import ParallelAgent, Step, StepType
from taskgate.domain.workflows.run import OUTPUT_LIMIT, add_usage, clip

RAW = '{"type":"result","result":"the plan"...truncated raw stream-json tail f4-bd8a-7daff3897c56"}'


def agent(kind: str, final: str | None, status: AgentStatus = AgentStatus.COMPLETED) -> Agent:
    report = None if final is None else {"final_message": final, "turns": 2}
    return Agent(f"id-{kind}", "s", kind, [kind], status, output_tail=RAW, report=report)


def test_an_agent_steps_output_is_the_agents_final_message_whole():
    plan = "# Plan\n" + "\n".join(f"{i}. change file_{i}.py" for i in range(400))
    status, output = agents_outcome(Step("plan", StepType.agent, agent="coder"), [agent("coder", plan)])
    assert (status, output) == (StepStatus.SUCCEEDED, plan)


def test_without_a_final_message_the_output_is_what_the_agent_printed_last():
    _, output = agents_outcome(Step("plan", StepType.agent, agent="coder"), [agent("coder", None)])
    assert output == RAW


def test_a_parallel_steps_output_holds_each_agents_whole_result_under_its_name():
    step = Step("validate", StepType.parallel, agents=(ParallelAgent("tester"), ParallelAgent("reviewer")))
    status, output = agents_outcome(step, [agent("tester", "all 12 tests pass\nnone skipped"),
                                           agent("reviewer", "looks good", AgentStatus.FAILED)])  # fmt: skip
    assert status is StepStatus.FAILED
    assert "[tester] completed:\nall 12 tests pass\nnone skipped" in output
    assert "[reviewer] failed:\nlooks good" in output


def test_clip_keeps_an_output_whole_when_it_fits_else_its_start_cut_at_a_line_with_a_note():
    assert clip("short\noutput") == "short\noutput"
    long = "".join(f"line {i:06d}\n" for i in range(OUTPUT_LIMIT // 5))
    clipped = clip(long)
    body, note = clipped.rsplit("\n", 1)
    assert len(clipped) <= OUTPUT_LIMIT and long.startswith(body + "\n")
    assert note.startswith("[… ") and "taskgate session output" in note


def test_a_report_without_usage_adds_nothing_to_a_frames_usage():
    assert add_usage({}, {"final_message": "hi", "turns": 0, "input_tokens": 0, "cost_usd": None}) == {}
    assert add_usage({"turns": 1}, {"turns": 2, "input_tokens": 5}) == {"turns": 3, "input_tokens": 5}
