"""OpenAgents-style workflow documents, read as taskgate workflows (pure).

OpenAgents (an OpenCode plugin) writes its workflows as JSON files (`.openagents/workflows/*.json`) with keys and
meanings of its own: `max_duration_ms`, a workflow-level `context` (or `initial_context`) of starting data, agent
steps without a prompt, `retry_delay` (later `retry_delay_ms`), a `max_retries` that counts attempts, a step without
`next` that ends the workflow. `reading` says whether a document is written that way, and why; `from_openagents`
returns the document in taskgate's own terms, with notes saying what was mapped (shown by `workflow validate`)
and the problems of what cannot be. Keys neither format knows stay for the validator, which reports them with its
did-you-mean hints. See docs/workflows.md, "OpenAgents-style workflows".

A document is OpenAgents-style when it says `format: openagents`, or when it says no format, is a `.json` file and
uses something only OpenAgents writes (`_marker`). Every such marker is an error in taskgate's own format, so no
valid taskgate workflow is ever read differently; YAML files opt in with `format:` only, so that a forgotten
prompt in a YAML workflow stays an error instead of quietly changing how its retries and routes work.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from taskgate.domain.workflows.definitions import END, Document, Path, WorkflowProblem

TASKGATE = "taskgate"
OPENAGENTS = "openagents"
FORMATS = (TASKGATE, OPENAGENTS)

DEFAULT_AGENT_PROMPT = "Work on task {{task.id}}: {{task.title}}\n\n{{task.description}}"
"""The prompt of an OpenAgents-style agent step that gives none: the task, as OpenAgents hands every agent the
workflow's input (the engine appends the `input` step's output, and the operator's instructions, as for any step)."""

_SAME_RESULTS = "a step receives the output of its `input` step (and the workflow's variables), not every result"
IGNORED: dict[str, str] = {  # OpenAgents workflow keys taskgate has no use for: accepted and ignored, saying why
    "debug": "every step run is recorded anyway (`taskgate workflow steps`)",
    "trace": "every step run is recorded anyway (`taskgate workflow steps`)",
    "persist": "a workflow's stack is always stored with its session",
    "persist_dir": "a workflow's stack is always stored with its session",
    "max_context_size": _SAME_RESULTS,
    "context_retention": _SAME_RESULTS,
    "parallel": "steps run one after another; a `parallel` step runs agents at once",
}
CONTEXT_KEYS = ("context", "initial_context")
WORKFLOW_MARKERS = ("max_duration_ms", *CONTEXT_KEYS, *IGNORED)
STEP_MARKERS = ("retry_delay", "condition")
_ROUTED = ("agent", "parallel", "checklist", "workflow", "group", "condition", "approval")


def reading(doc: Document) -> tuple[str, str]:
    """(format, why it was recognised): `format:` when given (an unknown value reads as taskgate's, and the
    validator reports it), else OpenAgents for a `.json` file with one of its markers, else taskgate."""
    data = doc.data
    if not isinstance(data, dict):
        return TASKGATE, ""
    declared = data.get("format")
    if declared is not None:
        return (declared, f"format: {declared}") if declared in FORMATS else (TASKGATE, "")
    marker = _marker(data) if doc.file.endswith(".json") else None
    return (OPENAGENTS, f"a JSON file where {marker}") if marker else (TASKGATE, "")


def _marker(data: dict[str, Any]) -> str | None:
    """The first thing of the document that only OpenAgents writes (each one is an error in taskgate's format)."""
    for key in WORKFLOW_MARKERS:
        if key in data:
            return f"the workflow has '{key}'"
    for step in _all_steps(data.get("steps")):
        name = step.get("id", "?")
        for key in STEP_MARKERS:
            if key in step:
                return f"step '{name}' has '{key}'"
        if "type" not in step and "agent" in step:
            return f"step '{name}' has an agent but no type"
        if step.get("type") == "agent" and "prompt" not in step:
            return f"agent step '{name}' has no prompt"
    return None


def _all_steps(raw: object) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in raw if isinstance(raw, list) else []:
        if isinstance(step, dict):
            out.append(step)
            out += _all_steps(step.get("steps")) if step.get("type") == "group" else []
    return out


def from_openagents(doc: Document, why: str = "") -> tuple[Document, list[WorkflowProblem], list[WorkflowProblem]]:
    """The OpenAgents-style document `doc` in taskgate's terms, with notes (what was mapped; the first says why it
    was read this way when `why` is a marker rather than `format:`) and problems (what cannot be mapped)."""
    mapper = _Mapper(doc)
    if why and not why.startswith("format:"):
        hint = 'say "format": "openagents" to make it explicit, or "format": "taskgate" for taskgate\'s own'
        mapper.note((), f"read as an OpenAgents-style workflow: {why}", hint)
    mapper.workflow()
    mapped = Document(doc.file, mapper.data, mapper.lines, doc.kind, doc.category)
    return mapped, mapper.notes, mapper.problems


