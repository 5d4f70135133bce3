"""Workflows and checklists: their models, their validation and their mermaid graph (pure).

A workflow file is read by infrastructure into a `Document`: the plain data (dicts, lists, scalars) and the
line of every mapping key and list item, keyed by its path (`("steps", 2, "next")`). `validate_documents`
turns documents into `Workflow` and `Checklist` models, or into `WorkflowProblem`s that each name the file,
the line, what is wrong and how to fix it. Nothing here reads a file. See docs/workflows.md for the format.

Routing: a step goes on to the step after it (in its own list) unless `next` or a route key says otherwise;
`end` ends the workflow (inside a group: the group). Steps no route reaches from the first one are errors.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from taskgate.domain.errors import NotFound
from taskgate.domain.expressions import ExpressionError, parse_condition
from taskgate.domain.variables import BUILTINS, VariableError, resolve_all
from taskgate.domain.variables import NAME as VARIABLE_NAME

END = "end"
DEFAULT_MAX_ITERATIONS = 100
DEFAULT_RETRY_DELAY_MS = 1_000
DEFAULT_RETRY_MAX_DELAY_MS = 60_000
MAX_RETRIES = 100

Path = tuple[str | int, ...]
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class WorkflowNotFound(NotFound):
    kind = "workflow"


class ChecklistNotFound(NotFound):
    kind = "checklist"


class StepType(StrEnum):
    agent = "agent"
    approval = "approval"
    parallel = "parallel"
    condition = "condition"
    checklist = "checklist"
    workflow = "workflow"
    group = "group"


class ContextMode(StrEnum):
    """How a group's steps see the workflow's context: their own (`isolated`), the workflow's, read and
    written (`shared`), or the workflow's, read only (`inherited`)."""

    isolated = "isolated"
    shared = "shared"
    inherited = "inherited"


@dataclass(frozen=True, slots=True)
class WorkflowProblem:
    """One thing wrong with a workflow or checklist file, and how to fix it."""

    file: str
    line: int
    message: str
    hint: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


