"""Workflow and checklist validation: a corpus of broken files, each with the error it must give (file, line,
message, hint); the shipped catalogue is valid (the "validated in CI" part); routes, cycles, the loader and the
mermaid graph."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from taskgate.application.workflows.library import WorkflowService, retarget
from taskgate.domain.errors import AlreadyExists, InvalidInput
from taskgate.domain.workflows.definitions import (
    END,
    ChecklistNotFound,
    Document,
    StepType,
    WorkflowNotFound,
    changes_target,
    parse_duration,
    retry_delay_ms,
    step_routes,
)
from taskgate.domain.workflows.mermaid import to_mermaid
from taskgate.domain.workflows.validation import validate_documents
from taskgate.infrastructure.workflow_files import WorkflowFiles, parse_text

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "src" / "taskgate" / "catalogue"
BROKEN = ROOT / "tests" / "fixtures" / "workflows" / "broken"
AGENTS = {"coder", "tester", "reviewer"}  # the example agent types of the built-in catalogue
EXPECT = re.compile(r"^# expect line (\d+): (.+)$")


def corpus() -> list[Path]:
    return sorted([*BROKEN.glob("*.yaml"), *BROKEN.glob("*.json"), *(BROKEN / "checklists").glob("*.yaml")])


def expectation(path: Path) -> tuple[int, str]:
    sidecar = path.with_name(path.name + ".expect")
    lines = (sidecar if sidecar.exists() else path).read_text().splitlines()
    match = EXPECT.match(lines[0])
    assert match, f"{path.name}: the first line must be '# expect line N: <message>'"
    return int(match[1]), match[2]


def test_the_corpus_has_at_least_forty_broken_files():
    assert len(corpus()) >= 40


@pytest.mark.parametrize("path", corpus(), ids=lambda p: p.relative_to(BROKEN).as_posix())
def test_each_broken_file_gives_its_error_with_file_line_and_hint(path: Path):
    line, message = expectation(path)
    service = WorkflowService(WorkflowFiles(CONFIG), AGENTS)
    problems = service.validate([path]).problems
    assert problems, f"{path.name} should be invalid"
    matching = [p for p in problems if message in p.message]
    assert matching, f"{path.name}: no problem says {message!r}; got:\n" + "\n".join(map(str, problems))
    assert any(p.line == line for p in matching), f"{path.name}: expected line {line}, got {matching}"
    for problem in matching:
        assert Path(problem.file).resolve() == path.resolve()
        assert problem.hint, f"{path.name}: no hint in {problem}"
        assert str(problem).startswith(f"{problem.file}:{problem.line}: ") and "(hint: " in str(problem)


def test_the_shipped_workflows_and_checklists_are_valid_with_the_example_agent_types():
    catalogue = WorkflowService(WorkflowFiles(CONFIG), AGENTS).catalogue()
    assert catalogue.problems == ()
    assert {"feature-development", "bug-fix", "refactor", "comprehensive-test"} <= set(catalogue.workflows)
    assert {"quality-validation", "security-review", "release"} <= set(catalogue.checklists)
    for workflow in catalogue.workflows.values():
        used = {s.agent for s in _all(workflow.steps) if s.agent} | {
            a.agent for s in _all(workflow.steps) for a in s.agents
        }
        assert used <= AGENTS


def test_the_shipped_templates_are_valid():
    files = WorkflowFiles(CONFIG)
    assert set(files.templates()) >= {"basic", "reviewed"}
    documents, _ = files.catalogue()
    for template in files.templates().values():
        doc, problems = files.read(Path(template))
        assert doc is not None and not problems
        assert validate_documents([doc, *documents], AGENTS).problems == ()


def test_the_shipped_workflows_use_every_feature_the_issue_names():
    catalogue = WorkflowService(WorkflowFiles(CONFIG), AGENTS).catalogue()
    feature = catalogue.workflows["feature-development"]
    kinds = [s.type for s in feature.steps]
    assert kinds[:4] == [StepType.agent, StepType.approval, StepType.agent, StepType.parallel]
    assert any(s.type is StepType.parallel for s in catalogue.workflows["refactor"].steps)
    comprehensive = list(_all(catalogue.workflows["comprehensive-test"].steps))
    group = next(s for s in comprehensive if s.type is StepType.group)
    assert group.context_mode is not None and group.summarize
    assert {StepType.condition, StepType.workflow, StepType.checklist} <= {s.type for s in comprehensive}


def _all(steps):
    for step in steps:
        yield step
        yield from _all(step.steps)


# -- the catalogue: files together


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def flow(ident: str, *steps: str) -> str:
    body = "".join(steps) or "  - id: a\n    type: agent\n    agent: coder\n    prompt: p\n"
    return f"id: {ident}\ndescription: d\nsteps:\n{body}"


def nest(step: str, target: str) -> str:
    return f"  - id: {step}\n    type: workflow\n    workflow: {target}\n"


def test_a_nesting_cycle_across_files_is_named_once(tmp_path: Path):
    write(tmp_path, "workflows/x/a.yaml", flow("a", nest("to-b", "b")))
    write(tmp_path, "workflows/x/b.yaml", flow("b", nest("to-c", "c")))
    write(tmp_path, "workflows/x/c.yaml", flow("c", nest("back", "a")))
    write(tmp_path, "workflows/x/d.yaml", flow("d", nest("into", "a")))
    problems = WorkflowService(WorkflowFiles(tmp_path)).catalogue().problems
    cycles = [p for p in problems if "nesting cycle" in p.message]
    assert [p.message for p in cycles] == ["nesting cycle: a › b › c › a"]
    assert cycles[0].file.endswith("a.yaml") and cycles[0].line == 6  # a's `workflow: b`


def test_a_cycle_through_a_group_is_found(tmp_path: Path):
    group = "  - id: g\n    type: group\n    steps:\n      - id: to-b\n        type: workflow\n        workflow: b\n"
    write(tmp_path, "workflows/x/a.yaml", flow("a", group))
    write(tmp_path, "workflows/x/b.yaml", flow("b", nest("to-a", "a")))
    catalogue = WorkflowService(WorkflowFiles(tmp_path)).catalogue()
    assert [p.message for p in catalogue.problems] == ["nesting cycle: a › b › a"]
    assert catalogue.workflows == {}


def test_duplicate_ids_across_files_name_both_files(tmp_path: Path):
    write(tmp_path, "workflows/one/a.yaml", flow("same"))
    write(tmp_path, "workflows/two/b.yaml", flow("same"))
    write(tmp_path, "checklists/x.yaml", "id: list\ndescription: d\nitems: [one]\n")
    write(tmp_path, "checklists/y.yaml", "id: list\ndescription: d\nitems: [two]\n")
    problems = WorkflowService(WorkflowFiles(tmp_path)).catalogue().problems
    messages = sorted(str(p) for p in problems)
    assert len(messages) == 2
    assert "duplicate checklist id 'list' (also " in messages[0] and "x.yaml:1" in messages[0]
    assert "duplicate workflow id 'same' (also " in messages[1] and "a.yaml:1" in messages[1]


def test_category_must_match_its_folder(tmp_path: Path):
    write(
        tmp_path,
        "workflows/dev/a.yaml",
        "id: a\ndescription: d\ncategory: ops\nsteps:\n" + flow("a").split("steps:\n")[1],
    )
    problems = WorkflowService(WorkflowFiles(tmp_path)).catalogue().problems
    assert len(problems) == 1 and "differs from the folder 'dev'" in problems[0].message and problems[0].line == 3


def test_templates_are_not_workflows_and_the_category_defaults_to_the_folder(tmp_path: Path):
    write(tmp_path, "workflows/templates/t.yaml", "id: t\nnot: valid\n")
    write(tmp_path, "workflows/ops/a.yaml", flow("a"))
    service = WorkflowService(WorkflowFiles(tmp_path))
    assert service.catalogue().problems == ()
    assert [(e.id, e.category, e.valid) for e in service.entries()] == [("a", "ops", True)]
    assert service.workflow("a").category == "ops"


def test_a_workflow_right_in_the_workflows_folder_is_read_without_a_category(tmp_path: Path):
    write(tmp_path, "workflows/mine.yaml", flow("mine"))
    write(tmp_path, "workflows/ops/a.yaml", flow("a"))
    service = WorkflowService(WorkflowFiles(tmp_path))
    assert service.catalogue().problems == ()
    assert sorted((e.id, e.category) for e in service.entries()) == [("a", "ops"), ("mine", None)]


def test_agent_names_are_checked_only_when_agent_types_are_given(tmp_path: Path):
    write(tmp_path, "workflows/x/a.yaml", flow("a"))
    assert WorkflowService(WorkflowFiles(tmp_path)).catalogue().ok
    problems = WorkflowService(WorkflowFiles(tmp_path), {"tester"}).catalogue().problems
    assert [p.message for p in problems] == ["step 'a': unknown agent type 'coder'"]
    assert "[agents.coder]" in problems[0].hint


def test_validate_files_replaces_the_catalogue_entry_and_reports_only_the_given_files(tmp_path: Path):
    write(tmp_path, "workflows/x/a.yaml", flow("a", nest("n", "missing")))
    draft = write(tmp_path, "drafts/b.yaml", flow("b", nest("n", "a")))
    service = WorkflowService(WorkflowFiles(tmp_path))
    result = service.validate([draft])
    assert result.problems == () and set(result.workflows) == {"b"}
    copy = write(tmp_path, "drafts/a.yaml", flow("a"))  # a fixed copy of a: checked instead of the catalogue's
    assert service.validate([copy, draft]).ok


def test_show_of_an_invalid_or_unknown_workflow(tmp_path: Path):
    write(tmp_path, "workflows/x/a.yaml", flow("a", "  - id: s\n    type: agent\n    prompt: p\n"))
    service = WorkflowService(WorkflowFiles(tmp_path))
    with pytest.raises(InvalidInput, match=r"workflow 'a' is invalid: .*a\.yaml:4: .*'agent' is missing"):
        service.workflow("a")
    with pytest.raises(WorkflowNotFound):
        service.workflow("nope")


def test_create_from_a_template_and_from_a_workflow_never_overwrites(tmp_path: Path):
    shutil.copytree(CONFIG / "workflows", tmp_path / "workflows")
    shutil.copytree(CONFIG / "checklists", tmp_path / "checklists")
    service = WorkflowService(WorkflowFiles(tmp_path), AGENTS)
    created = service.create("my-flow", "reviewed")
    assert created.problems == () and created.file.endswith("custom/my-flow.yaml")
    assert service.workflow("my-flow").category == "custom"
    copied = service.create("my-fix", "bug-fix", "ops")
    assert copied.problems == () and service.workflow("my-fix").category == "ops"
    assert len(service.workflow("my-fix").steps) == len(service.workflow("bug-fix").steps)
    with pytest.raises(AlreadyExists):
        service.create("my-flow", "basic")
    with pytest.raises(AlreadyExists):
        service.create("bug-fix", "basic", "maintenance")
    with pytest.raises(InvalidInput, match="unknown template 'nope'"):
        service.create("x", "nope")
    with pytest.raises(InvalidInput):
        service.create("../escape", "basic")
    assert service.catalogue().ok


def test_retarget_sets_id_and_category():
    assert retarget("# c\nid: t\nsteps: []\n", "n", "ops") == "# c\nid: n\ncategory: ops\nsteps: []\n"
    assert retarget("id: t\ncategory: x\n", "n", "ops") == "id: n\ncategory: ops\n"


# -- the loader


def test_lines_are_recorded_for_keys_and_list_items():
    doc, problems = parse_text("# c\nid: a\nsteps:\n  - id: s\n    type: agent\n  - id: t\n", "f.yaml")
    assert not problems and doc is not None
    assert doc.line(("id",)) == 2 and doc.line(("steps", 0)) == 4 and doc.line(("steps", 1, "id")) == 6
    assert doc.line(("steps", 0, "type")) == 5 and doc.line(("steps", 0, "missing")) == 4


def test_json_files_are_accepted_with_lines(tmp_path: Path):
    write(
        tmp_path,
        "workflows/x/a.json",
        '{\n  "id": "a",\n  "description": "d",\n  "steps": [\n'
        '    {"id": "s", "type": "agent", "agent": "coder",\n     "prompt": "p", "next": "zz"}\n  ]\n}\n',
    )
    problems = WorkflowService(WorkflowFiles(tmp_path)).catalogue().problems
    assert [(p.line, p.message) for p in problems] == [(6, "step 's': next targets unknown step 'zz'")]


def test_a_billion_laughs_file_is_refused_quickly():
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
    )
    doc, problems = parse_text(laughs, "laughs.yaml")
    assert doc is None and "too large" in problems[0].message


def test_unsafe_tags_never_construct_objects():
    doc, problems = parse_text("id: !!python/object/apply:os.system ['true']\n", "evil.yaml")
    assert doc is None and problems[0].line == 1
    doc, problems = parse_text("id: !!python/name:os.system\n", "evil.yaml")
    assert doc is None and problems


# -- routing, retries, durations


def test_routes_default_to_the_next_step_and_approval_rejection_ends():
    catalogue = WorkflowService(WorkflowFiles(CONFIG), AGENTS).catalogue()
    steps = {s.id: s for s in catalogue.workflows["feature-development"].steps}
    assert step_routes(steps["plan"], "approve-plan") == [("success", "approve-plan")]
    approve_plan = [("approve", "implement"), ("reject", "plan"), ("changes", "plan")]
    assert step_routes(steps["approve-plan"], "implement") == approve_plan
    assert step_routes(steps["validate"], "approve-result") == [("success", "approve-result"), ("error", "fix")]
    assert step_routes(steps["fix"], END) == [("success", "validate")]
    sign_off = catalogue.workflows["comprehensive-test"].steps[-1]
    assert step_routes(sign_off, END) == [("approve", END), ("reject", END), ("changes", "triage")]


def _approval_after(*kinds: str, **keys: str):
    """A workflow of steps s0, s1, … of `kinds`, then the approval `ok` (with `keys`), validated."""
    bodies = {"agent": {"agent": "coder", "prompt": "p"}, "parallel": {"agents": ["tester"], "prompt": "p"},
              "checklist": {"items": ["x"]}}  # fmt: skip
    steps = [{"id": f"s{i}", "type": kind, **bodies[kind]} for i, kind in enumerate(kinds)]
    steps.append({"id": "ok", "type": "approval", "message": "ok?", **keys})
    catalogue = validate_documents([Document("f.yaml", {"id": "w", "description": "d", "steps": steps})])
    assert catalogue.ok, catalogue.problems
    return catalogue.workflows["w"].steps


@pytest.mark.parametrize(
    ("kinds", "keys", "target"),
    [
        (("agent", "parallel", "checklist"), {}, "s0"),  # the maker, past the checks after it
        (("parallel", "agent", "parallel"), {}, "s1"),  # the nearest agent step
        (("parallel", "checklist"), {}, "s0"),  # no agent step: the nearest step that runs agents
        (("checklist",), {}, None),  # none runs agents: the approval is asked again
        (("agent", "parallel"), {"on_request_changes": "s1"}, "s1"),  # said explicitly
    ],
)
def test_request_changes_goes_to_on_request_changes_else_the_nearest_step_that_makes_the_work(kinds, keys, target):
    steps = _approval_after(*kinds, **keys)
    assert changes_target(steps[-1], steps) == target
    routes = step_routes(steps[-1], END, steps)
    assert (("changes", target) in routes) if target else all(label != "changes" for label, _ in routes)


def test_every_shipped_approval_sends_request_changes_to_a_step_that_runs_agents():
    catalogue = WorkflowService(WorkflowFiles(CONFIG), AGENTS).catalogue()
    targets = {
        (w.id, s.id): s.on_request_changes
        for w in catalogue.workflows.values()
        for s in w.steps
        if s.type is StepType.approval
    }
    assert targets == {
        ("bug-fix", "approve"): "fix", ("comprehensive-test", "sign-off"): "triage",
        ("feature-development", "approve-plan"): "plan", ("feature-development", "approve-result"): "fix",
        ("refactor", "approve-scope"): "analyse", ("refactor", "approve"): "refactor",
    }  # fmt: skip


def test_retry_delays_back_off_exponentially_up_to_the_cap():
    step = WorkflowService(WorkflowFiles(CONFIG), AGENTS).workflow("feature-development").steps[2]
    assert step.max_retries == 2 and step.retry_delay_ms == 5000
    assert [retry_delay_ms(step, n) for n in (1, 2, 3, 4, 5)] == [5000, 10000, 20000, 40000, 60000]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1d", 86400),
        (45, 45),
        ("", None),
        ("0s", None),
        ("soon", None),
        (True, None),
        (-3, None),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


# -- the graph


def test_mermaid_graph_has_every_step_and_labelled_routes():
    service = WorkflowService(WorkflowFiles(CONFIG), AGENTS)
    graph = to_mermaid(service.workflow("feature-development"))
    lines = graph.splitlines()
    assert lines[0] == "flowchart TD"
    assert "    start --> s0_plan" in lines
    assert '    s1_approve_plan{{"approve-plan<br/>approval"}}' in lines
    assert "    s1_approve_plan -->|reject| s0_plan" in lines
    assert "    s1_approve_plan -->|approve| s2_implement" in lines
    assert "    s3_validate -->|error| s5_fix" in lines
    assert "    s4_approve_result -->|approve| done" in lines
    assert "    s4_approve_result -->|changes| s5_fix" in lines
    labels = {"success", "error", "approve", "reject", "changes"}
    assert {label for label in re.findall(r"-->\|(\w+)\|", graph)} == labels


def test_mermaid_graph_of_groups_and_conditions():
    graph = to_mermaid(WorkflowService(WorkflowFiles(CONFIG), AGENTS).workflow("comprehensive-test"))
    assert '    subgraph s1_suites ["suites<br/>group (shared)"]' in graph
    assert "        s4_e2e_tests -->|success| s1_suites_end" in graph
    assert "    s5_failures_found -->|then| s6_triage" in graph and "-->|else| s7_quality_gate" in graph
    assert "#quot;FAILED#quot;" in graph and '"FAILED"' not in graph
    assert "    s1_suites -->|error| s6_triage" in graph


def test_mermaid_labels_are_escaped():
    doc = Document(
        "f.yaml",
        {
            "id": "w",
            "description": "d",
            "steps": [{"id": "c", "type": "condition", "when": 'a < 1 and b > "<script>"', "then": "end"}],
        },
    )
    catalogue = validate_documents([doc])
    graph = to_mermaid(catalogue.workflows["w"])
    assert "<script>" not in graph and "#lt;" in graph


# -- the docs


def test_the_docs_name_every_key_and_show_the_generated_graph():
    from taskgate.domain.workflows.definitions import CHECKLIST_KEYS, STEP_KEYS, WORKFLOW_KEYS

    doc = (ROOT / "docs" / "workflows.md").read_text()
    keys = {*WORKFLOW_KEYS, *CHECKLIST_KEYS, *(k for keys in STEP_KEYS.values() for k in keys), *StepType}
    assert [k for k in sorted(keys) if f"`{k}`" not in doc] == []
    graph = to_mermaid(WorkflowService(WorkflowFiles(CONFIG), AGENTS).workflow("feature-development"))
    assert f"```mermaid\n{graph}\n```" in doc


def test_a_checklist_is_found_by_id_or_by_its_display_name():
    service = WorkflowService(WorkflowFiles(CONFIG), AGENTS)
    for name in ("quality-validation", "Quality Validation Checklist", "quality validation", "QUALITY_VALIDATION"):
        assert service.checklist(name).id == "quality-validation", name
    with pytest.raises(ChecklistNotFound):
        service.checklist("Quality Checklist")


def _problems_of(text: str, *others: str) -> list[str]:
    docs = [parse_text(t, f"w{n}.yaml", category="dev") for n, t in enumerate((text, *others))]
    return [f"{p.line}: {p.message} (hint: {p.hint})" for p in validate_documents([d for d, _ in docs]).problems]


def test_an_unknown_variable_in_a_prompt_is_a_problem_at_its_line_with_a_suggestion():
    text = """
