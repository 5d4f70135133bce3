"""Session worktrees on real git repositories (made in temp dirs), on SQLite and PostgreSQL.

Covers issue 4's list: 8 sessions creating worktrees concurrently on one repo; base moved → rebase → merge; a real
conflict; a dirty worktree at merge; a worktree folder deleted by hand; hostile task titles; restart with orphans.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest

from taskgate.application.sessions.commands import CreateSession, FireTrigger
from taskgate.application.workspaces.options import GitOptions
from taskgate.domain.entities import Session, TaskStatus
from taskgate.domain.errors import ConflictError, InvalidInput, MergeConflict, VcsError, WorktreeNotCreated
from taskgate.domain.states import SessionState
from tests.builders import ACTOR, OPERATOR, fire, seed, start
from tests.conftest import Services, open_database, wire

IDENTITY = ("-c", "user.name=agent", "-c", "user.email=agent@example.invalid")
TO_MERGE = ("plan_complete", "work_complete", "approve")


def git(cwd: Path | str, *args: str) -> str:
    done = subprocess.run(["git", *IDENTITY, *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"git {args}: {done.stderr}"
    return done.stdout.strip()


def commit(cwd: Path | str, name: str, content: str, message: str) -> str:
    (Path(cwd) / name).write_text(content)
    git(cwd, "add", "--", name)
    git(cwd, "commit", "-q", "-m", message)
    return git(cwd, "rev-parse", "HEAD")


def branches(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").splitlines()


def worktree_paths(repo: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in git(repo, "worktree", "list", "--porcelain").splitlines() if
            line.startswith("worktree ")]  # fmt: skip


async def awaiting_merge(services: Services, git_repo: Path) -> tuple[Session, Path]:
    """A started session whose agent committed `feature.txt`, approved and ready to merge."""
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    worktree = Path(session.worktree_path)
    commit(worktree, "feature.txt", "the feature\n", "feat: add the feature")
    return await fire(services, session, *TO_MERGE), worktree


async def test_starting_a_task_creates_its_worktree_on_a_new_branch_from_main(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    worktree = Path(session.worktree_path)
    assert worktree == git_repo / ".worktrees" / session.id and worktree.is_dir()
    assert session.branch_name == f"feature/{seeded.tasks[0].id}/{session.id[:8]}"
    assert git(worktree, "branch", "--show-current") == session.branch_name
    assert session.state_data["base_commit"] == git(git_repo, "rev-parse", "main")
    assert git(git_repo, "status", "--porcelain") == ""  # .worktrees/ is excluded, not an untracked folder
    [snapshot] = await services.workspaces.snapshots(session.id, kind="context")
    assert snapshot.data["worktree"]["branch"] == session.branch_name
    assert snapshot.data["project"]["git"]["branch"] == "main"


async def test_eight_sessions_create_worktrees_concurrently_on_one_repo(sql_services, git_repo):
    seeded = await seed(sql_services, git_repo, tasks=8)

    async def prepare(task_id: str) -> Session:
        created = await sql_services.sessions.create_session(CreateSession(task_id, ACTOR, OPERATOR))
        return (await sql_services.sessions.fire(FireTrigger(created.id, "initialize", "system"))).session

    sessions = await asyncio.gather(*(prepare(t.id) for t in seeded.tasks))
    assert {s.state for s in sessions} == {SessionState.READY}
    assert sorted(worktree_paths(git_repo)[1:]) == sorted(s.worktree_path for s in sessions)
    assert sorted(b for b in branches(git_repo) if b != "main") == sorted(s.branch_name for s in sessions)
    for session in sessions:
        assert git(session.worktree_path, "branch", "--show-current") == session.branch_name
        assert git(session.worktree_path, "status", "--porcelain") == ""
    assert len(await sql_services.workspaces.list_worktrees()) == 8


async def test_a_merge_after_the_base_moved_rebases_the_branch_and_fast_forwards_main(services, git_repo):
    session, worktree = await awaiting_merge(services, git_repo)
    moved = commit(git_repo, "other.txt", "someone else's work\n", "chore: meanwhile on main")
    review = await services.workspaces.review(session.id)
    assert (review.ahead, review.behind) == (1, 1) and [f.path for f in review.diff_stat] == ["feature.txt"]

    result = await services.sessions.fire(FireTrigger(session.id, "merge", ACTOR))

    assert (result.record.to_state, result.session.state) == ("merged", SessionState.COMPLETED)
    assert [r.trigger for r in result.follow_ups] == ["cleanup_done"]
    log = git(git_repo, "log", "--format=%s", "main").splitlines()
    assert log[:2] == ["feat: add the feature", "chore: meanwhile on main"]  # linear: rebased onto the new main
    assert git(git_repo, "rev-parse", "main^") == moved
    assert (git_repo / "feature.txt").read_text() == "the feature\n"  # main's checkout followed the fast-forward
    merge = result.session.state_data["merge"]
    assert merge["rebased"] is True and merge["commit"] == git(git_repo, "rev-parse", "main")
    assert not worktree.exists() and session.branch_name not in branches(git_repo)
    assert result.record.reason.startswith("merged into main at ")
    task = (await services.tracker.list_tasks(session.project_id))[0]
    assert task.status == TaskStatus.COMPLETED


async def test_no_ff_mode_lands_the_branch_with_a_merge_commit(sql_services, git_repo, tmp_path):
    services = wire(sql_services.backend, sql_services.database, sql_services.url, git=GitOptions(merge_mode="no-ff"))
    session, _ = await awaiting_merge(services, git_repo)
    await services.sessions.fire(FireTrigger(session.id, "merge", ACTOR))
    parents = git(git_repo, "rev-list", "--parents", "-n", "1", "main").split()
    assert len(parents) == 3  # a merge commit: main's old head and the session's commit
    assert git(git_repo, "log", "-1", "--format=%s", "main").startswith("Merge branch 'feature/")


async def test_a_real_conflict_aborts_cleanly_and_leaves_the_session_awaiting_merge(services, git_repo):
    session, worktree = await awaiting_merge(services, git_repo)
    main_before = commit(git_repo, "feature.txt", "a different feature\n", "feat: the same file on main")
    branch_before = git(worktree, "rev-parse", "HEAD")

    with pytest.raises(MergeConflict) as refused:
        await services.sessions.fire(FireTrigger(session.id, "merge", ACTOR))

    assert refused.value.files == ["feature.txt"] and "feature.txt" in str(refused.value)
    after = await services.sessions.get(session.id)
    assert (after.state, after.version) == (SessionState.AWAITING_MERGE, session.version)
    assert after.state_data["merge_conflicts"] == ["feature.txt"]
    assert git(git_repo, "rev-parse", "main") == main_before and git(worktree, "rev-parse", "HEAD") == branch_before
    assert git(worktree, "status", "--porcelain") == ""  # the rebase was aborted: nothing half-applied
    git_dir = Path(git(worktree, "rev-parse", "--absolute-git-dir"))
    assert not (git_dir / "rebase-merge").exists() and not (git_dir / "rebase-apply").exists()
    last = (await services.sessions.history(session.id, limit=1))[0]
    assert (last.trigger, last.outcome.value) == ("merge", "blocked")
    assert last.guard_results[0]["policy"] == "merge" and "feature.txt" in last.guard_results[0]["message"]

    git(worktree, "merge", "-q", "-X", "ours", "main", "-m", "merge main, keeping our feature")  # the fix
    with pytest.raises(ConflictError, match="changed after it was approved"):  # the fix itself was not reviewed
        await services.sessions.fire(FireTrigger(session.id, "merge", ACTOR))
    blocked = (await services.sessions.history(session.id, limit=1))[0]
    assert (blocked.trigger, blocked.outcome.value, blocked.guard_results[0]["policy"]) == (
        "merge", "blocked", "approved_head"
    )  # fmt: skip
    assert git(git_repo, "rev-parse", "main") == main_before
    await fire(services, await services.sessions.get(session.id), "reverify", "approve")  # reviewed again
    done = await services.sessions.fire(FireTrigger(session.id, "merge", ACTOR))
    assert done.session.state == SessionState.COMPLETED and "merge_conflicts" not in done.session.state_data


async def test_a_dirty_worktree_refuses_the_merge_and_changes_nothing(services, git_repo):
    session, worktree = await awaiting_merge(services, git_repo)
    (worktree / "feature.txt").write_text("uncommitted edit\n")
    (worktree / "notes.txt").write_text("forgotten\n")
    main_before = git(git_repo, "rev-parse", "main")

    with pytest.raises(VcsError) as refused:
        await services.sessions.fire(FireTrigger(session.id, "merge", ACTOR))

    assert "uncommitted changes" in str(refused.value) and "feature.txt" in str(refused.value)
    assert "notes.txt" in str(refused.value)
    after = await services.sessions.get(session.id)
    assert (after.state, after.version) == (SessionState.AWAITING_MERGE, session.version)
    assert git(git_repo, "rev-parse", "main") == main_before
    assert (worktree / "feature.txt").read_text() == "uncommitted edit\n"  # the agent's work is untouched
    assert (await services.sessions.history(session.id, limit=1))[0].outcome.value == "blocked"


async def test_a_worktree_deleted_by_hand_is_flagged_at_start_and_restored_by_merge(services, git_repo):
    session, worktree = await awaiting_merge(services, git_repo)
    shutil.rmtree(worktree)

    report = await services.workspaces.reconcile()

    assert report.missing_worktrees == [session.id] and report.errors == []
    flagged = await services.sessions.get(session.id)
    assert "worktree_missing" in flagged.state_data and flagged.version == session.version
    assert flagged.state == SessionState.AWAITING_MERGE  # flagged, not failed
    done = await services.sessions.fire(FireTrigger(session.id, "merge", ACTOR))
    assert done.session.state == SessionState.COMPLETED
    assert (git_repo / "feature.txt").exists()  # the committed work survived in the branch


async def test_cancel_removes_the_worktree_and_deletes_the_branch(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    commit(session.worktree_path, "wip.txt", "half done\n", "wip")
    cancelled = await fire(services, session, "cancel")
    assert cancelled.state == SessionState.CANCELLED
    assert not Path(session.worktree_path).exists() and branches(git_repo) == ["main"]


async def test_reject_with_auto_revert_resets_and_discards_the_worktree(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await fire(services, await start(services, seeded.tasks[0]), "plan_complete")
    commit(session.worktree_path, "bad.txt", "wrong approach\n", "feat: the wrong approach")
    Path(session.worktree_path, "scratch.txt").write_text("untracked\n")
    main_before = git(git_repo, "rev-parse", "main")
    done = await fire(services, session, "reject", "compensate", reason="wrong approach")
    assert done.state == SessionState.COMPLETED
    assert not Path(session.worktree_path).exists() and branches(git_repo) == ["main"]
    assert git(git_repo, "rev-parse", "main") == main_before and not (git_repo / "bad.txt").exists()


async def test_a_missing_base_branch_refuses_the_start_and_writes_nothing(sql_services, git_repo):
    """Issue 36: it answered "Nothing was changed" but left a failed session that held the task."""
    services = wire(sql_services.backend, sql_services.database, sql_services.url, git=GitOptions(base_branch="dev"))
    seeded = await seed(services, git_repo, tasks=1)
    before = await services.snapshot()
    with pytest.raises(
        VcsError, match=r"the base branch 'dev' does not exist in .*: create it, or set git\.base_branch"
    ):
        await start(services, seeded.tasks[0])
    assert await services.snapshot() == before
    assert branches(git_repo) == ["main"] and worktree_paths(git_repo) == [str(git_repo)]


async def test_a_worktree_that_cannot_be_created_cancels_its_session_and_frees_the_task(
    sql_services, git_repo, monkeypatch
):
    seeded = await seed(sql_services, git_repo, tasks=1)
    vcs = sql_services.workspaces._vcs
    real = vcs.create_worktree

    async def refused(*args, **kwargs):
        raise VcsError("git worktree failed: No space left on device")

    monkeypatch.setattr(vcs, "create_worktree", refused)
    with pytest.raises(WorktreeNotCreated, match=r"session \S+ was cancelled: its worktree could not be created: git"):
        await start(sql_services, seeded.tasks[0])
    [session] = await sql_services.sessions.list_sessions(seeded.project.id)
    assert session.state == SessionState.CANCELLED
    history = await sql_services.sessions.history(session.id)
    assert history[-1].trigger == "cancel" and "worktree could not be created" in history[-1].reason
    assert (await sql_services.tracker.list_tasks(seeded.project.id))[0].status == TaskStatus.OPEN
    monkeypatch.setattr(vcs, "create_worktree", real)
    again = await start(sql_services, seeded.tasks[0])  # the task is free: a new session starts
    assert again.id != session.id and again.state == SessionState.PLANNING


HOSTILE_TITLES = [
    "--upload-pack=touch /tmp/taskgate-pwned",
    "-x",
    "../../etc/passwd",
    "a..b",
    "x@{1}",
    "name with spaces\tand\ttabs",
    "line\nbreak\x00nul\x07bell",
    "~^:?*[\\",
    "foo.lock",
    ".hidden",
    "trailing/",
    "; rm -rf ~",
    "$(id)",
    "`id`",
    "HEAD",
    "ünïcödé ‮ override",
]


async def test_hostile_titles_never_reach_git_as_options_or_paths(sql_services, git_repo):
    options = GitOptions(branch_pattern="feature/{task_id}/{slug}-{short_id}")
    services = wire(sql_services.backend, sql_services.database, sql_services.url, git=options, wip_limit=50)
    project = await services.tracker.init_project(str(git_repo))
    await services.tracker.ensure_operator(OPERATOR)
    from taskgate.application.trackers.builtin import AddTask

    for title in HOSTILE_TITLES:
        task = await services.tracker.add_task(AddTask(project.id, title.replace("\x00", "")))
        session = await start(services, task)
        assert Path(session.worktree_path).parent == git_repo / ".worktrees"
        check = subprocess.run(["git", "check-ref-format", "--branch", session.branch_name], capture_output=True)
        assert check.returncode == 0, session.branch_name
        assert not session.branch_name.startswith("-") and ".." not in session.branch_name
    assert not Path("/tmp/taskgate-pwned").exists()
    assert sorted(Path(p).name for p in worktree_paths(git_repo)[1:]) == sorted(
        s.id for s in await services.sessions.list_sessions(project.id)
    )


async def test_restart_with_orphans_reports_or_prunes_only_what_taskgate_made(
    sql_services, git_repo, request, tmp_path
):
    seeded = await seed(sql_services, git_repo, tasks=2)
    alive = await start(sql_services, seeded.tasks[0])
    gone = await start(sql_services, seeded.tasks[1])
    # A crash after the worktree was made but before the cancel could remove it leaves an orphan behind:
    await sql_services.sessions.transition(FireTrigger(gone.id, "cancel", ACTOR))
    git(git_repo, "branch", "feature/login")  # a user's own branch: must never be pruned
    git(git_repo, "branch", "feature/X-9/deadbeef")  # shaped like ours, no session: an orphan branch

    restarted = wire(sql_services.backend, sql_services.database, sql_services.url, git=GitOptions(orphans="report"))
    report = await restarted.workspaces.reconcile()
    assert report.orphan_worktrees == [gone.worktree_path] and not report.pruned
    assert sorted(report.orphan_branches) == sorted([gone.branch_name, "feature/X-9/deadbeef"])
    assert Path(gone.worktree_path).exists()  # report only

    rows = await restarted.workspaces.list_worktrees()
    assert {(r.session_id, r.orphan) for r in rows} == {(alive.id, False), (gone.id, True)}

    report = await wire(sql_services.backend, sql_services.database, sql_services.url).workspaces.reconcile()
    assert report.pruned and report.orphan_worktrees == [gone.worktree_path]
    assert not Path(gone.worktree_path).exists() and Path(alive.worktree_path).exists()
    assert sorted(branches(git_repo)) == sorted(["main", "feature/login", alive.branch_name])


async def test_an_initialisation_interrupted_by_a_crash_is_carried_on_at_restart(sql_services, git_repo):
    seeded = await seed(sql_services, git_repo, tasks=1)
    created = await sql_services.sessions.create_session(CreateSession(seeded.tasks[0].id, ACTOR, OPERATOR))
    # `transition` applies `initialize` without its effects: the state a crash right after the commit leaves
    stuck = (await sql_services.sessions.transition(FireTrigger(created.id, "initialize", "system"))).session
    assert stuck.state == SessionState.INITIALIZING and not Path(stuck.worktree_path or "/nonexistent").exists()

    restarted = wire(sql_services.backend, sql_services.database, sql_services.url)
    report = await restarted.workspaces.reconcile()

    assert report.resumed == [created.id]
    session = await restarted.sessions.get(created.id)
    assert session.state == SessionState.READY and Path(session.worktree_path).is_dir()


async def test_review_shows_commits_files_and_dirt_and_a_checkpoint_stores_it(services, git_repo):
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    commit(session.worktree_path, "api.py", "def api():\n    return 1\n", "feat: api")
    Path(session.worktree_path, "README.md").write_text("edited\n")
    Path(session.worktree_path, "new.txt").write_text("new\n")

    review = await services.workspaces.review(session.id)
    assert (review.ahead, review.behind) == (1, 0)
    assert [(f.path, f.added, f.deleted) for f in review.diff_stat] == [("api.py", 2, 0)]
    assert [c.subject for c in review.commits] == ["feat: api"] and "+def api():" in review.patch
    assert (review.dirty, review.untracked, review.conflicts) == (["README.md"], ["new.txt"], [])

    snapshot = await services.workspaces.checkpoint(session.id, "api looks right; README edit pending", ACTOR)
    [stored] = await services.workspaces.snapshots(session.id, kind="checkpoint")
    assert stored.id == snapshot.id and stored.note == "api looks right; README edit pending"
    assert stored.data["head_commit"] == review.head_commit and stored.actor == ACTOR


async def test_context_is_cached_for_the_ttl_and_invalidated_by_our_own_writes(tmp_path, request, git_repo):
    from taskgate.application.trackers.builtin import AddTask
    from tests.fakes import FakeClock

    clock = FakeClock()
    database, url = await open_database("sqlite", request, tmp_path)
    services = wire("sqlite", database, url, clock=clock)
    try:
        seeded = await seed(services, git_repo, tasks=2, blocked_by_first=True)
        first = await services.context.discover(seeded.project.id)
        assert not first.cached and first.tracker["blocked"] == 1 and first.tracker["ready"] == 1
        assert first.git["branch"] == "main" and first.git["clean"] is True

        clock.advance(seconds=10)
        again = await services.context.discover(seeded.project.id)
        assert again.cached and 9.9 < again.age_seconds < 10.1 and again.taken_at == first.taken_at

        await services.tracker.add_task(AddTask(seeded.project.id, "one more"))  # our own write
        fresh = await services.context.discover(seeded.project.id)
        assert not fresh.cached and fresh.tracker["total"] == 3

        clock.advance(seconds=31)
        assert not (await services.context.discover(seeded.project.id)).cached  # TTL (30 s) ran out
    finally:
        await database.dispose()


async def test_with_an_origin_remote_sessions_branch_from_the_fetched_origin_main(services, git_repo, tmp_path):
    origin = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(git_repo), str(origin))
    git(git_repo, "remote", "add", "origin", str(origin))
    upstream = tmp_path / "colleague"
    git(tmp_path, "clone", "-q", str(origin), str(upstream))
    pushed = commit(upstream, "upstream.txt", "from a colleague\n", "feat: pushed by a colleague")
    git(upstream, "push", "-q", "origin", "main")

    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])

    assert session.state_data["base_ref"] == "origin/main" and session.state_data["base_commit"] == pushed
    assert (Path(session.worktree_path) / "upstream.txt").exists()  # fetched, not the stale local main
    assert git(git_repo, "rev-parse", "origin/main") == pushed
    review = await services.workspaces.review(session.id)
    assert (review.base_ref, review.ahead, review.behind) == ("origin/main", 0, 0)


async def test_ten_concurrent_merges_of_one_session_merge_it_once(sql_services, git_repo):
    from taskgate.domain.errors import InvalidTransition

    session, _ = await awaiting_merge(sql_services, git_repo)
    results = await asyncio.gather(
        *(sql_services.sessions.fire(FireTrigger(session.id, "merge", ACTOR)) for _ in range(10)),
        return_exceptions=True,
    )
    merged = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(merged) == 1 and merged[0].session.state == SessionState.COMPLETED
    assert len(refused) == 9 and all(isinstance(r, InvalidTransition) for r in refused), refused
    history = await sql_services.sessions.history(session.id)
    assert [r.trigger for r in history if r.outcome.value == "applied"][-2:] == ["merge", "cleanup_done"]
    assert git(git_repo, "log", "--format=%s", "main").splitlines().count("feat: add the feature") == 1


async def test_eight_sessions_merging_concurrently_into_one_main_all_land(sql_services, git_repo):
    services = wire(sql_services.backend, sql_services.database, sql_services.url, wip_limit=8)
    seeded = await seed(services, git_repo, tasks=8)
    sessions = []
    for i, task in enumerate(seeded.tasks):
        session = await start(services, task)
        commit(session.worktree_path, f"feature_{i}.txt", f"feature {i}\n", f"feat: feature {i}")
        sessions.append(await fire(services, session, *TO_MERGE))

    results = await asyncio.gather(*(services.sessions.fire(FireTrigger(s.id, "merge", ACTOR)) for s in sessions))

    assert {r.session.state for r in results} == {SessionState.COMPLETED}
    subjects = git(git_repo, "log", "--format=%s", "main").splitlines()
    assert sorted(s for s in subjects if s.startswith("feat:")) == sorted(f"feat: feature {i}" for i in range(8))
    assert len(git(git_repo, "rev-list", "--merges", "main").splitlines()) == 0  # each rebased, then fast-forwarded
    assert branches(git_repo) == ["main"] and worktree_paths(git_repo) == [str(git_repo)]


async def test_taskgate_runs_no_repository_hook_on_its_own_git_operations(services, git_repo):
    hook = git_repo / ".git" / "hooks" / "post-checkout"
    marker = git_repo.parent / "hook-ran"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    session, _ = await awaiting_merge(services, git_repo)  # worktree add runs post-checkout for a user's git
    await services.sessions.fire(FireTrigger(session.id, "merge", ACTOR))
    assert not marker.exists()


async def test_worktrees_may_live_outside_the_repository_in_a_folder_per_project(sql_services, git_repo, tmp_path):
    """Issue 38: the worktree folder configurable, outside the repository if the user wants."""
    outside = tmp_path / "elsewhere"
    services = wire(sql_services.backend, sql_services.database, sql_services.url,
                    git=GitOptions(worktrees_dir=str(outside)))  # fmt: skip
    seeded = await seed(services, git_repo, tasks=2)
    session = await start(services, seeded.tasks[0])
    assert Path(session.worktree_path).parent == outside / seeded.project.name
    commit(session.worktree_path, "api.py", "def api(): ...\n", "feat: api")
    assert "elsewhere" not in git(git_repo, "status", "--porcelain")  # nothing of it in the checkout
    done = await fire(services, session, "plan_complete", "work_complete", "approve", "merge")
    assert done.state == SessionState.COMPLETED and (git_repo / "api.py").exists()
    assert not Path(session.worktree_path).exists() and branches(git_repo) == ["main"]

    orphan = await start(services, seeded.tasks[1])  # a crash forgot it: reconciliation finds it out there too
    async with services.uow(write=True) as uow:
        row = await uow.sessions.get(orphan.id, lock=True)
        await uow.sessions.update(replace(row, state=SessionState.CANCELLED), expected_version=row.version)
        await uow.commit()
    report = await services.workspaces.reconcile()
    assert report.orphan_worktrees == [orphan.worktree_path] and not Path(orphan.worktree_path).exists()


def test_an_absolute_worktrees_folder_inside_the_project_is_refused_naming_it():
    with pytest.raises(InvalidInput, match="is inside the project /srv/shop: give it relative"):
        GitOptions(worktrees_dir="/srv/shop/wt").worktrees_of("/srv/shop", "shop")
    assert GitOptions(worktrees_dir="/srv/wt").worktrees_of("/srv/shop", "shop") == PurePosixPath("/srv/wt/shop")
