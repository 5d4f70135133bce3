"""What a workflow's prompts and variables may name (pure): the names taskgate fills in at run time, the ones a
workflow may not declare, the references `workflow validate` can refuse before a run, and the `session_folder`
template's one rule. The resolution itself is domain/workflows/templating.py's.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from taskgate.domain.workflows.definitions import StepType, Workflow, WorkflowProblem, walk_steps
from taskgate.domain.workflows.templating import BUILTINS, references, resolve


def suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else ""


# What every prompt may use besides the workflow's own variables: the task's fields, the step's input, the operator's
# instructions and the built-ins. `context.*` (a run's --context) is only known at run time, and `steps.<id>.*`
# names the results of the workflow's own steps.
RUN_VARIABLES = frozenset({"task.id", "task.title", "task.description", "task.priority", "input", "instructions"})


RESULT_FIELDS = frozenset({"status", "output", "summary", "success", "attempts"})


RESERVED_VARIABLES = {
    "input": "{{input}} is the output of the step's input: step (or the run's --input)",
    "instructions": "{{instructions}} is the operator's instructions (request_changes, a rejection's reason)",
}


RESERVED_PREFIXES = {
    "task.": "task.* are the task's fields",
    "context.": "context.* are the run's --context",
    "steps.": "steps.* are the results of the workflow's steps",
    "load.": "load.* are the files of a step's load:",
}


def reserved_reason(name: str) -> str | None:
    """Why a workflow may not declare variable `name` (a name taskgate fills in), or None."""
    if name in RESERVED_VARIABLES or name in BUILTINS:
        return RESERVED_VARIABLES.get(name, f"{{{name}}} is a built-in")
    return next((why for prefix, why in RESERVED_PREFIXES.items() if name.startswith(prefix)), None)


def session_folder_path(template: str, session_id: str, workflow: str, date: str, task_id: str) -> str:
    """A `session_folder` template resolved (the engine's and validation's one rule). Raises: VariableError."""
    builtins = {"session_id": session_id, "workflow": workflow, "date": date}
    return resolve(template, builtins, {"task.id": task_id})


def inherited_variables(workflows: Mapping[str, Workflow]) -> dict[str, frozenset[str]]:
    """Per workflow, the variables it inherits when a workflow step of another one runs it (its frame starts with
    the parent frame's variables); followed through nesting, bounded by the number of workflows."""
    inherited: dict[str, set[str]] = {name: set() for name in workflows}
    for _ in range(len(workflows)):
        changed = False
        for parent in workflows.values():
            given = set(parent.variables) | inherited[parent.id]
            for step in walk_steps(parent.steps):
                child = step.workflow if step.type is StepType.workflow else None
                if child in inherited and not given <= inherited[child]:
                    inherited[child] |= given
                    changed = True
        if not changed:
            break
    return {name: frozenset(names) for name, names in inherited.items()}


def unknown_references(workflow: Workflow, inherited: frozenset[str]) -> list[WorkflowProblem]:
    """Every `{{name}}` of the workflow's prompts and variables must be one a run can know: its variables, those it
    inherits, `RUN_VARIABLES`, the built-ins, `context.*`, `load.<name>` of the step's own `load`, and
    `steps.<id>.<field>` of its steps. Found now, not when the session reaches the step."""
    step_ids = {s.id for s in walk_steps(workflow.steps)}
    base = set(workflow.variables) | inherited | RUN_VARIABLES | set(BUILTINS)

    def unknown(text: str, extra: set[str]) -> list[str]:
        return [name for name in references(text) if name not in base | extra and not _dynamic(name, step_ids)]

    problems: list[WorkflowProblem] = []
    for name, value in workflow.variables.items():
        for bad in unknown(value, set()):
            problems.append(_unknown_problem(workflow, workflow.line, f"variable '{name}'", bad, base))
    for step in walk_steps(workflow.steps):
        loaded = {f"load.{name}" for name in step.load}
        texts = [("prompt", step.prompt), *((("agents", a.prompt)) for a in step.agents)]
        if isinstance(step.summarize, str):
            texts.append(("summarize", step.summarize))
        for key, text in texts:
            for bad in unknown(text or "", loaded):
                line = step.lines.get(key, step.line)
                problems.append(_unknown_problem(workflow, line, f"step '{step.id}'", bad, base | loaded))
    return problems


def _dynamic(name: str, step_ids: set[str]) -> bool:
    """`context.<key>` (given at run time) and `steps.<id>.<field>` of an existing step."""
    if name.startswith("context.") and len(name) > len("context."):
        return True
    parts = name.split(".")
    return len(parts) == 3 and parts[0] == "steps" and parts[1] in step_ids and parts[2] in RESULT_FIELDS


def _unknown_problem(workflow: Workflow, line: int, where: str, name: str, known: set[str]) -> WorkflowProblem:
    hint = suggest(name, known) or (
        "declare it under 'variables:', or use one of: " + ", ".join(sorted(n for n in known if "-" not in n))
    )
    return WorkflowProblem(workflow.file, line, f"{where}: unknown variable '{{{{{name}}}}}'", hint)