@dataclass(frozen=True)
class Document:
    """A parsed workflow or checklist file: its data and the line of every key and list item (by path)."""

    file: str
    data: Any
    lines: Mapping[Path, int] = field(default_factory=dict)
    kind: Literal["workflow", "checklist"] = "workflow"
    category: str | None = None  # the folder under workflows/, when the file lives in the catalogue

    def line(self, path: Path) -> int:
        """The line of `path`, or of its nearest ancestor that has one."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 1)

    @property
    def declared_id(self) -> str | None:
        value = self.data.get("id") if isinstance(self.data, dict) else None
        return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class ChecklistItem:
    id: str
    text: str
    required: bool = True


@dataclass(frozen=True, slots=True)
class ParallelAgent:
    agent: str
    prompt: str | None = None


@dataclass(frozen=True)
class Step:
    """One step. `type` says which of the per-type fields apply (the others are None or empty)."""

    id: str
    type: StepType
    description: str | None = None
    # agent (and parallel's shared input/prompt)
    agent: str | None = None
    input: str | None = None
    prompt: str | None = None
    # approval
    message: str | None = None
    # parallel
    agents: tuple[ParallelAgent, ...] = ()
    min_success: int | None = None
    # condition
    when: str | None = None
    then: str | None = None
    else_: str | None = None
    # checklist
    items: tuple[ChecklistItem, ...] = ()
    checklist: str | None = None
    # workflow
    workflow: str | None = None
    # group
    steps: tuple[Step, ...] = ()
    context_mode: ContextMode | None = None
    summarize: bool | str | None = None
    # routing
    next: str | None = None
    on_success: str | None = None
    on_error: str | None = None
    on_approve: str | None = None
    on_reject: str | None = None
    on_request_changes: str | None = None
    # retries and timeout
    max_retries: int = 0
    retry_delay_ms: int = DEFAULT_RETRY_DELAY_MS
    retry_max_delay_ms: int = DEFAULT_RETRY_MAX_DELAY_MS
    timeout_ms: int | None = None
    # where it was written: the line of the step and of each of its keys
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def line(self) -> int:
        return self.lines.get("", 1)

    def as_dict(self) -> dict[str, Any]:
        """The step as its file would say it (only the keys that are set)."""
        out: dict[str, Any] = {"id": self.id, "type": self.type.value}
        for name in _STEP_FIELDS:
            value = getattr(self, name)
            key = "else" if name == "else_" else name
            if name == "agents" and value:
                out[key] = [{"agent": a.agent, **({"prompt": a.prompt} if a.prompt else {})} for a in value]
            elif name == "items" and value:
                out[key] = [{"id": i.id, "text": i.text, "required": i.required} for i in value]
            elif name == "steps" and value:
                out[key] = [s.as_dict() for s in value]
            elif name == "context_mode" and value is not None:
                out[key] = value.value
            elif name in ("max_retries", "retry_delay_ms", "retry_max_delay_ms"):
                if self.max_retries:
                    out[key] = value
            elif value not in (None, (), ""):
                out[key] = value
        return out


_STEP_FIELDS = (
    "description",
    "agent",
    "input",
    "prompt",
    "message",
    "agents",
    "min_success",
    "when",
    "then",
    "else_",
    "items",
    "checklist",
    "workflow",
    "steps",
    "context_mode",
    "summarize",
    "next",
    "on_success",
    "on_error",
    "on_approve",
    "on_reject",
    "on_request_changes",
    "max_retries",
    "retry_delay_ms",
    "retry_max_delay_ms",
    "timeout_ms",
)


@dataclass(frozen=True)
class Workflow:
    id: str
    description: str
    steps: tuple[Step, ...]
    category: str | None = None
    triggers: tuple[str, ...] = ()
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    max_duration_s: float | None = None
    file: str = ""
    line: int = 1
    variables: Mapping[str, str] = field(default_factory=dict)  # `{{name}}` in prompts (bounded, acyclic)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "variables": dict(self.variables),
            "description": self.description,
            "category": self.category,
            "triggers": list(self.triggers),
            "max_iterations": self.max_iterations,
            "max_duration_s": self.max_duration_s,
            "file": self.file,
            "steps": [s.as_dict() for s in self.steps],
        }


def agent_types_used(steps: Iterable[Step]) -> list[str]:
    """The agent types the steps launch (agent and parallel steps, inside groups too), first use first; nested
    workflows are not followed (their own run checks them)."""
    found: dict[str, None] = {}
    for step in steps:
        if step.agent:
            found[step.agent] = None
        found.update((a.agent, None) for a in step.agents)
        found.update((name, None) for name in agent_types_used(step.steps))
    return list(found)


@dataclass(frozen=True)
class Checklist:
    id: str
    description: str
    items: tuple[ChecklistItem, ...]
    file: str = ""
    line: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "description": self.description,
            "file": self.file,
            "items": [{"id": i.id, "text": i.text, "required": i.required} for i in self.items],
        }


@dataclass(frozen=True)
class Catalogue:
    """The valid workflows and checklists of a set of documents, and the problems of the others."""

    workflows: Mapping[str, Workflow]
    checklists: Mapping[str, Checklist]
    problems: tuple[WorkflowProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def matches_pattern(pattern: str | None, ident: str, description: str) -> bool:
    """Catalogue search: a glob (`*`, `?`, `[`) against the id, else a substring of the id or the description,
    ignoring case; no pattern matches everything."""
    if not pattern:
        return True
    pattern = pattern.lower()
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(ident.lower(), pattern)
    return pattern in ident.lower() or pattern in description.lower()


def retry_delay_ms(step: Step, attempt: int) -> int:
    """The wait before retry number `attempt` (1-based): retry_delay_ms doubled each time, capped."""
    return min(step.retry_max_delay_ms, step.retry_delay_ms * 2 ** max(0, attempt - 1))


def parse_duration(value: object) -> float | None:
    """Seconds from a number of seconds or a text such as `90s`, `30m`, `2h`, `1h30m`, `1d`; None if invalid."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value > 0 else None
    if not isinstance(value, str) or not value.strip():
        return None
    match = _DURATION.match(value.strip())
    if not match or not any(match.groups()):
        return None
    d, h, m, s = (int(g or 0) for g in match.groups())
    total = d * 86400 + h * 3600 + m * 60 + s
    return float(total) if total > 0 else None


# ---------------------------------------------------------------------------------------------- the schema

