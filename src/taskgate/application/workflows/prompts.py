"""What an agent step's agents are told: the step's prompt with its variables resolved, the files it asks for, the
input of an earlier step and the operator's instructions (pure but for reading the project's files).

The variables a prompt sees, besides the built-ins (`{project-root}`, `{session_id}`, `{session-folder}`):
the frame's variables (the workflow's `variables:`, those it inherited, a run's `--context` as `context.<key>`),
the task's fields (`task.id`, `task.title`, `task.description`, `task.priority`), `input` (the output of the step
named by `input:`), `instructions` (an operator's request_changes), `steps.<id>.<field>` of the frame's results,
and `load.<name>` for each file of the step's `load:`. The rules of resolution are domain/workflows/templating.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taskgate.application.workflows.storage import ProjectFiles
from taskgate.domain.agents.kinds import as_revision
from taskgate.domain.errors import InvalidInput
from taskgate.domain.workflows.definitions import Step, StepType
from taskgate.domain.workflows.run import Frame
from taskgate.domain.workflows.templating import ConfigLookup, references, resolve


@dataclass(frozen=True, slots=True)
class PromptFacts:
    """What a step's prompts are resolved against, besides its frame."""

    task: Mapping[str, Any]  # id, title, description, priority
    root: str  # the project's root: `{project-root}`, and the folder `load:` files must be in
    session_id: str
    folder: str  # the session folder: `{session-folder}`


@dataclass(frozen=True, slots=True)
class StepPrompts:
    """(agent type, prompt) per agent of the step, and what the manifest records as their inputs."""

    specs: list[tuple[str, str]]
    inputs: dict[str, Any]


def step_prompts(step: Step, top: Frame, facts: PromptFacts, files: ProjectFiles | None) -> StepPrompts:
    """The prompts of `step` run in frame `top`. Raises: VariableError (an unknown name, a cycle, a config key
    missing), InvalidInput / Forbidden (a `load:` file missing, too big, or outside the project)."""
    builtins = {"project-root": facts.root, "session_id": facts.session_id, "session-folder": facts.folder}
    variables = {**top.variables, **_task_variables(facts.task), **_result_variables(top)}
    given = step.input and top.results.get(step.input)
    if given:
        variables["input"] = str(given.get("output", ""))
    variables.setdefault("input", "")
    variables.setdefault("instructions", "")
    config = (lambda path, key: files.config_value(facts.root, path, key)) if files is not None else None
    loaded = _load(step, variables, builtins, facts, files, config)
    variables.update({f"load.{name}": text for name, (_path, text) in loaded.items()})
    pairs = (
        [(step.agent or "", step.prompt)]
        if step.type is StepType.agent
        else [(a.agent, a.prompt or step.prompt) for a in step.agents]
    )
    specs = []
    for agent, prompt in pairs:
        text = resolve(prompt or "", builtins, variables, config=config)
        for name, (path, content) in loaded.items():
            if f"load.{name}" not in (prompt or ""):
                text += f"\n\n{name} ({path}):\n{content}"
        if given and "input" not in references(prompt or ""):
            text += f"\n\nOutput of step '{step.input}':\n{variables['input']}"
        elif not given and top.variables.get("input") and "input" not in references(prompt or ""):
            text += f"\n\nThe run's input:\n{variables['input']}"  # `workflow run --input`, or a parent's
        if variables["instructions"]:
            text += f"\n\n{as_revision(variables['instructions'])}"
        specs.append((agent, text.strip() or f"Work on the task: {facts.task.get('title', '')}"))
    inputs = {
        "prompts": [{"agent": agent, "prompt": text} for agent, text in specs],
        "input_from": step.input,
        "instructions": variables["instructions"] or None,
        "files": {name: path for name, (path, _text) in loaded.items()},
        "context": {k[len("context.") :]: v for k, v in top.variables.items() if k.startswith("context.")},
    }
    return StepPrompts(specs, inputs)


def _task_variables(task: Mapping[str, Any]) -> dict[str, str]:
    return {f"task.{key}": str(task.get(key, "")) for key in ("id", "title", "description", "priority")}


def _result_variables(top: Frame) -> dict[str, str]:
    """`steps.<id>.<field>` for the frame's results (a nested step's structured result included)."""
    out: dict[str, str] = {}
    for step_id, result in top.results.items():
        for key in ("status", "output", "summary", "success", "attempts"):
            if key in result:
                value = result[key]
                text = ("true" if value else "false") if isinstance(value, bool) else str(value)
                out[f"steps.{step_id}.{key}"] = text
    return out


def _load(
    step: Step,
    variables: dict[str, str],
    builtins: dict[str, str],
    facts: PromptFacts,
    files: ProjectFiles | None,
    config: ConfigLookup | None,
) -> dict[str, tuple[str, str]]:
    """name → (path, text) of each `load:` file, read inside the project."""
    out: dict[str, tuple[str, str]] = {}
    for name in step.load:
        path = resolve("{{" + name + "}}", builtins, variables, config=config)
        if files is None:
            raise InvalidInput(f"step '{step.id}' loads {path}, but this service reads no project files")
        out[name] = (path, files.read_text(facts.root, path))
    return out
