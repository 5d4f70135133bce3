"""Dispatch through the `taskgate` executable on a fresh repository: workflows with `task_ready` and `label:bug`
triggers, `[dispatch] auto_start` off then on, and `taskgate sweep` (one tick of what `serve` runs) starting
sessions within the WIP limit; several sweeps at once; `workflow validate` refusing a trigger it does not know."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_git_repo
from tests.e2e.test_cli import TASKGATE, Cli

READY_FLOW = """
id: ready-flow
description: any ready task
triggers: [manual, task_ready]
steps:
  - id: work
    type: agent
    agent: ok
    prompt: "do {{task.title}}"
"""

BUG_FLOW = """
id: bug-flow
description: ready tasks labelled bug
triggers: ["label:bug"]
steps:
  - id: fix
    type: agent
    agent: ok
    prompt: "fix {{task.title}}"
"""


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """A fresh repository and config dir: the two workflows, an agent type, a WIP limit of 2 per plan."""
    config = tmp_path / "config"
    (config / "workflows" / "e2e").mkdir(parents=True)
    (config / "workflows" / "e2e" / "ready-flow.yaml").write_text(READY_FLOW)
    (config / "workflows" / "e2e" / "bug-flow.yaml").write_text(BUG_FLOW)
    ok = json.dumps([sys.executable, "-c", "print('done')", "{prompt}"])
    (config / "taskgate.toml").write_text(f"[agents.ok]\ncommand = {ok}\n\n[policies.wip_limit]\nlimit = 2\n")
    make_git_repo(tmp_path / "repo")
    cli = Cli(tmp_path)
    assert "project demo" in cli.ok("init", "repo", "--name", "demo")
    cli.ok("plan", "add", "Phase 1")
    return cli


def dispatch_on(cli: Cli) -> None:
    cli.env["TASKGATE_DISPATCH__AUTO_START"] = "true"


def outcomes(report: dict) -> dict[str, tuple[str, str | None]]:
    """What dispatch took up (not the tasks it only says why it left: held, or cancelled by a person)."""
    left = [d for d in report["dispatched"] if d["outcome"] == "held" or "cancelled its session" in d["detail"]]
    return {d["task_id"]: (d["outcome"], d["workflow"]) for d in report["dispatched"] if d not in left}


def test_sweeps_start_ready_tasks_with_their_triggers_workflow_only_when_dispatch_is_on_and_within_wip(cli: Cli):
    assert cli.json("task", "add", "Build it", "--plan", "1")["id"] == "DEMO-1"
    crash = cli.json("task", "add", "Crash on save", "--plan", "1", "--label", "bug")
    assert crash["labels"] == ["bug"] and "bug" in cli.ok("task", "list")
    cli.ok("task", "add", "Document it", "--plan", "1")
    triggers = cli.json("workflow", "triggers")
    assert {t["trigger"]: t["workflows"] for t in triggers["triggers"]} == {
        "task_ready": ["ready-flow"], "label:bug": ["bug-flow"]}  # fmt: skip
    assert triggers["dispatch"]["on"] is False and "replaces the built-in" in cli.ok("workflow", "triggers")

    assert "nothing to do" in cli.ok("sweep")  # dispatch off: nothing starts by itself
    assert cli.json("session", "list") == []

    dispatch_on(cli)
    assert "dispatch on: ready tasks of every project start sessions as operator alice" in cli.ok(
        "workflow", "triggers")  # fmt: skip
    report = cli.json("sweep")
    assert outcomes(report) == {"DEMO-1": ("started", "ready-flow"), "DEMO-2": ("started", "bug-flow"),
                                "DEMO-3": ("waiting", "ready-flow")}  # fmt: skip
    sessions = {d["task_id"]: d["session_id"] for d in report["dispatched"]}
    status = cli.json("session", "status", sessions["DEMO-2"])
    assert status["state"] == "planning" and status["workflow"]["breadcrumb"].startswith("bug-flow")
    history = cli.json("session", "history", sessions["DEMO-1"])
    assert [(r["trigger"], r["actor"], r["reason"]) for r in history if r["trigger"] in ("create", "start")] == [
        ("create", "operator:alice", "dispatch: trigger task_ready (workflow ready-flow)"),
        ("start", "operator:alice", "dispatch: trigger task_ready (workflow ready-flow)"),
    ]
    waiting = cli.json("session", "show", sessions["DEMO-3"])
    assert waiting["state"] == "ready"

    again = cli.ok("sweep")  # WIP still full: DEMO-3 waits; nothing is written for it
    assert "dispatch: 1 waiting" in again and "wip_limit" in again
    blocked = [r for r in cli.json("session", "history", sessions["DEMO-3"]) if r["outcome"] == "blocked"]
    assert len(blocked) == 1

    cli.ok("session", "fire", sessions["DEMO-1"], "cancel", "--reason", "not now")  # a slot frees
    freed = cli.json("sweep")
    assert outcomes(freed) == {"DEMO-3": ("started", "ready-flow")}  # DEMO-1 was cancelled: left to people
    assert [(d["task_id"], d["outcome"], d["detail"]) for d in freed["dispatched"] if d["task_id"] == "DEMO-1"] == [
        ("DEMO-1", "skipped", "a person cancelled its session: left to people")]  # fmt: skip
    assert cli.json("session", "show", sessions["DEMO-3"])["state"] == "planning"
    starts = [r for r in cli.json("session", "history", sessions["DEMO-3"]) if r["trigger"] == "start"]
    assert [r["outcome"] for r in starts] == ["blocked", "applied"]


def test_sweeps_running_at_once_in_separate_processes_start_each_task_exactly_once(cli: Cli):
    for n in range(6):
        cli.ok("task", "add", f"Free task {n}", *(["--label", "bug"] if n % 2 else []))  # no plan: no WIP limit
    dispatch_on(cli)
    procs = [subprocess.Popen([TASKGATE, "sweep", "--json"], cwd=cli.workdir, env=cli.env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]  # fmt: skip
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))

    started = [d for r in reports for d in r["dispatched"] if d["outcome"] == "started"]
    assert sorted(d["task_id"] for d in started) == [f"DEMO-{n}" for n in range(1, 7)]  # each once, by someone
    assert all(d["outcome"] in ("started", "skipped") for r in reports for d in r["dispatched"])
    sessions = cli.json("session", "list")
    assert sorted(s["task_id"] for s in sessions) == [f"DEMO-{n}" for n in range(1, 7)]
    for session in sessions:
        history = cli.json("session", "history", session["id"])
        assert [r["outcome"] for r in history if r["trigger"] == "start"] == ["applied"]
        flow = cli.json("session", "status", session["id"])["workflow"]["breadcrumb"]
        wanted = "bug-flow" if int(session["task_id"].split("-")[1]) % 2 == 0 else "ready-flow"
        assert flow.startswith(wanted)


def test_workflow_validate_refuses_a_trigger_it_does_not_know_with_file_line_and_the_valid_forms(cli: Cli):
    nightly = cli.workdir / "config" / "workflows" / "e2e" / "nightly.yaml"
    nightly.write_text(READY_FLOW.replace("ready-flow", "nightly").replace("[manual, task_ready]", "[nightly]"))
    done = cli.run("workflow", "validate")
    assert done.returncode == 1
    assert (
        "config/workflows/e2e/nightly.yaml:4: trigger 1 'nightly' is not a trigger "
        "(hint: a trigger is one of: manual, task_ready, label:<name>"
    ) in done.stdout
    twin = cli.workdir / "config" / "workflows" / "e2e" / "twin.yaml"
    twin.write_text(READY_FLOW.replace("id: ready-flow", "id: twin"))
    nightly.unlink()
    clash = cli.run("workflow", "validate", str(twin))
    assert clash.returncode == 1 and "twin.yaml:4: trigger 'task_ready' is also declared by workflow 'ready-flow'" in (
        clash.stdout)  # fmt: skip
    refused = cli.fails("task", "add", "x", "--label", "needs review")
    assert refused.startswith("error: label 'needs review' is invalid: 1-50 letters, digits and . _ : / -")
