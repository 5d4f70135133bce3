"""Validating workflow and checklist documents into models, or into problems that name file, line and fix.

`validate_documents` turns the `Document`s infrastructure read into `Workflow` and `Checklist` models (see
domain/workflows/definitions.py), or into `WorkflowProblem`s. Nothing here reads a file. See docs/workflows.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from taskgate.domain.errors import InvalidInput
from taskgate.domain.outputs import output_path
from taskgate.domain.workflows.definitions import (
    ALL_STEP_KEYS,
    CHECKLIST_KEYS,
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_RETRY_DELAY_MS,
    DEFAULT_RETRY_MAX_DELAY_MS,
    END,
    ID_PATTERN,
    ITEM_KEYS,
    MAX_RETRIES,
    RETRY_KEYS,
    ROUTE_KEYS,
    STEP_KEYS,
    WHERE_KEY,
    WORK_STEPS,
    WORKFLOW_KEYS,
    Catalogue,
    Checklist,
    ChecklistItem,
    ContextMode,
    Document,
    ParallelAgent,
    Path,
    Step,
    StepType,
    Workflow,
    WorkflowProblem,
    parse_duration,
    step_routes,
    walk_steps,
)
from taskgate.domain.workflows.expressions import ExpressionError, parse_condition
from taskgate.domain.workflows.openagents import FORMATS, OPENAGENTS, from_openagents, reading
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


def _check_condition(text: str) -> tuple[str, int | None] | None:
    """The condition language's parser on `when` (domain/workflows/expressions.py): (message, column) if it does not
    parse."""
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
                if key in every and key in WHERE_KEY:
                    self.problem(
                        (*path, key),
                        f"{what}: '{key}' does not apply here",
                        f"'{key}' belongs to {WHERE_KEY[key]} steps; remove it or change the type",
                    )
                else:
                    self.problem(
                        (*path, key),
                        f"{what}: unknown key '{key}'",
                        suggest(key, allowed) or f"known keys: {', '.join(allowed)}",
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
        if value is not None and not ID_PATTERN.match(value):
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
    c = _Checker(doc, frozenset(agent_types) if agent_types is not None else None, frozenset(deaf))
    c.problems += mapped
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
        steps = _parse_steps(c, raw_steps, ("steps",), all_ids)
        _check_scope(c, steps, [], all_ids)
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


def _visible_to(c: _Checker, data: dict[str, Any]) -> tuple[str, ...]:
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


def _session_folder(c: _Checker, raw: object) -> str | None:
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


def _load_names(c: _Checker, data: dict[str, Any], path: Path, name: str) -> tuple[str, ...]:
    """`load:` — names of the workflow's variables whose values are files of the project to read into the prompt.
    Whether each is declared is checked with the workflow's variables (`_check_loads`)."""
    raw = c.listing(data, "load", path) or []
    out = []
    for n, entry in enumerate(raw):
        if not isinstance(entry, str) or not VARIABLE_NAME.fullmatch(entry):
            c.problem((*path, "load", n), f"step '{name}': load entry {entry!r} is not a variable name",
                      "name a variable whose value is a file, e.g. '- instructions'")  # fmt: skip
            continue
        out.append(entry)
    return tuple(out)


def _check_loads(c: _Checker, steps: Sequence[Step], variables: Mapping[str, str]) -> None:
    for step in walk_steps(steps):
        for name in step.load:
            if name not in variables:
                c.at(step.lines.get("load", step.line), f"step '{step.id}': load names '{name}', which is not one of "
                     "the workflow's variables", suggest(name, variables) or f"add it under variables: ({name}: "
                     "'{installed_path}/file.md')")  # fmt: skip


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
            suggest(str(raw_type), list(StepType)) or f"use one of {', '.join(StepType)}",
        )
        return None
    c.owner = f"{kind.value} step '{name}'"
    c.keys(data, path, STEP_KEYS[kind], c.owner, ALL_STEP_KEYS)
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
        if data.get("max_retries") is None and any(data.get(k) is not None for k in RETRY_KEYS[1:]):
            c.problem(
                (*path, "retry_delay_ms"),
                f"step '{name}': a retry delay without max_retries",
                "add max_retries: N (the delay only applies between retries)",
            )
    if "load" in STEP_KEYS[kind]:
        fields["load"] = _load_names(c, data, path, name)
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
                    suggest(target, [*ids, END]) or f"route to one of: {', '.join([*sorted(ids), END])}",
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
