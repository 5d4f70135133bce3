"""The forge loop's use cases on every backend with an in-memory forge: publish on approve (and again after a crash,
never twice), each look decided and fired, the merge by compare-and-swap on the approved head, webhook deliveries."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from taskgate.application.forge.codec import encode_observation
from taskgate.application.forge.deliveries import ForgeDeliveries
from taskgate.application.forge.follower import ForgeFollower
from taskgate.application.forge.publish import ForgePublisher
from taskgate.application.nodes.heartbeats import NodeIdentity, NodeService
from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sessions.effects import CompositeEffects
from taskgate.domain.errors import ConflictError
from taskgate.domain.forge import LineComment, Review
from taskgate.infrastructure.system import SystemClock
from tests.builders import fire, seed, start
from tests.support.fake_forge import FakeForges


class Loop:
    """The forge loop wired to `services` with a fake forge."""

    def __init__(self, services) -> None:
        self.services, self.forges = services, FakeForges()
        clock = SystemClock()
        self.publisher = ForgePublisher(services.uow, services.sessions, self.forges, clock)
        services.sessions.use_effects(CompositeEffects([services.sessions.effects, self.publisher]))
        services.workspaces.use_remote_merge(self.publisher.merge_through)
        self.follower = ForgeFollower(services.uow, services.sessions, self.publisher, self.forges, clock)
        self.deliveries = ForgeDeliveries(services.uow, self.forges, self.follower, clock)

    @property
    def api(self):
        return self.forges.api

    async def approved(self, repo: Path) -> tuple[str, str]:
        """A session with a commit on its branch, approved: its id and branch."""
        seeded = await seed(self.services, repo, tasks=1)
        session = await start(self.services, seeded.tasks[0])
        worktree = Path(session.worktree_path)
        (worktree / "app.py").write_text("total = 1\n")
        git(worktree, "add", "app.py")
        git(worktree, "-c", "user.name=a", "-c", "user.email=a@a", "commit", "-qm", "feat")
        session = await fire(self.services, session, "plan_complete", "work_complete", "approve")
        assert session.state.value == "awaiting_merge"
        return session.id, session.branch_name

    async def state(self, sid: str) -> str:
        return (await self.services.sessions.get(sid)).state.value

    async def record(self, sid: str):
        return await self.follower.pull_request(sid)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


async def test_approve_pushes_and_opens_a_pull_request_once_even_when_published_again(services, git_repo):
    loop = Loop(services)
    sid, branch = await loop.approved(git_repo)
    record = await loop.record(sid)
    assert (record.number, record.status, record.pushed) == (1, "checks_pending", loop.api.heads[branch])
    assert loop.api.pulls[1].head_branch == branch and loop.api.opened == 1
    title, body = loop.api.bodies[1].split("\n\n", 1)
    assert title == "task 0 (REPO-1)" and f"Opened by taskgate for session `{sid}`" in body
    session = await services.sessions.get(sid)
    assert session.state_data["pull_request"] == {"number": 1, "url": "http://forge.test/pull/1", "kind": "github",
                                                  "draft": False}  # fmt: skip
    # a crash cut a publish off after its push and its pull request, before its row: published again, found there
    record.number = None
    async with services.uow(write=True) as uow:
        await uow.pull_requests.save(record)
        await uow.commit()
    note = await loop.publisher.resume(await services.sessions.get(sid))
    assert "pushed the branch" in note.note and loop.api.opened == 1 and loop.forges.pushes.pushes == 1
    assert (await loop.record(sid)).number == 1
    assert (await loop.publisher.resume(await services.sessions.get(sid))).note == ""  # nothing owed any more


async def test_a_failed_check_sends_the_agents_back_with_its_log_and_a_fix_is_pushed_to_the_same_pull_request(
    services, git_repo
):
    loop = Loop(services)
    sid, branch = await loop.approved(git_repo)
    head = loop.api.heads[branch]
    loop.api.set_check(head, "lint", "failure", log="\n".join(f"line {i}" for i in range(200)) + "\nE501 too long")
    report = await loop.follower.follow_once()
    assert report.fired == [f"session {sid}: ci_failed: CI failed (lint): sent back, round 1 of 2"], report
    session = await services.sessions.get(sid)
    assert session.state.value == "executing"
    assert (
        "E501 too long" in session.state_data["instructions"] and "line 100\n" not in session.state_data["instructions"]
    )
    assert session.state_data["forge"] == {"rounds": {"ci": 1}, "round": "ci_failed"}
    worktree = Path(session.worktree_path)
    (worktree / "app.py").write_text("total = 2\n")
    git(worktree, "-c", "user.name=a", "-c", "user.email=a@a", "commit", "-qam", "fix")
    await fire(services, session, "work_complete")
    report = await loop.follower.follow_once()
    assert await loop.state(sid) == "awaiting_merge" and report.fired[0].endswith("ci_failed round done: its fix "
                                                                                  "pushed to PR #1")  # fmt: skip
    assert loop.api.heads[branch] != head and loop.api.opened == 1
    loop.api.set_check(loop.api.heads[branch], "lint")
    await loop.follower.follow_once()  # green on a head the operator did not approve: back to the operator
    assert await loop.state(sid) == "verifying"
    await fire(services, await services.sessions.get(sid), "approve")
    await loop.follower.follow_once()
    assert await loop.state(sid) == "completed" and loop.api.pulls[1].merged
    assert branch not in loop.api.heads  # the pushed branch deleted after the merge


async def test_a_review_asking_for_changes_names_file_and_line(services, git_repo):
    loop = Loop(services)
    sid, branch = await loop.approved(git_repo)
    head = loop.api.heads[branch]
    loop.api.reviews[1] = [Review(1, "alice", "CHANGES_REQUESTED", "Rename it.", head)]
    loop.api.comments[1] = [LineComment(2, "alice", "app.py", 1, "call it sum", head)]
    await loop.follower.follow_once()
    instructions = (await services.sessions.get(sid)).state_data["instructions"]
    assert "alice: Rename it." in instructions and "- app.py:1 (alice): call it sum" in instructions
    assert (await loop.state(sid), (await services.sessions.get(sid)).state_data["forge"]["rounds"]) == (
        "executing", {"review": 1})  # fmt: skip


async def test_the_merge_is_a_compare_and_swap_on_the_approved_head(services, git_repo):
    loop = Loop(services)
    sid, branch = await loop.approved(git_repo)
    loop.api.set_check(loop.api.heads[branch], "lint")
    loop.api.heads[branch] = "f" * 40  # someone else pushed after the look that found it green
    loop.api.checks["f" * 40] = loop.api.checks[next(iter(loop.api.checks))]
    record = await loop.record(sid)
    seen = await loop.api.observe(1)
    seen_then = encode_observation(seen)
    seen_then["pull"]["head"] = record.pushed  # the look taken before the push by someone else
    async with services.uow(write=True) as uow:
        await uow.pull_requests.store_observation(sid, record.pushed_at, seen_then, "mergeable", record.pushed_at)
        await uow.commit()
    with pytest.raises(ConflictError, match="head is no longer"):  # the forge refuses: it is not the approved head
        await fire(services, await services.sessions.get(sid), "merge")
    assert not loop.api.pulls[1].merged
    blocked = [r for r in await services.sessions.history(sid, 50) if r.outcome.value == "blocked"]
    assert [r.trigger for r in blocked] == ["merge"]
    await loop.follower.follow_once()  # the next look sees the moved head: back to the operator, never merged
    assert await loop.state(sid) == "verifying" and not loop.api.pulls[1].merged
    assert "head moved to ffffffffffff" in (await services.sessions.history(sid, 50))[-1].reason


async def test_webhook_deliveries_are_verified_deduplicated_and_only_poke(services, git_repo):
    loop = Loop(services)
    sid, branch = await loop.approved(git_repo)
    async with services.uow(write=True) as uow:
        await uow.pull_requests.unpoke(sid)
        await uow.commit()
    body = json.dumps({"action": "completed", "check_run": {"pull_requests": [{"number": 1, "head": {"ref": branch}}]}})
    signed = "sha256=" + hmac.new(b"s3cret", body.encode(), hashlib.sha256).hexdigest()
    headers = {"x-github-event": "check_run", "x-github-delivery": "d-1", "x-hub-signature-256": signed}
    assert (await loop.deliveries.receive(headers, body.encode())).status == 202
    assert (await loop.record(sid)).poke is True
    again = await loop.deliveries.receive(headers, body.encode())
    assert (again.status, again.text) == (200, "ignored: delivery d-1 was received before")
    forged = await loop.deliveries.receive({**headers, "x-github-delivery": "d-2"}, body.encode() + b" ")
    assert forged.status == 401 and "signature does not match" in forged.text
    assert await loop.deliveries.counts() == {"accepted": 1, "replay": 1, "refused": 1}
    assert await loop.state(sid) == "awaiting_merge"  # a delivery moves nothing by itself


async def test_a_conflict_with_the_base_sends_a_rebase_round_naming_the_base_commit(services, git_repo):
    loop = Loop(services)
    sid, branch = await loop.approved(git_repo)
    loop.api.set_check(loop.api.heads[branch], "lint")
    loop.api.pulls[1] = replace(loop.api.pulls[1], mergeable=False)
    loop.api.heads["main"] = git(git_repo, "rev-parse", "main")
    report = await loop.follower.follow_once()
    assert report.fired == [f"session {sid}: rebase: PR #1 conflicts with main: rebase round 1"]
    session = await services.sessions.get(sid)
    assert f"`git merge {loop.api.heads['main']}`" in session.state_data["instructions"]
    assert session.state.value == "executing"


async def test_one_node_of_a_cluster_looks_at_the_forge_and_the_others_do_not(services, git_repo):
    loop = Loop(services)
    sid, _ = await loop.approved(git_repo)
    clock = SystemClock()
    followers = []
    for name in ("node-a", "node-b", "node-c"):
        nodes = NodeService(services.uow, clock, NodeIdentity(name, "host", f"/data/{name}", 1, "t"), heartbeat_s=5)
        followers.append(ForgeFollower(services.uow, services.sessions, loop.publisher, loop.forges, clock, nodes))
    before = loop.api.calls
    await asyncio.gather(*(f.follow_once() for f in followers))
    assert loop.api.calls - before == 1  # one look (the fake counts one call per look) by the lease's holder
    async with services.uow(write=False) as uow:
        holder = (await uow.leases.acquire("forge", "nobody", "nobody", clock.now(), clock.now())).holder
    assert holder.split("/")[0] in {"node-a", "node-b", "node-c"}
    assert (await loop.record(sid)).observed_at is not None


async def test_with_draft_the_work_is_opened_as_a_draft_before_the_approval_and_marked_ready_by_it(services, git_repo):
    loop = Loop(services)
    loop.forges.link = replace(loop.forges.link, draft=True)
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    worktree = Path(session.worktree_path)
    (worktree / "app.py").write_text("total = 1\n")
    git(worktree, "-c", "user.name=a", "-c", "user.email=a@a", "commit", "-qm", "feat", "--allow-empty")
    session = await fire(services, session, "plan_complete", "work_complete")
    assert session.state.value == "verifying" and loop.api.pulls[1].draft is True
    assert (await services.sessions.get(session.id)).state_data["pull_request"]["draft"] is True
    await fire(services, session, "approve")
    assert loop.api.pulls[1].draft is False and loop.api.opened == 1
    assert (await services.sessions.get(session.id)).state_data["pull_request"]["draft"] is False


async def test_a_publish_the_forge_failed_is_recorded_and_tried_again_by_the_forge_loop(services, git_repo):
    loop = Loop(services)
    loop.api.down = 1
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    result = await services.sessions.fire(FireTrigger(session.id, "plan_complete", "operator:alice"))
    for trigger in ("work_complete", "approve"):
        result = await services.sessions.fire(FireTrigger(session.id, trigger, "operator:alice"))
    assert result.session.state.value == "awaiting_merge"  # the approval stands; the forge's failure is a warning
    assert any("502 Bad Gateway" in w and "tries again" in w for w in result.warnings), result.warnings
    record = await loop.record(session.id)
    assert record.number is None and "502 Bad Gateway" in record.error and loop.api.opened == 0
    await loop.follower.follow_once()  # poll_s 0: tried again at once
    record = await loop.record(session.id)
    assert (record.number, record.error, loop.api.opened) == (1, None, 1)
