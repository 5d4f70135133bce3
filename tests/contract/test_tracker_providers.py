"""One suite, two trackers: BuiltinTracker on the real databases and BeadsTracker over the fake `bd`.

Both start from the same Beads issues (the built-in one through the JSONL import), so the same questions must
get the same answers. Status words are each tracker's own: Beads says `closed` where taskgate says
`completed`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from taskgate.application.trackers.beads_import import BeadsImporter, ImportBeads
from taskgate.application.trackers.ports import TrackerProvider
from taskgate.application.trackers.provider import BuiltinTracker
from taskgate.domain.entities import Project, TaskStatus
from taskgate.domain.errors import TaskNotFound
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.system import SystemClock
from taskgate.infrastructure.trackers import BeadsTracker
from tests.conftest import make_git_repo, open_database, wire
from tests.support import bead, install_fake_bd, jsonl, write_beads_state

ISSUES = [
    bead("tg-a", "Alpha", priority=1, description="first of all"),
    bead("tg-b", "Blocked by c", priority=0, deps=[("tg-c", "blocks")]),
    bead("tg-c", "Charlie", priority=2),
    bead("tg-d", "Only associations", priority=2, deps=[("tg-c", "related"), ("tg-a", "discovered-from")]),
    bead("tg-e", "Done already", status="closed", priority=3),
    bead("tg-f", "Blocker closed", priority=1, deps=[("tg-e", "blocks")]),
    bead("tg-g", "Child of a blocked epic", priority=4, deps=[("tg-b", "parent-child")]),
]


@dataclass
class Subject:
    tracker: TrackerProvider
    project: Project
    closed: str  # the tracker's word for a finished issue


@pytest.fixture(params=["builtin-sqlite", "builtin-postgresql", "beads"])
async def subject(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Subject]:
    repo = make_git_repo(tmp_path / "repo")
    if request.param == "beads":
        write_beads_state(repo, *ISSUES)
        bd = install_fake_bd(tmp_path / "bin")
        project = Project(1, "repo", "REPO", str(repo), created_at=None)  # type: ignore[arg-type]
        yield Subject(BeadsTracker(command=[str(bd)], timeout_s=20), project, "closed")
        return
    database, url = await open_database(request.param.removeprefix("builtin-"), request, tmp_path)
    services = wire(request.param, database, url)
    project = await services.tracker.init_project(str(repo))
    report = await BeadsImporter(services.uow, SystemClock()).import_jsonl(ImportBeads(project.id, jsonl(*ISSUES)))
    assert len(report.created) == len(ISSUES) and not report.skipped
    yield Subject(BuiltinTracker(services.uow, SystemClock()), project, TaskStatus.COMPLETED.value)
    assert isinstance(database, Database)
    await database.dispose()


async def ready_ids(subject: Subject) -> list[str]:
    return [i.id for i in await subject.tracker.ready(subject.project)]


async def test_ready_leaves_out_issues_with_an_open_blocking_dependency_and_closed_ones(subject: Subject) -> None:
    ready = await ready_ids(subject)
    assert "tg-b" not in ready  # blocks on the open tg-c
    assert "tg-g" not in ready  # its parent tg-b is blocked
    assert "tg-e" not in ready  # closed


async def test_ready_keeps_issues_with_only_association_links_or_closed_blockers(subject: Subject) -> None:
    ready = await ready_ids(subject)
    assert {"tg-d", "tg-f"} <= set(ready)


async def test_ready_is_ordered_by_priority_then_id(subject: Subject) -> None:
    assert await ready_ids(subject) == ["tg-a", "tg-f", "tg-c", "tg-d"]


async def test_show_returns_the_fields_of_the_issue(subject: Subject) -> None:
    alpha = await subject.tracker.show(subject.project, "tg-a")
    assert (alpha.id, alpha.title, alpha.description, alpha.status, alpha.priority) == (
        "tg-a",
        "Alpha",
        "first of all",
        "open",
        1,
    )
    blocked = await subject.tracker.show(subject.project, "tg-b")
    assert ("tg-c", "blocks") in blocked.dependencies
    done = await subject.tracker.show(subject.project, "tg-e")
    assert done.status == subject.closed


async def test_show_of_an_unknown_id_raises_task_not_found(subject: Subject) -> None:
    with pytest.raises(TaskNotFound):
        await subject.tracker.show(subject.project, "tg-zz")


async def test_set_status_of_an_unknown_id_raises_task_not_found(subject: Subject) -> None:
    with pytest.raises(TaskNotFound):
        await subject.tracker.set_status(subject.project, "tg-zz", TaskStatus.IN_PROGRESS)


async def test_list_returns_every_issue_closed_ones_included_by_id(subject: Subject) -> None:
    issues = await subject.tracker.list(subject.project)
    assert [i.id for i in issues] == sorted(i["id"] for i in ISSUES)
    assert {i.id: i.status for i in issues}["tg-e"] == subject.closed


async def test_set_status_round_trips_through_show_list_and_ready(subject: Subject) -> None:
    tracker, project = subject.tracker, subject.project
    await tracker.set_status(project, "tg-a", TaskStatus.IN_PROGRESS)
    assert (await tracker.show(project, "tg-a")).status == "in_progress"
    assert "tg-a" not in await ready_ids(subject)

    await tracker.set_status(project, "tg-c", TaskStatus.COMPLETED, reason="done in a session")
    assert (await tracker.show(project, "tg-c")).status == subject.closed
    assert {i.id: i.status for i in await tracker.list(project)}["tg-c"] == subject.closed
    assert await ready_ids(subject) == ["tg-b", "tg-f", "tg-d", "tg-g"]  # tg-b unblocked, and so its child

    await tracker.set_status(project, "tg-a", TaskStatus.OPEN)
    assert "tg-a" in await ready_ids(subject)
