"""The tracker poller (application/trackers/polling.py) over the GitHub stand-in, on the in-memory fakes, SQLite and
PostgreSQL: a poll mirrors the candidates with their holds and reports ready, held, claimed and lost; a session
whose issue is closed, unlabelled or reassigned is reported lost and acted on by the node holding it (asked once, or
stopped with its work kept); a tracker that keeps failing is recorded, not raised; each project has one poll row."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from githubkit.retry import RetryChainDecision, RetryRateLimit, RetryServerError
from githubkit.typing import RetryOption

from taskgate.application.sessions.commands import StartTask
from taskgate.application.trackers.polling import LOST_EVENT, LOST_MARK, TrackerPoller
from taskgate.application.trackers.routing import Trackers, TrackerSpec
from taskgate.application.workspaces.options import GitOptions
from taskgate.bootstrap import build_workspaces
from taskgate.domain.states import SessionState
from taskgate.infrastructure.git import GitPythonVcs
from taskgate.infrastructure.system import SystemClock
from taskgate.infrastructure.trackers import github_issues
from taskgate.infrastructure.trackers.github_issues import GitHubIssuesTracker
from tests.builders import ACTOR, OPERATOR
from tests.conftest import Services, make_git_repo
from tests.support.github_api import GitHubStandIn

pytestmark = pytest.mark.timeout(120)
BOT, TOKEN = "taskgate-bot", "ghp_secret_value_123"


@pytest.fixture
def gh(tmp_path: Path) -> Iterator[GitHubStandIn]:
    bare = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    with GitHubStandIn(bare, token=TOKEN, login=BOT) as standin:
        yield standin


async def poller_on(services: Services, gh: GitHubStandIn, repo: Path, on_lost: str = "ask"):
    """The project on `repo` reads GitHub issues of the stand-in (labelled taskgate, written back), wired as
    bootstrap does (claim at start, the tracker service's sync); its poller with policy `on_lost`."""
    trackers = Trackers(TrackerSpec("github", True, lambda: GitHubIssuesTracker(gh.url, "acme/shop", TOKEN, "GH")))
    clock = SystemClock()
    build_workspaces(services.sessions, services.uow, clock=clock, vcs=GitPythonVcs(), git=GitOptions(),
                     tracker=trackers, tracker_service=services.tracker)  # fmt: skip
    project = await services.tracker.init_project(str(repo))
    await services.tracker.ensure_operator(OPERATOR)
    assert services.tracker.sync is not None
    return project, TrackerPoller(services.uow, clock, services.sessions, services.tracker.sync, on_lost)


async def task(services: Services, task_id: str):
    async with services.uow(write=False) as uow:
        return await uow.tasks.get(task_id, with_blockers=False)


async def running_on(services: Services, poller: TrackerPoller, project, number: int):
    """A person's session on gh-`number` (mirrored by a poll first), in planning with its worktree."""
    await poller.poll(project)
    session = (await services.sessions.start_task(StartTask(f"gh-{number}", ACTOR, OPERATOR))).session
    assert session.state == SessionState.PLANNING and session.worktree_path
    return session


async def test_a_poll_mirrors_the_candidates_with_their_holds_and_reports_them(services, gh, git_repo) -> None:
    """Open labelled issues become tasks gh-N (a blocked one held, with GitHub's reason); the report names the
    ready, the held and why, the claimed (sessions on issues) and the number of candidates; an issue edited while
    queued is re-read by the next poll."""
    project, poller = await poller_on(services, gh, git_repo)
    a = gh.add_issue("first", labels=["taskgate"])
    b = gh.add_issue("blocked", labels=["taskgate"], blocked_by=[a])
    c = gh.add_issue("third", labels=["taskgate"])
    gh.add_issue("not ours", labels=["other"])
    outcome = await poller.poll(project)
    assert outcome.ok and outcome.ids == [f"gh-{n}" for n in (a, b, c)]
    report = outcome.poll.report
    assert report == {"ready": [f"gh-{a}", f"gh-{c}"], "held": {f"gh-{b}": f"blocked by gh-{a} (open)"},
                      "claimed": [], "lost": {}, "candidates": 3}  # fmt: skip
    assert outcome.poll.calls > 0 and outcome.poll.provider == "github"
    held = await task(services, f"gh-{b}")
    assert (held.source, held.external_id, held.hold) == ("github", f"gh-{b}", f"blocked by gh-{a} (open)")

    gh.edit_issue(c, title="third, renamed")
    session = await running_on(services, poller, project, a)
    again = (await poller.poll(project)).poll.report
    assert (await task(services, f"gh-{c}")).title == "third, renamed"
    assert (again["ready"], again["claimed"], again["lost"]) == ([f"gh-{c}"], [f"gh-{a}"], {})
    assert gh.issue(a)["assignees"] == [BOT] and session.task_id == f"gh-{a}"


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda gh, n: gh.close_issue(n), "closed in GitHub"),
        (lambda gh, n: gh.set_labels(n, ["taskgate:in-progress"]), "label taskgate removed"),
        (lambda gh, n: gh.assign(n, "bob"), "assigned to bob"),
    ],
    ids=["closed", "unlabelled", "reassigned"],
)
async def test_an_issue_that_is_no_longer_ours_is_reported_lost(services, gh, git_repo, change, why) -> None:
    """A session runs on an issue; the issue is closed, loses the label, or is given to bob: the next poll's
    report names the task as lost, with why."""
    project, poller = await poller_on(services, gh, git_repo)
    n = gh.add_issue("work", labels=["taskgate"])
    await running_on(services, poller, project, n)
    change(gh, n)
    report = (await poller.poll(project)).poll.report
    assert report["lost"] == {f"gh-{n}": why} and report["claimed"] == [f"gh-{n}"]


