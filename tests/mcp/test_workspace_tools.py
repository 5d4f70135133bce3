"""The worktree and context tools through the real MCP server (in-process SDK client) on real git repositories."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from taskgate.bootstrap import Settings, policy_book
from taskgate.domain.access import Principal
from tests.conftest import make_git_repo, wire
from tests.mcp.conftest import connect

ALICE = Principal.operator("alice")
IDENTITY = ["-c", "user.name=agent", "-c", "user.email=agent@example.invalid"]


def commit(cwd: str | Path, name: str, content: str, message: str) -> None:
    Path(cwd, name).write_text(content)
    subprocess.run(["git", "add", "--", name], cwd=cwd, check=True, capture_output=True)
    subprocess.run(["git", *IDENTITY, "commit", "-q", "-m", message], cwd=cwd, check=True, capture_output=True)


async def started(tools, tmp_path: Path) -> tuple[Path, dict]:
    repo = make_git_repo(tmp_path / "repo")
    await tools.ok("project_init", path=str(repo), name="shop")
    plan = await tools.ok("plan_add", name="Phase 1")
    await tools.ok("task_add", title="Build the API", plan_id=plan["id"])
    return repo, await tools.ok("project_session_start", task_id="SHOP-1")


async def test_an_operator_reviews_checkpoints_and_merges_a_session_through_the_tools(services, tmp_path):
    async with connect(services, ALICE) as tools:
        repo, session = await started(tools, tmp_path)
        assert session["branch"] == f"feature/SHOP-1/{session['id'][:8]}"
        commit(session["worktree"], "api.py", "def api(): ...\n", "feat: api")
        for trigger in ("plan_complete", "work_complete", "approve"):
            await tools.ok("session_fire", session_id=session["id"], trigger=trigger)

        review = await tools.ok("session_review", session_id=session["id"][:8], patch=True)
        assert (review["ahead"], review["behind"]) == (1, 0) and review["files"][0]["path"] == "api.py"
        assert "+def api(): ..." in review["patch"] and "1 commit(s) ahead of main" in review["summary"]
        checkpoint = await tools.ok("session_review_checkpoint", session_id=session["id"], note="looks right")
        assert checkpoint["note"] == "looks right" and checkpoint["actor"] == "operator:alice"

        merged = await tools.ok("project_session_merge", session_id=session["id"], reason="ship it")
        assert (merged["to_state"], merged["state"]) == ("merged", "completed")
        assert merged["then"] == ["cleanup_done: merged → completed"]
        assert (repo / "api.py").exists() and not Path(session["worktree"]).exists()


async def test_a_conflicting_merge_is_a_tool_error_naming_the_files_and_nothing_moves(services, tmp_path):
    async with connect(services, ALICE) as tools:
        repo, session = await started(tools, tmp_path)
        commit(session["worktree"], "README.md", "the session's readme\n", "docs: readme")
        for trigger in ("plan_complete", "work_complete", "approve"):
            await tools.ok("session_fire", session_id=session["id"], trigger=trigger)
        commit(repo, "README.md", "main's readme\n", "docs: readme on main")

        text = await tools.refused("project_session_merge", session_id=session["id"])
        assert "MergeConflict" in text and "README.md" in text and "awaiting_merge" in text
        status = await tools.ok("session_status", session_id=session["id"])
        assert status["state"] == "awaiting_merge" and status["workspace"]["merge_conflicts"] == ["README.md"]
        assert "last merge conflicted in README.md" in status["summary"]


async def test_a_session_whose_bytes_are_not_utf8_is_reviewed_with_replacement_characters(services, tmp_path):
    """git hands taskgate a Latin-1 file name and line as lone surrogates (surrogateescape), which JSON cannot carry:
    the tools answer with U+FFFD in their place instead of the SDK's bare "Error executing tool X"."""
    async with connect(services, ALICE) as tools:
        _, session = await started(tools, tmp_path)
        worktree = os.fsencode(session["worktree"])
        Path(os.fsdecode(worktree + b"/caf\xe9.txt")).write_bytes(b"caf\xe9\n")
        git = [b"git", *(arg.encode() for arg in IDENTITY)]
        for command in ([b"add", b"-A"], [b"commit", b"-q", b"-m", b"a Latin-1 file"]):
            subprocess.run([*git, *command], cwd=worktree, check=True, capture_output=True)

        review = await tools.ok("session_review", session_id=session["id"], patch=True)
        assert review["files"][0]["path"] == "caf\ufffd.txt" and "+caf\ufffd" in review["patch"]
        checkpoint = await tools.ok("session_review_checkpoint", session_id=session["id"])
        assert "1 file(s) changed" in checkpoint["summary"]
        for trigger in ("plan_complete", "work_complete"):
            await tools.ok("session_fire", session_id=session["id"], trigger=trigger)
        waiting = await tools.ok("project_sessions_ready")
        assert "1 session(s) waiting" in waiting["summary"], waiting


async def test_context_discover_reports_git_and_tracker_and_caches(services, tmp_path):
    async with connect(services, ALICE) as tools:
        await started(tools, tmp_path)
        first = await tools.ok("context_discover")
        assert first["git"]["branch"] == "main" and first["git"]["clean"] is True
        assert first["tracker"]["by_status"]["in_progress"] == 1 and not first["cached"]
        assert len(first["git"]["worktrees"]) == 2 and "1 session worktree(s)" in first["summary"]
        assert (await tools.ok("context_discover"))["cached"]
        assert not (await tools.ok("context_discover", refresh=True))["cached"]


