"""GitHub Issues as the tracker, dispatch running the work, end to end (issue 41), on SQLite and PostgreSQL.

Two real `taskgate serve --http` nodes on one database, the real CLI, a scripted agent in the sandbox in real
worktrees of a fresh repository, and the GitHub stand-in (tests/support/github_api: its issue endpoints are proven
against githubkit's models in tests/contract/test_github_issues_standin.py). The project is configured only as a
user would: `[tracker] kind = "github"` and `[dispatch]` in taskgate.toml, `GITHUB_TOKEN` in the environment.
Nobody types a command to start work: `serve` running is all it takes.

The story, on one deployment per backend:
1. shadow mode (`dispatch.dry_run`): the poll's ready set is the rule's (30 issues with labels, blockers, sub-issues,
   assignees and priorities), dispatch says what it would start within the cap and why it holds the rest, and
   nothing is written to the tracker or to sessions;
2. dispatch for real with a cap of 3, two nodes polling, the tracker answering 500 and 429 once: three sessions
   run, a claim lost to a concurrent claimer gives its session up, every other ready issue is claimed once;
3. an issue closed mid-run: by policy the session is marked and carries on (SQLite: `ask`) or is stopped with
   its work kept (PostgreSQL: `stop`);
4. the agents finish: every ready issue's session reaches verifying (the operator is asked), the next ones started
   as slots freed, never more than three at once (the agents' own start and end times), and the tracker shows
   the review label and a comment naming the session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import make_git_repo
from tests.e2e.test_cli import TASKGATE
from tests.e2e.test_mcp_transports import _free_port, _wait_until_listening, stop_server
from tests.support.github_api import GitHubStandIn

pytestmark = pytest.mark.slow

TOKEN = "ghp_trackerDispatchToken0123456789"
WAIT_S = 120.0
WORKER = """\
import subprocess, sys, time
from pathlib import Path
task_id, ctl = sys.argv[1], Path(sys.argv[2])
(ctl / f"start-{task_id}-{time.time_ns()}").write_text("")
while not (ctl / "release-all").exists():
    time.sleep(0.05)
Path("work.md").write_text(f"done {task_id}\\n")
identity = ["-c", "user.name=worker", "-c", "user.email=worker@taskgate.invalid"]
subprocess.run(["git", *identity, "add", "work.md"], check=True)
subprocess.run(["git", *identity, "commit", "-qm", f"feat: {task_id}"], check=True)
(ctl / f"end-{task_id}-{time.time_ns()}").write_text("")
"""
FLOW = """
id: tracker-flow
description: every ready issue
triggers: [task_ready]
steps:
  - id: work
    type: agent
    agent: worker
    prompt: "do {{task.title}}"
"""


def seed_issues(github: GitHubStandIn) -> dict[int, dict[str, Any]]:
    """30 issues; the odd ones carry the `taskgate` label. Among those: 3 is blocked by 5 (open), 7 by 30 (closed:
    no longer blocking), 9 has two open sub-issues (10, 11) and 19 only a closed one (20), 13 is bob's, 15 is
    already the bot's, 17 is closed; 27 and 29 are P0. Returns what was seeded, for the reference rule."""
    spec: dict[int, dict[str, Any]] = {}
    for n in range(1, 31):
        labels = (["taskgate"] if n % 2 else []) + (["P0"] if n in (27, 29) else [])
        assignees = {13: ["bob"], 15: ["taskgate-bot"]}.get(n, [])
        spec[n] = {"labels": labels, "assignees": assignees, "blocked_by": [], "parent": None, "closed": False}
    spec[3]["blocked_by"], spec[7]["blocked_by"] = [5], [30]
    spec[10]["parent"], spec[11]["parent"], spec[20]["parent"] = 9, 9, 19
    for n, s in spec.items():
        number = github.add_issue(f"Issue {n}", f"body of {n}", s["labels"], s["assignees"], s["blocked_by"],
                                  s["parent"])  # fmt: skip
        assert number == n
    for n in (17, 20, 30):
        github.close_issue(n)
        spec[n]["closed"] = True
    spec[11]["closed"] = False
    return spec


def reference_ready(spec: dict[int, dict[str, Any]]) -> list[str]:
    """The ready rule, computed here independently: open, labelled, no open blocker, no open sub-issue, assigned to
    nobody but the bot; most urgent (P0) first, then by number."""

    def ready(n: int) -> bool:
        s = spec[n]
        children = [c for c, cs in spec.items() if cs["parent"] == n]
        blocked = any(not spec[b]["closed"] for b in s["blocked_by"])
        return (not s["closed"] and "taskgate" in s["labels"] and not blocked
                and all(spec[c]["closed"] for c in children) and set(s["assignees"]) <= {"taskgate-bot"})  # fmt: skip

    found = [n for n in spec if ready(n)]
    return [f"gh-{n}" for n in sorted(found, key=lambda n: (0 if "P0" in spec[n]["labels"] else 2, n))]


