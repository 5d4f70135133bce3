"""What `session_status` shows of a session's workflow stack: its frames and what a person must do."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskgate.domain.entities import Session
from taskgate.domain.workflows.definitions import Step, StepType
from taskgate.domain.workflows.run import Frame, FrameKind, FrameStatus, breadcrumb, load_stack


@dataclass(frozen=True, slots=True)
class Waiting:
    """What the top frame waits for, if a person must act: an approval (with its message) or checklist items."""

    kind: str  # approval | checklist
    step_id: str | None
    message: str
    items: tuple[dict[str, Any], ...] = ()
    missing: tuple[str, ...] = ()
    since_version: int = 0
    output_of: str | None = None  # an approval: the last step before it with an output (what it asks to read)


@dataclass(frozen=True, slots=True)
class StackView:
    """The session's stack as `session_status` shows it."""

    session_id: str
    state: str
    depth: int
    breadcrumb: str
    frames: tuple[dict[str, Any], ...]
    waiting: Waiting | None
    version: int


def stack_view_json(view: StackView) -> dict[str, Any]:
    """The view as plain JSON (CLI --json, MCP models)."""
    waiting = None
    if view.waiting is not None:
        w = view.waiting
        waiting = {"kind": w.kind, "step": w.step_id, "message": w.message, "items": list(w.items),
                   "missing": list(w.missing), "output_of": w.output_of}  # fmt: skip
    return {"session_id": view.session_id, "state": view.state, "depth": view.depth, "breadcrumb": view.breadcrumb,
            "frames": list(view.frames), "waiting": waiting}  # fmt: skip


class StackReading:
    """What a session's stack shows (a mixin of WorkflowEngine, which provides `_find`)."""

    _find: Callable[[Frame, str], Step | None]  # CatalogueLookup's

    def view(self, session: Session) -> StackView:
        """Depth, breadcrumb, frames and what a person must do, from the stored stack."""
        stack = load_stack(session.workflow_stack)
        frames = tuple(_frame_view(f) for f in stack)
        return StackView(session.id, session.state.value, len(stack), breadcrumb(stack), frames,
                         self.waiting(session), session.version)  # fmt: skip

    def waiting(self, session: Session) -> Waiting | None:
        """What the session's top frame waits for from a person, or None."""
        stack = load_stack(session.workflow_stack)
        if not stack:
            return None
        top = stack[-1]
        if top.kind is FrameKind.checklist:
            return Waiting("checklist", None, top.name, tuple(top.items), tuple(top.missing_items()), session.version)
        if top.status is not FrameStatus.waiting or top.step is None:
            return None
        step = self._find(top, top.step)
        if step is None:
            return None
        if step.type is StepType.approval:
            return Waiting("approval", step.id, step.message or "", since_version=session.version,
                           output_of=self._read_before(top))  # fmt: skip
        return Waiting("checklist", step.id, step.description or step.checklist or step.id, tuple(top.items),
                       tuple(top.missing_items()), session.version)  # fmt: skip

    def _read_before(self, top: Frame) -> str | None:
        """The step an approval asks to read: the one entered last before it (a loop comes back through its
        steps) that ran agents or a nested frame and has an output; never an approval's own note."""
        for step_id in reversed(top.history[:-1]):
            found = self._find(top, step_id)
            if found is not None and found.type in _PRODUCING and top.results.get(step_id, {}).get("output"):
                return step_id
        return None


_PRODUCING = frozenset({StepType.agent, StepType.parallel, StepType.workflow, StepType.group})


def _frame_view(frame: Frame) -> dict[str, Any]:
    return {
        "kind": frame.kind.value,
        "name": frame.name,
        "step": frame.step,
        "status": frame.status.value,
        "attempt": frame.attempt,
        "context_mode": frame.context_mode.value,
        "iterations": frame.iterations,
    }
