"""Use cases over the workflow catalogue: list, show, validate, create from a template (no runtime yet).

The files come through the `WorkflowSource` port (infrastructure/workflow_files.py on disk); the rules are the
domain's (domain/workflows/definitions.py). Every answer re-reads the files, so an edit shows at the next command.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from taskgate.domain.errors import AlreadyExists, InvalidInput
from taskgate.domain.workflows.definitions import (
    Catalogue,
    Checklist,
    ChecklistNotFound,
    Document,
    Workflow,
    WorkflowNotFound,
    WorkflowProblem,
)
from taskgate.domain.workflows.triggers import Declared, TriggerRoutes, resolve_routes, starts_sessions
from taskgate.domain.workflows.validation import validate_documents

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}$")


class WorkflowSource(Protocol):
    """Where workflow, checklist and template files live."""

    def catalogue(self) -> tuple[list[Document], list[WorkflowProblem]]:
        """Every workflow and checklist file, parsed; the unreadable ones as problems."""
        ...

    def read(self, path: Path) -> tuple[Document | None, list[WorkflowProblem]]:
        """One file named by the user."""
        ...

    def same_file(self, a: str, b: str) -> bool: ...

    def templates(self) -> dict[str, str]:
        """Template name -> file."""
        ...

    def template_text(self, file: str) -> str: ...

    def existing_workflow_file(self, category: str, name: str) -> str | None: ...

    def write_workflow(self, category: str, name: str, text: str) -> str:
        """Create the file (never overwriting: FileExistsError); returns its name as shown to the user."""
        ...

    def origin(self, file: str) -> str:
        """Where a catalogue file comes from: "built-in" (shipped with taskgate) or "project"."""
        ...


@dataclass(frozen=True)
class CatalogueEntry:
    """A catalogue workflow for `workflow list`: valid or not."""

    id: str
    category: str | None
    description: str
    file: str
    steps: int
    valid: bool
    source: str = "project"  # "built-in" (shipped with taskgate) or "project"
    visible_to: tuple[str, ...] = ()  # who may see and run it (domain/workflows/visibility.py); empty: everyone


@dataclass(frozen=True)
class Created:
    file: str
    template: str
    problems: tuple[WorkflowProblem, ...]
    dropped_triggers: tuple[str, ...] = ()  # the copied workflow's task_ready/label: triggers, left out of the copy


class WorkflowService:
    """The workflow catalogue of one config directory. `agent_types`: the agent names that `agent`/`agents[]`
    must use (None: not checked), or name → whether its command takes `{prompt}` (a step's prompt must reach
    its agent)."""

    def __init__(self, source: WorkflowSource, agent_types: Iterable[str] | Mapping[str, bool] | None = None) -> None:
        self.source = source
        self.agent_types: frozenset[str] | Mapping[str, bool] | None = (
            dict(agent_types) if isinstance(agent_types, Mapping)
            else frozenset(agent_types) if agent_types is not None else None
        )  # fmt: skip

    def catalogue(self) -> Catalogue:
        """Every workflow and checklist, validated together; the problems of every file."""
        documents, problems = self.source.catalogue()
        checked = validate_documents(documents, self.agent_types)
        clashes = self._trigger_clashes(documents, checked.workflows)
        return Catalogue(checked.workflows, checked.checklists, _sorted([*problems, *checked.problems, *clashes]),
                         checked.invalid)  # fmt: skip

    def trigger_routes(self, workflows: Mapping[str, Workflow] | None = None) -> TriggerRoutes:
        """Which workflow each starting trigger (`task_ready`, `label:…`) starts, over the valid workflows of the
        catalogue (or `workflows`): domain/workflows/triggers.py `resolve_routes`, a project workflow over a built-in
        one."""
        found = self.catalogue().workflows if workflows is None else workflows
        own = {w.id: self.source.origin(w.file) != "built-in" for w in found.values()}
        return resolve_routes(Declared(w.id, w.triggers, own[w.id]) for w in found.values())

    def _trigger_clashes(
        self, documents: Sequence[Document], workflows: Mapping[str, Workflow]
    ) -> list[WorkflowProblem]:
        """A starting trigger that several workflows of one layer declare: one problem at each of their trigger
        lines, naming the others (a ready task could start either, and dispatch guesses at nothing)."""
        by_file = {d.file: d for d in documents}
        problems = []
        for trigger, names in self.trigger_routes(workflows).contested.items():
            for name in names:
                workflow = workflows[name]
                doc = by_file.get(workflow.file)
                line = doc.line(("triggers", list(workflow.triggers).index(trigger))) if doc else workflow.line
                others = ", ".join(f"'{o}' ({workflows[o].file})" for o in names if o != name)
                problems.append(WorkflowProblem(
                    workflow.file, line, f"trigger '{trigger}' is also declared by workflow {others}",
                    "keep it on one of them: a ready task would match both (a project workflow's trigger replaces "
                    "a built-in one's)",
                ))  # fmt: skip
        return problems

    def validate(self, paths: Sequence[Path] = ()) -> Catalogue:
        """The catalogue (no `paths`), or the given files checked against it: a given file replaces the
        catalogue's file of the same path or id, and only the given files' problems are reported. A name that is
        no file but the id of a workflow or checklist of the catalogue means that entry's file."""
        if not paths:
            return self.catalogue()
        documents, _ = self.source.catalogue()
        files_by_id = {d.declared_id: d.file for d in documents if d.declared_id}
        paths = [Path(files_by_id[str(p)]) if not p.exists() and str(p) in files_by_id else p for p in paths]
        given: list[Document] = []
        problems: list[WorkflowProblem] = []
        for path in paths:
            doc, found = self.source.read(path)
            problems += found
            if doc is not None:
                given.append(doc)
        ids = {(d.kind, d.declared_id) for d in given if d.declared_id}
        others = [
            d
            for d in documents
            if (d.kind, d.declared_id) not in ids and not any(self.source.same_file(d.file, g.file) for g in given)
        ]
        checked = validate_documents([*given, *others], self.agent_types)
        clashes = self._trigger_clashes([*given, *others], checked.workflows)
        files = [str(p) for p in paths]
        mine = [p for p in [*checked.problems, *clashes] if any(self.source.same_file(p.file, f) for f in files)]
        names = {d.declared_id for d in given}
        return Catalogue(
            {k: w for k, w in checked.workflows.items() if k in names},
            {k: c for k, c in checked.checklists.items() if k in names},
            _sorted([*problems, *mine]),
        )

    def entries(self, category: str | None = None) -> list[CatalogueEntry]:
        """The catalogue's workflows (valid ones and those with problems), by category and id."""
        documents, _ = self.source.catalogue()
        checked = self.catalogue()
        out = []
        for doc in documents:
            if doc.kind != "workflow" or (category is not None and doc.category != category):
                continue
            ident = doc.declared_id or Path(doc.file).stem
            workflow = checked.workflows.get(ident)
            if workflow is not None and workflow.file == doc.file:
                out.append(CatalogueEntry(ident, workflow.category, workflow.description, doc.file,
                                          len(workflow.steps), True, self.source.origin(doc.file),
                                          workflow.visible_to))  # fmt: skip
            else:
                data = doc.data if isinstance(doc.data, dict) else {}
                description = data.get("description") if isinstance(data.get("description"), str) else ""
                steps = data.get("steps") if isinstance(data.get("steps"), list) else []
                origin = self.source.origin(doc.file)
                out.append(CatalogueEntry(ident, doc.category, description, doc.file, len(steps), False, origin))
        return sorted(out, key=lambda e: (e.category or "", e.id))

    def workflow(self, name: str) -> Workflow:
        """A valid workflow by id. Raises: WorkflowNotFound; InvalidInput when it has problems."""
        checked = self.catalogue()
        if name in checked.workflows:
            return checked.workflows[name]
        documents, _ = self.source.catalogue()
        if any(d.kind == "workflow" and d.declared_id == name for d in documents):
            first = next((p for p in checked.problems if _mentions(p, name, documents)), None)
            detail = f": {first}" if first else ""
            raise InvalidInput(f"workflow '{name}' is invalid{detail}; run `taskgate workflow validate`")
        raise WorkflowNotFound(name)

    def checklist(self, name: str) -> Checklist:
        """A valid checklist by id, or by its display name (`Quality Validation Checklist` for
        `quality-validation`: case, spaces and a trailing "checklist" aside); an exact id wins.

        Raises: ChecklistNotFound; InvalidInput when it has problems.
        """
        checked = self.catalogue()
        if name in checked.checklists:
            return checked.checklists[name]
        wanted = _display_key(name)
        named = [c for key, c in checked.checklists.items() if _display_key(key) == wanted]
        if len(named) == 1:
            return named[0]
        documents, _ = self.source.catalogue()
        if any(d.kind == "checklist" and d.declared_id == name for d in documents):
            raise InvalidInput(f"checklist '{name}' is invalid; run `taskgate workflow validate`")
        raise ChecklistNotFound(name)

    def origin(self, file: str) -> str:
        """Where a catalogue file comes from: "built-in" or "project"."""
        return self.source.origin(file)

    def templates(self) -> list[str]:
        """What `create --template` accepts: the templates, then the catalogue's valid workflows."""
        return sorted(self.source.templates()) + [
            w for w in self.catalogue().workflows if w not in self.source.templates()
        ]

    def create(self, name: str, template: str, category: str | None = None) -> Created:
        """A new workflow file `workflows/<category>/<name>.yaml` from a template (or a catalogue workflow),
        then validated. Raises: InvalidInput (bad name, unknown template), AlreadyExists (id or file taken)."""
        if not _NAME.match(name):
            raise InvalidInput(f"workflow name {name!r}: use lower-case letters, digits, '-' and '_'")
        if category is not None and not _NAME.match(category):
            raise InvalidInput(f"category {category!r}: use lower-case letters, digits, '-' and '_'")
        templates = self.source.templates()
        documents, _ = self.source.catalogue()
        dropped: tuple[str, ...] = ()
        if template in templates:
            text, default_category = self.source.template_text(templates[template]), "custom"
        else:
            source = next((d for d in documents if d.kind == "workflow" and d.declared_id == template), None)
            if source is None:
                known = ", ".join(self.templates()) or "none"
                raise InvalidInput(f"unknown template '{template}'; known: {known}")
            if source.file.endswith(".json"):
                raise InvalidInput(f"workflow '{template}' is JSON; only YAML workflows serve as templates")
            text, default_category = self.source.template_text(source.file), source.category or "custom"
            text, dropped = _without_starting_triggers(text, source)
        category = category or default_category
        taken = next((d for d in documents if d.kind == "workflow" and d.declared_id == name), None)
        if taken is not None:
            raise AlreadyExists(f"workflow '{name}' already exists in {taken.file}")
        if (existing := self.source.existing_workflow_file(category, name)) is not None:
            raise AlreadyExists(f"{existing} already exists; it is never overwritten")
        try:
            file = self.source.write_workflow(category, name, retarget(text, name, category))
        except FileExistsError:
            raise AlreadyExists(f"the file for workflow '{name}' already exists; it is never overwritten") from None
        return Created(file, template, self.validate([Path(file)]).problems, dropped)


