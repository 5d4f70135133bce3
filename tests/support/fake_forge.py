"""An in-memory forge for fast tests of the forge loop: ForgeApi and BranchPushes as dictionaries.

tests/contract/test_forge_api_contract.py runs the same behaviour against it and against the real adapter
(GitHubForge on the GitHub stand-in), so what the fast tests rely on is what GitHub does.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field, replace

from taskgate.application.forge.ports import ForgeLink, PushResult
from taskgate.domain.entities import Project
from taskgate.domain.errors import ForgeError, ForgeHeadMoved
from taskgate.domain.forge import CheckRun, Limits, LineComment, Observation, PullRequest, Review


@dataclass
class FakeForgeApi:
    """One repository's pull requests, checks and reviews; `heads` is the remote's branches (shared with pushes)."""

    repository: str = "acme/shop"
    heads: dict[str, str] = field(default_factory=dict)
    pulls: dict[int, PullRequest] = field(default_factory=dict)
    checks: dict[str, list[CheckRun]] = field(default_factory=dict)
    reviews: dict[int, list[Review]] = field(default_factory=dict)
    comments: dict[int, list[LineComment]] = field(default_factory=dict)
    logs: dict[int, str] = field(default_factory=dict)
    bodies: dict[int, str] = field(default_factory=dict)  # each pull request's title and description
    calls: int = 0
    opened: int = 0
    down: int = 0  # the next `down` calls fail as a forge that does not answer would

    async def check(self) -> str:
        self.calls += 1
        return "main"

    async def find_pull(self, branch: str) -> PullRequest | None:
        self.calls += 1
        mine = sorted(
            (p for p in self.pulls.values() if p.head_branch == branch), key=lambda p: (p.state == "open", p.number)
        )
        return self._live(mine[-1]) if mine else None

    async def open_pull(self, branch: str, base: str, title: str, body: str, *, draft: bool = False) -> PullRequest:
        self.calls += 1
        if self.down:
            self.down -= 1
            raise ForgeError(f"open a pull request of {branch}: acme/shop answered 502 Bad Gateway")
        if branch not in self.heads:
            raise ForgeError(f"open a pull request of {branch}: 422 head invalid")
        if any(p.head_branch == branch and p.state == "open" for p in self.pulls.values()):
            raise ForgeError(f"open a pull request of {branch}: 422 A pull request already exists")
        number = len(self.pulls) + 1
        self.opened += 1
        self.bodies[number] = f"{title}\n\n{body}"
        self.pulls[number] = PullRequest(number, f"http://forge.test/pull/{number}", "open", self.heads[branch],
                                         branch, base, mergeable=True, draft=draft)  # fmt: skip
        return self.pulls[number]

    async def mark_ready(self, number: int) -> None:
        self.calls += 1
        self.pulls[number] = replace(self.pulls[number], draft=False)

    async def update_pull(self, number: int, *, body: str | None = None, reopen: bool = False) -> PullRequest:
        self.calls += 1
        if reopen:
            self.pulls[number] = replace(self.pulls[number], state="open")
        if body is not None:
            self.bodies[number] = self.bodies.get(number, "").split("\n\n", 1)[0] + f"\n\n{body}"
        return self._live(self.pulls[number])

    async def observe(self, number: int) -> Observation:
        self.calls += 1
        pull = self._live(self.pulls[number])
        return Observation(pull, tuple(self.checks.get(pull.head, ())), tuple(self.reviews.get(number, ())),
                           tuple(self.comments.get(number, ())))  # fmt: skip

    async def log_tail(self, check: CheckRun, lines: int) -> str:
        self.calls += 1
        return "\n".join(self.logs.get(check.id, "").splitlines()[-lines:])

    async def merge(self, number: int, head: str, method: str, title: str) -> str:
        self.calls += 1
        pull = self._live(self.pulls[number])
        if pull.head != head:
            raise ForgeHeadMoved(f"PR #{number}'s head is no longer {head[:12]}: not merged (409)")
        if pull.state != "open" or pull.merged:
            raise ForgeError(f"merge PR #{number}: 405 Pull Request is not mergeable")
        self.pulls[number] = replace(pull, merged=True, state="closed", merged_by="taskgate", merge_commit="m" * 40)
        return "m" * 40

    # -- what people and CI do --------------------------------------------------------------------------------

    def set_check(self, sha: str, name: str, conclusion: str | None = "success", log: str = "") -> None:
        runs = self.checks.setdefault(sha, [])
        check = CheckRun(len(self.logs) + 1, name, "completed" if conclusion else "in_progress", conclusion)
        self.logs[check.id] = log
        runs.append(check)

    def _live(self, pull: PullRequest) -> PullRequest:
        """The pull request with its head as the remote branch stands now."""
        return replace(pull, head=self.heads.get(pull.head_branch, pull.head))


@dataclass
class FakePushes:
    """The remote's branches in `api.heads`; a push reads the local branch with git and leases like git does."""

    api: FakeForgeApi
    pushes: int = 0

    async def push(self, repo_root: str, branch: str, expected: str | None) -> PushResult:
        local = _rev(repo_root, branch)
        there = self.api.heads.get(branch)
        if there == local:
            return PushResult(local, created=False, already=True)
        if there != expected:
            raise ForgeError(f"push {branch}: the remote has {there}, not {expected}: someone else pushed to it")
        self.pushes += 1
        self.api.heads[branch] = local
        return PushResult(local, created=there is None, already=False)

    async def fetch(self, repo_root: str, branch: str) -> str:
        return self.api.heads.get(branch) or _rev(repo_root, branch)

    async def delete(self, repo_root: str, branch: str, expected: str) -> bool:
        if self.api.heads.get(branch) != expected:
            return False
        del self.api.heads[branch]
        return True


class FakeForges:
    """Every project's forge is the one fake (ForgeDirectory)."""

    def __init__(self, api: FakeForgeApi | None = None, limits: Limits | None = None, draft: bool = False) -> None:
        self.api = api or FakeForgeApi()
        self.pushes = FakePushes(self.api)
        self.link = ForgeLink("github", self.api, self.pushes, limits or Limits(max_ci_rounds=2), poll_s=0.0,
                              draft=draft)  # fmt: skip

    def for_project(self, project: Project) -> ForgeLink | None:
        return self.link

    def webhook_secrets(self) -> list[str]:
        return ["s3cret"]


def _rev(repo_root: str, branch: str) -> str:
    return subprocess.run(["git", "-C", repo_root, "rev-parse", f"refs/heads/{branch}"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
