"""The forge loop end to end (issue 40), on SQLite (webhooks) and PostgreSQL (polling).

A real `taskgate serve --http`, the real CLI, a real agent (the fixer: it commits what it is told) in real worktrees
in the sandbox, a real git remote over smart HTTP (`git http-backend`, Basic auth with the token), and the GitHub
stand-in (tests/support/github_api: GitHub's paths, status codes, ETags, rate limits and signed webhooks; its shapes
are proven against githubkit's models in tests/contract/test_github_standin.py). What people and CI do on the forge
is done through the stand-in's controls: a check fails or passes, a review asks for changes, a human merges or
closes, someone else pushes.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from playwright.async_api import expect

from tests.e2e.test_cli import TASKGATE
from tests.e2e.test_console_browser import signed_in
from tests.e2e.test_crash_points import CrashService
from tests.e2e.test_crash_recovery import connect, wait_for_session
from tests.e2e.test_mcp_transports import ok
from tests.support.git_http import GitHttpRemote
from tests.support.github_api import GitHubStandIn
from tests.support.served import db_rows, served_on

pytestmark = pytest.mark.slow

TOKEN = "ghp_forgeLoopToken0123456789abcdef"
SECRET = "forge-webhook-secret"
WAIT_S = 90.0
FIXER = """\
import json, os, re, subprocess, sys
from pathlib import Path
task_id, instructions, dumps = sys.argv[1], sys.argv[2], Path(sys.argv[3])
runs = len(list(dumps.glob(f"{task_id}-*.json")))
(dumps / f"{task_id}-{runs}.json").write_text(json.dumps(dict(os.environ)))
identity = ["-c", "user.name=fixer", "-c", "user.email=fixer@taskgate.invalid"]
if merge := re.search(r"`git merge ([0-9a-f]{40})`", instructions):  # a rebase round: take the base, keep ours
    subprocess.run(["git", *identity, "merge", "--no-edit", "-X", "ours", merge.group(1)], check=True)
Path("work").mkdir(exist_ok=True)
with Path("work", f"{task_id}.md").open("a") as out:
    out.write(f"- {instructions or 'first pass'}\\n")
