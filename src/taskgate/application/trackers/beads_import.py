"""Import a Beads JSONL export (`.beads/issues.jsonl`) into the built-in tracker, idempotently.

Parsing is pure and per line: lines are split on `\\n` only (Go's encoder leaves U+0085, U+2028 and U+2029
raw inside strings, so `str.splitlines` would cut an issue in two), each line is decoded as strict UTF-8 on
its own, and a malformed line is reported with its number and skipped whole: the rest imports.

Every issue Beads keeps is imported. What `bd ready` would leave out (its status, pin, type, deferral; see
domain/beads.py) is kept as the task's `hold`, and its dependencies become blocker rows by the same rule, so
`task ready` lists exactly what `bd ready` would. An issue deleted in Beads (a legacy `tombstone` line, or an
issue of an earlier import missing from this one) completes its task, which then blocks nothing.

Ids are per project: a task's id is the Beads id, or, when another project (or a built-in task) already uses
it, the Beads id after the project key (`KEY.bd-a1b2`); the Beads id stays the task's `external_id`, which a
re-import matches on. The import is one write unit of work: if anything fails, nothing is written.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.application.trackers.builtin import MAX_DESCRIPTION, MAX_TITLE, reopen_for
from taskgate.domain.beads import (
    ANY_CHILDREN,
    BLOCKING_DEPENDENCY_TYPES,
    TOMBSTONE,
    BeadsGraph,
    BeadsNode,
    is_valid_issue_id,
    qualified_id,
    task_status_for_import,
)
from taskgate.domain.bounds import IDS
from taskgate.domain.entities import Plan, Project, Task, TaskStatus
from taskgate.domain.errors import InvalidInput, ProjectArchived
from taskgate.domain.workflows.triggers import usable_labels

SOURCE = "beads"
DELETED = "deleted"  # the tracker_status of a task whose issue is gone from Beads


@dataclass(frozen=True, slots=True)
class BeadsIssue:
    """One well-formed line of the export: what the import uses of it."""

    line: int
    id: str
    title: str
    description: str
    status: str
    priority: int
    dependencies: tuple[tuple[str, str], ...] = ()  # (depends_on_id, type), every type
    issue_type: str = "task"
    pinned: bool = False
    ephemeral: bool = False
    defer_until: datetime | None = None
    any_gates: frozenset[str] = frozenset()
    labels: tuple[str, ...] = ()  # those that fit the task label rule (domain/workflows/triggers.py)

    def node(self) -> BeadsNode:
        """The issue as the ready rule sees it."""
        return BeadsNode(self.status, self.dependencies, self.issue_type, self.pinned, self.ephemeral,
                         self.defer_until, self.any_gates)  # fmt: skip


@dataclass(frozen=True, slots=True)
class LineProblem:
    """Why a line was skipped (or, for a warning, imported with something left out)."""

    line: int
    reason: str
    issue_id: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedExport:
    issues: list[BeadsIssue]
    problems: list[LineProblem]


@dataclass(frozen=True, slots=True)
class ImportBeads:
    """Import `data` (the JSONL export's bytes) into the project, new tasks into `plan_id` if given. `strict`:
    refuse the whole file, writing nothing, when any line is malformed."""

    project_id: int
    data: bytes
    plan_id: int | None = None
    actor: str = "system"
    strict: bool = False

    def __post_init__(self) -> None:
        """Raises: InvalidInput for an id out of its range (domain/bounds.py), before any I/O."""
        IDS.check("project_id", self.project_id)
        IDS.check("plan_id", self.plan_id)


@dataclass(slots=True)
class ImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)  # tasks whose issue Beads no longer has
    skipped: list[LineProblem] = field(default_factory=list)
    warnings: list[LineProblem] = field(default_factory=list)
    ready: int = 0  # how many issues of the file `bd ready` would list
    reopened_plan: int | None = (
        None  # the closed plan that new open tasks reopened (see application/trackers/builtin.py)
    )

    def counts(self) -> dict[str, int]:
        return {
            "created": len(self.created),
            "updated": len(self.updated),
            "unchanged": len(self.unchanged),
            "deleted": len(self.deleted),
            "skipped": len(self.skipped),
            "ready": self.ready,
        }


Progress = Callable[[str], None]


def parse_beads_jsonl(data: bytes | str) -> ParsedExport:
    """Every line of a Beads export as an issue or a problem (line numbers start at 1; blank lines are ignored).

    Lines end at `\\n` only. A later line repeating an earlier id is a problem; the first one wins.
    """
    raw_lines = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    issues: list[BeadsIssue] = []
    problems: list[LineProblem] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(io.BytesIO(raw_lines), start=1):  # lines end at b"\n" only, read one at a time
        if not raw.strip():
            continue
        try:
            issue = _parse_line(number, raw)
        except _BadLine as bad:
            problems.append(LineProblem(number, bad.reason, bad.issue_id))
            continue
        if issue.id in first_line:
            problems.append(LineProblem(number, f"duplicate id (first on line {first_line[issue.id]})", issue.id))
            continue
        first_line[issue.id] = number
        issues.append(issue)
    return ParsedExport(issues, problems)


class _BadLine(Exception):
    def __init__(self, reason: str, issue_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.issue_id = reason, issue_id


def _parse_line(number: int, raw: bytes) -> BeadsIssue:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _BadLine(f"not UTF-8 (byte {exc.start + 1} of the line)") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _BadLine(f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _BadLine("not a JSON object")
    issue_id = data.get("id")
    if not isinstance(issue_id, str) or not issue_id:
        raise _BadLine("missing id")
    if not is_valid_issue_id(issue_id):
        raise _BadLine(f"bad id {issue_id[:80]!r}: 1-64 letters, digits and . _ - starting with a letter or digit")
    try:
        issue = _issue(number, issue_id, data)
        if "\\ud" in text.lower():  # a lone surrogate can only come from a JSON escape: check the strings then
            _check_storable(issue)
    except _BadLine as bad:
        raise _BadLine(bad.reason, issue_id) from None
    return issue


def _issue(number: int, issue_id: str, data: dict[str, Any]) -> BeadsIssue:
    dependencies, any_gates = _dependencies(data, issue_id)
    return BeadsIssue(
        line=number,
        id=issue_id,
        title=_title(data),
        description=_description(data),
        status=_word(data, "status", "open"),  # Beads omits an empty status and reads it as open
        priority=_priority(data),
        dependencies=dependencies,
        issue_type=_word(data, "issue_type", "task"),
        pinned=data.get("pinned") is True,
        ephemeral=data.get("ephemeral") is True or data.get("wisp") is True,  # `wisp`: Beads 0.35-0.37
        defer_until=_when(data.get("defer_until")),
        any_gates=any_gates,
        labels=usable_labels(data.get("labels") or ()),  # a list of strings: checked by _dependencies
    )


def _check_storable(issue: BeadsIssue) -> None:
    """Refuse a lone surrogate in any string kept (JSON can spell `\\ud800`; no database can store it)."""
    strings = [("title", issue.title), ("description", issue.description), ("status", issue.status),
               ("issue_type", issue.issue_type)]  # fmt: skip
    strings += [("a dependency", part) for dep in issue.dependencies for part in dep]
    for what, text in strings:
        _storable(text, what)


def _storable(text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _BadLine(
            f"{what} holds a lone surrogate (U+{ord(text[exc.start]):04X}), which cannot be stored"
        ) from None
    return text


def _title(data: dict[str, Any]) -> str:
    title = data.get("title")
    if not isinstance(title, str) or not title.strip():
        raise _BadLine("missing title")
    if len(title.strip()) > MAX_TITLE or "\x00" in title:
        raise _BadLine(f"title longer than {MAX_TITLE} characters or containing NUL")
    return title.strip()


def _description(data: dict[str, Any]) -> str:
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise _BadLine("description is not a string")
    if len(description) > MAX_DESCRIPTION or "\x00" in description:
        raise _BadLine(f"description longer than {MAX_DESCRIPTION} characters or containing NUL")
    return description


def _word(data: dict[str, Any], key: str, default: str) -> str:
    value = data.get(key) or default
    if not isinstance(value, str) or len(value) > 32 or not value.isprintable():
        raise _BadLine(f"{key} is not a word of at most 32 printable characters")
    return value


def _priority(data: dict[str, Any]) -> int:
    priority = data.get("priority", 2)  # bd always writes it; a hand-written line without one gets bd's default
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 4:
        raise _BadLine(f"bad priority {priority!r}: an integer 0 (most urgent) to 4")
    return priority


def _when(value: Any) -> datetime | None:
    if value in (None, ""):
        return None
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise _BadLine(f"defer_until {str(value)[:40]!r} is not an RFC 3339 time") from None
    if parsed.tzinfo is None:
        raise _BadLine("defer_until has no time zone")
    return parsed


def _dependencies(data: dict[str, Any], issue_id: str) -> tuple[tuple[tuple[str, str], ...], frozenset[str]]:
    deps = data.get("dependencies") or []
    labels = data.get("labels") or []
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise _BadLine("labels is not a list of strings")
    if not isinstance(deps, list):
        raise _BadLine("dependencies is not a list")
    found: dict[str, str] = {}
    any_gates: set[str] = set()
    for dep in deps:
        target, kind = _dependency(dep, issue_id)
        if kind == "waits-for" and _gate(dep) == ANY_CHILDREN:
            any_gates.add(target)
        if target not in found or (
            kind in BLOCKING_DEPENDENCY_TYPES and found[target] not in BLOCKING_DEPENDENCY_TYPES
        ):
            found[target] = kind  # one link per target; a blocking one wins
    return tuple(found.items()), frozenset(any_gates)


def _dependency(dep: Any, issue_id: str) -> tuple[str, str]:
    if not isinstance(dep, dict):
        raise _BadLine("a dependency is not an object")
    target, kind, owner = dep.get("depends_on_id"), dep.get("type"), dep.get("issue_id", issue_id)
    if not isinstance(target, str) or not target or not isinstance(kind, str) or not kind:
        raise _BadLine("a dependency lacks depends_on_id or type")
    if owner != issue_id:
        raise _BadLine(f"a dependency belongs to issue_id {owner!r}, not to this line's id")
    if target == issue_id:
        raise _BadLine(f"depends on itself ({kind})")
    return target, kind


def _gate(dep: dict[str, Any]) -> str:
    """A waits-for dependency's gate from its metadata (a JSON string); anything unreadable is all-children."""
    try:
        meta = json.loads(dep.get("metadata") or "{}")
    except (TypeError, ValueError):
        return "all-children"
    return meta.get("gate", "all-children") if isinstance(meta, dict) else "all-children"


class BeadsImporter:
    """The import use case. A re-import finds the tasks it made before by their Beads id (`external_id`)."""

    def __init__(self, uow: UnitOfWorkFactory, clock: Clock) -> None:
        self._uow, self._clock = uow, clock

    async def import_jsonl(self, cmd: ImportBeads, progress: Progress | None = None) -> ImportReport:
        """Create, update or leave alone one task per issue; report every skipped line with its number.

        Never changes the status of a task with an active session, and never reopens a task: an issue closed
        (or deleted) in Beads completes its task. New open tasks reopen a closed plan.
        Raises: ProjectNotFound, ProjectArchived, PlanNotFound, InvalidInput (plan of another project, or a
        malformed line with `strict`).
        """
        say = progress or (lambda _message: None)
        parsed = parse_beads_jsonl(cmd.data)
        say(f"read {len(parsed.issues) + len(parsed.problems)} issue lines, {len(parsed.problems)} malformed")
        if cmd.strict and parsed.problems:
            first = min(parsed.problems, key=lambda p: p.line)
            raise InvalidInput(f"{len(parsed.problems)} malformed line(s), nothing imported (--strict); "
                               f"first: line {first.line}: {first.reason}")  # fmt: skip
        now = self._clock.now()
        graph = BeadsGraph({issue.id: issue.node() for issue in parsed.issues})
        report = ImportReport(skipped=list(parsed.problems), ready=len(graph.ready(now)))
        async with self._uow(write=True) as uow:
            project, plan = await self._writable(uow, cmd)
            say(f"importing {len(parsed.issues)} issues into project {project.name}")
            writer = _Writer(uow, project, cmd.plan_id, now, report)
            await writer.write(parsed.issues, graph)
            reopened = await reopen_for(uow, plan, writer.opened, cmd.actor, now)
            report.reopened_plan = reopened.id if reopened else None
            if report.created or report.updated or report.deleted:
                counts = report.counts()
                await uow.events.append("tracker.beads_imported", now, {"actor": cmd.actor, **counts})
                await uow.commit()
        report.skipped.sort(key=lambda p: p.line)
        report.warnings.sort(key=lambda p: p.line)
        return report

    @staticmethod
    async def _writable(uow: UnitOfWork, cmd: ImportBeads) -> tuple[Project, Plan | None]:
        """The project, and the plan of the new tasks locked (as adding a task locks it)."""
        project = await uow.projects.get(cmd.project_id)
        if project.archived_at is not None:
            raise ProjectArchived(project.name)
        plan = await uow.plans.get(cmd.plan_id, lock=True) if cmd.plan_id is not None else None
        if plan is not None and plan.project_id != project.id:
            raise InvalidInput(f"plan {cmd.plan_id} belongs to another project")
        return project, plan


class _Writer:
    """Writes the issues: new tasks in bulk, then every blocker row (which may point forward in the file), then
    the changes to tasks of earlier imports, then the deletions."""

    def __init__(self, uow: UnitOfWork, project: Project, plan_id: int | None, now: datetime, report: ImportReport):
        self._uow, self._project, self._plan_id, self._now, self._report = uow, project, plan_id, now, report
        self.opened: list[str] = []  # the new tasks that are open

    async def write(self, issues: list[BeadsIssue], graph: BeadsGraph) -> None:
        existing = {t.external_id or t.id: t for t in await self._uow.tasks.of_source(self._project.id, SOURCE)}
        ids = await self._task_ids(issues, existing)
        kept = [i for i in issues if i.id in ids]
        wanted = {i.id: self._task(i, ids[i.id], graph) for i in kept}
        links = {i.id: self._links(i, graph, ids) for i in kept}
        new = [wanted[i.id] for i in kept if i.id not in existing]
        await self._uow.tasks.add_many(new)
        self._report.created += [t.id for t in new]
        self.opened += [t.id for t in new if t.status == TaskStatus.OPEN]
        await self._uow.tasks.add_links([(t.id, b, k) for t in new for b, k in links[t.external_id or t.id]])
        current = await self._uow.tasks.blocker_links([existing[i.id].id for i in kept if i.id in existing])
        for issue in kept:
            if issue.id in existing:
                task = existing[issue.id]
                changed = await self._update(task, wanted[issue.id], links[issue.id], current.get(task.id, []))
                (self._report.updated if changed else self._report.unchanged).append(task.id)
        for external_id, task in sorted(existing.items()):
            if external_id not in wanted and task.tracker_status != DELETED:
                await self._delete(task)

    async def _task_ids(self, issues: list[BeadsIssue], existing: dict[str, Task]) -> dict[str, str]:
        """The task id of each issue: its earlier task's, the Beads id when free, else `KEY.id`; lines whose id
        cannot be had are skipped."""
        fresh = [i for i in issues if i.id not in existing]
        taken = {t.id for t in await self._uow.tasks.get_many([i.id for i in fresh])}
        qualified = {i.id: qualified_id(self._project.key, i.id) for i in fresh if i.id in taken}  # after a collision
        asked = [q for q in qualified.values() if q is not None]
        taken |= {t.id for t in await self._uow.tasks.get_many(asked)} if asked else set()
        ids = {i.id: existing[i.id].id for i in issues if i.id in existing}
        for issue in fresh:
            other = qualified.get(issue.id)
            if issue.id not in taken:
                ids[issue.id] = issue.id
            elif other is not None and other not in taken:
                ids[issue.id] = other
            else:
                key = self._project.key
                reason = f"id {issue.id} is taken by another task, and so is {key}.{issue.id[:70]} (or it is too long)"
                self._report.skipped.append(LineProblem(issue.line, reason, issue.id))
        return ids

    def _task(self, issue: BeadsIssue, task_id: str, graph: BeadsGraph) -> Task:
        hold = "deleted in Beads" if issue.status == TOMBSTONE else graph.hold(issue.id, self._now)
        return Task(
            id=task_id,
            project_id=self._project.id,
            plan_id=self._plan_id,
            title=issue.title,
            description=issue.description,
            priority=issue.priority,
            status=task_status_for_import(issue.status),
            created_at=self._now,
            source=SOURCE,
            external_id=issue.id,
            tracker_status=issue.status,
            hold=hold,
            labels=list(issue.labels),
        )

    def _links(self, issue: BeadsIssue, graph: BeadsGraph, ids: dict[str, str]) -> list[tuple[str, str]]:
        found = []
        for target, kind in graph.stored_blockers(issue.id):
            if target in ids:
                found.append((ids[target], kind))
            else:  # its line was skipped: say so, since the ready set can now differ from Beads'
                reason = f"{kind} blocker {target} was skipped, so it does not block here"
                self._report.warnings.append(LineProblem(issue.line, reason, issue.id))
        for target, kind in issue.dependencies:
            if target not in graph.nodes and kind in BLOCKING_DEPENDENCY_TYPES:
                reason = f"{kind} dependency on {target}, which is not in the export: it blocks nothing (as in Beads)"
                self._report.warnings.append(LineProblem(issue.line, reason, issue.id))
        return found

    async def _update(self, task: Task, wanted: Task, links: list[tuple[str, str]], current) -> bool:
        """Bring details, tracker facts and blockers up to date; complete the task if Beads closed it."""
        changed = False
        if (task.title, task.description, task.priority, task.labels) != (
            wanted.title, wanted.description, wanted.priority, wanted.labels
        ):  # fmt: skip
            await self._uow.tasks.update_details(
                task.id, title=wanted.title, description=wanted.description, priority=wanted.priority,
                labels=wanted.labels,
            )  # fmt: skip
            changed = True
        if (task.tracker_status, task.hold) != (wanted.tracker_status, wanted.hold):
            await self._uow.tasks.set_tracker_facts(task.id, tracker_status=wanted.tracker_status, hold=wanted.hold)
            changed = True
        if sorted(links) != sorted(current):
            await self._uow.tasks.set_blockers(task.id, links)
            changed = True
        return await self._complete_if_closed(task, wanted.status) or changed

    async def _complete_if_closed(self, task: Task, status: TaskStatus) -> bool:
        if status != TaskStatus.COMPLETED or task.status == TaskStatus.COMPLETED:
            return False
        if await self._uow.sessions.active_for_task(task.id):
            return False  # the session decides; the write-back will tell Beads what happened
        await self._uow.tasks.set_status(task.id, TaskStatus.COMPLETED)
        return True

    async def _delete(self, task: Task) -> None:
        """An issue of an earlier import that Beads no longer has: completed (it blocks nothing), held."""
        gone = replace(task, tracker_status=DELETED, hold="deleted in Beads (missing from the export)")
        await self._uow.tasks.set_tracker_facts(task.id, tracker_status=gone.tracker_status, hold=gone.hold)
        await self._complete_if_closed(task, TaskStatus.COMPLETED)
        self._report.deleted.append(task.id)