id: w
description: d
variables:
  target: src
steps:
  - id: a
    type: agent
    agent: x
    prompt: "fix {{targt}} for {{task.title}} with {{steps.a.output}} {{context.anything}} {x}"
  - id: b
    type: agent
    agent: x
    prompt: "{{steps.nope.output}}"
"""
    problems = _problems_of(text)
    assert problems[0].startswith("10: step 'a': unknown variable '{{targt}}' (hint: did you mean 'target'?")
    assert problems[1].startswith("14: step 'b': unknown variable '{{steps.nope.output}}'")
    assert len(problems) == 2


def test_a_nested_workflow_may_use_the_variables_of_the_workflow_that_runs_it():
    parent = """
id: parent
description: d
variables:
  area: api
steps:
  - id: sub
    type: workflow
    workflow: child
"""
    child = """
id: child
description: d
steps:
  - id: a
    type: agent
    agent: x
    prompt: "work on {{area}}"
"""
    assert _problems_of(parent, child) == []
    assert _problems_of(child)[0].startswith("8: step 'a': unknown variable '{{area}}'")


def test_load_must_name_a_declared_variable():
    text = """
id: w
description: d
variables:
  guide: "{project-root}/i.md"
steps:
  - id: a
    type: agent
    agent: x
    load: [guide, guidee]
    prompt: "{{load.guide}}"
