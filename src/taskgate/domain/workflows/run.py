"""A session's workflow stack and the pure rules that move it (DESIGN §7); no I/O here.

The stack is a list of frames, persisted as JSON in `sessions.workflow_stack` (bottom first). The top frame
runs; a frame is a workflow (the root, a nested `workflow` step, or one pushed by `add_workflow_to_session`),
a group step's own list of steps, or a checklist pushed by `add_checklist_to_session`.

A frame's current step moves through `pending → running | waiting | retry → done`: the engine (application
layer) starts the step, records its outcome in the frame (`done`), and routes it when the frame is on top. The
split matters for nesting: a frame pushed while its parent's agents still run keeps the parent's outcome in
the parent until the child has popped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from taskgate.domain.entities import StepStatus
from taskgate.domain.workflows.definitions import END, ContextMode, Step, StepType

MAX_DEPTH = 16  # frames on one session's stack
HISTORY = 50  # visited steps a frame remembers (for workflow_back)
OUTPUT_LIMIT = 32_000  # characters of a step's output kept in the context (and given to the next step's prompt)
RUN_OUTPUT_LIMIT = 1_000_000  # characters of a step's output kept in its run row (`taskgate session output`)


class FrameKind(StrEnum):
    workflow = "workflow"
    group = "group"
    checklist = "checklist"


class FrameStatus(StrEnum):
    pending = "pending"  # the current step has not started
    running = "running"  # its agents run, or a child frame runs for it
    waiting = "waiting"  # it waits for a person: an approval, or a checklist's required items
    retry = "retry"  # it failed and waits until `retry_at` for another attempt
    done = "done"  # its outcome is recorded and waits to be routed


@dataclass(frozen=True, slots=True)
class LoopLimits:
    """The loop guard: a frame fails after `max_iterations` step runs (the workflow's own limit wins when
    lower), or when one step ran `repeats` times with the same outcome among its last `window` step runs."""

    max_iterations: int = 100
    window: int = 5
    repeats: int = 3


@dataclass(slots=True)
class Frame:
    """One frame of the stack. `results` is what its steps see as `steps.<id>` (by context mode)."""

    kind: FrameKind
    name: str  # workflow id, checklist id, or the group step's id
    workflow: str | None = None  # the workflow that defines the frame's steps (groups: the enclosing one)
    context_mode: ContextMode = ContextMode.isolated
    summarize: bool | str | None = None
    parent_step: str | None = None  # the step of the frame below that pushed this one (None: pushed by hand)
    step: str | None = None
    status: FrameStatus = FrameStatus.pending
    attempt: int = 1
    run_id: int | None = None
    agents: list[str] = field(default_factory=list)  # the running step's agent ids (also on its run row)
    outcome: dict[str, Any] | None = None  # {"status": StepStatus value, "output": str}
    retry_at: str | None = None  # ISO time
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)
    iterations: int = 0
    max_iterations: int = 100
    trail: list[list[str]] = field(default_factory=list)  # [step id, outcome fingerprint], the last `window`
    history: list[str] = field(default_factory=list)  # steps entered, for workflow_back
    items: list[dict[str, Any]] = field(default_factory=list)  # checklist items waited for {id, text, required}
    checked: list[str] = field(default_factory=list)
    own: list[str] = field(default_factory=list)  # step ids whose results this frame wrote (for shared pops)
    started_at: str = ""
    deadline: str | None = None  # ISO time: the workflow's max_duration
    usage: dict[str, Any] = field(default_factory=dict)  # tokens, turns, cost the agents reported, summed
    baseline: dict[str, str] | None = None  # the worktree's changed files when the frame started (path → stat)

    def as_json(self) -> dict[str, Any]:
        """The frame as plain JSON values, sharing no container the frame changes with it.

        The frame's own lists and dicts are copied, one level deep: what they hold (a step's result, a trail
        entry, a checklist item) is replaced by the rules of this module, never changed in place, so sharing it
        is safe. A deep copy cost ~120 µs per save for a frame with 40 step results, as much as the JSON encoding
        itself, on every step (`dataclasses.asdict`, earlier, ~400 µs)."""
        data = {name: _shallow(getattr(self, name)) for name in self.__dataclass_fields__}
        data["kind"], data["status"] = self.kind.value, self.status.value
        data["context_mode"] = self.context_mode.value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Frame:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(
            **{
                **known,
                "kind": FrameKind(data["kind"]),
                "status": FrameStatus(data.get("status", "pending")),
                "context_mode": ContextMode(data.get("context_mode", "isolated")),
            }
        )

    @property
    def label(self) -> str:
        """The frame as the breadcrumb shows it."""
        return f"checklist {self.name}" if self.kind is FrameKind.checklist else self.name

    def missing_items(self) -> list[str]:
        """Required checklist items not ticked yet."""
        return [i["id"] for i in self.items if i.get("required", True) and i["id"] not in self.checked]


def _shallow(value: Any) -> Any:
    """A copy of a container (a dict, or a list for a list or tuple); anything else as it is."""
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list | tuple):
        return list(value)
    return value


def load_stack(raw: Sequence[Mapping[str, Any]]) -> list[Frame]:
    return [Frame.from_json(f) for f in raw]


def dump_stack(stack: Sequence[Frame]) -> list[dict[str, Any]]:
    return [f.as_json() for f in stack]


def breadcrumb(stack: Sequence[Frame]) -> str:
    """`workflow › step › nested workflow › step`, bottom to top."""
    parts: list[str] = []
    for frame in stack:
        parts.append(frame.label)
        if frame.step and frame.kind is not FrameKind.checklist:
            parts.append(frame.step)
    return " › ".join(parts)


# ------------------------------------------------------------------------------------------------- routing


def following(steps: Sequence[Step], step_id: str) -> str:
    """The step after `step_id` in its list, or `end`."""
    ids = [s.id for s in steps]
    i = ids.index(step_id)
    return ids[i + 1] if i + 1 < len(ids) else END


def find_step(steps: Sequence[Step], step_id: str) -> Step | None:
    return next((s for s in steps if s.id == step_id), None)


def find_group(steps: Sequence[Step], group_id: str) -> Step | None:
    """The group step `group_id` anywhere among `steps` (groups nest)."""
    for step in steps:
        if step.id == group_id and step.type is StepType.group:
            return step
        if step.steps and (found := find_group(step.steps, group_id)) is not None:
            return found
    return None


def route(step: Step, status: StepStatus, steps: Sequence[Step]) -> str | None:
    """Where an outcome goes: a step id, `end`, or None (no route: the frame fails, or a rejection rejects).

    `changes_requested` is not routed here (see `workflows.changes_target`)."""
    default = step.next or following(steps, step.id)
    if status in (StepStatus.SUCCEEDED, StepStatus.SKIPPED):
        return step.on_success or default
    if status is StepStatus.APPROVED:
        return step.on_approve or default
    if status is StepStatus.REJECTED:
        return step.on_reject
    if status is StepStatus.FAILED:
        return step.on_error
    raise ValueError(f"no route for {status.value}")


def condition_target(step: Step, result: bool, steps: Sequence[Step]) -> str:
    default = step.next or following(steps, step.id)
    return (step.then if result else step.else_) or default


def fingerprint(status: str, output: str, instructions: str = "") -> str:
    return hashlib.sha256(f"{status}\0{output}\0{instructions}".encode()).hexdigest()[:16]


def iteration_problem(frame: Frame, limits: LoopLimits) -> str | None:
    """Why the frame may not run another step (its max_iterations is used up), or None."""
    cap = min(frame.max_iterations, limits.max_iterations)
    if frame.iterations >= cap:
        return f"loop guard: {frame.label} ran {frame.iterations} steps, its limit is {cap} (max_iterations)"
    return None


def repeat_problem(frame: Frame, step_id: str, print_: str, limits: LoopLimits) -> str | None:
    """Remember that `step_id` ended with outcome `print_`; say why that is a loop without progress, or None.

    Retries are not remembered (they are bounded by max_retries); routed step runs are."""
    frame.trail = [*frame.trail, [step_id, print_]][-limits.window :]
    same = sum(1 for s, p in frame.trail if s == step_id and p == print_)
    if same >= limits.repeats:
        return (
            f"loop guard: step '{step_id}' of {frame.label} ended the same way {same} times in its last "
            f"{len(frame.trail)} step runs (no progress)"
        )
    return None


def enter(frame: Frame, step_id: str) -> None:
    """Make `step_id` the frame's current step, not started yet."""
    frame.step, frame.status, frame.attempt = step_id, FrameStatus.pending, 1
    frame.run_id, frame.outcome, frame.retry_at, frame.agents = None, None, None, []
    frame.history = [*frame.history, step_id][-HISTORY:]