def retarget(text: str, name: str, category: str) -> str:
    """The template's text with its top-level `id` (and `category`) set to `name` and `category`."""
    text, found = re.subn(r"(?m)^id:.*$", f"id: {name}", text, count=1)
    if not found:
        text = f"id: {name}\n{text}"
    text, found = re.subn(r"(?m)^category:.*$", f"category: {category}", text, count=1)
    if not found:
        text = re.sub(r"(?m)^(id:.*)$", rf"\1\ncategory: {category}", text, count=1)
    return text


def _without_starting_triggers(text: str, doc: Document) -> tuple[str, tuple[str, ...]]:
    """A copy of a workflow starts by hand: the text without the triggers that start sessions (`task_ready`,
    `label:…`), which would otherwise contend with the original's or take them over. Returns the text and the
    triggers left out. The list is rewritten on its key's line (flow style) or loses its items' lines (block)."""
    triggers = doc.data.get("triggers") if isinstance(doc.data, dict) else None
    if not isinstance(triggers, list):
        return text, ()
    dropped = tuple(t for t in triggers if isinstance(t, str) and starts_sessions(t))
    if not dropped:
        return text, ()
    kept = [t for t in triggers if t not in dropped]
    lines = text.splitlines(keepends=True)
    key = doc.line(("triggers",)) - 1
    items = [doc.line(("triggers", n)) - 1 for n in range(len(triggers))]
    if all(i == key for i in items) or not kept:  # flow style (`triggers: [manual, task_ready]`), or none kept
        for n, item in enumerate(items):
            if item != key and triggers[n] in dropped:
                lines[item] = ""
        lines[key] = f"triggers: [{', '.join(json.dumps(t) for t in kept)}]\n"
    else:
        for n, item in enumerate(items):
            if triggers[n] in dropped:
                lines[item] = ""
    return "".join(lines), dropped


def _sorted(problems: Iterable[WorkflowProblem]) -> tuple[WorkflowProblem, ...]:
    return tuple(sorted(set(problems), key=lambda p: (p.file, p.line, p.message)))


def _mentions(problem: WorkflowProblem, name: str, documents: Sequence[Document]) -> bool:
    return any(d.declared_id == name and d.file == problem.file for d in documents)


def _display_key(name: str) -> str:
    """`Quality Validation Checklist`, `quality_validation` and `quality-validation` alike."""
    words = re.sub(r"[\s_-]+", " ", name.strip().lower()).split()
    if words and words[-1] == "checklist" and len(words) > 1:
        words = words[:-1]
    return " ".join(words)