class TrackerDeployment:
    """A fresh repository registered as project `shop`, served by two nodes on one database, reading GitHub Issues."""

    def __init__(self, root: Path, database_url: str | None, on_lost: str) -> None:
        self.root, self.ctl = root, root / "ctl"
        self.ctl.mkdir()
        make_git_repo(root / "repo")
        bare = root / "shop.git"
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
        self.github = GitHubStandIn(bare, token=TOKEN)
        self.github.start()
        (root / "config" / "workflows" / "e2e").mkdir(parents=True)
        (root / "config" / "workflows" / "e2e" / "tracker-flow.yaml").write_text(FLOW)
        worker = root / "worker.py"
        worker.write_text(WORKER)
        q = json.dumps
        self.ports = [_free_port(), _free_port()]
        (root / "config" / "taskgate.toml").write_text(
            f"[sweeper]\ninterval_s = 0.5\n\n[execution]\nheartbeat_interval_s = 1\n\n"
            f"[dispatch]\nauto_start = true\nmax_running = 3\n\n"
            f'[tracker]\nkind = "github"\non_issue_gone = "{on_lost}"\n\n'
            f'[tracker.github]\nrepository = "acme/shop"\napi_url = {q(self.github.url)}\n\n'
            f'[agents.worker]\ncommand = [{q(sys.executable)}, {q(str(worker))}, "{{task_id}}", {q(str(self.ctl))}, '
            f'"{{prompt}}"]\ntimeout_s = 300\n\n[sandbox]\nwrite = [{q(str(self.ctl))}]\n'
        )  # fmt: skip
        base = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
        self.base = base | {"TASKGATE_CONFIG": str(root / "config" / "taskgate.toml"), "GITHUB_TOKEN": TOKEN,
                            "TASKGATE_OPERATOR__DEFAULT": "alice", "COLUMNS": "200"}  # fmt: skip
        if database_url:
            self.base["TASKGATE_DATABASE_URL"] = database_url
        self.processes: list[subprocess.Popen[bytes] | None] = [None, None]
        self.logs: list[Path] = []
        self.token = ""

    def env(self, n: int, **extra: str) -> dict[str, str]:
        # SQLite: both nodes share the data dir's database file; PostgreSQL: each node has its own data dir
        data = "data" if "TASKGATE_DATABASE_URL" not in self.base else f"data-{n}"
        return self.base | {"TASKGATE_DATA_DIR": str(self.root / data), "TASKGATE_NODE__ID": f"node-{n + 1}",
                            "TASKGATE_MCP__PORT": str(self.ports[n])} | extra  # fmt: skip

    def cli(self, *args: str) -> str:
        done = subprocess.run([TASKGATE, *args], cwd=self.root, env=self.env(0), capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode in (0, 4), f"taskgate {' '.join(args)} failed: {done.stderr}"
        return done.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json"))

    def start(self, n: int, **extra: str) -> None:
        log = self.root / f"node-{n + 1}-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("w") as out:
            self.processes[n] = subprocess.Popen(
                [TASKGATE, "serve", "--http", "--host", "127.0.0.1", "--port", str(self.ports[n])], cwd=self.root,
                env=self.env(n, **extra), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            )  # fmt: skip
        _wait_until_listening(self.processes[n], self.ports[n], log)

    def stop(self, n: int) -> None:
        process, self.processes[n] = self.processes[n], None
        if process is not None:
            stop_server(process)

    def poll(self) -> dict[str, Any]:
        """The project's last poll, as `taskgate tracker status --json` shows it."""
        projects = self.json("tracker", "status")["projects"]
        assert [p["project"] for p in projects] == ["shop"], projects
        return projects[0]

    def sessions(self) -> dict[str, dict[str, Any]]:
        return {s["task_id"]: s for s in self.json("session", "list", "--all")}

    def writes(self) -> int:
        """Requests that would change something on GitHub."""
        return sum(1 for method, _, _ in list(self.github.calls) if method in ("POST", "PATCH", "PUT", "DELETE"))

    def intervals(self, stopped: dict[str, int] | None = None) -> list[tuple[int, int]]:
        """Each agent run's (start, end) in ns, from the files the worker writes; an agent stopped by taskgate writes
        no end, and `stopped` gives when its session stopped running (its fail transition)."""
        starts = {p.name.split("-", 1)[1].rsplit("-", 1)[0]: int(p.name.rsplit("-", 1)[1])
                  for p in self.ctl.glob("start-*")}  # fmt: skip
        ends = {
            p.name.split("-", 1)[1].rsplit("-", 1)[0]: int(p.name.rsplit("-", 1)[1]) for p in self.ctl.glob("end-*")
        }
        return [(starts[t], ends.get(t, (stopped or {}).get(t, time.time_ns()))) for t in starts]

    def close(self) -> None:
        for n in range(2):
            self.stop(n)
        self.github.stop()


def until(what: str, check, deployment: TrackerDeployment) -> Any:
    deadline = time.monotonic() + WAIT_S
    while not (found := check()):
        if time.monotonic() > deadline:
            logs = "\n".join(log.read_text()[-3000:] for log in deployment.logs[-2:])
            pytest.fail(f"did not {what} within {WAIT_S:.0f}s; server logs:\n{logs}")
        time.sleep(0.3)
    return found


def most_at_once(intervals: list[tuple[int, int]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


@pytest.fixture(params=["sqlite", "postgresql"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TrackerDeployment]:
    from tests.e2e.test_crash_points import _pg_database

    databases = _pg_database() if request.param == "postgresql" else iter([None])
    on_lost = "ask" if request.param == "sqlite" else "stop"
    svc = TrackerDeployment(tmp_path, next(databases), on_lost)
    try:
        assert "project shop" in svc.cli("init", "repo", "--name", "shop")
        yield svc
    finally:
        (svc.ctl / "release-all").write_text("")
        svc.close()
        for _ in databases:
            pass


def test_ready_issues_are_dispatched_within_the_cap_to_verifying_with_nobody_typing_a_command(deployment):
    spec = seed_issues(deployment.github)
    expected = reference_ready(spec)
    assert len(expected) == 11

    # 1. shadow mode: the same decisions, nothing written anywhere
    deployment.start(0, TASKGATE_DISPATCH__DRY_RUN="true")
    shadow = until("poll in shadow mode", lambda: (p := deployment.poll())["dispatch"] and p, deployment)
    assert shadow["ready"] == expected and shadow["error"] is None and shadow["dry_run"] is True
    assert {d["task"]: d["outcome"] for d in shadow["dispatch"]} == {
        **{t: "would_start" for t in expected[:3]}, **{t: "held" for t in expected[3:]}}  # fmt: skip
    held = {d["task"]: d["detail"] for d in shadow["dispatch"] if d["outcome"] == "held"}
    assert held[expected[3]] == "no slot: 3 running in the project (max_running 3)"
    assert shadow["held"]["gh-3"] == "blocked by gh-5 (open)" and shadow["held"]["gh-13"] == "assigned to bob"
    assert shadow["held"]["gh-9"] == "has 2 open sub-issues"
    assert deployment.writes() == 0 and deployment.sessions() == {}
    deployment.stop(0)

    # 2. for real: two nodes, one 500 and one 429 on the way, a concurrent claimer taking gh-29 first
    deployment.github.fail_next(1, 500, "/repos/acme/shop/issues")
    deployment.github.fail_next(1, 429, "/repos/acme/shop/issues")
    deployment.github.race_next_claim(29, "mallory")
    deployment.start(0)
    deployment.start(1)
    first = until("start three agents", lambda: len(list(deployment.ctl.glob("start-*"))) >= 3 and
                  deployment.sessions(), deployment)  # fmt: skip
    running = [t for t in expected if first.get(t, {}).get("state") in ("planning", "executing")]
    assert len(running) == 3 and running[0] == "gh-27", {t: s["state"] for t, s in first.items()}  # P0 first
    # the next two by priority then number (gh-1, gh-5), unless a transient tracker error put one off to a later pass
    victim = running[1]
    assert first["gh-29"]["state"] == "cancelled"  # its claim was lost: given up, left to people
    assert deployment.github.issue(29)["assignees"] == ["mallory"]
    cancel = [r for r in deployment.json("session", "history", first["gh-29"]["id"]) if r["trigger"] == "cancel"]
    assert "claimed concurrently by mallory" in cancel[0]["reason"]
    issue = deployment.github.issue(27)
    assert issue["assignees"] == ["taskgate-bot"] and "taskgate:in-progress" in issue["labels"]
    assert deployment.poll()["error"] is None  # the 500 and the 429 were retried inside the poll
    assert sum(1 for _, _, status in deployment.github.calls if status in (500, 429)) >= 2  # both were answered

    # 3. an issue closed mid-run
    deployment.github.close_issue(int(victim[3:]))
    lost = until(f"see {victim} lost", lambda: deployment.poll()["lost"].get(victim), deployment)
    assert lost == "closed in GitHub"
    policy = "stop" if "TASKGATE_DATABASE_URL" in deployment.base else "ask"
    stopped: dict[str, int] = {}
    if policy == "stop":
        until(f"stop {victim}'s session", lambda: deployment.sessions()[victim]["state"] == "failed", deployment)
        fail = [r for r in deployment.json("session", "history", first[victim]["id"]) if r["trigger"] == "fail"]
        stopped[victim] = int(datetime.fromisoformat(fail[0]["at"]).timestamp() * 1e9)
        assert "closed in GitHub (on_issue_gone = stop)" in fail[0]["reason"]
    else:
        shown = lambda: deployment.json("session", "show", first[victim]["id"])  # noqa: E731
        mark = until(f"mark {victim}'s session", lambda: shown()["state_data"].get("tracker_lost"), deployment)
        assert (mark["why"], mark["policy"]) == ("closed in GitHub", "ask")
        assert shown()["state"] in ("planning", "executing")  # it carries on until the operator decides
        assert "closed in GitHub" in deployment.cli("session", "show", first[victim]["id"])

    # 4. the agents finish: every ready issue reaches verifying, three at a time
    (deployment.ctl / "release-all").write_text("")
    wanted = [t for t in expected if t != "gh-29" and not (t == victim and policy == "stop")]

    def all_verifying() -> dict[str, dict[str, Any]] | None:
        found = deployment.sessions()
        return found if all(found.get(t, {}).get("state") == "verifying" for t in wanted) else None

    done = until("bring every ready issue to verifying", all_verifying, deployment)
    assert sorted(done) == sorted(expected)  # one session per ready issue, none for the others
    assert most_at_once(deployment.intervals(stopped)) == 3  # the cap was reached and never exceeded
    claims = {n: deployment.github.calls_to("POST", f"/repos/acme/shop/issues/{n}/assignees") for n in range(1, 31)}
    assert {n for n, c in claims.items() if c} == {int(t[3:]) for t in expected}
    assert all(c == 1 for c in claims.values() if c), claims  # two nodes polling: one claim per issue
    five = deployment.github.issue(5)
    assert "taskgate:in-review" in five["labels"] and "taskgate:in-progress" not in five["labels"]
    assert any(f"session {done['gh-5']['id']}" in body for body in five["comments"]), five["comments"]


@pytest.fixture
def shadow(tmp_path: Path) -> Iterator[TrackerDeployment]:
    """One SQLite deployment in shadow mode, with an operator token for the console."""
    svc = TrackerDeployment(tmp_path, None, "ask")
    try:
        svc.cli("init", "repo", "--name", "shop")
        svc.token = json.loads(svc.cli("token", "create", "--operator", "alice", "--json"))["token"]
        yield svc
    finally:
        svc.close()


async def test_the_console_shows_each_polls_findings_and_why_each_ready_issue_waits(shadow, browser):
    from playwright.async_api import expect

    from tests.e2e.test_console_browser import signed_in

    spec = seed_issues(shadow.github)
    shadow.start(0, TASKGATE_DISPATCH__DRY_RUN="true")
    until("poll in shadow mode", lambda: shadow.poll()["dispatch"], shadow)
    site = SimpleNamespace(url=f"http://127.0.0.1:{shadow.ports[0]}", tokens={"alice": shadow.token})
    page = await signed_in(browser, site, "alice")
    await page.get_by_role("link", name="Tracker").click()
    section = page.get_by_role("region", name="shop: github acme/shop, label taskgate")
    await expect(section.locator("[data-ready-count]")).to_have_text(str(len(reference_ready(spec))))
    await expect(section.locator("[data-dry-run]")).to_be_visible()
    fourth = reference_ready(spec)[3]
    await expect(section.locator(f'[data-dispatch="{fourth}"]')).to_contain_text("no slot: 3 running in the project")
    await expect(section.locator('[data-held="gh-3"]')).to_have_text("gh-3: blocked by gh-5 (open)")
    assert shadow.writes() == 0

    def doctor(**env: str) -> tuple[str, str]:
        done = subprocess.run([TASKGATE, "doctor", "--json"], cwd=shadow.root / "repo", env={**shadow.env(0), **env},
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        return next((c["status"], c["detail"]) for c in json.loads(done.stdout) if c["name"] == "tracker")

    assert doctor() == ("ok", "github acme/shop, label taskgate: 14 candidate(s), 11 ready")
    refused = doctor(GITHUB_TOKEN="ghp_wrong")
    assert refused[0] == "fail" and "GITHUB_TOKEN" in refused[1] and "ghp_wrong" not in refused[1], refused
    assert doctor(GITHUB_TOKEN="") == ("fail", "GITHUB_TOKEN is not set: [tracker.github] token_env names the "
                                               "variable holding the API token")  # fmt: skip