def record(
    frame: Frame, step_id: str, status: StepStatus, output: str, attempts: int, nested: Mapping[str, Any] | None = None
) -> None:
    """The step's result as the frame's later steps and conditions read it (`steps.<id>.…`); `nested` adds the
    structured result of a workflow or group step (`nested_result`)."""
    result = {"status": status.value, "output": clip(output), "attempts": attempts,
              "success": status in (StepStatus.SUCCEEDED, StepStatus.APPROVED)}  # fmt: skip
    frame.results[step_id] = {**result, **(nested or {})}
    if step_id not in frame.own:
        frame.own.append(step_id)


def clip(output: str, limit: int = OUTPUT_LIMIT) -> str:
    """A step's output as the context keeps it: whole when it fits in `limit` characters; else its start, cut at
    the end of a line, and a line saying how much was left out (the step's run row keeps the whole output, which
    `taskgate session output` prints). An agent's result reads from its start (its summary, its plan)."""
    if len(output) <= limit:
        return output
    head = output[: limit - 200]
    cut = head.rfind("\n")
    head = head[:cut] if cut > 0 else head
    return f"{head}\n[… {len(output) - len(head)} more characters; `taskgate session output` prints the whole output]"


USAGE_KEYS = ("turns", "input_tokens", "output_tokens", "cache_read_tokens", "cost_usd")
CHILD_OUTPUT_LIMIT = 500  # characters of each child step's output kept in the parent's structured result


