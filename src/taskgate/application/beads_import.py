"""Import a Beads JSONL export (`.beads/issues.jsonl`) into the built-in tracker, idempotently.

Parsing is pure and per line: a malformed line is reported with its number and skipped whole. The import is
one write unit of work: tasks first (so dependencies may point forward in the file), then their blockers; a
failure anywhere rolls everything back. Only blocking dependency types become blockers (see domain/beads.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.application.tracker import MAX_DESCRIPTION, MAX_TITLE, reopen_for
from taskgate.domain.beads import (
    BLOCKING_DEPENDENCY_TYPES,
    CLOSED,
    TOMBSTONE,
    BeadsNode,
    effective_blockers,
    is_valid_issue_id,
    task_status_for_import,
)
from taskgate.domain.bounds import IDS
from taskgate.domain.entities import Plan, Project, Task, TaskStatus
from taskgate.domain.errors import InvalidInput, ProjectArchived

SOURCE = "beads"


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
    """Import `text` (the JSONL export) into the project, new tasks into `plan_id` if given."""

    project_id: int
    text: str
    plan_id: int | None = None
    actor: str = "system"

    def __post_init__(self) -> None:
        """Raises: InvalidInput for an id out of its range (domain/bounds.py), before any I/O."""
        IDS.check("project_id", self.project_id)
        IDS.check("plan_id", self.plan_id)


@dataclass(slots=True)
class ImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: list[LineProblem] = field(default_factory=list)
    warnings: list[LineProblem] = field(default_factory=list)
    reopened_plan: int | None = None  # the closed plan that new open tasks reopened (see application/tracker.py)

    def counts(self) -> dict[str, int]:
        return {
            "created": len(self.created),
            "updated": len(self.updated),
            "unchanged": len(self.unchanged),
            "skipped": len(self.skipped),
        }


Progress = Callable[[str], None]


def parse_beads_jsonl(text: str) -> ParsedExport:
    """Every line of a Beads export as an issue or a problem (line numbers start at 1; blank lines are ignored).

    A later line repeating an earlier id is a problem; the first one wins.
    """
    issues: list[BeadsIssue] = []
    problems: list[LineProblem] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
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


def _parse_line(number: int, raw: str) -> BeadsIssue:
    try:
        data = json.loads(raw)
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
        return BeadsIssue(
            line=number,
            id=issue_id,
            title=_title(data),
            description=_description(data),
            status=_status(data),
            priority=_priority(data),
            dependencies=_dependencies(data, issue_id),
        )
    except _BadLine as bad:
        raise _BadLine(bad.reason, issue_id) from None


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


def _status(data: dict[str, Any]) -> str:
    status = data.get("status") or "open"  # Beads omits an empty status and reads it as open
    if not isinstance(status, str):
        raise _BadLine("status is not a string")
    if status == TOMBSTONE:
        raise _BadLine("tombstone (the issue was deleted in Beads)")
    return status


def _priority(data: dict[str, Any]) -> int:
    priority = data.get("priority", 2)  # bd always writes it; a hand-written line without one gets bd's default
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 4:
        raise _BadLine(f"bad priority {priority!r}: an integer 0 (most urgent) to 4")
    return priority


def _dependencies(data: dict[str, Any], issue_id: str) -> tuple[tuple[str, str], ...]:
    deps = data.get("dependencies") or []
    labels = data.get("labels") or []
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise _BadLine("labels is not a list of strings")
    if not isinstance(deps, list):
        raise _BadLine("dependencies is not a list")
    found: dict[str, str] = {}
    for dep in deps:
        if not isinstance(dep, dict):
            raise _BadLine("a dependency is not an object")
        target, kind, owner = dep.get("depends_on_id"), dep.get("type"), dep.get("issue_id", issue_id)
        if not isinstance(target, str) or not target or not isinstance(kind, str) or not kind:
            raise _BadLine("a dependency lacks depends_on_id or type")
        if owner != issue_id:
            raise _BadLine(f"a dependency belongs to issue_id {owner!r}, not to this line's id")
        if target == issue_id:
            raise _BadLine(f"depends on itself ({kind})")
        if target not in found or (
            kind in BLOCKING_DEPENDENCY_TYPES and found[target] not in BLOCKING_DEPENDENCY_TYPES
        ):
            found[target] = kind  # one link per target; a blocking one wins
    return tuple(found.items())


class BeadsImporter:
    """The import use case. Beads ids become task ids, so a re-import finds the tasks it made before."""

    def __init__(self, uow: UnitOfWorkFactory, clock: Clock) -> None:
        self._uow, self._clock = uow, clock

    async def import_jsonl(self, cmd: ImportBeads, progress: Progress | None = None) -> ImportReport:
        """Create, update or leave alone one task per issue; report every skipped line with its number.

        Never changes the status of a task with an active session, and never reopens a task: an issue closed
        in Beads completes its task, nothing else moves a status. New open tasks reopen a closed plan.
        Raises: ProjectNotFound, ProjectArchived, PlanNotFound, InvalidInput (plan of another project).
        """
        say = progress or (lambda _message: None)
        parsed = parse_beads_jsonl(cmd.text)
        say(f"read {len(parsed.issues) + len(parsed.problems)} issue lines, {len(parsed.problems)} malformed")
        report = ImportReport(skipped=list(parsed.problems))
        async with self._uow(write=True) as uow:
            project, plan = await self._writable(uow, cmd)
            issues = await self._resolvable(uow, project, parsed.issues, report)
            say(f"importing {len(issues)} issues into project {project.name}")
            writer = _Writer(uow, project, cmd.plan_id, self._clock.now(), report)
            await writer.write(issues)
            reopened = await reopen_for(uow, plan, writer.opened, cmd.actor, self._clock.now())
            report.reopened_plan = reopened.id if reopened else None
            if report.created or report.updated:
                counts = report.counts()
                await uow.events.append("tracker.beads_imported", self._clock.now(), {"actor": cmd.actor, **counts})
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

    @staticmethod
    async def _resolvable(
        uow: UnitOfWork, project: Project, issues: list[BeadsIssue], report: ImportReport
    ) -> list[_Resolved]:
        """The issues that can be imported: no id collision, every blocking dependency target known."""
        targets = {t for issue in issues for t, _ in issue.dependencies}
        known = {t.id: t for t in await uow.tasks.get_many(sorted({i.id for i in issues} | targets))}
        kept: dict[str, BeadsIssue] = {}
        refused: dict[str, int] = {}  # id → line, of lines whose id belongs to something else
        for issue in issues:
            reason = _collision(known.get(issue.id), project)
            if reason:
                report.skipped.append(LineProblem(issue.line, reason, issue.id))
                refused[issue.id] = issue.line
            else:
                kept[issue.id] = issue
        in_project = {i for i, t in known.items() if t.project_id == project.id and i not in refused}
        _drop_unresolvable(kept, in_project, report)
        for issue in kept.values():
            for target, kind in issue.dependencies:
                if kind not in BLOCKING_DEPENDENCY_TYPES and target not in kept and target not in in_project:
                    report.warnings.append(
                        LineProblem(issue.line, f"{kind} link to unknown {target} ignored", issue.id)
                    )
        graph = _graph(kept, known, project)
        return [_Resolved(issue, known.get(issue.id), effective_blockers(issue.id, graph)) for issue in kept.values()]


def _collision(existing: Task | None, project: Project) -> str | None:
    if existing is None or (existing.project_id == project.id and existing.source == SOURCE):
        return None
    if existing.project_id != project.id:
        return f"id {existing.id} is already used by a task of another project"
    return f"id {existing.id} is already used by a {existing.source} task of this project"


def _drop_unresolvable(kept: dict[str, BeadsIssue], in_project: set[str], report: ImportReport) -> None:
    """Skip issues with a blocking dependency on something neither imported nor in the project, repeatedly:
    skipping one may strand the issues that depend on it."""
    changed = True
    while changed:
        changed = False
        for issue in list(kept.values()):
            missing = next(
                (
                    (t, k)
                    for t, k in issue.dependencies
                    if k in BLOCKING_DEPENDENCY_TYPES and t not in kept and t not in in_project
                ),
                None,
            )
            if missing:
                target, kind = missing
                reason = f"{kind} dependency on {target}, which is neither imported from this file nor in the project"
                report.skipped.append(LineProblem(issue.line, reason, issue.id))
                del kept[issue.id]
                changed = True


def _graph(kept: dict[str, BeadsIssue], known: dict[str, Task], project: Project) -> dict[str, BeadsNode]:
    """Issues of the file, plus project tasks they point at (their stored blockers are already unfolded)."""
    graph = {
        t.id: BeadsNode(
            CLOSED if t.status == TaskStatus.COMPLETED else "open", tuple((b, "blocks") for b in t.blockers)
        )
        for t in known.values()
        if t.project_id == project.id
    }
    graph.update({i.id: BeadsNode(i.status, i.dependencies) for i in kept.values()})
    return graph


@dataclass(frozen=True, slots=True)
class _Resolved:
    issue: BeadsIssue
    existing: Task | None
    blockers: list[tuple[str, str]]


class _Writer:
    """Writes resolved issues: every task first, then the blockers (which may point forward in the file)."""

    def __init__(
        self, uow: UnitOfWork, project: Project, plan_id: int | None, now: datetime, report: ImportReport
    ) -> None:
        self._uow, self._project, self._plan_id, self._now, self._report = uow, project, plan_id, now, report
        self.opened: list[str] = []  # the new tasks that are open

    async def write(self, resolved: list[_Resolved]) -> None:
        changed: set[str] = set()
        for item in resolved:
            if item.existing is None:
                task = self._new_task(item.issue)
                await self._uow.tasks.add(task)
                self._report.created.append(item.issue.id)
                if task.status == TaskStatus.OPEN:
                    self.opened.append(task.id)
            elif await self._update(item.issue, item.existing):
                changed.add(item.issue.id)
        existing_ids = [item.issue.id for item in resolved if item.existing is not None]
        current = await self._uow.tasks.blocker_links(existing_ids) if existing_ids else {}
        for item in resolved:
            wanted = sorted(item.blockers)
            if wanted != sorted(current.get(item.issue.id, [])):
                await self._uow.tasks.set_blockers(item.issue.id, wanted)
                if item.existing is not None:
                    changed.add(item.issue.id)
        for item in resolved:
            if item.existing is not None:
                (self._report.updated if item.issue.id in changed else self._report.unchanged).append(item.issue.id)

    def _new_task(self, issue: BeadsIssue) -> Task:
        return Task(
            id=issue.id,
            project_id=self._project.id,
            plan_id=self._plan_id,
            title=issue.title,
            description=issue.description,
            priority=issue.priority,
            status=task_status_for_import(issue.status),
            created_at=self._now,
            source=SOURCE,
        )

    async def _update(self, issue: BeadsIssue, task: Task) -> bool:
        """Bring title, description and priority up to date; complete the task if Beads closed it."""
        changed = False
        if (task.title, task.description, task.priority) != (issue.title, issue.description, issue.priority):
            await self._uow.tasks.update_details(
                task.id, title=issue.title, description=issue.description, priority=issue.priority
            )
            changed = True
        closes = task_status_for_import(issue.status) == TaskStatus.COMPLETED and task.status != TaskStatus.COMPLETED
        if closes and not await self._uow.sessions.active_for_task(task.id):
            await self._uow.tasks.set_status(task.id, TaskStatus.COMPLETED)
            changed = True
        return changed