WORKFLOW_KEYS = ("id", "description", "category", "triggers", "max_iterations", "max_duration", "variables", "steps")
CHECKLIST_KEYS = ("id", "description", "items")
ITEM_KEYS = ("id", "text", "required")
_COMMON = ("id", "type", "description", "next", "on_error", "timeout_ms")
_RETRIES = ("max_retries", "retry_delay_ms", "retry_max_delay_ms")
STEP_KEYS: dict[StepType, tuple[str, ...]] = {
    StepType.agent: (*_COMMON, *_RETRIES, "agent", "input", "prompt", "on_success"),
    StepType.approval: (*_COMMON, "message", "on_approve", "on_reject", "on_request_changes"),
    StepType.parallel: (*_COMMON, *_RETRIES, "agents", "min_success", "input", "prompt", "on_success"),
    StepType.condition: ("id", "type", "description", "next", "on_error", "when", "then", "else"),
    StepType.checklist: (*_COMMON, *_RETRIES, "items", "checklist", "on_success"),
    StepType.workflow: (*_COMMON, *_RETRIES, "workflow", "input", "on_success"),
    StepType.group: (*_COMMON, *_RETRIES, "steps", "context_mode", "summarize", "on_success"),
}
_ALL_STEP_KEYS = sorted({k for keys in STEP_KEYS.values() for k in keys})
ROUTE_KEYS = ("next", "on_success", "on_error", "on_approve", "on_reject", "on_request_changes", "then", "else")
WORK_STEPS = frozenset({StepType.agent, StepType.parallel, StepType.workflow, StepType.group})  # steps that run agents
_WHERE_KEY = {
    "message": "approval",
    "on_approve": "approval",
    "on_reject": "approval",
    "on_request_changes": "approval",
    "agents": "parallel",
    "min_success": "parallel",
    "when": "condition",
    "then": "condition",
    "else": "condition",
    "items": "checklist",
    "checklist": "checklist",
    "workflow": "workflow",
    "steps": "group",
    "context_mode": "group",
    "summarize": "group",
    "agent": "agent",
    "on_success": "agent, parallel, checklist, workflow and group",
    "max_retries": "agent, parallel, checklist, workflow and group",
    "input": "agent, parallel and workflow",
}


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else ""


def _check_condition(text: str) -> tuple[str, int | None] | None:
    """The condition language's parser on `when` (domain/expressions.py): (message, column) if it does not parse."""
    try:
        parse_condition(text)
    except ExpressionError as exc:
        return exc.message, exc.column
    return None


class _Checker:
    """Collects the problems of one document while building its model."""

    def __init__(self, doc: Document, agent_types: frozenset[str] | None, deaf: frozenset[str] = frozenset()) -> None:
        self.doc = doc
        self.agent_types = agent_types
        self.deaf = deaf  # agent types whose command has no {prompt}: a step's prompt would never reach them
        self.problems: list[WorkflowProblem] = []
        self.scope_of: dict[str, int] = {}  # step id -> its list (raw, so steps dropped while parsing count)
        self.incomplete_scopes: set[int] = set()
        self.scopes = 0
        self.owner = ""  # what a missing key belongs to ("agent step 'plan'"); the file when empty

    def problem(self, path: Path, message: str, hint: str = "") -> None:
        self.problems.append(WorkflowProblem(self.doc.file, self.doc.line(path), message, hint))

    def at(self, line: int, message: str, hint: str = "") -> None:
        self.problems.append(WorkflowProblem(self.doc.file, line, message, hint))

    def where(self, path: Path) -> str:
        return ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in path).replace(".[", "[")

    # -- scalars

    def keys(self, data: dict[str, Any], path: Path, allowed: Sequence[str], what: str, every: Sequence[str] = ()):
        for key in data:
            if not isinstance(key, str):
                self.problem(path, f"{what}: key {key!r} is not a text", "write keys as plain words")
            elif key not in allowed:
                if key in every and key in _WHERE_KEY:
                    self.problem(
                        (*path, key),
                        f"{what}: '{key}' does not apply here",
                        f"'{key}' belongs to {_WHERE_KEY[key]} steps; remove it or change the type",
                    )
                else:
                    self.problem(
                        (*path, key),
                        f"{what}: unknown key '{key}'",
                        _suggest(key, allowed) or f"known keys: {', '.join(allowed)}",
                    )

    def text(self, data: dict[str, Any], key: str, path: Path, *, required: bool = False) -> str | None:
        value = data.get(key)
        if value is None:
            if required:
                self.problem(
                    path, f"{self.owner or self.where(path) or 'the file'}: '{key}' is missing", f"add '{key}: …'"
                )
            elif key in data:
                self.problem((*path, key), f"'{key}' is empty", f"give '{key}' a value or remove it")
            return None
        if not isinstance(value, str) or not value.strip():
            self.problem((*path, key), f"'{key}' must be a non-empty text, not {value!r}", f"write {key}: some text")
            return None
        return value

    def ident(self, data: dict[str, Any], key: str, path: Path, *, required: bool = False) -> str | None:
        value = self.text(data, key, path, required=required)
        if value is not None and not _ID.match(value):
            self.problem(
                (*path, key),
                f"'{key}' {value!r} is not a valid id",
                "use letters, digits, '-' and '_' (at most 100), starting with a letter or digit",
            )
            return None
        return value

    def integer(self, data: dict[str, Any], key: str, path: Path, *, minimum: int, maximum: int | None = None):
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum else f"at least {minimum}"
            self.problem(
                (*path, key),
                f"'{key}' must be a whole number {bound}, not {value!r}",
                f"write {key}: {max(minimum, 1)}",
            )
            return None
        return value

    def listing(self, data: dict[str, Any], key: str, path: Path, *, required: bool = False) -> list[Any] | None:
        value = data.get(key)
        if value is None:
            if required:
                self.problem(
                    (*path, key) if key in data else path,
                    f"{self.owner or self.where(path) or 'the file'}: '{key}' is missing or empty",
                    f"add '{key}:' with at least one entry",
                )
            return None
        if not isinstance(value, list):
            self.problem(
                (*path, key),
                f"'{key}' must be a list, not {type(value).__name__}",
                f"write each entry of '{key}' on its own '- ' line",
            )
            return None
        if required and not value:
            self.problem((*path, key), f"'{key}' is empty", f"add at least one entry to '{key}'")
            return None
        return value

    def items(self, raw: list[Any], path: Path) -> tuple[ChecklistItem, ...]:
        out: list[ChecklistItem] = []
        seen: dict[str, int] = {}
        for n, item in enumerate(raw):
            at = (*path, n)
            if isinstance(item, str) and item.strip():
                out.append(ChecklistItem(f"item-{n + 1}", item))
                continue
            if not isinstance(item, dict):
                self.problem(
                    at,
                    f"checklist item {n + 1} must be a text or a mapping with id and text",
                    "write '- id: tests-pass' and 'text: …' under it",
                )
                continue
            outer, self.owner = self.owner, f"checklist item {n + 1}"
            self.keys(item, at, ITEM_KEYS, self.owner)
            ident, text = self.ident(item, "id", at, required=True), self.text(item, "text", at, required=True)
            self.owner = outer
            required = item.get("required", True)
            if not isinstance(required, bool):
                self.problem(
                    (*at, "required"),
                    f"'required' must be true or false, not {required!r}",
                    "write required: false for an optional item",
                )
                required = True
            if ident is not None and ident in seen:
                self.problem(
                    (*at, "id"),
                    f"duplicate checklist item id '{ident}' (also line {seen[ident]})",
                    "give every item its own id",
                )
            elif ident is not None and text is not None:
                seen[ident] = self.doc.line(at)
                out.append(ChecklistItem(ident, text, required))
        return tuple(out)