async def test_agents_may_review_their_own_session_but_not_merge_or_checkpoint(services, tmp_path):
    async with connect(services, ALICE) as tools:
        _, session = await started(tools, tmp_path)
    agent = Principal.agent("tok1", session["id"])
    async with connect(services, agent) as tools:
        assert (await tools.ok("session_review", session_id=session["id"]))["branch"] == session["branch"]
        assert (await tools.ok("context_discover"))["project"] == "shop"
        assert "Forbidden" in await tools.refused("project_session_merge", session_id=session["id"])
        assert "Forbidden" in await tools.refused("session_review_checkpoint", session_id=session["id"])


async def test_sessions_ready_shows_what_a_decision_needs_and_drops_what_the_caller_decided(services, tmp_path):
    # the product's policy set (every built-in but commit_message_format), as `taskgate serve` builds it
    services = wire(services.backend, services.database, services.url, policies=policy_book(Settings()))
    async with connect(services, ALICE) as tools:
        _, session = await started(tools, tmp_path)
        commit(session["worktree"], "api.py", "def api(): ...\n", "feat: api")
        for trigger in ("plan_complete", "work_complete"):
            await tools.ok("session_fire", session_id=session["id"], trigger=trigger)

        [item] = (await tools.ok("project_sessions_ready"))["sessions"]
        assert item["id"] == session["id"] and item["files"][0]["path"] == "api.py"
        assert [c["subject"] for c in item["commits"]] == ["feat: api"] and item["review_error"] is None
        assert item["would_approve"] is True and item["tests"] is None and item["approvals"] == []
        assert {p["policy"] for p in item["policies"]} >= {"require_tests", "review_approval", "clean_worktree"}

        Path(session["worktree"], "stray.txt").write_text("uncommitted\n")
        [item] = (await tools.ok("project_sessions_ready"))["sessions"]
        assert item["would_approve"] is False
        assert any(p["policy"] == "clean_worktree" and not p["passed"] for p in item["policies"])
        Path(session["worktree"], "stray.txt").unlink()

        await tools.ok("project_decide", session_id=session["id"], decision="approve")
        assert (await tools.ok("project_sessions_ready"))["sessions"] == []


async def test_a_start_on_a_repository_without_its_base_branch_is_refused_and_no_session_holds_the_task(
    services, tmp_path
):
    """Issue 36: it said "Nothing was changed" and left a failed session holding the task."""
    async with connect(services, ALICE) as tools:
        repo = make_git_repo(tmp_path / "repo")
        subprocess.run(["git", "branch", "-m", "main", "trunk"], cwd=repo, check=True, capture_output=True)
        await tools.ok("project_init", path=str(repo), name="shop")
        await tools.ok("task_add", title="Build the API")
        text = await tools.refused("project_session_start", task_id="SHOP-1")
        assert "the base branch 'main' does not exist" in text and "git.base_branch" in text, text
        assert (await tools.ok("session_list"))["sessions"] == []


async def test_a_branch_and_worktree_deleted_by_hand_are_refused_pointing_to_the_dangling_commit(services, tmp_path):
    async with connect(services, ALICE) as tools:
        repo, session = await started(tools, tmp_path)
        commit(session["worktree"], "api.py", "def api(): ...\n", "feat: api")
        for command in (["worktree", "remove", "--force", session["worktree"]], ["branch", "-D", session["branch"]]):
            subprocess.run(["git", *command], cwd=repo, check=True, capture_output=True)
        text = await tools.refused("session_review", session_id=session["id"])
        assert f"branch '{session['branch']}'" in text and "git fsck --lost-found" in text, text
        assert "reflog`" not in text


async def test_a_merged_session_is_reviewed_as_what_its_merge_landed_and_a_cancelled_one_says_why_not(
    services, tmp_path
):
    """Issue 38: review of a session taskgate merged said its branch was "deleted outside taskgate"."""
    async with connect(services, ALICE) as tools:
        repo, session = await started(tools, tmp_path)
        commit(session["worktree"], "api.py", "def api(): ...\n", "feat: api")
        for trigger in ("plan_complete", "work_complete", "approve"):
            await tools.ok("session_fire", session_id=session["id"], trigger=trigger)
        commit(repo, "NOTES.md", "a colleague's note\n", "docs: notes")  # main moves: the merge rebases
        assert (await tools.ok("project_session_merge", session_id=session["id"]))["state"] == "completed"
        review = await tools.ok("session_review", session_id=session["id"], patch=True)
        assert [f["path"] for f in review["files"]] == ["api.py"] and "+def api(): ..." in review["patch"]
        assert [c["subject"] for c in review["commits"]] == ["feat: api"]
        assert review["branch"] == f"{session['branch']} (merged into main)", review["branch"]

        await tools.ok("task_add", title="Another")
        other = await tools.ok("project_session_start", task_id="SHOP-2")
        await tools.ok("session_fire", session_id=other["id"], trigger="cancel")
        text = await tools.refused("session_review", session_id=other["id"])
        assert "cancelled without a merge" in text and "deleted outside taskgate" not in text, text