subprocess.run(["git", *identity, "add", "work"], check=True)
subject = f"fix: round {runs}" if instructions else f"feat: {task_id}"
subprocess.run(["git", *identity, "commit", "-q", "-m", subject], check=True)
"""


class ForgeService(CrashService):
    """A deployment whose project has a `[forge]`: GitHub's stand-in for the API, a smart-HTTP remote as origin."""

    def __init__(self, root: Path, database_url: str | None, *, webhooks: bool) -> None:
        super().__init__(root, database_url)
        self.remote = GitHttpRemote(root / "remotes", token=TOKEN).start()
        self.bare = self.remote.create("acme", "shop")
        self.git("remote", "add", "origin", self.remote.repo_url("acme", "shop"))
        # the user's own credentials for their remote, as `gh auth setup-git` leaves them (taskgate's fetches of the
        # base use them, like the user's `git fetch`; its pushes use [forge] token_env through a helper of its own)
        self.git("config", "credential.helper", '!f() { echo username=someone; echo "password=$GITHUB_TOKEN"; }; f')
        self.push_as_someone(self.repo, "main")
        self.github = GitHubStandIn(self.bare, token=TOKEN)
        self.github.start()
        script = root / "fixer.py"
        script.write_text(FIXER)
        command = json.dumps([sys.executable, str(script), "{task_id}", "{instructions}", str(self.release)])
        q = json.dumps
        forge = (f'\n[agents.fixer]\ncommand = {command}\n\n[forge]\nkind = "github"\napi_url = {q(self.github.url)}\n'
                 f'token_env = "GITHUB_TOKEN"\nmax_ci_rounds = 2\npoll_s = {600 if webhooks else 1}\n')  # fmt: skip
        if webhooks:
            forge += 'webhook_secret_env = "TG_FORGE_SECRET"\n'
            self.github.webhook_url, self.github.webhook_secret = f"http://127.0.0.1:{self.port}/forge/webhook", SECRET
        config = root / "config" / "taskgate.toml"
        config.write_text(config.read_text() + forge)
        self.env |= {"GITHUB_TOKEN": TOKEN, "TG_FORGE_SECRET": SECRET}

    def push_as_someone(self, clone: Path, ref: str) -> None:
        """Push `ref` from `clone` as a person would (their own credential helper, not taskgate's)."""
        helper = f"!f() {{ echo username=someone; echo password={TOKEN}; }}; f"
        subprocess.run(["git", "-C", str(clone), "-c", "credential.helper=", "-c", f"credential.helper={helper}",
                        "push", "-q", "origin", ref], check=True, capture_output=True)  # fmt: skip

    def someone_commits(self, clone: Path, branch: str, path: str, text: str) -> None:
        """Someone else clones the remote, writes `path` on `branch`, commits and pushes it."""
        helper = f"!f() {{ echo username=someone; echo password={TOKEN}; }}; f"
        subprocess.run(["git", "-c", f"credential.helper={helper}", "clone", "-q", "-b", branch,
                        self.remote.repo_url("acme", "shop"), str(clone)], check=True, capture_output=True)  # fmt: skip
        (clone / path).parent.mkdir(parents=True, exist_ok=True)
        (clone / path).write_text(text)
        for args in (["add", path], ["-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "someone's"]):
            subprocess.run(["git", "-C", str(clone), *args], check=True)
        self.push_as_someone(clone, branch)

    def bare_git(self, *args: str) -> str:
        return subprocess.run(["git", "--git-dir", str(self.bare), *args], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    def close_all(self) -> None:
        self.github.stop()
        self.remote.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def forge(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForgeService]:
    root = tmp_path_factory.mktemp(f"forge-{request.param}")
    webhooks = request.param == "sqlite"  # SQLite hears webhooks, PostgreSQL polls: both ways in, both backends
    titles = [f"Forge {i}" for i in range(1, 10)]
    with served_on(request.param, lambda url: ForgeService(root, url, webhooks=webhooks), titles) as svc:
        try:
            yield svc
        finally:
            svc.close_all()


async def verifying(client, task: str) -> dict[str, Any]:
    sid = (await ok(client, "project_session_start", task_id=task))["id"]
    await ok(client, "session_execute", session_id=sid, agents=["fixer"])
    return await wait_for_session(client, sid, "reach verifying", lambda s: s["state"] == "verifying")


async def until(what: str, check: Callable[[], Any]) -> Any:
    """Poll `check` until it returns something truthy (bounded by WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while not (found := check()):
        assert time.monotonic() < deadline, f"did not {what} within {WAIT_S:.0f}s"
        await asyncio.sleep(0.2)
    return found


def pull_of(svc: ForgeService, number: int) -> dict[str, Any] | None:
    try:
        return svc.github.pull(number)
    except Exception:  # not opened yet
        return None


async def approved(svc: ForgeService, client, task: str) -> tuple[str, str, int]:
    """The task's session approved from the CLI: its id, branch and pull request number (opened by the approval)."""
    status = await verifying(client, task)
    out = svc.cli("session", "decide", status["id"], "approve", "--reason", "looks right")
    assert "awaiting_merge" in out, out
    shown = json.loads(svc.cli("session", "show", status["id"], "--json"))["pull_request"]
    assert shown["status"] == "checks_pending" and shown["url"].startswith("http://github.test/acme/shop/pull/")
    assert svc.github.pull(shown["number"])["head"]["sha"] == svc.git("rev-parse", status["branch"]).strip()
    return status["id"], status["branch"], shown["number"]


async def reasons(svc: ForgeService, sid: str) -> list[tuple[str, str]]:
    sql = "SELECT trigger, reason FROM transition_log WHERE session_id = {} AND outcome = 'applied' ORDER BY seq"
    rows = await db_rows(svc, sql, sid)
    return [(r[0], r[1] or "") for r in rows]


async def test_ci_fails_then_a_review_asks_then_the_operator_approves_and_it_merges_through_the_forge(forge):
    """approve → push → PR → CI fails → the agent fixes → CI green → a review asks for changes → the agent fixes →
    approve → merged through the forge → completed and cleaned, the token nowhere but where it is used."""
    svc = forge
    async with connect(svc) as client:
        sid, branch, number = await approved(svc, client, "DEMO-1")
        head1 = svc.github.pull(number)["head"]["sha"]
        log = "\n".join(f"step {i}" for i in range(300)) + "\napp.py:3:1: E501 line too long (131 > 120)"
        svc.github.set_check(head1, "lint", conclusion="failure", log=log)
        head2 = await until("push the CI fix", lambda: _moved(svc, number, head1))
        svc.github.set_check(head2, "lint")
        await wait_for_session(client, sid, "ask for the merge", lambda s: s["state"] == "verifying")
        told = svc.git("show", f"{branch}:work/DEMO-1.md")
        assert "Check 'lint' (failure)" in told and "E501 line too long (131 > 120)" in told and "step 10\n" not in told
        svc.github.review(number, "CHANGES_REQUESTED", "Say what changed.",
                          [{"path": "work/DEMO-1.md", "line": 1, "body": "more detail here"}])  # fmt: skip
        head3 = await until("push the review's fix", lambda: _moved(svc, number, head2))
        assert "- work/DEMO-1.md:1 (alice): more detail here" in svc.git("show", f"{branch}:work/DEMO-1.md")
        svc.github.set_check(head3, "lint")
        await wait_for_session(client, sid, "ask again", lambda s: s["state"] == "verifying")
        svc.cli("session", "decide", sid, "approve", "--reason", "good now")
        done = await wait_for_session(client, sid, "complete", lambda s: s["state"] == "completed")
    assert svc.github.pull(number)["merged"] is True
    assert (
        subprocess.run(["git", "--git-dir", str(svc.bare), "merge-base", "--is-ancestor", head3, "main"]).returncode
        == 0
    )
    assert svc.bare_git("ls-remote", "--heads", ".", branch) == ""  # its pushed branch deleted after the merge
    assert not Path(done["worktree"]).exists()
    steps = await reasons(svc, sid)
    triggers = [t for t, _ in steps]
    assert triggers[triggers.index("approve"):] == [
        "approve", "ci_failed", "work_complete", "update_pr", "reverify", "review_changes", "work_complete",
        "update_pr", "reverify", "approve", "merge", "cleanup_done"]  # fmt: skip
    said = dict(steps)
    assert said["ci_failed"] == "CI failed (lint): sent back, round 1 of 2"
    assert said["review_changes"] == "review by alice asks for changes: sent back, round 1 of 3"
    assert said["merge"].startswith("checks green on the approved head") and triggers[-2:] == ["merge", "cleanup_done"]
    # the auditor's side: the log replays through the table (forge triggers included) and its chains verify
    now = datetime.now(UTC).isoformat()
    assert "completed" in svc.cli("session", "state-at", sid, now)
    logged = json.loads(svc.cli("audit", "transitions", "--session", sid, "--json"))
    assert {(r["trigger"], r["actor"]) for r in logged} >= {("ci_failed", "forge"), ("merge", "forge")}
    svc.cli("audit", "verify")
    _token_nowhere(svc)


async def test_a_pull_request_merged_by_a_human_completes_the_session(forge):
    svc = forge
    async with connect(svc) as client:
        sid, _, number = await approved(svc, client, "DEMO-2")
        svc.github.merge_by_human(number, user="bob")
        await wait_for_session(client, sid, "complete", lambda s: s["state"] == "completed")
    steps = await reasons(svc, sid)
    assert ("forge_merged", f"PR #{number} merged on the forge by bob") in steps


async def test_a_pull_request_closed_on_the_forge_goes_back_to_the_operator_and_an_approval_reopens_it(forge):
    svc = forge
    async with connect(svc) as client:
        sid, _, number = await approved(svc, client, "DEMO-3")
        svc.github.close(number)
        await wait_for_session(client, sid, "go back to the operator", lambda s: s["state"] == "verifying")
        assert (await reasons(svc, sid))[-1][1].startswith(f"PR #{number} closed on the forge without merge")
        svc.cli("session", "decide", sid, "approve", "--reason", "reopen it")
        assert svc.github.pull(number)["state"] == "open"
        svc.github.set_check(svc.github.pull(number)["head"]["sha"], "lint")
        await wait_for_session(client, sid, "complete", lambda s: s["state"] == "completed")


async def test_a_head_moved_by_someone_else_after_the_approval_is_never_merged(forge, tmp_path: Path):
    svc = forge
    async with connect(svc) as client:
        sid, branch, number = await approved(svc, client, "DEMO-4")
        svc.someone_commits(tmp_path / "someone", branch, "extra.txt", "not reviewed\n")
        moved = svc.bare_git("rev-parse", branch)
        svc.github.set_check(moved, "lint")
        await wait_for_session(client, sid, "go back to the operator", lambda s: s["state"] == "verifying")
    assert "head moved" in (await reasons(svc, sid))[-1][1]
    assert svc.github.pull(number)["merged"] is False
    assert svc.bare_git("rev-parse", "main") != moved


async def test_a_forged_or_replayed_webhook_is_refused_and_counted(forge):
    svc = forge
    body = json.dumps({"action": "completed", "check_run": {"pull_requests": []}}).encode()
    good = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    forged = _post(svc, body, {"X-Hub-Signature-256": "sha256=" + "0" * 64, "X-GitHub-Delivery": "forged-1"})
    unsigned = _post(svc, body, {"X-GitHub-Delivery": "forged-2"})
    assert forged[0] == unsigned[0] == 401
    if svc.github.webhook_secret:  # the webhook deployment: a signed delivery is taken once, its replay ignored
        assert _post(svc, body, {"X-Hub-Signature-256": good, "X-GitHub-Delivery": "real-1"})[0] == 202
        assert _post(svc, body, {"X-Hub-Signature-256": good, "X-GitHub-Delivery": "real-1"}) == (
            200, "ignored: delivery real-1 was received before")  # fmt: skip
    sql = "SELECT outcome, COUNT(*) FROM forge_deliveries WHERE id <> {} GROUP BY outcome"
    counts = dict(await db_rows(svc, sql, "-"))
    assert counts["refused"] >= 2 and (counts.get("replay", 0) >= 1) == bool(svc.github.webhook_secret)


async def test_server_errors_and_rate_limits_are_retried_with_back_off(forge):
    svc = forge
    svc.github.fail_next(1, 500, "/repos/acme/shop/pulls")
    svc.github.fail_next(1, 403, "/repos/acme/shop/commits")
    async with connect(svc) as client:
        sid, _, number = await approved(svc, client, "DEMO-5")
        svc.github.set_check(svc.github.pull(number)["head"]["sha"], "lint")
        await wait_for_session(client, sid, "complete", lambda s: s["state"] == "completed")
    statuses = [(m, p, s) for m, p, s in svc.github.calls if s in (500, 403)]
    assert {s for _, _, s in statuses} == {500, 403}
    for method, path, _ in statuses:  # each answered again, successfully, on the same path
        later = svc.github.calls[svc.github.calls.index((method, path, 500 if "pulls" in path else 403)) + 1 :]
        assert any(m == method and p == path and s < 400 for m, p, s in later)


async def test_a_server_killed_while_a_pull_request_is_open_is_carried_on_by_its_successor(forge):
    svc = forge
    async with connect(svc) as client:
        sid, _, number = await approved(svc, client, "DEMO-6")
    svc.crash()
    svc.github.set_check(svc.github.pull(number)["head"]["sha"], "lint")
    svc.start()
    async with connect(svc) as client:
        await wait_for_session(client, sid, "complete after the restart", lambda s: s["state"] == "completed")
    assert svc.github.pull(number)["merged"] is True


def _moved(svc: ForgeService, number: int, old: str) -> str | None:
    head = svc.github.pull(number)["head"]["sha"]
    return head if head != old else None


def _post(svc: ForgeService, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{svc.port}/forge/webhook", data=body, method="POST",
                                     headers={"X-GitHub-Event": "check_run", **headers})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _token_nowhere(svc: ForgeService) -> None:
    """The token is in no agent's environment, no file of the data dir, the repository's git dir or the logs."""
    dumps = sorted(svc.release.glob("DEMO-1-*.json"))
    assert len(dumps) == 3  # the first run, the CI round, the review round
    for dump in dumps:
        environment = json.loads(dump.read_text())
        assert TOKEN not in json.dumps(environment) and "GITHUB_TOKEN" not in environment
    for folder in (svc.root / "data", svc.repo / ".git"):
        for path in folder.rglob("*"):
            if path.is_file() and path.stat().st_size < 50_000_000:
                assert TOKEN.encode() not in path.read_bytes(), f"the token is in {path}"
    for log in svc.logs:
        assert TOKEN not in log.read_text()
    assert set(svc.remote.seen_passwords) == {TOKEN}  # the token reached the remote, and only as its password


async def test_the_console_shows_the_pull_request_with_its_sub_state_and_what_happened(forge, browser):
    svc = forge
    async with connect(svc) as client:
        sid, _, number = await approved(svc, client, "DEMO-7")
        svc.github.set_check(svc.github.pull(number)["head"]["sha"], "lint", conclusion="failure", log="boom")
        await wait_for_session(client, sid, "send the agents back", lambda s: s["state"] != "awaiting_merge")
        status = await wait_for_session(client, sid, "push the fix", lambda s: s["state"] == "awaiting_merge")
        assert status["pull_request"]["number"] == number and "pull request #" in status["summary"]
    site = SimpleNamespace(url=f"http://127.0.0.1:{svc.port}", tokens={"alice": svc.token})
    page = await signed_in(browser, site, "alice")
    await page.goto(f"{site.url}/sessions/{sid}")
    section = page.get_by_role("region", name="Pull request")
    await expect(section.get_by_role("link", name=f"#{number}")).to_have_attribute(
        "href", f"http://github.test/acme/shop/pull/{number}"
    )
    await expect(section).to_contain_text("checks_pending")
    await expect(section).to_contain_text("pushed")


def test_doctor_checks_the_forges_remote_token_api_and_events_and_names_what_is_wrong(forge):
    svc = forge

    def doctor(**env: str) -> dict[str, tuple[str, str]]:
        done = subprocess.run([TASKGATE, "doctor", "--json"], cwd=svc.repo, env={**svc.env, **env},
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        return {c["name"]: (c["status"], c["detail"]) for c in json.loads(done.stdout) if c["name"].startswith("forge")}

    lines = doctor()
    assert lines["forge remote"] == ("ok", "origin → acme/shop (github)")
    assert lines["forge token"][0] == lines["forge api"][0] == "ok"
    assert lines["forge events"][0] == ("ok" if svc.github.webhook_secret else "warn")
    refused = doctor(GITHUB_TOKEN="ghp_wrong")["forge api"]
    assert (
        refused[0] == "fail"
        and "the token in $GITHUB_TOKEN was refused" in refused[1]
        and "ghp_wrong" not in refused[1]
    )
    assert doctor(GITHUB_TOKEN="")["forge token"] == (
        "fail",
        "$GITHUB_TOKEN is not set: nothing can be pushed or opened",
    )


async def test_a_conflict_with_the_base_sends_a_rebase_round_and_the_merged_fix_lands(forge, tmp_path: Path):
    svc = forge
    async with connect(svc) as client:
        sid, _, number = await approved(svc, client, "DEMO-9")
        svc.someone_commits(tmp_path / "someone", "main", "work/DEMO-9.md", "- the same file, written on main\n")
        head = svc.github.pull(number)["head"]["sha"]
        assert svc.github.pull(number)["mergeable"] is False
        svc.github.set_check(head, "lint")
        merged_in = await until("push the merge of main", lambda: _moved(svc, number, head))
        assert svc.github.pull(number)["mergeable"] is True
        svc.github.set_check(merged_in, "lint")
        await wait_for_session(client, sid, "ask for the merge", lambda s: s["state"] == "verifying")
        svc.cli("session", "decide", sid, "approve", "--reason", "conflict resolved")
        await wait_for_session(client, sid, "complete", lambda s: s["state"] == "completed")
    steps = await reasons(svc, sid)
    assert ("rebase", f"PR #{number} conflicts with main: rebase round 1") in steps
    assert svc.github.pull(number)["merged"] is True
