"""Workflow triggers and task labels (domain/workflows/triggers.py), and what the catalogue makes of them: which
workflow a ready task gets, triggers two workflows declare, a project workflow's trigger over a built-in one's, and
copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskgate.application.trackers.builtin import AddTask
from taskgate.application.workflows.library import WorkflowService
from taskgate.domain.errors import InvalidInput
from taskgate.domain.workflows.triggers import (
    Declared,
    Route,
    check_labels,
    resolve_routes,
    trigger_problem,
    usable_labels,
)
from taskgate.infrastructure.workflow_files import LayeredCatalogue, WorkflowFiles


@pytest.mark.parametrize("trigger", ["manual", "task_ready", "label:bug", "label:area/ui", "label:v1.2_rc-3"])
def test_the_valid_forms(trigger):
    assert trigger_problem(trigger) is None


@pytest.mark.parametrize(
    ("trigger", "message"),
    [
        ("nightly", "'nightly' is not a trigger"),
        ("Task_Ready", "'Task_Ready' is not a trigger"),
        ("label:", "label '' is invalid"),
        ("label:needs review", "label 'needs review' is invalid"),
        ("label:-bug", "label '-bug' is invalid"),
        (42, "must be a non-empty text, not 42"),
        ("  ", "must be a non-empty text"),
    ],
)
def test_anything_else_is_refused_with_the_valid_forms_as_hint(trigger, message):
    problem = trigger_problem(trigger)
    assert problem is not None and message in problem[0]
    assert "manual" in problem[1] or "label:bug" in problem[1]


def test_task_labels_follow_one_rule_and_an_external_trackers_others_are_dropped():
    assert check_labels(["bug", "ui", "bug"]) == ("bug", "ui")
    with pytest.raises(InvalidInput, match="label 'needs review' is invalid"):
        check_labels(["needs review"])
    with pytest.raises(InvalidInput, match="at most 20 labels"):
        check_labels([f"l{i}" for i in range(21)])
    with pytest.raises(InvalidInput, match="label 'a b' is invalid"):
        AddTask(1, "t", labels=["a b"])
    assert AddTask(1, "t", labels=["bug", "bug"]).labels == ("bug",)
    assert usable_labels(["bug", "needs review", 7, "ui", "bug"]) == ("bug", "ui")


def test_a_label_trigger_beats_task_ready_and_the_tasks_first_matching_label_decides():
    routes = resolve_routes([
        Declared("feature", ["manual", "task_ready"]),
        Declared("bug-fix", ["label:bug"]),
        Declared("security", ["label:security", "manual"]),
        Declared("by-hand", ["manual"]),
    ])  # fmt: skip
    assert dict(routes.workflows) == {"label:bug": "bug-fix", "label:security": "security", "task_ready": "feature"}
    assert routes.route([]) == Route("feature", "task_ready")
    assert routes.route(["ui"]) == Route("feature", "task_ready")
    assert routes.route(["ui", "bug"]) == Route("bug-fix", "label:bug")
    assert routes.route(["security", "bug"]) == Route("security", "label:security")
    assert routes.route(["bug", "security"]) == Route("bug-fix", "label:bug")
    assert not resolve_routes([Declared("by-hand", ["manual"])])  # nothing that starts sessions
    assert resolve_routes([Declared("by-hand", ["manual"])]).route(["bug"]) is None


def test_a_project_workflows_trigger_replaces_a_built_in_ones_and_two_of_one_layer_contest_it():
    routes = resolve_routes([
        Declared("feature-development", ["task_ready"], own=False),
        Declared("bug-fix", ["label:bug"], own=False),
        Declared("ours", ["task_ready"]),
        Declared("triage", ["label:bug"]),
        Declared("also-triage", ["label:bug"]),
    ])  # fmt: skip
    assert dict(routes.workflows) == {"task_ready": "ours"}
    assert dict(routes.replaced) == {"task_ready": ("feature-development",), "label:bug": ("bug-fix",)}
    assert dict(routes.contested) == {"label:bug": ("also-triage", "triage")}
    left_alone = routes.route(["bug"])
    assert isinstance(left_alone, str) and "declared by several workflows (also-triage, triage)" in left_alone
    assert routes.route(["ui"]) == Route("ours", "task_ready")  # a task the contested trigger does not decide


def flow(ident: str, triggers: str) -> str:
    steps = "steps:\n  - id: s\n    type: approval\n    message: ok?\n"
    return f"id: {ident}\ndescription: d\ntriggers: {triggers}\n{steps}"


def layered(tmp_path: Path, project: dict[str, str]) -> WorkflowService:
    """The shipped catalogue (feature-development: task_ready, bug-fix: label:bug) under a project's own files."""
    (tmp_path / "workflows" / "dev").mkdir(parents=True, exist_ok=True)
    for name, text in project.items():
        (tmp_path / "workflows" / "dev" / name).write_text(text)
    return WorkflowService(LayeredCatalogue(tmp_path))


