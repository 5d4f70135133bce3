"""What taskgate takes from Beads (gastownhall/beads, formerly steveyegge/beads): its ready rule, ids, statuses.

The rule is `bd ready`'s, read from Beads' source (v1.0.3; `cmd/bd/ready.go`, `internal/storage/issueops/
ready_work.go` `GetReadyWorkInTx`, `internal/storage/issueops/blocked.go` `ComputeBlockedIDsInTx`) and written
out in docs/trackers.md. An issue is **ready** when all of these hold:

1. its status is `open` (not `in_progress`, `blocked`, `deferred`, `hooked`, `pinned`, `closed`, nor any custom
   status, whatever its category: `bd ready` filters `status = 'open'`);
2. it is not pinned (the `pinned` flag), not ephemeral (a wisp), and its type is not one `bd ready` leaves out
   (`merge-request`, `gate`, `molecule`, `message`, `agent`, `role`, `rig`);
3. it is not deferred (`defer_until` in the future), nor is its parent;
4. it is not **blocked**, and neither is its parent (one hop: a blocked parent hides its direct children only).

An issue is blocked when it is *active* (its status is neither `closed` nor `pinned`) and it has
- a `blocks` or `conditional-blocks` dependency on an active issue, or
- a `waits-for` dependency on a spawner whose direct `parent-child` children are: for the default gate
  `all-children`, any of them active; for `any-children`, none closed and some active (no children: never).

A dependency on an issue that is missing, deleted (a legacy `tombstone`), closed, pinned, or `external:…`
blocks nothing. `related`, `discovered-from` and every other type never block.

`BeadsGraph.stored_blockers` turns this into the rows the built-in tracker keeps (ready = every stored blocker
completed), so that completing a task in taskgate unblocks what depends on it as closing it in Beads would.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

from taskgate.domain.entities import TaskStatus

BLOCKING_DEPENDENCY_TYPES = frozenset({"blocks", "parent-child", "conditional-blocks", "waits-for"})
"""The types Beads says affect ready work (`types.AffectsReadyWork`); the others are associations."""
EDGE_TYPES = frozenset({"blocks", "conditional-blocks"})
NOT_WORK_TYPES = frozenset({"merge-request", "gate", "molecule", "message", "agent", "role", "rig"})
"""Issue types `bd ready` leaves out when no `--type` is given (workflow and identity types)."""
OPEN = "open"
CLOSED = "closed"
PINNED = "pinned"
TOMBSTONE = "tombstone"  # a deleted issue in an export written before Beads 0.51 (later ones just drop it)
INACTIVE_STATUSES = frozenset({CLOSED, PINNED, TOMBSTONE})
ANY_CHILDREN = "any-children"
WAITS_FOR_ANY = "waits-for-any"  # the stored type of an any-children gate's children (docs/trackers.md)

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def is_valid_issue_id(issue_id: object) -> bool:
    """Whether `issue_id` looks like a Beads id (`bd-a1b2`, `bd-a1b2.3`): safe as an argv item and a task id.

    It must start with a letter or digit, so nothing like `--flag` can reach `bd` as an option.
    """
    return isinstance(issue_id, str) and _ID_RE.fullmatch(issue_id) is not None


@dataclass(frozen=True, slots=True)
class BeadsNode:
    """One issue as the ready rule sees it. `dependencies`: (depends_on_id, type); `any_gates`: the spawners of
    this issue's `waits-for` dependencies whose gate is `any-children`."""

    status: str = OPEN
    dependencies: tuple[tuple[str, str], ...] = ()
    issue_type: str = "task"
    pinned: bool = False
    ephemeral: bool = False
    defer_until: datetime | None = None
    any_gates: frozenset[str] = frozenset()


