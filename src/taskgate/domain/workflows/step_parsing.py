"""A workflow's steps from its YAML (pure): each step's type and keys checked (agents, parallel agents, approvals,
checklists, nested workflows, conditions, routes), with ids unique across the workflow, routes within the step's scope,
and a changes target that can take changes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from taskgate.domain.workflows.checker import Checker, check_condition
from taskgate.domain.workflows.definitions import (
    ALL_STEP_KEYS,
    DEFAULT_RETRY_DELAY_MS,
    DEFAULT_RETRY_MAX_DELAY_MS,
    END,
    MAX_RETRIES,
    RETRY_KEYS,
    ROUTE_KEYS,
    STEP_KEYS,
    WORK_STEPS,
    ContextMode,
    ParallelAgent,
    Path,
    Step,
    StepType,
    step_routes,
)
from taskgate.domain.workflows.templating import NAME as VARIABLE_NAME
from taskgate.domain.workflows.variables import (
    suggest,
)


def parse_steps(c: Checker, raw: list[Any], path: Path, all_ids: dict[str, int]) -> tuple[Step, ...]:
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


def _parse_step(c: Checker, data: Any, path: Path, all_ids: dict[str, int]) -> Step | None:
    outer = c.owner
    try:
        return _parse_step_in(c, data, path, all_ids)
    finally:
        c.owner = outer


def _parse_step_in(c: Checker, data: Any, path: Path, all_ids: dict[str, int]) -> Step | None:
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
        fields["load"] = load_names(c, data, path, name)
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
            if when is not None and (bad := check_condition(when)) is not None:
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
                fields["steps"] = parse_steps(c, raw, (*path, "steps"), all_ids)
    if ident is None:
        return None
    return Step(ident, kind, **fields)


def _agent_name(c: Checker, data: dict[str, Any], key: str, path: Path, name: str, *, required: bool) -> str | None:
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


def _parallel_agents(c: Checker, data: dict[str, Any], path: Path, name: str, *, has_prompt: bool):
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


def check_scope(c: Checker, steps: Sequence[Step], visible: list[str], all_ids: dict[str, int]) -> None:
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
            check_scope(c, step.steps, [*visible, *(s.id for s in steps[:i])], all_ids)
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


def _check_changes_target(c: Checker, step: Step, steps: Sequence[Step]) -> None:
    """`on_request_changes` names a step of the list that runs agents: the operator's instructions are for them."""
    target = next((s for s in steps if s.id == step.on_request_changes), None)
    at = step.lines.get("on_request_changes", step.line)
    if step.on_request_changes == END:
        c.at(at, f"step '{step.id}': on_request_changes cannot be 'end'",
             "name the step that makes the change (an agent step, usually the coder's)")  # fmt: skip
    elif target is not None and target.type not in WORK_STEPS:
        c.at(at, f"step '{step.id}': on_request_changes '{target.id}' is a {target.type.value} step, which runs no "
             "agents", "name an agent, parallel, workflow or group step: the one that makes the change")  # fmt: skip


def parse_mapping(c: Checker, kind: str, body: str) -> dict | None:
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


def load_names(c: Checker, data: dict[str, Any], path: Path, name: str) -> tuple[str, ...]:
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
