"""What `session_status` shows of a session's workflow stack: its frames and what a person must do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Waiting:
    """What the top frame waits for, if a person must act: an approval (with its message) or checklist items."""

    kind: str  # approval | checklist
    step_id: str | None
    message: str
    items: tuple[dict[str, Any], ...] = ()
    missing: tuple[str, ...] = ()
    since_version: int = 0


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
                   "missing": list(w.missing)}  # fmt: skip
    return {"session_id": view.session_id, "state": view.state, "depth": view.depth, "breadcrumb": view.breadcrumb,
            "frames": list(view.frames), "waiting": waiting}  # fmt: skip
