"""A workflow as a mermaid flowchart (`taskgate workflow show --mermaid`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from taskgate.domain.workflows.definitions import END, Step, StepType, Workflow, step_routes


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