# ---------------------------------------------------------------------------------------------- workflows


def parse_workflow(
    doc: Document, agent_types: Iterable[str] | Mapping[str, bool] | None = None
) -> tuple[Workflow | None, list[WorkflowProblem]]:
    """The workflow of `doc`, or None and its problems (schema, ids, routes, reachability, inputs, agents).
    References to other files (nested workflows, checklists) are checked by `validate_documents`.
    `agent_types` as in `validate_documents`."""
    deaf = frozenset(n for n, takes in agent_types.items() if not takes) if isinstance(agent_types, Mapping) else ()
    c = _Checker(doc, frozenset(agent_types) if agent_types is not None else None, frozenset(deaf))
    data = _mapping(c, "workflow", "steps")
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
    for n, trigger in enumerate(triggers):
        if not isinstance(trigger, str) or not trigger.strip():
            c.problem(
                ("triggers", n),
                f"trigger {n + 1} must be a non-empty text, not {trigger!r}",
                "name the event, e.g. '- manual' or '- task_ready'",
            )
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
    raw_steps = c.listing(data, "steps", (), required=True)
    steps: tuple[Step, ...] = ()
    if raw_steps:
        all_ids: dict[str, int] = {}
        steps = _parse_steps(c, raw_steps, ("steps",), all_ids)
        _check_scope(c, steps, [], all_ids)
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
    )
    return workflow, []


def _variables(c: _Checker, raw: object) -> dict[str, str]:
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
        out[name] = str(value)
    try:
        resolve_all(out, dict.fromkeys(BUILTINS, ""), strict=False)
    except VariableError as exc:
        c.problem(("variables",), f"variables: {exc}", "break the cycle or shorten the values")
    return out


def _parse_steps(c: _Checker, raw: list[Any], path: Path, all_ids: dict[str, int]) -> tuple[Step, ...]:
    c.scopes += 1
    scope, steps = c.scopes, []
    for item in raw:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            c.scope_of.setdefault(item["id"], scope)
    for n, item in enumerate(raw):
        step = _parse_step(c, item, (*path, n), all_ids)
        if step is not None:
            steps.append(step)
    if len(steps) != len(raw):  # a step was dropped: its problem is reported; routes to it are not errors
        c.incomplete_scopes.add(scope)
    return tuple(steps)


