"""Parsing a Beads export line by line, the Beads readiness rule, and the import on the in-memory fakes."""

from __future__ import annotations

import json

import pytest

from taskgate.application.trackers.beads_import import BeadsImporter, ImportBeads, parse_beads_jsonl
from taskgate.domain.beads import is_valid_issue_id, task_status_for_import
from taskgate.domain.entities import TaskStatus
from taskgate.domain.errors import ProjectArchived
from tests.conftest import wire
from tests.fakes import FakeClock, FakeVcs, InMemoryDatabase
from tests.support import bead, jsonl


def reasons(text: str) -> dict[int, str]:
    return {p.line: p.reason for p in parse_beads_jsonl(text).problems}


def test_a_well_formed_line_keeps_what_the_import_needs() -> None:
    line = bead("bd-a1", "  Title  ", description="d", status="in_progress", priority=0, deps=[("bd-b", "blocks")])
    (issue,) = parse_beads_jsonl(jsonl(line | {"labels": ["x"], "design": "ignored"})).issues
    assert (issue.line, issue.id, issue.title, issue.description, issue.status, issue.priority) == (
        1,
        "bd-a1",
        "Title",
        "d",
        "in_progress",
        0,
    )
    assert issue.dependencies == (("bd-b", "blocks"),)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({"title": "no id"}), "missing id"),
        (json.dumps({"id": "--help", "title": "flag"}), "bad id '--help'"),
        (json.dumps({"id": "bd-1"}), "missing title"),
        (json.dumps({"id": "bd-1", "title": "x" * 501}), "title longer than 500"),
        (json.dumps({"id": "bd-1", "title": "t", "priority": 7}), "bad priority 7"),
        (json.dumps({"id": "bd-1", "title": "t", "priority": "1"}), "bad priority '1'"),
        (json.dumps({"id": "bd-1", "title": "t", "priority": True}), "bad priority True"),
        (json.dumps({"id": "bd-1", "title": "t", "labels": "x"}), "labels is not a list"),
        (json.dumps({"id": "bd-1", "title": "t", "dependencies": [{"type": "blocks"}]}), "lacks depends_on_id"),
        (json.dumps(bead("bd-1", deps=[("bd-1", "blocks")])), "depends on itself"),
        (
            json.dumps(
                {
                    "id": "bd-1",
                    "title": "t",
                    "dependencies": [{"issue_id": "bd-2", "depends_on_id": "bd-3", "type": "blocks"}],
                }
            ),
            "belongs to issue_id 'bd-2'",
        ),
    ],
)
def test_malformed_lines_are_reported_with_their_number_and_reason(line: str, reason: str) -> None:
    text = jsonl(bead("bd-0"), "", line)
    parsed = parse_beads_jsonl(text)
    assert [i.id for i in parsed.issues] == ["bd-0"]
    assert reason in reasons(text)[3]


def test_a_repeated_id_keeps_the_first_line() -> None:
    parsed = parse_beads_jsonl(jsonl(bead("bd-1", "first"), bead("bd-1", "second")))
    assert [i.title for i in parsed.issues] == ["first"]
    assert parsed.problems[0].line == 2 and "first on line 1" in parsed.problems[0].reason


def test_a_blocking_link_wins_over_an_association_to_the_same_issue() -> None:
    (issue,) = parse_beads_jsonl(jsonl(bead("bd-1", deps=[("bd-2", "related"), ("bd-2", "blocks")]))).issues
    assert issue.dependencies == (("bd-2", "blocks"),)


@pytest.mark.parametrize("good", ["bd-a1b2", "bd-a1b2.3", "X_1", "9"])
def test_beads_ids_are_accepted(good: str) -> None:
    assert is_valid_issue_id(good)


@pytest.mark.parametrize("bad", ["", "-x", "--help", ".hidden", "a b", "a/b", "a\n", "é", "a" * 65, None, 3])
def test_anything_else_is_not_an_id(bad: object) -> None:
    assert not is_valid_issue_id(bad)


def test_only_closed_and_deleted_import_as_completed() -> None:
    assert task_status_for_import("closed") == task_status_for_import("tombstone") == TaskStatus.COMPLETED
    for other in ("open", "in_progress", "blocked", "deferred", "hooked", "custom"):
        assert task_status_for_import(other) == TaskStatus.OPEN


# The ready rule itself: tests/unit/trackers/test_beads_ready_rule.py.


# -- the importer on the fakes --------------------------------------------------------------------------------


@pytest.fixture
async def memory(tmp_path):
    services = wire("memory", InMemoryDatabase(), None, clock=FakeClock(), vcs=FakeVcs())
    project = await services.tracker.init_project(str(tmp_path))
    return services, project


async def test_forward_references_and_epics_import_as_beads_reads_them(memory) -> None:
    services, project = memory
    export = jsonl(
        bead("bd-c", "child", deps=[("bd-e", "parent-child")]),
        bead("bd-e", "epic", deps=[("bd-g", "blocks")]),
        bead("bd-g", "gate", priority=0),
    )
    report = await BeadsImporter(services.uow, FakeClock()).import_jsonl(ImportBeads(project.id, export))
    assert report.created == ["bd-c", "bd-e", "bd-g"]
    async with services.uow(write=False) as uow:
        assert await uow.tasks.blocker_links(["bd-c", "bd-e"]) == {
            "bd-c": [("bd-g", "parent-child")],
            "bd-e": [("bd-g", "blocks")],
        }
    assert [t.id for t in await services.tracker.ready_tasks(project.id)] == ["bd-g"]


async def test_a_skipped_line_blocks_nothing_and_the_report_says_so(memory) -> None:
    services, project = memory
    export = jsonl(
        '{"id": "bd-1", "title": 5}',
        bead("bd-2", deps=[("bd-1", "blocks")]),
        bead("bd-3", deps=[("bd-2", "waits-for")]),
        bead("bd-4", deps=[("bd-1", "related")]),
    )
    report = await BeadsImporter(services.uow, FakeClock()).import_jsonl(ImportBeads(project.id, export))
    assert report.created == ["bd-2", "bd-3", "bd-4"] and [p.line for p in report.skipped] == [1]
    assert [(p.line, p.issue_id) for p in report.warnings] == [(2, "bd-2")]  # its blocker is not in the export
    assert [t.id for t in await services.tracker.ready_tasks(project.id)] == ["bd-2", "bd-3", "bd-4"]


async def test_progress_is_reported_and_an_archived_project_is_refused(memory) -> None:
    services, project = memory
    said: list[str] = []
    await BeadsImporter(services.uow, FakeClock()).import_jsonl(
        ImportBeads(project.id, jsonl(bead("bd-1"))), said.append
    )
    assert said == ["read 1 issue lines, 0 malformed", f"importing 1 issues into project {project.name}"]
    await services.tracker.archive_project(project.id)
    with pytest.raises(ProjectArchived):
        await BeadsImporter(services.uow, FakeClock()).import_jsonl(ImportBeads(project.id, jsonl(bead("bd-2"))))
