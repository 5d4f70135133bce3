"""ForgeApi and BranchPushes: the real adapters (GitHubForge through githubkit on the GitHub stand-in, GitPushes over a
real smart-HTTP remote) and the in-memory fake the fast tests use behave alike."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from taskgate.domain.errors import ForgeError, ForgeHeadMoved
from taskgate.infrastructure.forge.github import GitHubForge
from taskgate.infrastructure.forge.pushes import GitPushes
from tests.support.fake_forge import FakeForgeApi, FakePushes
from tests.support.git_http import GitHttpRemote
from tests.support.github_api import GitHubStandIn

TOKEN = "ghp_contract"


@dataclass
class Twin:
    """One implementation: the API, the pushes, how CI reports a check, and the local repository."""

    api: Any
    pushes: Any
    set_check: Any
    repo: Path


def git(cwd: Path, *args: str) -> str:
    identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
    return subprocess.run(["git", *identity, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def local_repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-qm", "init")
    git(repo, "checkout", "-qb", "feature/x")
    (repo / "b.txt").write_text("b\n")
    git(repo, "add", "b.txt")
    git(repo, "commit", "-qm", "feat")
    git(repo, "checkout", "-q", "main")
    return repo


@pytest.fixture(params=["github", "fake"])
async def twin(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Twin]:
    repo = local_repo(tmp_path)
    if request.param == "fake":
        api = FakeForgeApi()
        pushes = FakePushes(api)
        await pushes.push(str(repo), "main", None)
        yield Twin(api, pushes, lambda sha, name, conclusion: api.set_check(sha, name, conclusion), repo)
        return
    remote = GitHttpRemote(tmp_path / "remotes", token=TOKEN).start()
    bare = remote.create("acme", "shop")
    git(repo, "remote", "add", "origin", remote.repo_url("acme", "shop"))
    pushes = GitPushes("origin", "GITHUB_TOKEN", {"GITHUB_TOKEN": TOKEN})
    await pushes.push(str(repo), "main", None)
    standin = GitHubStandIn(bare, token=TOKEN)
    standin.start()
    try:
        api = GitHubForge(standin.url, "acme/shop", TOKEN, "GITHUB_TOKEN")
        yield Twin(api, pushes, lambda sha, name, conclusion: standin.set_check(sha, name, conclusion=conclusion), repo)
    finally:
        standin.stop()
        remote.stop()


async def test_a_branch_is_pushed_under_a_lease_and_opened_once(twin: Twin):
    head = git(twin.repo, "rev-parse", "feature/x")
    first = await twin.pushes.push(str(twin.repo), "feature/x", None)
    assert (first.sha, first.created, first.already) == (head, True, False)
    again = await twin.pushes.push(str(twin.repo), "feature/x", None)  # a push a crash cut off after it landed
    assert (again.sha, again.already) == (head, True)
    assert await twin.api.find_pull("feature/x") is None
    pull = await twin.api.open_pull("feature/x", "main", "Feature X", "body")
    assert (pull.state, pull.head, pull.head_branch, pull.base_branch, pull.merged) == ("open", head, "feature/x",
                                                                                       "main", False)  # fmt: skip
    with pytest.raises(ForgeError):
        await twin.api.open_pull("feature/x", "main", "Feature X", "body")  # one open pull request per branch
    assert (await twin.api.find_pull("feature/x")).number == pull.number


async def test_a_look_shows_the_checks_of_the_head_and_the_merge_is_a_compare_and_swap(twin: Twin):
    await twin.pushes.push(str(twin.repo), "feature/x", None)
    pull = await twin.api.open_pull("feature/x", "main", "Feature X", "body")
    twin.set_check(pull.head, "lint", "failure")
    seen = await twin.api.observe(pull.number)
    assert [(c.name, c.conclusion, c.failed) for c in seen.checks] == [("lint", "failure", True)]
    twin.set_check(pull.head, "lint", "success")  # a re-run
    seen = await twin.api.observe(pull.number)
    assert {c.conclusion for c in seen.checks if c.name == "lint"} >= {"success"}
    with pytest.raises(ForgeHeadMoved):
        await twin.api.merge(pull.number, "0" * 40, "merge", "Feature X")
    commit = await twin.api.merge(pull.number, pull.head, "merge", "Feature X")
    assert len(commit) == 40
    merged = (await twin.api.observe(pull.number)).pull
    assert (merged.merged, merged.state) == (True, "closed")
    with pytest.raises(ForgeError):
        await twin.api.merge(pull.number, pull.head, "merge", "Feature X")  # merged already: not mergeable


async def test_a_lease_refuses_to_overwrite_someone_elses_commits(twin: Twin):
    first = await twin.pushes.push(str(twin.repo), "feature/x", None)
    git(twin.repo, "checkout", "-q", "feature/x")
    (twin.repo / "c.txt").write_text("c\n")
    git(twin.repo, "add", "c.txt")
    git(twin.repo, "commit", "-qm", "more")
    with pytest.raises(ForgeError):
        await twin.pushes.push(str(twin.repo), "feature/x", "1" * 40)  # not what the remote has
    moved = await twin.pushes.push(str(twin.repo), "feature/x", first.sha)
    assert (moved.created, moved.already) == (False, False) and moved.sha != first.sha
    assert not await twin.pushes.delete(str(twin.repo), "feature/x", first.sha)
    assert await twin.pushes.delete(str(twin.repo), "feature/x", moved.sha)


async def test_a_draft_is_opened_and_marked_ready_for_review(twin: Twin):
    await twin.pushes.push(str(twin.repo), "feature/x", None)
    pull = await twin.api.open_pull("feature/x", "main", "Feature X", "body", draft=True)
    assert pull.draft is True and (await twin.api.observe(pull.number)).pull.draft is True
    await twin.api.mark_ready(pull.number)
    await twin.api.mark_ready(pull.number)  # not a draft any more: nothing to do
    assert (await twin.api.observe(pull.number)).pull.draft is False