def _parse_step(c: _Checker, data: Any, path: Path, all_ids: dict[str, int]) -> Step | None:
    outer = c.owner
    try:
        return _parse_step_in(c, data, path, all_ids)
    finally:
        c.owner = outer


def _parse_step_in(c: _Checker, data: Any, path: Path, all_ids: dict[str, int]) -> Step | None:
    if not isinstance(data, dict):
        c.problem(
            path,
            f"step {path[-1] + 1} must be a mapping, not {type(data).__name__}",  # type: ignore[operator]
            "write '- id: name' and 'type: agent' (and the type's keys) under it",
        )
        return None
    c.owner = f"step {path[-1] + 1}"  # type: ignore[operator]
    ident = c.ident(data, "id", path, required=True)
    if ident == END:
        c.problem((*path, "id"), "'end' is reserved for ending the workflow", "give the step another id")
        ident = None
    if ident is not None:
        if ident in all_ids:
            c.problem(
                (*path, "id"),
                f"duplicate step id '{ident}' (also line {all_ids[ident]})",
                "give every step of the workflow its own id, groups included",
            )
            ident = None
        else:
            all_ids[ident] = c.doc.line(path)
    name = ident or f"step {path[-1] + 1}"  # type: ignore[operator]
    raw_type = data.get("type")
    if raw_type is None:
        c.problem(path, f"step '{name}': 'type' is missing", f"add 'type:' one of {', '.join(StepType)}")
        return None
    try:
        kind = StepType(raw_type)
    except ValueError:
        c.problem(
            (*path, "type"),
            f"step '{name}': unknown type {raw_type!r}",
            _suggest(str(raw_type), list(StepType)) or f"use one of {', '.join(StepType)}",
        )
        return None
    c.owner = f"{kind.value} step '{name}'"
    c.keys(data, path, STEP_KEYS[kind], c.owner, _ALL_STEP_KEYS)
    lines = {"": c.doc.line(path)} | {k: c.doc.line((*path, k)) for k in data if isinstance(k, str)}
    fields: dict[str, Any] = {"lines": lines, "description": c.text(data, "description", path)}
    for key in ROUTE_KEYS:
        if key in STEP_KEYS[kind]:
            fields["else_" if key == "else" else key] = c.text(data, key, path)
    for first, second in (("next", "on_success"), ("next", "on_approve")):
        if data.get(first) is not None and data.get(second) is not None:
            c.problem(
                (*path, second),
                f"step '{name}' has both '{first}' and '{second}'",
                f"keep one: '{first}' and '{second}' both say where success goes",
            )
    if "timeout_ms" in STEP_KEYS[kind]:
        fields["timeout_ms"] = c.integer(data, "timeout_ms", path, minimum=1)
    if "max_retries" in STEP_KEYS[kind]:
        fields["max_retries"] = c.integer(data, "max_retries", path, minimum=0, maximum=MAX_RETRIES) or 0
        fields["retry_delay_ms"] = c.integer(data, "retry_delay_ms", path, minimum=0) or DEFAULT_RETRY_DELAY_MS
        cap = c.integer(data, "retry_max_delay_ms", path, minimum=0)
        fields["retry_max_delay_ms"] = (
            cap if cap is not None else max(DEFAULT_RETRY_MAX_DELAY_MS, fields["retry_delay_ms"])
        )
        if cap is not None and data.get("retry_delay_ms") is not None and cap < fields["retry_delay_ms"]:
            c.problem(
                (*path, "retry_max_delay_ms"),
                f"step '{name}': retry_max_delay_ms is below retry_delay_ms",
                "the cap must be at least the first delay",
            )
        if data.get("max_retries") is None and any(data.get(k) is not None for k in _RETRIES[1:]):
            c.problem(
                (*path, "retry_delay_ms"),
                f"step '{name}': a retry delay without max_retries",
                "add max_retries: N (the delay only applies between retries)",
            )
    match kind:
        case StepType.agent:
            fields["agent"] = _agent_name(c, data, "agent", path, name, required=True)
            fields["input"] = c.ident(data, "input", path)
            fields["prompt"] = c.text(data, "prompt", path, required=True)
        case StepType.approval:
            fields["message"] = c.text(data, "message", path, required=True)
        case StepType.parallel:
            fields["input"] = c.ident(data, "input", path)
            fields["prompt"] = c.text(data, "prompt", path)
            agents = _parallel_agents(c, data, path, name, has_prompt=fields["prompt"] is not None)
            fields["agents"] = agents
            fields["min_success"] = c.integer(data, "min_success", path, minimum=1)
            if fields["min_success"] is not None and agents and fields["min_success"] > len(agents):
                c.problem(
                    (*path, "min_success"),
                    f"step '{name}': min_success {fields['min_success']} is more than its {len(agents)} agents",
                    f"use at most {len(agents)}, or add agents",
                )
        case StepType.condition:
            when = c.text(data, "when", path, required=True)
            fields["when"] = when
            if when is not None and (bad := _check_condition(when)) is not None:
                message, column = bad
                at = f" at column {column}" if column is not None else ""
                c.problem(
                    (*path, "when"),
                    f"step '{name}': invalid condition{at}: {message}",
                    "see docs/workflows.md for the condition language",
                )
            if data.get("then") is None and data.get("else") is None:
                c.problem(
                    path,
                    f"condition step '{name}' has neither 'then' nor 'else'",
                    "add 'then: <step id>' (and 'else: <step id>' if needed)",
                )
        case StepType.checklist:
            raw_items, named = data.get("items"), data.get("checklist")
            if (raw_items is None) == (named is None):
                c.problem(
                    path,
                    f"checklist step '{name}' needs exactly one of 'items' and 'checklist'",
                    "list the items inline, or name a checklist of the catalogue (.taskgate/checklists/ or built-in)",
                )
            elif named is not None:
                fields["checklist"] = c.ident(data, "checklist", path)
            elif (items := c.listing(data, "items", path, required=True)) is not None:
                fields["items"] = c.items(items, (*path, "items"))
        case StepType.workflow:
            fields["workflow"] = c.ident(data, "workflow", path, required=True)
            fields["input"] = c.ident(data, "input", path)
        case StepType.group:
            mode = data.get("context_mode")
            if mode is not None:
                try:
                    fields["context_mode"] = ContextMode(mode)
                except ValueError:
                    c.problem(
                        (*path, "context_mode"),
                        f"step '{name}': unknown context_mode {mode!r}",
                        f"use one of {', '.join(ContextMode)}",
                    )
            else:
                fields["context_mode"] = ContextMode.isolated
            summarize = data.get("summarize")
            if (
                summarize is not None
                and not isinstance(summarize, bool)
                and not (isinstance(summarize, str) and summarize.strip())
            ):
                c.problem(
                    (*path, "summarize"),
                    f"step '{name}': 'summarize' must be true, false or a prompt",
                    "write summarize: true, or the summary's instructions",
                )
            else:
                fields["summarize"] = summarize
            raw = c.listing(data, "steps", path, required=True)
            if raw:
                fields["steps"] = _parse_steps(c, raw, (*path, "steps"), all_ids)
    if ident is None:
        return None
    return Step(ident, kind, **fields)


