"""Linear as the tracker, dispatch running the work, end to end (issue 41), on SQLite and PostgreSQL.

One real `taskgate serve --http` node, the real CLI, the scripted agent of tests/e2e/test_tracker_dispatch.py in the
sandbox in real worktrees, and the Linear stand-in (tests/support/linear_api: GraphQL executed against the schema
converted from @linear/sdk). The project is configured only as a user would: `[tracker] kind = "linear"`,
`[tracker.linear]` and `[dispatch]` in taskgate.toml, `LINEAR_API_KEY` in the environment.

The story, on one deployment per backend:
1. shadow mode (`dispatch.dry_run`): the poll's ready set is the rule of docs/tracker-linear.md, computed here
   independently over 20 issues (states, the label, blocks relations, sub-issues, assignees, priorities), and
   nothing reaches Linear's mutations or taskgate's sessions;
2. dispatch for real with a cap of 2, Linear answering one RATELIMITED and one 500 first: two sessions run, their
   issues assigned to the API key's user and In Progress; a claim overtaken by another user gives its session up;
3. the agents finish: every other ready issue reaches verifying, never more than two at once, and Linear shows each
   In Review with a comment naming its session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_git_repo
from tests.e2e.test_mcp_transports import _free_port
from tests.e2e.test_tracker_dispatch import FLOW, WORKER, TrackerDeployment, most_at_once, until
from tests.support.linear_api import LinearStandIn

pytestmark = pytest.mark.slow

KEY = "lin_api_trackerLinearE2E0123456789"
PRIORITY = {1: 0, 2: 1, 3: 2, 4: 3, 0: 4}  # Linear's priority (1 urgent … 4 low, 0 none) → taskgate's order
DONE = ("Done", "Canceled")


def seed_issues(linear: LinearStandIn) -> dict[str, dict[str, Any]]:
    """20 issues of team ENG. Not candidates: 3 (no label), 4 (Backlog), 5 (Done), 18 (Canceled). Held: 6 blocked by
    7 (Todo), 9 with open sub-issues 10 and 11, 14 bob's. Ready although related: 8 blocked by 5 (Done), 19 by 18
    (Canceled), 12 whose only sub-issue 13 is Done, 15 already the viewer's. Returns what was seeded."""
    bob = linear.add_user("Bob Builder", "bob@acme.dev")
    tg = ["taskgate"]
    spec: dict[int, dict[str, Any]] = {n: {"state": "Todo", "labels": tg, "priority": 0} for n in range(1, 21)}
    for n, change in {
        2: {"priority": 3}, 3: {"labels": []}, 4: {"state": "Backlog"}, 5: {"state": "Done"},
        6: {"priority": 2}, 7: {"labels": [], "priority": 1}, 8: {"priority": 1, "blocked_by": [5]},
        9: {"priority": 1}, 10: {"priority": 3, "parent": 9}, 11: {"state": "Backlog", "labels": [], "parent": 9},
        12: {"priority": 2}, 13: {"state": "Done", "parent": 12}, 14: {"priority": 1, "assignee": bob},
        15: {"assignee": linear.viewer_id}, 16: {"priority": 1}, 17: {"priority": 4, "labels": [*tg, "backend"]},
        18: {"state": "Canceled", "priority": 1}, 19: {"priority": 3, "blocked_by": [18]},
    }.items():  # fmt: skip
        spec[n] = spec[n] | change
    spec[6]["blocked_by"] = [7]
    for n, s in spec.items():
        parent = f"ENG-{s['parent']}" if s.get("parent") else None
        identifier = linear.add_issue("ENG", f"Issue {n}", f"body of {n}", s["state"], s["priority"], s["labels"],
                                      s.get("assignee"), parent)  # fmt: skip
        assert identifier == f"ENG-{n}"
    for n, s in spec.items():
        for blocker in s.get("blocked_by", []):
            linear.block(f"ENG-{blocker}", f"ENG-{n}")
    return spec


def reference_ready(spec: dict[int, dict[str, Any]], viewer: str) -> list[str]:
    """The rule of docs/tracker-linear.md, computed here: in Todo with the label, no open blocker, no open sub-issue,
    assigned to nobody or the viewer; by priority (urgent first, none last), then number."""

    def ready(n: int) -> bool:
        s = spec[n]
        children = [c for c, cs in spec.items() if cs.get("parent") == n]
        return (s["state"] == "Todo" and "taskgate" in s["labels"]
                and all(spec[b]["state"] in DONE for b in s.get("blocked_by", []))
                and all(spec[c]["state"] in DONE for c in children)
                and s.get("assignee") in (None, viewer))  # fmt: skip

    return [f"ENG-{n}" for n in sorted(filter(ready, spec), key=lambda n: (PRIORITY[spec[n]["priority"]], n))]


