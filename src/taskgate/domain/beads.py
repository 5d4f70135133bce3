"""What taskgate takes from Beads (steveyegge/beads): its readiness rule, its ids, and its statuses.

Beads decides readiness from typed dependencies (`internal/types/types.go`, `AffectsReadyWork`): only
`blocks`, `parent-child`, `conditional-blocks` and `waits-for` block; `related`, `discovered-from` and every
other type are associations. An issue is blocked (Beads' `blocked_issues_cache`) when

- a `blocks` or `conditional-blocks` dependency points at an issue that is not closed;
- a `waits-for` dependency points at a spawner that has a child (by `parent-child`) that is not closed;
- a `parent-child` dependency points at a parent that is itself blocked (blocking is inherited; an open
  epic does not block its children, or no child could ever start).

`effective_blockers` unfolds that rule into the plain list of issues whose closing unblocks an issue, which
is what the built-in tracker stores: "ready when every blocker is completed" then says the same as Beads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from taskgate.domain.entities import TaskStatus

BLOCKING_DEPENDENCY_TYPES = frozenset({"blocks", "parent-child", "conditional-blocks", "waits-for"})
CLOSED = "closed"
TOMBSTONE = "tombstone"  # a soft-deleted issue in an export

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def is_valid_issue_id(issue_id: object) -> bool:
    """Whether `issue_id` looks like a Beads id (`bd-a1b2`, `bd-a1b2.3`): safe as an argv item and a task id.

    It must start with a letter or digit, so nothing like `--flag` can reach `bd` as an option.
    """
    return isinstance(issue_id, str) and _ID_RE.fullmatch(issue_id) is not None


@dataclass(frozen=True, slots=True)
class BeadsNode:
    """One issue of a dependency graph: its Beads status and (depends_on_id, type) pairs."""

    status: str
    dependencies: tuple[tuple[str, str], ...] = ()


def effective_blockers(issue_id: str, graph: Mapping[str, BeadsNode]) -> list[tuple[str, str]]:
    """The issues whose closing unblocks `issue_id`, as (id, dependency type that brought it), first seen wins.

    `blocks`/`conditional-blocks` give their target, `waits-for` the children of its spawner, `parent-child`
    the effective blockers of the parent (recursively; a cycle stops the walk). Targets outside `graph` are
    kept for `blocks`/`conditional-blocks` (they block until known closed) and give nothing otherwise.
    """
    found: dict[str, str] = {}
    _collect(issue_id, graph, found, visiting=set())
    found.pop(issue_id, None)
    return list(found.items())


def _collect(issue_id: str, graph: Mapping[str, BeadsNode], found: dict[str, str], visiting: set[str]) -> None:
    if issue_id in visiting or issue_id not in graph:
        return
    visiting.add(issue_id)
    for target, kind in graph[issue_id].dependencies:
        if kind in ("blocks", "conditional-blocks"):
            found.setdefault(target, kind)
        elif kind == "waits-for":
            for child in children_of(target, graph):
                found.setdefault(child, kind)
        elif kind == "parent-child":
            inherited: dict[str, str] = {}
            _collect(target, graph, inherited, visiting)
            for blocker in inherited:
                found.setdefault(blocker, kind)


def children_of(parent_id: str, graph: Mapping[str, BeadsNode]) -> list[str]:
    """Ids whose `parent-child` dependency points at `parent_id`, sorted."""
    return sorted(i for i, node in graph.items() if (parent_id, "parent-child") in node.dependencies)


def is_ready(issue_id: str, graph: Mapping[str, BeadsNode]) -> bool:
    """Open, and every effective blocker is closed (an unknown blocker counts as open)."""
    node = graph.get(issue_id)
    if node is None or node.status != "open":
        return False
    return all(b in graph and graph[b].status == CLOSED for b, _ in effective_blockers(issue_id, graph))


def blocking_only(dependencies: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The dependencies whose type affects readiness."""
    return [(target, kind) for target, kind in dependencies if kind in BLOCKING_DEPENDENCY_TYPES]


def task_status_for_import(beads_status: str) -> TaskStatus:
    """The status an imported issue gets: `closed` → completed, everything else → open.

    In taskgate every status between open and completed follows a session (DESIGN §2); an imported issue
    has no session yet, so a Beads `in_progress`, `blocked`, `deferred`, `hooked` or custom status cannot
    be represented truthfully and becomes `open` (blockers, not the status, keep it out of `ready`).
    """
    return TaskStatus.COMPLETED if beads_status == CLOSED else TaskStatus.OPEN
