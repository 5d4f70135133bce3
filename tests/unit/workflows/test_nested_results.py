"""What a nested workflow or group hands the step that ran it: usage summed, files changed, children, summary."""

from __future__ import annotations

from taskgate.domain.entities import StepStatus
from taskgate.domain.workflows.definitions import Step, StepType
from taskgate.domain.workflows.run import Frame, FrameKind, add_usage, changed_files, nested_result, record


def test_usage_sums_what_agents_report_and_ignores_what_they_do_not():
    total = add_usage({}, {"turns": 3, "input_tokens": 100, "output_tokens": 20, "cost_usd": 0.5, "is_error": False})
    total = add_usage(total, {"turns": 1, "input_tokens": 10, "output_tokens": 2, "cost_usd": None})  # Codex: no cost
    total = add_usage(total, None)
    assert total == {"turns": 4, "input_tokens": 110, "output_tokens": 22, "cost_usd": 0.5}
    assert add_usage({}, {"turns": True}) == {}  # a boolean is not a count


def test_files_changed_are_the_paths_whose_state_differs_between_snapshots():
    before = {"a.py": "3/1", "b.py": "dirty", "gone.py": "1/0"}
    after = {"a.py": "3/1", "b.py": "5/0", "new.py": "untracked"}
    assert changed_files(before, after) == ["b.py", "gone.py", "new.py"]
    assert changed_files(None, after) is None and changed_files(before, None) is None


def test_the_structured_result_lists_children_with_their_status_and_the_summary():
    child = Frame(FrameKind.workflow, "inner", workflow="inner", usage={"turns": 2})
    record(child, "build", StepStatus.SUCCEEDED, "x" * 900, 2)
    record(child, "gate", StepStatus.REJECTED, "not yet", 1)
    steps = (Step("build", StepType.agent), Step("gate", StepType.approval))
    result = nested_result(child, steps, StepStatus.FAILED, ["src/a.py"])
    assert result["success"] is False and result["files_changed"] == ["src/a.py"] and result["usage"] == {"turns": 2}
    assert result["children"]["build"] == {"status": "succeeded", "output": "x" * 500, "attempts": 2, "success": True}
    assert result["children"]["gate"]["success"] is False
    assert result["summary"].splitlines() == [f"- build: succeeded: {'x' * 300}", "- gate: rejected: not yet"]


def test_conditions_read_a_runs_context_keys_and_the_frames_variables_as_context():
    from taskgate.domain.workflows.expressions import parse_condition
    from taskgate.domain.workflows.run import frame_context

    frame = Frame(FrameKind.workflow, "w", variables={"context.area": "api", "target": "src"})
    facts = frame_context(frame, {"title": "t"}, {"id": "s"})
    assert parse_condition('context.area == "api" and context.target == "src"').evaluate(facts) is True
