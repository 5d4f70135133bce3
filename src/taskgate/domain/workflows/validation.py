"""Validating workflow and checklist documents into models, or into problems that name file, line and fix.

`validate_documents` turns the `Document`s infrastructure read into `Workflow` and `Checklist` models (see
domain/workflows/definitions.py), or into `WorkflowProblem`s. Nothing here reads a file. See docs/workflows.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from taskgate.domain.errors import InvalidInput
from taskgate.domain.outputs import output_path
from taskgate.domain.workflows.checker import Checker
from taskgate.domain.workflows.definitions import (
    CHECKLIST_KEYS,
    DEFAULT_MAX_ITERATIONS,
    WORKFLOW_KEYS,
    Catalogue,
    Checklist,
    Document,
    Step,
    Workflow,
    WorkflowProblem,
    parse_duration,
    walk_steps,
)
from taskgate.domain.workflows.openagents import FORMATS, OPENAGENTS, from_openagents, reading
from taskgate.domain.workflows.step_parsing import check_scope, parse_mapping, parse_steps
from taskgate.domain.workflows.templating import BUILTINS, VariableError, resolve_all
from taskgate.domain.workflows.templating import NAME as VARIABLE_NAME
from taskgate.domain.workflows.triggers import trigger_problem
from taskgate.domain.workflows.variables import (
    inherited_variables,
    reserved_reason,
    session_folder_path,
    suggest,
    unknown_references,
)
from taskgate.domain.workflows.visibility import agent_type_named, entry_problem


def parse_workflow(
    doc: Document, agent_types: Iterable[str] | Mapping[str, bool] | None = None
) -> tuple[Workflow | None, list[WorkflowProblem]]:
    """The workflow of `doc`, or None and its problems (schema, ids, routes, reachability, inputs, agents).
    References to other files (nested workflows, checklists) are checked by `validate_documents`.
    `agent_types` as in `validate_documents`."""
    deaf = frozenset(n for n, takes in agent_types.items() if not takes) if isinstance(agent_types, Mapping) else ()
    dialect, why = reading(
        doc
    )  # an OpenAgents-style file is mapped to taskgate's terms first (domain/workflows/openagents.py)
    doc, notes, mapped = from_openagents(doc, why) if dialect == OPENAGENTS else (doc, [], [])
    c = Checker(doc, frozenset(agent_types) if agent_types is not None else None, frozenset(deaf))
    c.problems += mapped
    data = parse_mapping(c, "workflow", "steps")
    if data is None:
        return None, c.problems
    c.keys(data, (), WORKFLOW_KEYS, "workflow")
    ident = c.ident(data, "id", (), required=True)
    description = c.text(data, "description", (), required=True)
    category = c.ident(data, "category", ())
    if category is not None and doc.category is not None and category != doc.category:
        c.problem(
            ("category",),
            f"category '{category}' differs from the folder '{doc.category}'",
            f"move the file to workflows/{category}/ or write category: {doc.category}",
        )
    triggers = c.listing(data, "triggers", ()) or []
    for n, trigger in enumerate(triggers):  # the forms and what they mean: domain/workflows/triggers.py
        problem = trigger_problem(trigger)
        if problem is not None:
            c.problem(("triggers", n), f"trigger {n + 1} {problem[0]}", problem[1])
        elif trigger in triggers[:n]:
            c.problem(("triggers", n), f"trigger {n + 1} {trigger!r} is listed twice", "remove one of them")
    max_iterations = c.integer(data, "max_iterations", (), minimum=1, maximum=100_000)
    duration = None
    if data.get("max_duration") is not None:
        duration = parse_duration(data["max_duration"])
        if duration is None:
            c.problem(
                ("max_duration",),
                f"'max_duration' {data['max_duration']!r} is not a duration",
                "write seconds or a text such as 90s, 30m, 2h, 1h30m, 1d",
            )
    variables = _variables(c, data.get("variables"))
    session_folder = _session_folder(c, data.get("session_folder"))
    visible_to = _visible_to(c, data)
    raw_steps = c.listing(data, "steps", (), required=True)
    steps: tuple[Step, ...] = ()
    if raw_steps:
        all_ids: dict[str, int] = {}
        steps = parse_steps(c, raw_steps, ("steps",), all_ids)
        check_scope(c, steps, [], all_ids)
        _check_loads(c, steps, variables)
    if c.problems or ident is None or description is None:
        return None, c.problems
    workflow = Workflow(
        ident,
        description,
        steps,
        category or doc.category,
        tuple(triggers),
        max_iterations or DEFAULT_MAX_ITERATIONS,
        duration,
        doc.file,
        doc.line(()),
        variables,
        visible_to=visible_to,
        session_folder=session_folder,
        format=dialect,
        notes=tuple(notes),
    )
    return workflow, []


def _visible_to(c: Checker, data: dict[str, Any]) -> tuple[str, ...]:
    """`visible_to:` (who may see and run the workflow; domain/workflows/visibility.py), and `format:`."""
    if data.get("format") is not None and data["format"] not in FORMATS:
        hint = suggest(str(data["format"]), FORMATS) or f"use one of {', '.join(FORMATS)}, or leave it out"
        c.problem(("format",), f"unknown format {data['format']!r}", hint)
    raw = c.listing(data, "visible_to", ())
    if raw is None:
        return ()
    if not raw:
        c.problem(("visible_to",), "'visible_to' is empty: nobody could run the workflow",
                  "list who may ('*', agent types, 'operator:<id>'), or remove the key")  # fmt: skip
    for n, entry in enumerate(raw):
        problem = entry_problem(entry)
        agent = agent_type_named(entry) if problem is None else None
        if problem is None and agent is not None and c.agent_types is not None and agent not in c.agent_types:
            problem = f"unknown agent type '{agent}'"
            hint = suggest(agent, c.agent_types) or f"configure [agents.{agent}] in taskgate.toml"
        else:
            hint = "e.g. visible_to: ['*'], [plan, build] or ['operator:alice']"
        if problem is not None:
            c.problem(("visible_to", n), f"visible_to entry {n + 1}: {problem}", hint)
    return tuple(raw)


def _variables(c: Checker, raw: object) -> dict[str, str]:
    """`variables:` — names to texts; each resolves (no cycle, no unknown name but the task's and built-ins)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        c.problem(("variables",), "'variables' must be a mapping of names to texts", "write variables:\n  name: text")
        return {}
    out: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not VARIABLE_NAME.fullmatch(name) or not isinstance(value, str | int | float):
            c.problem(("variables", str(name)), f"variable {name!r}: names are identifiers, values are texts",
                      "e.g. docs_dir: '{project-root}/docs'")  # fmt: skip
            continue
        if (why := reserved_reason(name)) is not None:
            other = name.replace(".", "_")
            c.problem(("variables", name), f"variable '{name}' is reserved: {why}",
                      f"give it another name, e.g. {other}_file or my_{other}")  # fmt: skip
            continue
        out[name] = str(value)
    try:
        resolve_all(out, dict.fromkeys(BUILTINS, ""), strict=False)
    except VariableError as exc:
        c.problem(("variables",), f"variables: {exc}", "break the cycle or shorten the values")
    return out


def _session_folder(c: Checker, raw: object) -> str | None:
    """`session_folder:` — where the sessions of this workflow keep their folder, under the outputs root:
    a relative path using `{session_id}` (required), `{workflow}`, `{date}` and `{{task.id}}`."""
    if raw is None:
        return None
    hint = "e.g. session_folder: '{workflow}/{date}/{session_id}' (relative to the outputs root)"
    if not isinstance(raw, str) or "{session_id}" not in raw:
        c.problem(("session_folder",), "'session_folder' must be a text containing {session_id}", hint)
        return None
    try:
        sample = session_folder_path(raw, "00000000-0000-4000-8000-000000000000", "w", "2026-01-01", "T-1")
        output_path(sample)
    except (VariableError, InvalidInput) as exc:
        c.problem(("session_folder",), f"session_folder {raw!r}: {exc}", hint)
        return None
    return raw


def _check_loads(c: Checker, steps: Sequence[Step], variables: Mapping[str, str]) -> None:
    for step in walk_steps(steps):
        for name in step.load:
            if name not in variables:
                c.at(step.lines.get("load", step.line), f"step '{step.id}': load names '{name}', which is not one of "
                     "the workflow's variables", suggest(name, variables) or f"add it under variables: ({name}: "
                     "'{installed_path}/file.md')")  # fmt: skip


def parse_checklist(doc: Document) -> tuple[Checklist | None, list[WorkflowProblem]]:
    c = Checker(doc, None)
    data = parse_mapping(c, "checklist", "items")
    if data is None:
        return None, c.problems
    c.keys(data, (), CHECKLIST_KEYS, "checklist")
    ident = c.ident(data, "id", (), required=True)
    description = c.text(data, "description", (), required=True)
    raw = c.listing(data, "items", (), required=True)
    items = c.items(raw, ("items",)) if raw else ()
    if c.problems or ident is None or description is None:
        return None, c.problems
    return Checklist(ident, description, items, doc.file, doc.line(())), []


_REFERENCES = (  # step keys naming another catalogue file: (key, as the message names it, fix hint)
    ("workflow", "nested workflow", "add it under .taskgate/workflows/<category>/, or fix the name"),
    ("checklist", "checklist", "add it as .taskgate/checklists/<name>.yaml, or list the items inline"),
)


def validate_documents(
    documents: Iterable[Document], agent_types: Iterable[str] | Mapping[str, bool] | None = None
) -> Catalogue:
    """Every document checked on its own, then together: ids unique across files, nested workflows and named
    checklists exist, no nesting cycle. `agent_types`: the known agent names (None: not checked), or name →
    whether its command takes `{prompt}` (a step naming one that does not is a problem)."""
    problems: list[WorkflowProblem] = []
    workflows: dict[str, Workflow] = {}
    checklists: dict[str, Checklist] = {}
    seen: dict[tuple[str, str], Document] = {}
    all_ids: dict[str, set[str]] = {"workflow": set(), "checklist": set()}
    documents = sorted(documents, key=lambda d: d.file)
    for doc in documents:
        if doc.declared_id is not None:
            all_ids[doc.kind].add(doc.declared_id)
            first = seen.setdefault((doc.kind, doc.declared_id), doc)
            if first is not doc:
                problems.append(
                    WorkflowProblem(
                        doc.file,
                        doc.line(("id",)),
                        f"duplicate {doc.kind} id '{doc.declared_id}' (also {first.file}:{first.line(('id',))})",
                        f"rename one of them: {doc.kind} ids are unique across files",
                    )
                )
                continue
        if doc.kind == "checklist":
            checklist, found = parse_checklist(doc)
            if checklist is not None:
                checklists[checklist.id] = checklist
        else:
            workflow, found = parse_workflow(doc, agent_types)
            if workflow is not None:
                workflows[workflow.id] = workflow
        problems.extend(found)
    broken: set[str] = set()
    for workflow in workflows.values():
        for step in walk_steps(workflow.steps):
            for key, label, hint in _REFERENCES:
                name = getattr(step, key)
                if name is not None and name not in all_ids[key]:
                    message = f"step '{step.id}': {label} '{name}' does not exist"
                    line = step.lines.get(key, step.line)
                    problems.append(WorkflowProblem(workflow.file, line, message, suggest(name, all_ids[key]) or hint))
                    broken.add(workflow.id)
    for cycle, step in _nesting_cycles(workflows):
        owner = workflows[cycle[0]]
        problems.append(
            WorkflowProblem(
                owner.file,
                step.lines.get("workflow", step.line),
                f"nesting cycle: {' › '.join(cycle)}",
                f"a workflow cannot run itself, even through others; remove the '{step.id}' step or "
                "change what it nests",
            )
        )
        broken.update(cycle)
    inherited = inherited_variables(workflows)
    for workflow in workflows.values():
        found = unknown_references(workflow, inherited.get(workflow.id, frozenset()))
        if found:
            problems.extend(found)
            broken.add(workflow.id)
    for name in broken:
        workflows.pop(name, None)
    problems.sort(key=lambda p: (p.file, p.line, p.message))
    invalid: dict[str, WorkflowProblem] = {}
    for doc in documents:
        if doc.kind == "workflow" and doc.declared_id and doc.declared_id not in workflows:
            first = next((p for p in problems if p.file == doc.file), None)
            if first is not None:
                invalid.setdefault(doc.declared_id, first)
    return Catalogue(dict(sorted(workflows.items())), dict(sorted(checklists.items())), tuple(problems), invalid)


def _nesting_cycles(workflows: Mapping[str, Workflow]) -> list[tuple[list[str], Step]]:
    """Each cycle of nested workflows once, starting at its smallest name, with the step that opens it."""
    nests = {name: [s for s in walk_steps(w.steps) if s.workflow in workflows] for name, w in workflows.items()}
    found: dict[tuple[str, ...], tuple[list[str], Step]] = {}

    def visit(name: str, trail: list[str], via: list[Step]) -> None:
        for step in nests[name]:
            target = step.workflow
            assert target is not None
            if target in trail:
                start = trail.index(target)
                cycle, steps = trail[start:], [*via[start:], step]
                turn = cycle.index(min(cycle))
                key = tuple(cycle[turn:] + cycle[:turn])
                if key not in found:
                    found[key] = ([*key, key[0]], steps[turn])
            elif len(trail) < 50:
                visit(target, [*trail, target], [*via, step])

    for name in sorted(workflows):
        visit(name, [name], [])
    return [found[k] for k in sorted(found)]