class LinearDeployment(TrackerDeployment):
    """A fresh repository registered as project `shop`, served by one node, reading team ENG of the Linear stand-in."""

    def __init__(self, root: Path, database_url: str | None) -> None:
        self.root, self.ctl = root, root / "ctl"
        self.ctl.mkdir()
        make_git_repo(root / "repo")
        self.linear = LinearStandIn(key=KEY).__enter__()
        (root / "config" / "workflows" / "e2e").mkdir(parents=True)
        (root / "config" / "workflows" / "e2e" / "tracker-flow.yaml").write_text(FLOW)
        worker = root / "worker.py"
        worker.write_text(WORKER)
        q = json.dumps
        self.ports = [_free_port(), _free_port()]
        (root / "config" / "taskgate.toml").write_text(
            f"[sweeper]\ninterval_s = 0.5\n\n[execution]\nheartbeat_interval_s = 1\n\n"
            f"[dispatch]\nauto_start = true\nmax_running = 2\n\n"
            f'[tracker]\nkind = "linear"\n\n'
            f'[tracker.linear]\nteam = "ENG"\nlabel = "taskgate"\napi_url = {q(self.linear.url)}\n\n'
            f'[agents.worker]\ncommand = [{q(sys.executable)}, {q(str(worker))}, "{{task_id}}", {q(str(self.ctl))}, '
            f'"{{prompt}}"]\ntimeout_s = 300\n\n[sandbox]\nwrite = [{q(str(self.ctl))}]\n'
        )  # fmt: skip
        base = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
        self.base = base | {"TASKGATE_CONFIG": str(root / "config" / "taskgate.toml"), "LINEAR_API_KEY": KEY,
                            "TASKGATE_OPERATOR__DEFAULT": "alice", "COLUMNS": "200"}  # fmt: skip
        if database_url:
            self.base["TASKGATE_DATABASE_URL"] = database_url
        self.processes: list[subprocess.Popen[bytes] | None] = [None, None]
        self.logs: list[Path] = []

    def mutations(self) -> list[str]:
        return [op for op in list(self.linear.operations) if op.endswith(("IssueUpdate", "CommentCreate"))]

    def close(self) -> None:
        for n in range(2):
            self.stop(n)
        self.linear.__exit__()


@pytest.fixture(params=["sqlite", "postgresql"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LinearDeployment]:
    from tests.e2e.test_crash_points import _pg_database

    databases = _pg_database() if request.param == "postgresql" else iter([None])
    svc = LinearDeployment(tmp_path, next(databases))
    try:
        assert "project shop" in svc.cli("init", "repo", "--name", "shop")
        yield svc
    finally:
        (svc.ctl / "release-all").write_text("")
        svc.close()
        for _ in databases:
            pass


def test_ready_linear_issues_are_dispatched_within_the_cap_to_verifying(deployment):
    linear = deployment.linear
    spec = seed_issues(linear)
    expected = reference_ready(spec, linear.viewer_id)
    assert expected == ["ENG-8", "ENG-16", "ENG-12", "ENG-2", "ENG-10", "ENG-19", "ENG-17", "ENG-1", "ENG-15",
                        "ENG-20"]  # fmt: skip

    # 1. shadow mode: the rule's ready set, nothing written to Linear or to sessions
    deployment.start(0, TASKGATE_DISPATCH__DRY_RUN="true")
    shadow = until("poll in shadow mode", lambda: (p := deployment.poll())["dispatch"] and p, deployment)
    assert shadow["error"] is None and shadow["dry_run"] is True, shadow
    assert shadow["ready"] == expected, json.dumps(shadow, indent=1)
    assert {d["task"]: d["outcome"] for d in shadow["dispatch"]} == {
        **{t: "would_start" for t in expected[:2]}, **{t: "held" for t in expected[2:]}}  # fmt: skip
    assert shadow["held"]["ENG-6"] == "blocked by ENG-7 (Todo)"
    assert shadow["held"]["ENG-9"] == "has 2 open sub-issues"
    assert shadow["held"]["ENG-14"] == "assigned to bob@acme.dev"
    assert deployment.mutations() == [] and deployment.sessions() == {}
    deployment.stop(0)

    # 2. for real, cap 2: Linear rate-limits once and fails once first; another user overtakes the claim of ENG-8
    mallory = linear.add_user("Mallory", "mallory@acme.dev")
    linear.rate_limit_next(1)
    linear.fail_next(1, 500)
    linear.race_next_claim("ENG-8", mallory)
    deployment.start(0)
    first = until("start two agents", lambda: len(list(deployment.ctl.glob("start-*"))) >= 2 and
                  deployment.sessions(), deployment)  # fmt: skip
    running = [t for t in expected if first.get(t, {}).get("state") in ("planning", "executing")]
    assert len(running) == 2, {t: s["state"] for t, s in first.items()}
    lost = until("give ENG-8 up", lambda: deployment.sessions().get("ENG-8", {}).get("state") == "cancelled" and
                 deployment.sessions()["ENG-8"], deployment)  # fmt: skip
    cancel = [r for r in deployment.json("session", "history", lost["id"]) if r["trigger"] == "cancel"]
    assert "claimed concurrently by mallory@acme.dev" in cancel[0]["reason"], cancel
    assert linear.issue("ENG-8")["assignee"] == mallory  # taskgate does not take it back
    for task in running:
        issue = linear.issue(task)
        assert (issue["assignee"], issue["state"]) == (linear.viewer_id, "In Progress"), issue
    assert deployment.poll()["error"] is None  # the RATELIMITED and the 500 were retried inside the poll
    assert linear.requests - len(linear.operations) == 2  # both were answered (neither reaches execution)

    # 3. the agents finish: every other ready issue reaches verifying, two at a time
    (deployment.ctl / "release-all").write_text("")
    wanted = [t for t in expected if t != "ENG-8"]

    def all_verifying() -> dict[str, dict[str, Any]] | None:
        found = deployment.sessions()
        return found if all(found.get(t, {}).get("state") == "verifying" for t in wanted) else None

    done = until("bring every ready issue to verifying", all_verifying, deployment)
    assert sorted(done) == sorted(expected)  # one session per ready issue, none for the others
    assert most_at_once(deployment.intervals()) == 2  # the cap was reached and never exceeded
    for task in wanted:
        issue = linear.issue(task)
        assert (issue["assignee"], issue["state"]) == (linear.viewer_id, "In Review"), issue
        assert any(f"session {done[task]['id']}" in body for body in issue["comments"]), issue["comments"]
    untouched = [f"ENG-{n}" for n in spec if f"ENG-{n}" not in expected]
    assert all(not linear.issue(t)["comments"] for t in untouched)
