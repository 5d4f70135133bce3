"""OpenAgents-style workflow files read as taskgate workflows (domain/workflows/openagents.py) and `visible_to`
(domain/workflows/visibility.py): the fixtures in the shapes of OpenAgents' examples validate, each key is mapped
as docs/workflows.md says, the format is recognised only where taskgate's own would be an error, and unknown keys
still get their did-you-mean hints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from taskgate.application.workflows.library import WorkflowService
from taskgate.domain.errors import Forbidden
from taskgate.domain.workflows.definitions import END
from taskgate.domain.workflows.openagents import DEFAULT_AGENT_PROMPT
from taskgate.domain.workflows.validation import validate_documents
from taskgate.domain.workflows.visibility import Viewer, allows, check_visible
from taskgate.infrastructure.workflow_files import WorkflowFiles, parse_text

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "workflows"
OPENAGENTS_AGENTS = {"plan", "build", "test", "review", "researcher", "reviewer"}


def catalogue_of(tmp_path: Path, agents=OPENAGENTS_AGENTS) -> WorkflowService:
    """The OpenAgents fixtures under workflows/openagents/, the Vibe ones under workflows/vibe/ and checklists/."""
    shutil.copytree(FIXTURES / "openagents", tmp_path / "workflows" / "openagents")
    shutil.copytree(FIXTURES / "vibe" / "workflows", tmp_path / "workflows" / "vibe")
    shutil.copytree(FIXTURES / "vibe" / "checklists", tmp_path / "checklists")
    return WorkflowService(WorkflowFiles(tmp_path), agents)


def problems_of(text: str, file: str = "w.json", agents=None) -> list[str]:
    doc, problems = parse_text(text, file, is_json=file.endswith(".json"))
    assert doc is not None, problems
    return [f"{p.line}: {p.message} (hint: {p.hint})" for p in validate_documents([doc], agents).problems]


def workflow_of(text: str, file: str = "w.json"):
    doc, problems = parse_text(text, file, is_json=file.endswith(".json"))
    assert doc is not None, problems
    checked = validate_documents([doc])
    assert checked.ok, [str(p) for p in checked.problems]
    [workflow] = checked.workflows.values()
    return workflow


def test_every_fixture_validates_and_the_openagents_ones_are_read_in_their_format(tmp_path: Path):
    catalogue = catalogue_of(tmp_path).catalogue()
    assert catalogue.problems == ()
    assert {w.id: w.format for w in catalogue.workflows.values()} == {
        "quick-plan": "openagents", "feature-flow": "openagents", "study-code": "openagents",
        "careful-refactor": "openagents", "gated-feature": "openagents", "resilient-change": "openagents",
        "criteria-feature": "taskgate",
    }  # fmt: skip
    assert list(catalogue.checklists) == ["acceptance-criteria"]
    why = {n.file.rsplit("/", 1)[1]: n.message for n in catalogue.notes if n.message.startswith("read as")}
    assert why["feature.json"] == "read as an OpenAgents-style workflow: a JSON file where the workflow has " \
        "'max_duration_ms'"  # fmt: skip
    assert "'context'" in why["gated-feature.json"] and "'initial_context'" in why["resilient.json"]
    assert len(why) == 6  # one per OpenAgents file, none for the YAML workflow


def test_the_feature_example_maps_duration_retries_prompts_and_routes(tmp_path: Path):
    workflow = catalogue_of(tmp_path).workflow("feature-flow")
    assert (workflow.max_iterations, workflow.max_duration_s) == (10, 600.0)
    outline, implement, check = workflow.steps
    assert [s.agent for s in workflow.steps] == ["plan", "build", "test"]
    assert implement.max_retries == 1  # "max_retries": 2 is two attempts in OpenAgents: one retry here
    assert (implement.input, check.input) == ("outline", "implement")
    assert outline.prompt == DEFAULT_AGENT_PROMPT and "{{task.title}}" in outline.prompt
    assert (outline.next, implement.next, check.next) == ("implement", "check", None)
    assert (outline.timeout_ms, implement.timeout_ms) == (120000, 300000)


def test_a_step_without_next_ends_the_workflow_instead_of_running_the_error_handler_after_it(tmp_path: Path):
    steps = {s.id: s for s in catalogue_of(tmp_path).workflow("careful-refactor").steps}
    assert steps["inspect"].next == END  # OpenAgents ends there; the handler below it runs only on an error
    assert steps["recover"].next is None  # the last step ends the workflow anyway
    assert {s.on_error for s in steps.values() if s.id != "recover"} == {"recover"}
    resilient = {s.id: s for s in catalogue_of(tmp_path / "r").workflow("resilient-change").steps}
    assert resilient["check"].next == END and resilient["check"].max_retries == 1
    assert resilient["outline"].agent == "plan" and resilient["outline"].type.value == "agent"  # no "type" given


def test_context_becomes_variables_and_the_default_prompt_lists_them(tmp_path: Path):
    workflow = catalogue_of(tmp_path).workflow("gated-feature")
    assert dict(workflow.variables) == {"area": "the payment module", "max_files": "5"}
    assert workflow.visible_to == ("plan", "build")
    steps = {s.id: s for s in workflow.steps}
    assert steps["outline"].prompt == f"{DEFAULT_AGENT_PROMPT}\n\nContext:\n- area: {{{{area}}}}\n- max_files: " \
        "{{max_files}}"  # fmt: skip
    assert steps["implement"].prompt.startswith("Implement {{task.title}} in {{area}}")  # its own prompt stays
    assert (steps["test"].max_retries, steps["test"].retry_delay_ms) == (2, 500)  # retry_delay: the old name
    assert steps["outline"].on_success == "approve-outline" and steps["approve-outline"].on_approve == "implement"
    nested = workflow_of('{"id": "w", "description": "d", "context": {"flags": {"a": true}, "on": false},'
                         ' "steps": [{"id": "s", "agent": "x"}]}')  # fmt: skip
    assert dict(nested.variables) == {"flags": '{"a": true}', "on": "false"}


def test_notes_say_what_was_mapped_and_point_at_the_lines(tmp_path: Path):
    notes = [n for n in catalogue_of(tmp_path).catalogue().notes if n.file.endswith("gated-feature.json")]
    by_text = {n.message: (n.line, n.hint) for n in notes}
    assert by_text["step 'test': 'retry_delay' is a deprecated name of 'retry_delay_ms' (the first retry's wait in "
                   "milliseconds)"] == (32, "rename it to retry_delay_ms")  # fmt: skip
    assert by_text["step 'test': max_retries 3 counts attempts in OpenAgents: 2 retries after the first attempt"][0] \
        == 36  # fmt: skip
    assert any(m.startswith("agent step(s) outline, test, review give no prompt") for m in by_text)
    ignored = [n for n in catalogue_of(tmp_path / "r").catalogue().notes if "ignored" in n.message]
    assert [(n.message, n.line) for n in ignored] == [
        ("'debug' is ignored: every step run is recorded anyway (`taskgate workflow steps`)", 5)
    ]


def test_yaml_needs_format_openagents_and_json_is_sniffed_only_on_markers():
    bare = "id: w\ndescription: d\nsteps:\n  - id: s\n    type: agent\n    agent: x\n"
    assert problems_of(bare, "w.yaml") == ["4: agent step 's': 'prompt' is missing (hint: add 'prompt: …')"]
    assert workflow_of(bare + "format: openagents\n", "w.yaml").format == "openagents"
    ours = {"id": "w", "description": "d", "steps": [
        {"id": "a", "type": "agent", "agent": "x", "prompt": "p", "max_retries": 2, "on_error": "b"},
        {"id": "b", "type": "agent", "agent": "x", "prompt": "p"}]}  # fmt: skip
    workflow = workflow_of(json.dumps(ours))  # JSON in taskgate's own terms: read as before
    assert workflow.format == "taskgate" and workflow.steps[0].max_retries == 2 and workflow.steps[0].next is None
    explicit = workflow_of(json.dumps({**ours, "format": "openagents"}))
    assert explicit.steps[0].max_retries == 1 and explicit.steps[0].next == END
    assert not any(n.message.startswith("read as") for n in explicit.notes)  # it said so itself
    forced = problems_of(json.dumps({**ours, "format": "taskgate", "max_duration_ms": 1000}))
    assert forced == ["1: workflow: unknown key 'max_duration_ms' (hint: did you mean 'max_duration'?)"]
    assert problems_of(json.dumps({**ours, "format": "openagent"})) == [
        "1: unknown format 'openagent' (hint: did you mean 'openagents'?)"
    ]


def test_unknown_keys_and_conflicts_of_an_openagents_file_are_problems_with_hints():
    text = """{
  "id": "w", "description": "d", "max_duration_ms": 60000,
  "steps": [
    {"id": "a", "agent": "x", "max_retries": 2, "retry_delay": 100, "retry_delay_ms": 200},
    {"id": "b", "agent": "x", "retry_dela": 5},
    {"id": "c", "type": "transform", "transform": "a.files"},
    {"id": "d", "type": "condition", "condition": "a.passed === true", "then": "a"}
  ]
}"""
    assert problems_of(text) == [
        "4: both 'retry_delay' and 'retry_delay_ms' are given (hint: keep 'retry_delay_ms' only)",
        "5: agent step 'b': unknown key 'retry_dela' (hint: did you mean 'retry_delay_ms'?)",
        "6: step 'c': unknown type 'transform' (hint: use one of agent, approval, parallel, condition, checklist, "
        "workflow, group)",
        "7: step 'd': invalid condition at column 12: unexpected character '=': use '==' to compare (hint: see "
        "docs/workflows.md for the condition language)",
    ]
    assert problems_of(
        '{"id": "w", "description": "d", "max_duration_ms": "10m", "steps": [{"id": "a", "agent": "x"}]}'
    ) == [
        "1: 'max_duration_ms' must be a whole number above 0, not '10m' (hint: write the workflow's time limit in "
        "milliseconds, e.g. 600000)"
    ]


def test_visible_to_entries_are_checked_against_the_agent_types():
    base = '{"id": "w", "description": "d", "format": "openagents", "steps": [{"id": "a", "agent": "plan"}], '
    assert problems_of(base + '"visible_to": ["plan", "bild", "operator:alice", "*"]}', agents={"plan", "build"}) == [
        "1: visible_to entry 2: unknown agent type 'bild' (hint: did you mean 'build'?)"
    ]
    assert problems_of(base + '"visible_to": []}') == [
        "1: 'visible_to' is empty: nobody could run the workflow (hint: list who may ('*', agent types, "
        "'operator:<id>'), or remove the key)"
    ]
    assert problems_of(base + '"visible_to": ["operator:", "two words"]}')[0].startswith(
        "1: visible_to entry 1: 'operator:' names nobody"
    )
    assert problems_of(base + '"visible_to": "plan"}') == [
        "1: 'visible_to' must be a list, not str (hint: write each entry of 'visible_to' on its own '- ' line)"
    ]


@pytest.mark.parametrize(
    ("visible_to", "viewer", "allowed"),
    [
        ((), Viewer.agent(None), True),
        (("*",), Viewer.agent(None), True),
        (("plan", "build"), Viewer.operator("alice"), True),  # names no operator: operators are not filtered
        (("plan", "build"), Viewer.agent("plan"), True),
        (("plan", "build"), Viewer.agent("test"), False),
        (("plan",), Viewer.agent(None), False),  # a session token belongs to no agent type
        (("agent:plan",), Viewer.agent("plan"), True),
        (("agent:*",), Viewer.agent(None), True),
        (("agent:*",), Viewer.operator("alice"), True),
        (("operator:bob",), Viewer.operator("alice"), False),
        (("operator:bob",), Viewer.operator("bob"), True),
        (("operator:bob",), Viewer.agent("plan"), False),
        (("operator:*", "plan"), Viewer.operator("alice"), True),
        (("operator:bob", "plan"), Viewer.agent("plan"), True),
        (("operator:bob",), None, True),  # the system (a nested workflow step) is never filtered
    ],
)
def test_who_visible_to_admits(visible_to, viewer, allowed):
    assert allows(visible_to, viewer) is allowed


def test_a_refusal_names_the_list_and_the_caller():
    with pytest.raises(Forbidden) as refused:
        check_visible("deploy", ("operator:bob", "build"), Viewer.agent("plan"))
    assert str(refused.value).startswith("workflow 'deploy' is visible_to [operator:bob, build] only, not to an "
                                         "agent of type plan")  # fmt: skip
    assert "not to operator:alice" in _refusal(("operator:bob",), Viewer.operator("alice"))
    assert "an agent token that names no agent type" in _refusal(("plan",), Viewer.agent(None))


def _refusal(visible_to, viewer) -> str:
    with pytest.raises(Forbidden) as refused:
        check_visible("w", visible_to, viewer)
    return str(refused.value)


def test_the_catalogue_entries_carry_visible_to(tmp_path: Path):
    entries = {e.id: e for e in catalogue_of(tmp_path).entries()}
    assert entries["gated-feature"].visible_to == ("plan", "build") and entries["feature-flow"].visible_to == ()