def _agent_name(c: _Checker, data: dict[str, Any], key: str, path: Path, name: str, *, required: bool) -> str | None:
    agent = c.ident(data, key, path, required=required)
    if agent is not None and c.agent_types is not None and agent not in c.agent_types:
        known = ", ".join(sorted(c.agent_types)) or "none"
        c.problem(
            (*path, key),
            f"step '{name}': unknown agent type '{agent}'",
            f"configure [agents.{agent}] in taskgate.toml, or use one of: {known}",
        )
    elif agent is not None and agent in c.deaf:
        c.problem(
            (*path, key),
            f"step '{name}': agent type '{agent}' has no {{prompt}} in its command, so this step's prompt would "
            f"never reach it",
            f'add "{{prompt}}" to agents.{agent}.command (e.g. ["my-agent", "--message", "{{prompt}}"])',
        )
    return agent


def _parallel_agents(c: _Checker, data: dict[str, Any], path: Path, name: str, *, has_prompt: bool):
    raw = c.listing(data, "agents", path, required=True)
    if not raw:
        return ()
    out = []
    for n, entry in enumerate(raw):
        at = (*path, "agents", n)
        if isinstance(entry, str):
            entry = {"agent": entry}
        elif not isinstance(entry, dict):
            c.problem(
                at,
                f"step '{name}': agent {n + 1} must be a name or a mapping with 'agent'",
                "write '- tester' or '- agent: tester' with 'prompt: …'",
            )
            continue
        outer, c.owner = c.owner, f"step '{name}' agent {n + 1}"
        c.keys(entry, at, ("agent", "prompt"), c.owner)
        agent = _agent_name(c, entry, "agent", at, name, required=True)
        c.owner = outer
        prompt = c.text(entry, "prompt", at)
        if prompt is None and not has_prompt and agent is not None:
            c.problem(
                at, f"step '{name}': agent '{agent}' has no prompt", "give the step a 'prompt', or this agent its own"
            )
        if agent is not None:
            out.append(ParallelAgent(agent, prompt))
    return tuple(out)