async def lost_after_close(services, gh, git_repo, on_lost: str):
    """A session on an issue that is then closed, the poll saved: (project, poller, session, issue number)."""
    project, poller = await poller_on(services, gh, git_repo, on_lost)
    n = gh.add_issue("work", labels=["taskgate"])
    session = await running_on(services, poller, project, n)
    gh.close_issue(n)
    await poller.save([await poller.poll(project)], [], dry_run=False)
    return project, poller, session, n


async def lost_events(services: Services, session_id: str) -> list[dict]:
    async with services.uow(write=False) as uow:
        return [e for e in await uow.events.list(session_id, limit=1000) if e["kind"] == LOST_EVENT]


async def test_ask_marks_the_session_once_and_leaves_it_running(sql_services, gh, git_repo) -> None:
    """on_issue_gone = ask: the session gets the tracker_lost mark and one tracker.issue_lost event, however often
    act_on_lost runs, and stays in planning for the operator to decide."""
    services = sql_services  # polls are stored: the SQL backends
    _, poller, session, n = await lost_after_close(services, gh, git_repo, "ask")
    assert await poller.act_on_lost() == [f"gh-{n} (session {session.id}): closed in GitHub; the operator is asked"]
    assert await poller.act_on_lost() == []  # marked already: nothing more
    after = await services.sessions.get(session.id)
    assert after.state == SessionState.PLANNING
    assert {k: after.state_data[LOST_MARK][k] for k in ("issue", "why", "policy")} == {
        "issue": f"gh-{n}", "why": "closed in GitHub", "policy": "ask"}  # fmt: skip
    assert len(await lost_events(services, session.id)) == 1


async def test_stop_fails_the_session_for_manual_review_and_keeps_its_work(sql_services, gh, git_repo) -> None:
    """on_issue_gone = stop: the session is failed with compensation manual_review; its worktree and branch are
    still there for review."""
    services = sql_services  # polls are stored: the SQL backends
    _, poller, session, n = await lost_after_close(services, gh, git_repo, "stop")
    assert await poller.act_on_lost() == [f"gh-{n} (session {session.id}): closed in GitHub; stopped"]
    after = await services.sessions.get(session.id)
    assert (after.state, after.compensation_plan) == (SessionState.FAILED, "manual_review")
    assert after.state_data[LOST_MARK]["policy"] == "stop" and len(await lost_events(services, session.id)) == 1
    assert Path(after.worktree_path).is_dir()
    branches = subprocess.run(["git", "branch", "--list", after.branch_name], cwd=git_repo, check=True,
                              capture_output=True, text=True).stdout  # fmt: skip
    assert after.branch_name in branches


async def test_a_node_that_does_not_hold_the_session_leaves_it_alone(sql_services, gh, git_repo) -> None:
    """The session was created on node-a; a poller on node-b (its SessionService on another node) neither marks
    nor stops it, even with policy stop; node-a then does."""
    services = sql_services  # polls are stored: the SQL backends
    services.sessions.on_node("node-a")
    _, poller, session, _ = await lost_after_close(services, gh, git_repo, "stop")
    assert session.node_id == "node-a"
    services.sessions.on_node("node-b")
    assert await poller.act_on_lost() == []
    untouched = await services.sessions.get(session.id)
    assert untouched.state == SessionState.PLANNING and LOST_MARK not in untouched.state_data
    assert await lost_events(services, session.id) == []
    services.sessions.on_node("node-a")
    assert len(await poller.act_on_lost()) == 1


class QuickServerRetry(RetryServerError):
    """githubkit's server-error retries (three), without their 1 s, 4 s, 9 s waits."""

    def __call__(self, exc, retry_count: int) -> RetryOption:
        option = super().__call__(exc, retry_count)
        quick = timedelta(milliseconds=1)  # not 0: githubkit waits 60 s for a falsy retry_after
        return RetryOption(True, quick) if option.do_retry else option


async def test_a_failing_tracker_is_recorded_not_raised_and_each_project_keeps_one_poll_row(
    sql_services, gh, git_repo, tmp_path, monkeypatch
) -> None:
    """GitHub answers 500 to everything: the poll retries, then returns its error (no report) instead of raising;
    `save` writes one tracker_polls row per project: the next sweep's replaces it, and a second project has its own."""
    services = sql_services  # polls are stored: the SQL backends
    monkeypatch.setattr(github_issues, "RETRY", RetryChainDecision(RetryRateLimit(max_retry=3), QuickServerRetry()))
    project, poller = await poller_on(services, gh, git_repo)
    gh.add_issue("work", labels=["taskgate"])
    gh.fail_next(100, 500)
    failed = await poller.poll(project)
    assert not failed.ok and failed.poll.report == {} and failed.ids == []
    assert "list issues of acme/shop" in failed.poll.error and failed.poll.calls == 4  # the request and 3 retries
    await poller.save([failed], [], dry_run=False)
    (row,) = await poller.polls()
    assert (row.project_id, row.error, row.report) == (project.id, failed.poll.error, {"dispatch": [],
                                                                                        "dry_run": False})  # fmt: skip

    other = await services.tracker.init_project(str(make_git_repo(tmp_path / "other")))
    outcomes = await poller.poll_all(await services.tracker.list_projects())  # a sweep later, both still failing
    await poller.save(outcomes, [], dry_run=False)
    async with services.uow(write=False) as uow:
        rows = await uow.tracker_polls.list()
    assert [(r.project_id, r.polled_at) for r in rows] == [(project.id, outcomes[0].poll.polled_at),
                                                           (other.id, outcomes[1].poll.polled_at)]  # fmt: skip
    assert rows[0].polled_at > failed.poll.polled_at and all(r.error for r in rows)