class _Mapper:
    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.data: dict[str, Any] = copy.deepcopy(doc.data)
        self.lines: dict[Path, int] = dict(doc.lines)
        self.notes: list[WorkflowProblem] = []
        self.problems: list[WorkflowProblem] = []
        self.prompt = DEFAULT_AGENT_PROMPT
        self.prompted: list[str] = []  # the agent steps that got the default prompt

    def note(self, path: Path, message: str, hint: str = "") -> None:
        self.notes.append(WorkflowProblem(self.doc.file, self.doc.line(path), message, hint))

    def problem(self, path: Path, message: str, hint: str = "") -> None:
        self.problems.append(WorkflowProblem(self.doc.file, self.doc.line(path), message, hint))

    def rename(self, mapping: dict[str, Any], path: Path, old: str, new: str) -> bool:
        """Move `old` to `new` (with its lines). Both given: a problem, and `old` is dropped (False)."""
        if new in mapping:
            self.problem((*path, old), f"both '{old}' and '{new}' are given", f"keep '{new}' only")
            mapping.pop(old)  # reported once, not again as an unknown key
            return False
        mapping[new] = mapping.pop(old)
        for key in [k for k in self.lines if k[: len(path) + 1] == (*path, old)]:
            self.lines[(*path, new, *key[len(path) + 1 :])] = self.lines.pop(key)
        return True

    def workflow(self) -> None:
        data = self.data
        if "max_duration_ms" in data:
            ms = data["max_duration_ms"]
            if isinstance(ms, bool) or not isinstance(ms, int) or ms <= 0:
                self.problem(("max_duration_ms",), f"'max_duration_ms' must be a whole number above 0, not {ms!r}",
                             "write the workflow's time limit in milliseconds, e.g. 600000")  # fmt: skip
                data.pop("max_duration_ms")
            elif self.rename(data, (), "max_duration_ms", "max_duration"):
                data["max_duration"] = ms / 1000  # seconds
        names = self.context()
        if names:
            listed = "\n".join(f"- {name}: {{{{{name}}}}}" for name in names)
            self.prompt = f"{DEFAULT_AGENT_PROMPT}\n\nContext:\n{listed}"
        for key, why in IGNORED.items():
            if key in data:
                data.pop(key)
                self.note((key,), f"'{key}' is ignored: {why}", f"remove '{key}'")
        if isinstance(data.get("steps"), list):
            self.steps(data["steps"], ("steps",))
        if self.prompted:
            self.note(("steps",), f"agent step(s) {', '.join(self.prompted)} give no prompt: their agents get the "
                      "task (id, title, description), the workflow's context and the output of their 'input' step",
                      "give a step a 'prompt' to say more")  # fmt: skip

    def context(self) -> list[str]:
        """`context` / `initial_context` (OpenAgents' starting data) become the workflow's variables: `{{name}}` in
        prompts, `context.name` in conditions. Texts and numbers stay; other values are written as JSON."""
        found: list[str] = []
        for key in CONTEXT_KEYS:
            if key not in self.data:
                continue
            raw = self.data.pop(key)
            variables = self.data.setdefault("variables", {})
            if not isinstance(raw, dict) or not isinstance(variables, dict):
                where = key if not isinstance(raw, dict) else "variables"
                self.problem((where,), f"'{key}' and 'variables' must be mappings of names to values",
                             f'write "{key}": {{"name": "value"}}')  # fmt: skip
                continue
            for name, value in raw.items():
                if name in variables:
                    self.problem((key, name), f"'{name}' is given in '{key}' and in 'variables' (or twice)",
                                 "keep one of them")  # fmt: skip
                    continue
                variables[name] = _as_variable(value)
                if (key, name) in self.lines:
                    self.lines[("variables", name)] = self.lines[(key, name)]
                found.append(str(name))
            self.lines.setdefault(("variables",), self.doc.line((key,)))
        return found

    def steps(self, raw: list[Any], path: Path) -> None:
        for n, step in enumerate(raw):
            if isinstance(step, dict):
                self.step(step, (*path, n), last=n == len(raw) - 1)

    def step(self, step: dict[str, Any], path: Path, *, last: bool) -> None:
        name = step.get("id", f"step {path[-1] + 1}")  # type: ignore[operator]
        if "type" not in step and "agent" in step:
            step["type"] = "agent"  # OpenAgents' own examples leave it out
        if "retry_delay" in step and self.rename(step, path, "retry_delay", "retry_delay_ms"):
            self.note((*path, "retry_delay_ms"), f"step '{name}': 'retry_delay' is a deprecated name of "
                      "'retry_delay_ms' (the first retry's wait in milliseconds)",
                      "rename it to retry_delay_ms")  # fmt: skip
        attempts = step.get("max_retries")
        if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts > 0:
            step["max_retries"] = attempts - 1
            self.note((*path, "max_retries"), f"step '{name}': max_retries {attempts} counts attempts in "
                      f"OpenAgents: {attempts - 1} retr{'y' if attempts == 2 else 'ies'} after the first attempt",
                      f"in taskgate's format this is max_retries: {attempts - 1}")  # fmt: skip
        if "condition" in step:
            self.rename(step, path, "condition", "when")
        kind = step.get("type")
        if kind == "agent" and "prompt" not in step:
            step["prompt"] = self.prompt
            self.prompted.append(str(name))
        if kind in _ROUTED and not last and not _routes_on(step, kind):
            step["next"] = END  # OpenAgents: no route on success ends the workflow (taskgate goes on to the next step)
        if kind == "group" and isinstance(step.get("steps"), list):
            self.steps(step["steps"], (*path, "steps"))


def _routes_on(step: dict[str, Any], kind: str) -> bool:
    """Whether the step says where it goes when it does not fail (a condition: for both outcomes)."""
    if kind == "approval":
        return "on_approve" in step or "next" in step
    if kind == "condition":
        return "next" in step or ("then" in step and "else" in step)
    return "on_success" in step or "next" in step


def _as_variable(value: object) -> str | int | float:
    """A context value as a workflow variable: texts and numbers as they are, anything else as JSON."""
    if isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    return json.dumps(value)