def add_usage(total: Mapping[str, Any], report: Mapping[str, Any] | None) -> dict[str, Any]:
    """`total` plus what one agent reported of its run (agent_reports.AgentReport.as_dict()); keys it does not
    report stay as they were (a cost is summed only where reported). A report of no usage at all (a plain-text
    agent's, which holds only its final message) adds nothing."""
    out = dict(total)
    if not any((report or {}).get(key) for key in USAGE_KEYS) and (report or {}).get("cost_usd") is None:
        return out
    for key in USAGE_KEYS:
        value = (report or {}).get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = out.get(key, 0) + value
    return out


def changed_files(before: Mapping[str, str] | None, after: Mapping[str, str] | None) -> list[str] | None:
    """The files whose state differs between two snapshots of the worktree's changes (path → stat); None when
    either is unknown."""
    if before is None or after is None:
        return None
    return sorted(p for p in {*before, *after} if before.get(p) != after.get(p))


def nested_result(child: Frame, steps: Sequence[Step], status: StepStatus, files: list[str] | None) -> dict[str, Any]:
    """What a workflow or group step hands its frame besides its output: `success`, `summary` (a line per step
    it ran), `children` (each step's status, output start and attempts), `files_changed` (None: unknown) and
    `usage` (summed over its agents, nested frames included)."""
    children = {
        step_id: {"status": r.get("status"), "output": str(r.get("output", ""))[:CHILD_OUTPUT_LIMIT],
                  "attempts": r.get("attempts", 1), "success": r.get("success", r.get("status") == "succeeded")}
        for step_id in child.own if (r := child.results.get(step_id)) is not None
    }  # fmt: skip
    return {
        "success": status is StepStatus.SUCCEEDED,
        "summary": summary(child, steps),
        "children": children,
        "files_changed": files,
        "usage": dict(child.usage),
    }


def child_results(parent: Frame, mode: ContextMode) -> dict[str, dict[str, Any]]:
    """What a child frame's steps see when it starts: nothing (isolated) or a copy of the parent's."""
    return {} if mode is ContextMode.isolated else {k: dict(v) for k, v in parent.results.items()}


def merge_back(parent: Frame, child: Frame) -> None:
    """A shared child's writes become the parent's (isolated and inherited children keep theirs)."""
    if child.context_mode is ContextMode.shared:
        for step_id in child.own:
            if step_id in child.results:
                parent.results[step_id] = child.results[step_id]
                if step_id not in parent.own:
                    parent.own.append(step_id)


def last_output(frame: Frame) -> str:
    """The output of the last step the frame ran that had one (what a nested frame hands on by default)."""
    for step_id in reversed(frame.own):
        out = frame.results.get(step_id, {}).get("output")
        if out:
            return str(out)
    return ""


def summary(child: Frame, steps: Sequence[Step]) -> str:
    """The summarize text a group hands its parent: the prompt (if one was given), then one line per step
    the group ran, in the group's order, with its status and the start of its output."""
    lines = [child.summarize] if isinstance(child.summarize, str) else []
    for step in steps:
        result = child.results.get(step.id)
        if result is not None and step.id in child.own:
            out = " ".join(str(result.get("output", "")).split())[:300]
            lines.append(f"- {step.id}: {result['status']}" + (f": {out}" if out else ""))
    return "\n".join(lines)


def frame_context(frame: Frame, task: Mapping[str, Any], session: Mapping[str, Any]) -> dict[str, Any]:
    """What conditions and prompts read: `steps.<id>.status|output|attempts`, `context.<var>`, `task.*`,
    `session.*`."""
    context = dict(frame.variables)  # a run's --context key k is the variable `context.k`: `context.k` here too
    context.update({k.removeprefix("context."): v for k, v in frame.variables.items() if k.startswith("context.")})
    return {"steps": frame.results, "context": context, "task": dict(task), "session": dict(session)}