class BeadsGraph:
    """A set of issues (an export, or what `bd list --all` printed) and the ready rule over them."""

    def __init__(self, nodes: Mapping[str, BeadsNode]) -> None:
        self.nodes = nodes
        self._holds: dict[str, str | None] = {}  # per issue, for the one `now` a graph is asked about

    def is_active(self, issue_id: str) -> bool:
        """Known, and neither closed, pinned nor deleted: only such an issue can block another."""
        node = self.nodes.get(issue_id)
        return node is not None and node.status not in INACTIVE_STATUSES

    @cached_property
    def children(self) -> dict[str, list[str]]:
        """Each parent's direct children (the issues whose `parent-child` dependency points at it)."""
        found: dict[str, list[str]] = {}
        for issue_id, node in self.nodes.items():
            for target, kind in node.dependencies:
                if kind == "parent-child":
                    found.setdefault(target, []).append(issue_id)
        return {parent: sorted(kids) for parent, kids in found.items()}

    @cached_property
    def blocked(self) -> frozenset[str]:
        """The issues blocked by their own dependencies (Beads' `ComputeBlockedIDsInTx`)."""
        return frozenset(i for i in self.nodes if self.is_active(i) and self.direct_blockers(i, now_only=True))

    def direct_blockers(self, issue_id: str, *, now_only: bool = False) -> list[tuple[str, str]]:
        """What blocks the issue through its own `blocks`/`conditional-blocks`/`waits-for` dependencies, as
        (issue whose closing unblocks it, type). `now_only`: just the ones active now (the rule); otherwise every
        one that could block (known and not pinned or deleted: closed ones too, should they reopen)."""
        node = self.nodes.get(issue_id)
        if node is None:
            return []
        found: dict[str, str] = {}
        for target, kind in node.dependencies:
            if kind in EDGE_TYPES and self._counts(target, now_only):
                found.setdefault(target, kind)
            elif kind == "waits-for":
                for child, child_kind in self._gate(target, target in node.any_gates, now_only):
                    found.setdefault(child, child_kind)
        return list(found.items())

    def _counts(self, issue_id: str, now_only: bool) -> bool:
        if now_only:
            return self.is_active(issue_id)
        node = self.nodes.get(issue_id)
        return node is not None and node.status not in (PINNED, TOMBSTONE)

    def _gate(self, spawner: str, any_children: bool, now_only: bool) -> list[tuple[str, str]]:
        kids = self.children.get(spawner, [])
        if not any_children:
            return [(k, "waits-for") for k in kids if self._counts(k, now_only)]
        if now_only and any(self.nodes[k].status == CLOSED for k in kids):
            return []  # one closed child opens an any-children gate
        return [(k, WAITS_FOR_ANY) for k in kids if self._counts(k, now_only)]

    def parents(self, issue_id: str) -> list[str]:
        """The issue's parents (its `parent-child` dependencies)."""
        return self._parents.get(issue_id, [])

    @cached_property
    def _parents(self) -> dict[str, list[str]]:
        return {i: parents for i, node in self.nodes.items()
                if (parents := [target for target, kind in node.dependencies if kind == "parent-child"])}  # fmt: skip

    def hold(self, issue_id: str, now: datetime) -> str | None:
        """Why `bd ready` leaves the issue out whatever its blockers (status, pin, wisp, type, deferral); None:
        nothing does. The words are shown to operators (`task show`, the import report). A graph answers for one
        `now` (an import's): the answer is kept."""
        if issue_id not in self._holds:
            self._holds[issue_id] = self._hold(issue_id, now)
        return self._holds[issue_id]

    def _hold(self, issue_id: str, now: datetime) -> str | None:
        node = self.nodes[issue_id]
        if node.status != OPEN:
            return f"status {node.status} in Beads"
        if node.pinned:
            return "pinned in Beads"
        if node.ephemeral:
            return "ephemeral in Beads (a wisp)"
        if node.issue_type in NOT_WORK_TYPES:
            return f"type {node.issue_type} is not work for bd ready"
        if node.defer_until is not None and node.defer_until > now:
            return f"deferred in Beads until {node.defer_until.isoformat()}"
        for parent in self.parents(issue_id):
            deferred = self.nodes.get(parent)
            if deferred is not None and deferred.defer_until is not None and deferred.defer_until > now:
                return f"parent {parent} deferred in Beads until {deferred.defer_until.isoformat()}"
            if self.is_active(parent) and any(b == issue_id for b, _ in self.direct_blockers(parent, now_only=True)):
                # a cycle: the parent is blocked by this very issue, so bd ready hides it until it closes
                return f"parent {parent} is blocked by this issue itself"
        return None

    def is_ready(self, issue_id: str, now: datetime) -> bool:
        """`bd ready` would list the issue (see the module docstring)."""
        if issue_id not in self.nodes or self.hold(issue_id, now) is not None or issue_id in self.blocked:
            return False
        return not any(parent in self.blocked for parent in self.parents(issue_id))

    def ready(self, now: datetime) -> list[str]:
        """Every issue `bd ready --limit 0` would list, by id."""
        return sorted(i for i in self.nodes if self.is_ready(i, now))

    def stored_blockers(self, issue_id: str) -> list[tuple[str, str]]:
        """The blocker rows the built-in tracker keeps for the issue: its own direct blockers, and its active
        parents' (one hop, typed `parent-child`). Every row names an issue of this graph."""
        found = dict(self.direct_blockers(issue_id))
        for parent in self.parents(issue_id):
            if self.is_active(parent):
                for blocker, _ in self.direct_blockers(parent):
                    if blocker != issue_id:
                        found.setdefault(blocker, "parent-child")
        found.pop(issue_id, None)
        return sorted(found.items())


MAX_TASK_ID = 64  # the tasks.id column


def qualified_id(project_key: str, issue_id: str) -> str | None:
    """The task id of a Beads issue whose own id another project (or a built-in task) has: `KEY.id`; None when
    that would not fit a task id."""
    qualified = f"{project_key}.{issue_id}"
    return qualified if len(qualified) <= MAX_TASK_ID else None


def blocking_only(dependencies: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The dependencies whose type affects readiness."""
    return [(target, kind) for target, kind in dependencies if kind in BLOCKING_DEPENDENCY_TYPES]


def task_status_for_import(beads_status: str) -> TaskStatus:
    """The status an imported issue gets: `closed` (and a deleted issue) → completed, everything else → open.

    In taskgate every status between open and completed follows a session (DESIGN §2); an imported issue
    has no session yet, so a Beads `in_progress`, `hooked` or custom status is kept as the task's
    `tracker_status` and, through its hold, keeps the task out of `ready`.
    """
    return TaskStatus.COMPLETED if beads_status in (CLOSED, TOMBSTONE) else TaskStatus.OPEN