def changes_target(step: Step, steps: Sequence[Step]) -> str | None:
    """Where `request_changes` on approval `step` sends the work back, with the operator's instructions: its
    `on_request_changes`, else the nearest `agent` step before it in its list (the step that makes the work, in
    the usual shape "make it, check it, approve it"), else the nearest `parallel`, `workflow` or `group` step
    before it; None when no step before it runs agents (the approval is then asked again)."""
    if step.on_request_changes is not None:
        return step.on_request_changes
    before = list(steps[: next((i for i, s in enumerate(steps) if s.id == step.id), 0)])
    for kinds in ({StepType.agent}, WORK_STEPS):
        found = next((s.id for s in reversed(before) if s.type in kinds), None)
        if found is not None:
            return found
    return None


def step_routes(step: Step, following: str, steps: Sequence[Step] = ()) -> list[tuple[str, str]]:
    """The labelled routes out of `step` (label, target), `following` being where it goes by default (the
    next step of its list, or `end`), `steps` its list (for an approval's `changes` route). A missing
    `on_error` ends the workflow as failed: no route."""
    success = step.next or following
    routes: list[tuple[str, str]]
    if step.type is StepType.approval:
        routes = [("approve", step.on_approve or success), ("reject", step.on_reject or END)]
        changes = changes_target(step, steps) if steps else step.on_request_changes
        if changes is not None:
            routes.append(("changes", changes))
    elif step.type is StepType.condition:
        routes = [("then", step.then or success), ("else", step.else_ or success)]
    else:
        routes = [("success", step.on_success or success)]
    if step.on_error:
        routes.append(("error", step.on_error))
    return routes


def _check_scope(c: _Checker, steps: Sequence[Step], visible: list[str], all_ids: dict[str, int]) -> None:
    """Routes stay in their list and name a step or `end`; every step is reachable; `input` names an earlier
    step (of this list or an enclosing one). Groups are checked the same way, as their own scope."""
    ids = {s.id for s in steps}
    scope = c.scope_of.get(steps[0].id) if steps else None
    for i, step in enumerate(steps):
        for key in ROUTE_KEYS:
            target = getattr(step, "else_" if key == "else" else key, None)
            if target is None or target == END or target in ids or c.scope_of.get(target, -1) == scope:
                continue
            at = step.lines.get(key, step.line)
            if target in all_ids:
                c.at(
                    at,
                    f"step '{step.id}': {key} '{target}' is not in the same list of steps",
                    "routes cannot enter or leave a group; route to 'end' to finish the group",
                )
            else:
                c.at(
                    at,
                    f"step '{step.id}': {key} targets unknown step '{target}'",
                    _suggest(target, [*ids, END]) or f"route to one of: {', '.join([*sorted(ids), END])}",
                )
        if step.on_request_changes is not None:
            _check_changes_target(c, step, steps)
        if step.input is not None and step.input not in visible and step.input not in [s.id for s in steps[:i]]:
            later = step.input in all_ids
            c.at(
                step.lines.get("input", step.line),
                f"step '{step.id}': input '{step.input}' is {'not a previous step' if later else 'unknown'}",
                "input names a step that runs before this one (in this list or around its group)",
            )
        if step.steps:
            _check_scope(c, step.steps, [*visible, *(s.id for s in steps[:i])], all_ids)
    if not steps or scope in c.incomplete_scopes:
        return
    reached, todo = {steps[0].id}, [0]
    index = {s.id: i for i, s in enumerate(steps)}
    while todo:
        i = todo.pop()
        following = steps[i + 1].id if i + 1 < len(steps) else END
        for _, target in step_routes(steps[i], following, steps):
            if target in index and target not in reached:
                reached.add(target)
                todo.append(index[target])
    for step in steps:
        if step.id not in reached:
            c.at(
                step.line,
                f"step '{step.id}' is unreachable",
                "route to it (next, on_success, on_error, …) from another step, or remove it",
            )


def _check_changes_target(c: _Checker, step: Step, steps: Sequence[Step]) -> None:
    """`on_request_changes` names a step of the list that runs agents: the operator's instructions are for them."""
    target = next((s for s in steps if s.id == step.on_request_changes), None)
    at = step.lines.get("on_request_changes", step.line)
    if step.on_request_changes == END:
        c.at(at, f"step '{step.id}': on_request_changes cannot be 'end'",
             "name the step that makes the change (an agent step, usually the coder's)")  # fmt: skip
    elif target is not None and target.type not in WORK_STEPS:
        c.at(at, f"step '{step.id}': on_request_changes '{target.id}' is a {target.type.value} step, which runs no "
             "agents", "name an agent, parallel, workflow or group step: the one that makes the change")  # fmt: skip


