"""Who may see and run a workflow: its `visible_to` list (pure).

OpenAgents' `visible_to` names the agents that may call a workflow (or a subagent): `["plan", "build"]`, `["*"]`
for all, and a person (no calling agent) is never filtered. taskgate keeps that meaning and adds operators:

* `*`: everyone; `agent:*`: every agent; `operator:*`: every operator;
* `<agent type>` or `agent:<agent type>`: an agent whose own token (`TASKGATE_TOKEN`) belongs to an agent of that type
  (`[agents.<type>]`); an agent token made by hand for a whole session names no type, so only `*` or `agent:*`
  admit it;
* `operator:<id>`: that operator. A list that names no operator restricts agents only, as in OpenAgents.

A workflow without `visible_to` is everyone's. The list is checked when a caller names the workflow (to run it,
push it onto a session, start a session with it, or list the catalogue); a `workflow` step of a running workflow
is the workflow's own doing and is not checked. See docs/workflows.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from taskgate.domain.errors import Forbidden

EVERYONE = "*"
OPERATOR, AGENT = "operator:", "agent:"


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who names a workflow: an operator by id, or an agent by its type (None when its token names no agent)."""

    kind: Literal["operator", "agent"]
    name: str | None

    @classmethod
    def operator(cls, operator_id: str) -> Viewer:
        return cls("operator", operator_id)

    @classmethod
    def agent(cls, agent_type: str | None) -> Viewer:
        return cls("agent", agent_type)

    @classmethod
    def of_actor(cls, actor: str) -> Viewer:
        """The viewer of an operator's actor text (`operator:alice`, as the CLI acts)."""
        return cls.operator(actor.removeprefix(OPERATOR))

    def __str__(self) -> str:
        if self.kind == "operator":
            return f"{OPERATOR}{self.name}"
        return f"an agent of type {self.name}" if self.name else "an agent token that names no agent type"


def allows(visible_to: Sequence[str], viewer: Viewer | None) -> bool:
    """Whether `viewer` may see and run a workflow with this `visible_to` (empty: everyone; None: the system)."""
    if not visible_to or viewer is None or EVERYONE in visible_to:
        return True
    if viewer.kind == "operator":
        named = [entry for entry in visible_to if entry.startswith(OPERATOR)]
        return not named or f"{OPERATOR}*" in named or f"{OPERATOR}{viewer.name}" in named
    if f"{AGENT}*" in visible_to:
        return True
    return viewer.name is not None and (viewer.name in visible_to or f"{AGENT}{viewer.name}" in visible_to)


def check_visible(workflow_id: str, visible_to: Sequence[str], viewer: Viewer | None) -> None:
    """Raises: Forbidden naming the list, when `viewer` may not run the workflow."""
    if not allows(visible_to, viewer):
        raise Forbidden(
            f"workflow '{workflow_id}' is visible_to [{', '.join(visible_to)}] only, not to {viewer} "
            "(its file's visible_to says who may run it)"
        )


def entry_problem(entry: object) -> str | None:
    """What is wrong with one `visible_to` entry, or None."""
    if not isinstance(entry, str) or not entry.strip() or entry != entry.strip() or " " in entry:
        return f"{entry!r} is not a name: write '*', an agent type, 'agent:<type>' or 'operator:<id>'"
    if entry in (OPERATOR, AGENT):
        return f"'{entry}' names nobody: add an id or type after the colon, or '*'"
    return None


def agent_type_named(entry: str) -> str | None:
    """The agent type an entry names (`plan`, `agent:plan`), or None (`*`, `agent:*`, `operator:…`)."""
    if entry == EVERYONE or entry.startswith(OPERATOR) or entry == f"{AGENT}*":
        return None
    return entry.removeprefix(AGENT)
