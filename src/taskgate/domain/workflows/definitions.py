"""Workflows and checklists: their models, schema and routing rules (pure).

A workflow file is read by infrastructure into a `Document`: the plain data (dicts, lists, scalars) and the
line of every mapping key and list item, keyed by its path (`("steps", 2, "next")`). `validate_documents`
(domain/workflows/validation.py) turns documents into `Workflow` and `Checklist` models, or into
`WorkflowProblem`s that each name the file, the line, what is wrong and how to fix it. Nothing here reads a
file. See docs/workflows.md for the format.

Routing: a step goes on to the step after it (in its own list) unless `next` or a route key says otherwise;
`end` ends the workflow (inside a group: the group). Steps no route reaches from the first one are errors.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from taskgate.domain.errors import NotFound

END = "end"
DEFAULT_MAX_ITERATIONS = 100
DEFAULT_RETRY_DELAY_MS = 1_000
DEFAULT_RETRY_MAX_DELAY_MS = 60_000
MAX_RETRIES = 100

Path = tuple[str | int, ...]
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
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
    load: tuple[str, ...] = ()  # variables naming files of the project, read into the prompt (`{{load.<name>}}`)
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
    "load",
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
    visible_to: tuple[str, ...] = ()  # who may see and run it (domain/workflows/visibility.py); empty: everyone
    session_folder: str | None = None  # where its sessions' folders go under the outputs root (a template)
    format: str = "taskgate"  # or "openagents": how the file was read (domain/workflows/openagents.py)
    notes: tuple[WorkflowProblem, ...] = field(default=(), compare=False, repr=False)  # what `validate` notes

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "variables": dict(self.variables),
            "description": self.description,
            "category": self.category,
            "triggers": list(self.triggers),
            "max_iterations": self.max_iterations,
            "max_duration_s": self.max_duration_s,
            "visible_to": list(self.visible_to),
            "session_folder": self.session_folder,
            "format": self.format,
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
    invalid: Mapping[str, WorkflowProblem] = field(default_factory=dict)  # a declared workflow id → its first problem

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def notes(self) -> tuple[WorkflowProblem, ...]:
        """What the valid workflows' files were told without being wrong (how an OpenAgents file was read)."""
        return tuple(note for workflow in self.workflows.values() for note in workflow.notes)


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

WORKFLOW_KEYS = ("id", "description", "category", "triggers", "max_iterations", "max_duration", "variables",
                 "visible_to", "format", "session_folder", "steps")  # fmt: skip
CHECKLIST_KEYS = ("id", "description", "items")
ITEM_KEYS = ("id", "text", "required")
_COMMON = ("id", "type", "description", "next", "on_error", "timeout_ms")
RETRY_KEYS = ("max_retries", "retry_delay_ms", "retry_max_delay_ms")
STEP_KEYS: dict[StepType, tuple[str, ...]] = {
    StepType.agent: (*_COMMON, *RETRY_KEYS, "agent", "input", "prompt", "load", "on_success"),
    StepType.approval: (*_COMMON, "message", "on_approve", "on_reject", "on_request_changes"),
    StepType.parallel: (*_COMMON, *RETRY_KEYS, "agents", "min_success", "input", "prompt", "load", "on_success"),
    StepType.condition: ("id", "type", "description", "next", "on_error", "when", "then", "else"),
    StepType.checklist: (*_COMMON, *RETRY_KEYS, "items", "checklist", "on_success"),
    StepType.workflow: (*_COMMON, *RETRY_KEYS, "workflow", "input", "on_success"),
    StepType.group: (*_COMMON, *RETRY_KEYS, "steps", "context_mode", "summarize", "on_success"),
}
ALL_STEP_KEYS = sorted({k for keys in STEP_KEYS.values() for k in keys})
ROUTE_KEYS = ("next", "on_success", "on_error", "on_approve", "on_reject", "on_request_changes", "then", "else")
WORK_STEPS = frozenset({StepType.agent, StepType.parallel, StepType.workflow, StepType.group})  # steps that run agents
WHERE_KEY = {
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


# ---------------------------------------------------------------------------------------------- workflows


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


# ---------------------------------------------------------------------------------------------- checklists


# ---------------------------------------------------------------------------------------------- the catalogue


def walk_steps(steps: Iterable[Step]) -> Iterable[Step]:
    """Every step, group members included (depth first, in file order)."""
    for step in steps:
        yield step
        yield from walk_steps(step.steps)


# ---------------------------------------------------------------------------------------------- mermaid