"""
    (problem,) = _problems_of(text)
    assert "load names 'guidee', which is not one of the workflow's variables" in problem
    assert "did you mean 'guide'?" in problem


def test_the_names_taskgate_fills_in_cannot_be_declared():
    text = """
id: w
description: d
variables:
  instructions: "{project-root}/i.md"
  input: x
  task.title: y
  session_id: z
  fine: ok
steps:
  - {id: a, type: agent, agent: x, prompt: "{{fine}}"}
"""
    problems = _problems_of(text)
    assert problems[0].startswith("5: variable 'instructions' is reserved: {{instructions}} is the operator's")
    assert "hint: give it another name, e.g. instructions_file" in problems[0]
    assert problems[1].startswith("6: variable 'input' is reserved")
    assert problems[2].startswith("7: variable 'task.title' is reserved: task.* are the task's fields")
    assert problems[3].startswith("8: variable 'session_id' is reserved: {session_id} is a built-in")
    assert len(problems) == 4


def test_a_session_folder_template_needs_the_session_id_and_stays_under_the_outputs_root():
    base = "id: w\ndescription: d\nsession_folder: {folder}\nsteps:\n  - {{id: a, type: agent, agent: x, prompt: p}}\n"
    assert _problems_of(base.format(folder="'{workflow}/{date}/{{task.id}}-{session_id}'")) == []
    (missing,) = _problems_of(base.format(folder="'{workflow}/out'"))
    assert "3: 'session_folder' must be a text containing {session_id}" in missing
    (escape,) = _problems_of(base.format(folder="'../{session_id}'"))
    assert "3: session_folder '../{session_id}':" in escape and "'..'" in escape
    (unknown,) = _problems_of(base.format(folder="'{{nope}}/{session_id}'"))
    assert "unknown variable '{{nope}}'" in unknown


def test_an_invalid_workflow_is_known_as_such_with_its_first_problem():
    text = "id: w\ndescription: d\nvariables:\n  input: x\nsteps:\n  - {id: a, type: agent, agent: x, prompt: p}\n"
    doc, _ = parse_text(text, "w.yaml", category="dev")
    catalogue = validate_documents([doc])
    assert "w" not in catalogue.workflows and catalogue.invalid["w"].line == 4
    assert "variable 'input' is reserved" in catalogue.invalid["w"].message