# ---------------------------------------------------------------------------------------------- checklists


def _mapping(c: _Checker, kind: str, body: str) -> dict | None:
    """The document's top-level mapping, or None after reporting that it is not one."""
    c.owner = f"the {kind}"
    if isinstance(c.doc.data, dict):
        return c.doc.data
    c.problem(
        (),
        f"a {kind} file must be a mapping, not {type(c.doc.data).__name__}",
        f"start the file with 'id: my-{kind}', 'description: …' and '{body}:'",
    )
    return None


def parse_checklist(doc: Document) -> tuple[Checklist | None, list[WorkflowProblem]]:
    c = _Checker(doc, None)
    data = _mapping(c, "checklist", "items")
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


# ---------------------------------------------------------------------------------------------- the catalogue


def walk_steps(steps: Iterable[Step]) -> Iterable[Step]:
    """Every step, group members included (depth first, in file order)."""
    for step in steps:
        yield step
        yield from walk_steps(step.steps)


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
    for doc in sorted(documents, key=lambda d: d.file):
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
                    problems.append(WorkflowProblem(workflow.file, line, message, _suggest(name, all_ids[key]) or hint))
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
    for name in broken:
        workflows.pop(name, None)
    problems.sort(key=lambda p: (p.file, p.line, p.message))
    return Catalogue(dict(sorted(workflows.items())), dict(sorted(checklists.items())), tuple(problems))


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


# ---------------------------------------------------------------------------------------------- mermaid


def _mermaid_text(text: str) -> str:
    """Text safe inside a quoted mermaid label (entity codes for quotes, angle brackets and line breaks)."""
    text = " ".join(text.split())
    for char, code in (("&", "#amp;"), ('"', "#quot;"), ("<", "#lt;"), (">", "#gt;")):
        text = text.replace(char, code)
    return text[:80] + ("…" if len(text) > 80 else "")


def to_mermaid(workflow: Workflow) -> str:
    """A mermaid `flowchart TD` of the workflow: one node per step (groups as subgraphs), labelled routes."""
    lines = ["flowchart TD", "    start((start))", "    done((end))"]
    names: dict[str, str] = {}

    def node(step_id: str) -> str:
        return names.setdefault(step_id, f"s{len(names)}_{re.sub(r'[^A-Za-z0-9_]', '_', step_id)}")

    def label(step: Step) -> str:
        detail = {
            StepType.agent: f"agent: {step.agent}",
            StepType.approval: "approval",
            StepType.parallel: "parallel: " + ", ".join(a.agent for a in step.agents),
            StepType.condition: f"if {step.when}",
            StepType.checklist: f"checklist: {step.checklist}" if step.checklist else f"checklist ({len(step.items)})",
            StepType.workflow: f"workflow: {step.workflow}",
            StepType.group: f"group ({step.context_mode.value if step.context_mode else 'isolated'})",
        }[step.type]
        return '"' + _mermaid_text(step.id) + "<br/>" + _mermaid_text(detail) + '"'

    shapes = {
        StepType.agent: ("[", "]"),
        StepType.approval: ("{{", "}}"),
        StepType.parallel: ("[[", "]]"),
        StepType.condition: ("{", "}"),
        StepType.checklist: ("[/", "/]"),
        StepType.workflow: ("[[", "]]"),
    }

    def emit(steps: Sequence[Step], indent: str, end_node: str) -> None:
        for step in steps:
            if step.type is StepType.group:
                lines.append(f"{indent}subgraph {node(step.id)} [{label(step)}]")
                lines.append(f"{indent}    direction TB")
                inner_end = f"{node(step.id)}_end"
                lines.append(f'{indent}    {inner_end}(("end"))')
                emit(step.steps, indent + "    ", inner_end)
                lines.append(f"{indent}end")
            else:
                left, right = shapes[step.type]
                lines.append(f"{indent}{node(step.id)}{left}{label(step)}{right}")
        for i, step in enumerate(steps):
            following = steps[i + 1].id if i + 1 < len(steps) else END
            for name, target in step_routes(step, following, steps):
                dest = end_node if target == END else node(target)
                lines.append(f"{indent}{node(step.id)} -->|{name}| {dest}")

    if workflow.steps:
        lines.append(f"    start --> {node(workflow.steps[0].id)}")
    emit(workflow.steps, "    ", "done")
    return "\n".join(lines)