def test_the_shipped_catalogue_routes_task_ready_to_feature_development_and_bugs_to_bug_fix(tmp_path):
    routes = layered(tmp_path, {}).trigger_routes()
    assert dict(routes.workflows) == {"label:bug": "bug-fix", "task_ready": "feature-development"}
    assert not routes.contested and not routes.replaced


def test_the_catalogue_reports_a_contested_trigger_at_each_trigger_line_naming_the_other(tmp_path):
    service = layered(tmp_path, {
        "a.yaml": flow("a", "[task_ready]"),
        "b.yaml": "id: b\ndescription: d\ntriggers:\n  - manual\n  - task_ready\nsteps:\n  - id: s\n"
                  "    type: approval\n    message: ok?\n",
    })  # fmt: skip
    problems = service.catalogue().problems
    assert [(Path(p.file).name, p.line) for p in problems] == [("a.yaml", 3), ("b.yaml", 5)]
    assert "trigger 'task_ready' is also declared by workflow 'b'" in problems[0].message
    assert "a ready task would match both" in problems[0].hint
    assert [p.line for p in service.validate([Path(problems[1].file)]).problems] == [5]  # a file given alone
    assert {"a", "b", "feature-development"} <= set(service.catalogue().workflows)  # all still run by hand
    routes = service.trigger_routes()
    assert dict(routes.contested) == {"task_ready": ("a", "b")} and routes.workflows["label:bug"] == "bug-fix"


def test_a_project_workflow_takes_a_trigger_over_from_the_built_in_one_without_a_problem(tmp_path):
    service = layered(tmp_path, {"ours.yaml": flow("ours", "[task_ready]")})
    assert service.catalogue().problems == ()
    routes = service.trigger_routes()
    assert routes.workflows["task_ready"] == "ours" and dict(routes.replaced) == {
        "task_ready": ("feature-development",)}  # fmt: skip


@pytest.mark.parametrize(
    ("triggers", "kept"),
    [
        ('[manual, "label:bug", task_ready]', ["manual"]),
        ("\n  - manual\n  - task_ready", ["manual"]),
        ("\n  - label:bug", []),
    ],
)
def test_a_copy_of_a_workflow_starts_by_hand_without_the_triggers_that_start_sessions(tmp_path, triggers, kept):
    (tmp_path / "workflows" / "dev").mkdir(parents=True)
    (tmp_path / "workflows" / "dev" / "fix.yaml").write_text(flow("fix", triggers))
    service = WorkflowService(WorkflowFiles(tmp_path))
    created = service.create("my-fix", "fix", "ops")
    assert created.problems == () and set(created.dropped_triggers) <= {"task_ready", "label:bug"}
    assert created.dropped_triggers
    assert list(service.workflow("my-fix").triggers) == kept
    assert service.catalogue().ok  # no contest with the original
