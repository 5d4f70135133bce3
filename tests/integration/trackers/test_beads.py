"""BeadsTracker against a real subprocess (the fake `bd`): failures, timeouts, write-back, injection; and the
Beads import on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from taskgate.application.sessions.commands import FireTrigger, StartTask
from taskgate.application.trackers.beads_import import BeadsImporter, ImportBeads
from taskgate.application.trackers.builtin import AddTask
from taskgate.application.workspaces.options import GitOptions
from taskgate.domain.entities import PlanStatus, Project, TaskStatus
from taskgate.domain.errors import ClaimRefused, InvalidInput, TaskNotFound, TrackerError
from taskgate.infrastructure.db.work_store import SqlAlchemyTaskRepository
from taskgate.infrastructure.git import GitPythonVcs
from taskgate.infrastructure.system import SystemClock
from taskgate.infrastructure.trackers import BeadsTracker
from tests.builders import ACTOR, OPERATOR
from tests.conftest import make_git_repo
from tests.support import bead, install_fake_bd, jsonl, write_beads_state


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    write_beads_state(root, bead("tg-1", "One"), bead("tg-2", "Two", deps=[("tg-1", "blocks")]))
    return root


@pytest.fixture
def project(repo: Path) -> Project:
    return Project(1, "repo", "REPO", str(repo), created_at=datetime.now(UTC))


@pytest.fixture
def bd(tmp_path: Path) -> str:
    return str(install_fake_bd(tmp_path / "bin"))


@pytest.fixture
def bd_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "bd.log"
    monkeypatch.setenv("FAKE_BD_LOG", str(log))
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


async def test_a_missing_bd_is_a_tracker_error_that_says_how_to_configure_it(project: Project, tmp_path) -> None:
    tracker = BeadsTracker(command=[str(tmp_path / "nowhere" / "bd")])
    started = time.monotonic()
    with pytest.raises(TrackerError, match=r"was not found.*\[tracker\.beads\] command"):
        await tracker.ready(project)
    assert time.monotonic() - started < 2


async def test_a_bd_not_on_path_is_a_tracker_error(project: Project, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(TrackerError, match="`bd` was not found"):
        await BeadsTracker().list(project)


async def test_a_failing_bd_is_a_tracker_error_with_its_stderr(project: Project, bd: str, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_BD_FAIL_ON", "ready")
    with pytest.raises(TrackerError, match=r"bd ready .*exit code 1: Error: failed to open database: simulated"):
        await BeadsTracker(command=[bd]).ready(project)


async def test_output_that_is_not_json_is_a_tracker_error(project: Project, bd: str, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_BD_GARBAGE", "1")
    with pytest.raises(TrackerError, match="not JSON"):
        await BeadsTracker(command=[bd]).list(project)


async def test_a_hanging_bd_is_killed_at_the_timeout(project: Project, bd: str, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_BD_SLEEP", "30")
    started = time.monotonic()
    with pytest.raises(TrackerError, match=r"did not finish within 0\.5 s and was killed"):
        await BeadsTracker(command=[bd], timeout_s=0.5).ready(project)
    assert time.monotonic() - started < 5


async def test_a_project_root_that_is_gone_is_a_tracker_error(bd: str, tmp_path: Path) -> None:
    gone = Project(1, "gone", "GONE", str(tmp_path / "gone"), created_at=datetime.now(UTC))
    with pytest.raises(TrackerError, match="is not a directory"):
        await BeadsTracker(command=[bd]).list(gone)


async def test_write_back_off_writes_nothing_and_runs_nothing(project: Project, repo: Path, bd: str, bd_log) -> None:
    state = (repo / ".beads" / "issues.jsonl").read_text()
    tracker = BeadsTracker(command=[bd], write_back=False)
    for status in TaskStatus:
        await tracker.set_status(project, "tg-1", status)
    assert calls(bd_log) == []
    assert (repo / ".beads" / "issues.jsonl").read_text() == state


async def test_unmapped_statuses_write_nothing_by_default(project: Project, bd: str, bd_log) -> None:
    tracker = BeadsTracker(command=[bd])
    for status in (TaskStatus.PENDING_REVIEW, TaskStatus.APPROVED, TaskStatus.MERGED):
        await tracker.set_status(project, "tg-1", status)
    assert calls(bd_log) == []


async def test_write_back_runs_update_and_close_as_mapped(project: Project, bd: str, bd_log) -> None:
    tracker = BeadsTracker(command=[bd], status_map={"pending_review": "in_progress", "completed": "closed"})
    await tracker.set_status(project, "tg-1", TaskStatus.PENDING_REVIEW)
    await tracker.set_status(project, "tg-1", TaskStatus.IN_PROGRESS)  # not in this map: nothing
    await tracker.set_status(project, "tg-1", TaskStatus.COMPLETED, reason="--merged in session 1")
    assert calls(bd_log) == [
        ["update", "tg-1", "--status=in_progress", "--json"],
        ["close", "tg-1", "--reason=--merged in session 1", "--json"],
    ]
    state = {i["id"]: i for i in map(json.loads, (Path(project.root_path) / ".beads/issues.jsonl").open())}
    assert state["tg-1"]["status"] == "closed" and state["tg-1"]["close_reason"] == "--merged in session 1"


@pytest.mark.parametrize("evil", ["--help", "-x", "tg-1 --all", "../tg-1", "", "tg-1\n", "a" * 65])
async def test_ids_that_are_not_beads_ids_never_reach_bd(project: Project, bd: str, bd_log, evil: str) -> None:
    tracker = BeadsTracker(command=[bd])
    with pytest.raises(TaskNotFound):
        await tracker.show(project, evil)
    with pytest.raises(InvalidInput):
        await tracker.set_status(project, evil, TaskStatus.COMPLETED)
    assert calls(bd_log) == []


def test_a_status_map_with_an_unknown_task_status_is_refused() -> None:
    with pytest.raises(InvalidInput, match="unknown task status 'done'"):
        BeadsTracker(status_map={"done": "closed"})
    with pytest.raises(InvalidInput, match="not a Beads status word"):
        BeadsTracker(status_map={"completed": "--force"})


# -- the import on the real databases --------------------------------------------------------------------------

EXPORT = jsonl(
    bead("bd-1", "Epic", priority=1),
    bead("bd-2", "Child, needs bd-4 (later in the file)", deps=[("bd-1", "parent-child"), ("bd-4", "blocks")]),
    bead("bd-3", "Related only", deps=[("bd-2", "related"), ("bd-1", "discovered-from")]),
    bead("bd-4", "Blocker", priority=0),
    '{"id": "bd-5", "title": ',
    bead("bd-6", "Needs an unknown issue", deps=[("bd-404", "blocks")]),
    bead("bd-7", "Closed upstream", status="closed"),
)


async def links(services, task_ids: list[str]) -> dict[str, list[tuple[str, str]]]:
    async with services.uow(write=False) as uow:
        return await uow.tasks.blocker_links(task_ids)


async def test_import_creates_tasks_and_only_blocking_dependencies(sql_services, tmp_path) -> None:
    project = await sql_services.tracker.init_project(str(make_git_repo(tmp_path / "repo")))
    importer = BeadsImporter(sql_services.uow, SystemClock())
    report = await importer.import_jsonl(ImportBeads(project.id, EXPORT))

    assert report.created == ["bd-1", "bd-2", "bd-3", "bd-4", "bd-6", "bd-7"]
    assert [(p.line, p.issue_id) for p in report.skipped] == [(5, None)]
    assert "invalid JSON" in report.skipped[0].reason
    assert [(w.issue_id, "bd-404" in w.reason) for w in report.warnings] == [("bd-6", True)]
    assert await links(sql_services, ["bd-1", "bd-2", "bd-3", "bd-6"]) == {"bd-2": [("bd-4", "blocks")]}
    tasks = {t.id: t for t in await sql_services.tracker.list_tasks(project.id)}
    assert {t.source for t in tasks.values()} == {"beads"}
    assert tasks["bd-7"].status == TaskStatus.COMPLETED
    ready = [t.id for t in await sql_services.tracker.ready_tasks(project.id)]
    assert ready == ["bd-4", "bd-1", "bd-3", "bd-6"] and report.ready == 4  # a missing blocker blocks nothing


async def test_a_second_import_changes_no_row(sql_services, tmp_path) -> None:
    project = await sql_services.tracker.init_project(str(make_git_repo(tmp_path / "repo")))
    importer = BeadsImporter(sql_services.uow, SystemClock())
    await importer.import_jsonl(ImportBeads(project.id, EXPORT))
    before = await sql_services.snapshot()
    again = await importer.import_jsonl(ImportBeads(project.id, EXPORT))
    assert again.counts() == {"created": 0, "updated": 0, "unchanged": 6, "deleted": 0, "skipped": 1, "ready": 4}
    assert await sql_services.snapshot() == before


async def test_a_changed_export_updates_details_and_blockers(sql_services, tmp_path) -> None:
    project = await sql_services.tracker.init_project(str(make_git_repo(tmp_path / "repo")))
    importer = BeadsImporter(sql_services.uow, SystemClock())
    await importer.import_jsonl(ImportBeads(project.id, EXPORT))
    changed = jsonl(
        bead("bd-1", "Epic, renamed", priority=1),
        bead("bd-2", "Child, needs bd-4 (later in the file)", deps=[("bd-1", "parent-child")]),
        bead("bd-4", "Blocker", priority=3, description="now described"),
    )
    report = await importer.import_jsonl(ImportBeads(project.id, changed))
    assert (report.updated, report.unchanged) == (["bd-1", "bd-2", "bd-4"], [])
    assert report.deleted == ["bd-3", "bd-6", "bd-7"]  # gone from Beads: completed here, blocking nothing
    tasks = {t.id: t for t in await sql_services.tracker.list_tasks(project.id)}
    assert tasks["bd-1"].title == "Epic, renamed" and tasks["bd-2"].blockers == []
    assert (tasks["bd-4"].priority, tasks["bd-4"].description) == (3, "now described")


async def test_ids_taken_by_builtin_tasks_or_other_projects_get_the_project_key(sql_services, tmp_path) -> None:
    tracker = sql_services.tracker
    mine = await tracker.init_project(str(make_git_repo(tmp_path / "mine")))
    other = await tracker.init_project(str(make_git_repo(tmp_path / "other")))
    builtin = await tracker.add_task(AddTask(mine.id, "a built-in task"))
    importer = BeadsImporter(sql_services.uow, SystemClock())
    await importer.import_jsonl(ImportBeads(other.id, jsonl(bead("bd-9", "theirs"))))
    export = jsonl(
        bead(builtin.id, "collides"),
        bead("bd-9", "also collides"),
        bead("bd-10", "needs it", deps=[(builtin.id, "blocks")]),
    )
    report = await importer.import_jsonl(ImportBeads(mine.id, export))
    assert report.skipped == [] and report.created == [f"MINE.{builtin.id}", "MINE.bd-9", "bd-10"]
    tasks = {t.id: t for t in await tracker.list_tasks(mine.id)}
    assert tasks[f"MINE.{builtin.id}"].external_id == builtin.id and tasks["bd-10"].external_id == "bd-10"
    assert await links(sql_services, ["bd-10"]) == {"bd-10": [(f"MINE.{builtin.id}", "blocks")]}
    assert (await importer.import_jsonl(ImportBeads(mine.id, export))).counts()["unchanged"] == 3


async def test_the_same_export_imports_into_two_projects(sql_services, tmp_path) -> None:
    tracker = sql_services.tracker
    first = await tracker.init_project(str(make_git_repo(tmp_path / "first")))
    second = await tracker.init_project(str(make_git_repo(tmp_path / "second")))
    importer = BeadsImporter(sql_services.uow, SystemClock())
    export = jsonl(bead("bd-1", "Blocker"), bead("bd-2", "Blocked", deps=[("bd-1", "blocks")]))
    await importer.import_jsonl(ImportBeads(first.id, export))
    report = await importer.import_jsonl(ImportBeads(second.id, export))
    assert report.skipped == [] and report.created == ["SECOND.bd-1", "SECOND.bd-2"]
    assert [t.id for t in await tracker.ready_tasks(second.id)] == ["SECOND.bd-1"]
    assert [t.id for t in await tracker.ready_tasks(first.id)] == ["bd-1"]


async def test_an_active_session_keeps_its_task_status(sql_services, tmp_path) -> None:
    project = await sql_services.tracker.init_project(str(make_git_repo(tmp_path / "repo")))
    await sql_services.tracker.ensure_operator(OPERATOR)
    importer = BeadsImporter(sql_services.uow, SystemClock())
    await importer.import_jsonl(ImportBeads(project.id, jsonl(bead("bd-1", "Work"), bead("bd-2", "Idle"))))
    await sql_services.sessions.start_task(StartTask("bd-1", ACTOR, OPERATOR))
    closed = jsonl(bead("bd-1", "Work", status="closed"), bead("bd-2", "Idle", status="closed"))
    report = await importer.import_jsonl(ImportBeads(project.id, closed))
    tasks = {t.id: t for t in await sql_services.tracker.list_tasks(project.id)}
    assert tasks["bd-1"].status == TaskStatus.IN_PROGRESS
    assert tasks["bd-2"].status == TaskStatus.COMPLETED
    assert report.updated == ["bd-1", "bd-2"]  # bd-1 keeps its status; Beads' own is kept as tracker_status
    assert (tasks["bd-1"].tracker_status, tasks["bd-2"].tracker_status) == ("closed", "closed")


async def test_open_issues_imported_into_a_closed_plan_reopen_it_and_closed_ones_do_not(sql_services, tmp_path):
    project = await sql_services.tracker.init_project(str(make_git_repo(tmp_path / "repo")))
    plan = await sql_services.tracker.add_plan(project.id, "Done")
    async with sql_services.uow(write=True) as uow:  # as the completion of its last task leaves it
        await uow.plans.set_status(plan.id, PlanStatus.CLOSED)
        await uow.commit()
    importer = BeadsImporter(sql_services.uow, SystemClock())

    done = await importer.import_jsonl(ImportBeads(project.id, jsonl(bead("bd-1", "Old", status="closed")), plan.id))
    assert done.reopened_plan is None
    assert (await sql_services.tracker.list_plans(project.id))[0].status == PlanStatus.CLOSED

    report = await importer.import_jsonl(ImportBeads(project.id, jsonl(bead("bd-2", "New")), plan.id, ACTOR))
    assert report.reopened_plan == plan.id
    assert (await sql_services.tracker.list_plans(project.id))[0].status == PlanStatus.OPEN
    assert [t.id for t in await sql_services.tracker.ready_tasks(project.id)] == ["bd-2"]
    async with sql_services.uow(write=False) as uow:
        [event] = [e for e in await uow.events.list(None, limit=100) if e["kind"] == "plan.reopened"]
    assert (event["payload"]["tasks"], event["payload"]["actor"]) == (["bd-2"], ACTOR)


async def test_a_failure_mid_import_writes_nothing(sql_services, tmp_path, monkeypatch) -> None:
    project = await sql_services.tracker.init_project(str(make_git_repo(tmp_path / "repo")))
    before = await sql_services.snapshot()

    async def broken(self, links):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(SqlAlchemyTaskRepository, "add_links", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        await BeadsImporter(sql_services.uow, SystemClock()).import_jsonl(ImportBeads(project.id, EXPORT))
    assert await sql_services.snapshot() == before


async def test_a_beads_task_moved_by_its_session_is_written_back_to_beads(sql_services, tmp_path, bd, bd_log):

    from taskgate.bootstrap import build_workspaces
    from taskgate.domain.states import SessionState

    repo = make_git_repo(tmp_path / "beads-repo")
    state = write_beads_state(repo, bead("tg-1", "Beads work"))
    project = await sql_services.tracker.init_project(str(repo))
    await sql_services.tracker.ensure_operator(OPERATOR)
    await BeadsImporter(sql_services.uow, SystemClock()).import_jsonl(ImportBeads(project.id, state.read_text()))
    tracker = BeadsTracker(command=[bd], status_map={"in_progress": "in_progress", "completed": "closed"})
    build_workspaces(
        sql_services.sessions,
        sql_services.uow,
        clock=SystemClock(),
        vcs=GitPythonVcs(),
        git=GitOptions(),
        tracker=tracker,
    )

    session = (await sql_services.sessions.start_task(StartTask("tg-1", ACTOR, OPERATOR))).session
    assert calls(bd_log) == [  # the context read; still ready in Beads? then claimed; then the status written back
        ["version", "--json"],
        ["ready", "--limit", "0", "--sort", "priority", "--json"],
        ["ready", "--limit", "0", "--sort", "priority", "--json"],
        ["update", "tg-1", "--claim", f"--actor={ACTOR}", "--json"],
        ["update", "tg-1", "--status=in_progress", "--json"],
    ]
    for trigger in ("plan_complete", "work_complete", "approve", "merge"):
        session = (await sql_services.sessions.fire(FireTrigger(session.id, trigger, ACTOR))).session
    assert session.state == SessionState.COMPLETED
    assert calls(bd_log)[-1][:2] == ["close", "tg-1"] and len(calls(bd_log)) == 6  # unmapped statuses write nothing
    issues = {i["id"]: i for i in map(json.loads, state.open())}
    assert issues["tg-1"]["status"] == "closed"


async def test_a_failing_write_back_never_undoes_the_transition(sql_services, tmp_path, bd, monkeypatch):
    from taskgate.bootstrap import build_workspaces

    repo = make_git_repo(tmp_path / "beads-repo")
    state = write_beads_state(repo, bead("tg-1", "Beads work"))
    project = await sql_services.tracker.init_project(str(repo))
    await sql_services.tracker.ensure_operator(OPERATOR)
    await BeadsImporter(sql_services.uow, SystemClock()).import_jsonl(ImportBeads(project.id, state.read_text()))
    build_workspaces(
        sql_services.sessions,
        sql_services.uow,
        clock=SystemClock(),
        vcs=GitPythonVcs(),
        git=GitOptions(),
        tracker=BeadsTracker(command=[bd]),
    )
    session = (await sql_services.sessions.start_task(StartTask("tg-1", ACTOR, OPERATOR))).session
    monkeypatch.setenv("FAKE_BD_FAIL", "1")
    for trigger in ("plan_complete", "work_complete", "approve", "merge"):
        result = await sql_services.sessions.fire(FireTrigger(session.id, trigger, ACTOR))
    assert result.session.state.value == "completed" and "will be retried" in " ".join(result.warnings)
    async with sql_services.uow(write=False) as uow:
        events = [e for e in await uow.events.list(session.id) if e["kind"] == "tracker.writeback_failed"]
        [owed] = await uow.writebacks.list(states=["pending"])
    assert len(events) == 1 and events[0]["payload"]["status"] == "completed" and events[0]["payload"]["error"]
    assert (owed.task_id, owed.status, owed.attempts) == ("tg-1", "completed", 1) and "simulated" in owed.last_error


async def test_a_failed_write_back_is_retried_with_backoff_then_given_up_and_an_operator_retries_it(
    sql_services, tmp_path, bd, monkeypatch
):
    from taskgate.application.trackers.writebacks import WritebackService
    from taskgate.domain import writebacks as wb
    from tests.fakes import FakeClock

    repo = make_git_repo(tmp_path / "beads-repo")
    state = write_beads_state(repo, bead("tg-1", "Beads work"))
    project = await sql_services.tracker.init_project(str(repo))
    await BeadsImporter(sql_services.uow, SystemClock()).import_jsonl(ImportBeads(project.id, state.read_text()))
    clock = FakeClock()
    async with sql_services.uow(write=True) as uow:
        await uow.writebacks.enqueue_for_task("tg-1", ("beads",), "completed", None, "by hand", clock.now())
        await uow.commit()
    service = WritebackService(sql_services.uow, clock, BeadsTracker(command=[bd]))
    monkeypatch.setenv("FAKE_BD_FAIL", "1")
    delays = []
    for _ in range(wb.MAX_ATTEMPTS):
        [tried] = await service.run_due()
        assert not tried.ok and await service.run_due() == []  # not due again before its backoff
        [row] = await service.rows()
        if row.state == wb.PENDING:
            delays.append((row.next_attempt_at - clock.now()).total_seconds())
            await clock.sleep(delays[-1] + 1)
    assert row.state == wb.FAILED and row.attempts == wb.MAX_ATTEMPTS and await service.run_due() == []
    assert [round(d) for d in delays] == [10, 20, 40, 80, 160]
    monkeypatch.delenv("FAKE_BD_FAIL")
    assert (await service.retry(row.id, "operator:alice")).ok
    [row] = await service.rows()
    assert (row.state, row.resolved_by) == (wb.DONE, "operator:alice")
    assert {i["id"]: i for i in map(json.loads, state.open())}["tg-1"]["status"] == "closed"


async def test_two_workers_never_write_the_same_row_twice(sql_services, tmp_path, bd, bd_log) -> None:
    """Many concurrent run_due calls (as several serve processes' sweepers would): one bd call for the row,
    because an attempt starts with a compare-and-swap claim on the row's attempt count."""
    import asyncio

    from taskgate.application.trackers.writebacks import WritebackService

    repo = make_git_repo(tmp_path / "beads-repo")
    state = write_beads_state(repo, bead("tg-1", "Beads work"))
    project = await sql_services.tracker.init_project(str(repo))
    await BeadsImporter(sql_services.uow, SystemClock()).import_jsonl(ImportBeads(project.id, state.read_text()))
    async with sql_services.uow(write=True) as uow:
        await uow.writebacks.enqueue_for_task("tg-1", ("beads",), "completed", None, "by hand", SystemClock().now())
        await uow.commit()
    workers = [WritebackService(sql_services.uow, SystemClock(), BeadsTracker(command=[bd])) for _ in range(12)]
    results = await asyncio.gather(*(w.run_due() for w in workers))
    assert sum(len(r) for r in results) == 1
    assert [c[:2] for c in calls(bd_log) if c[0] == "close"] == [["close", "tg-1"]]


# -- bd's versions, its JSON envelope and its claim ---------------------------------------------------------------


async def test_a_bd_older_than_the_oldest_supported_is_refused_naming_both(project: Project, bd: str, monkeypatch):
    monkeypatch.setenv("FAKE_BD_VERSION", "0.42.0")
    with pytest.raises(TrackerError, match=r"bd 0\.42\.0 is older than 0\.49\.4, the oldest taskgate supports"):
        await BeadsTracker(command=[bd]).ready(project)


async def test_the_json_envelope_and_the_legacy_shape_read_the_same(project: Project, bd: str, monkeypatch) -> None:
    legacy = await BeadsTracker(command=[bd]).ready(project)
    monkeypatch.setenv("BD_JSON_ENVELOPE", "1")
    tracker = BeadsTracker(command=[bd])
    assert await tracker.ready(project) == legacy and [i.id for i in legacy] == ["tg-1"]
    assert (await tracker.show(project, "tg-2")).dependencies == (("tg-1", "blocks"),)
    with pytest.raises(TaskNotFound):  # bd's error object inside the envelope
        await tracker.show(project, "tg-404")


async def test_a_claim_by_another_orchestrator_is_refused_with_bds_words(project: Project, bd: str) -> None:
    tracker = BeadsTracker(command=[bd])
    await tracker.claim(project, "tg-1", "alice")
    await tracker.claim(project, "tg-1", "alice")  # ours already: idempotent
    with pytest.raises(ClaimRefused, match="already claimed by alice"):
        await tracker.claim(project, "tg-1", "bob")
    assert (await tracker.show(project, "tg-1")).status == "in_progress"


async def test_a_close_bd_refuses_is_a_tracker_error_with_its_reason(project: Project, repo: Path, bd: str) -> None:
    write_beads_state(
        repo, bead("tg-e", "Epic", issue_type="epic"), bead("tg-k", "Kid", deps=[("tg-e", "parent-child")])
    )
    with pytest.raises(TrackerError, match=r"cannot close epic tg-e: 1 open child issue\(s\)"):
        await BeadsTracker(command=[bd]).set_status(project, "tg-e", TaskStatus.COMPLETED)
