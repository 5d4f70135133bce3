"""Running workflows through the `taskgate` executable: real subprocesses for the CLI and for the agents (small
Python programs configured as `[agents.NAME]`), a real git repository and SQLite file. The CLI process drives
the workflow (no `serve` runs): `workflow run` until the approval, `session decide` in a second process on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from taskgate.infrastructure.sandbox import bwrap
from tests.conftest import make_git_repo
from tests.e2e.test_cli import Cli, seed

REVIEWED = """
id: reviewed-change
description: make a change, have it approved, then check it
steps:
  - id: make
    type: agent
    agent: ok
    prompt: "make {{task.title}}"
  - id: approve
    type: approval
    message: Is the change what the task asked for?
  - id: check
    type: agent
    agent: ok
    input: make
    prompt: check it
"""

BREAKS = """
id: breaks
description: an agent that fails, retried once
steps:
  - id: try
    type: agent
    agent: bad
    prompt: try
    max_retries: 1
    retry_delay_ms: 100
"""

SHIP = """
id: ship
description: tick the release list
items:
  - id: notes
    text: Release notes are written.
  - id: tagged
    text: The commit is tagged.
  - id: tweet
    text: Say it somewhere.
    required: false
"""


@pytest.fixture
def offline(tmp_path: Path) -> Cli:
    """The config dir: one agent type, the workflow and the checklist."""
    config = tmp_path / "config"
    (config / "workflows" / "e2e").mkdir(parents=True)
    (config / "checklists").mkdir()
    (config / "workflows" / "e2e" / "reviewed-change.yaml").write_text(REVIEWED)
    (config / "workflows" / "e2e" / "breaks.yaml").write_text(BREAKS)
    (config / "checklists" / "ship.yaml").write_text(SHIP)
    ok = json.dumps([sys.executable, "-c", "print('done')", "{prompt}"])  # real processes in the session's worktree
    bad = json.dumps([sys.executable, "-c", "import sys; print('it broke'); sys.exit(3)", "{prompt}"])
    (config / "taskgate.toml").write_text(f"[agents.ok]\ncommand = {ok}\n\n[agents.bad]\ncommand = {bad}\n")
    return Cli(tmp_path)


@pytest.fixture
def cli(offline: Cli) -> Cli:
    """A project with tasks DEMO-1, DEMO-2 (blocked by DEMO-1) and DEMO-3."""
    make_git_repo(offline.workdir / "repo")
    cli = offline
    seed(cli)
    assert cli.json("task", "add", "Release it", "--plan", "1")["id"] == "DEMO-3"
    return cli


def test_a_workflow_runs_to_its_approval_and_a_decision_in_another_process_finishes_it(cli: Cli):
    out = cli.ok("workflow", "run", "reviewed-change", "--task", "DEMO-1")
    sid = out.split()[1]
    lines = out.splitlines()
    assert f"session {sid} for DEMO-1 runs workflow reviewed-change" == lines[0]
    assert "▶ reviewed-change › make running" in out and "✓ reviewed-change › make succeeded: done" in out
    assert "⏸ reviewed-change › approve waits for a person" in out
    marks = [line.split(" › ")[1] for line in lines if " › " in line and line[0] in "▶✓⏸"]
    assert marks[:3] == ["make running (1 agent(s))", "make succeeded: done", "approve waits for a person"]  # in order
    assert f"paused: session {sid} (executing) at reviewed-change › approve" in out
    assert "waits for approval at step 'approve': Is the change what the task asked for?" in out
    approve = next(line for line in lines if f"continue: taskgate session decide {sid} approve" in line)
    version = int(approve.rsplit(" ", 1)[1])  # the printed command names the version it decides on

    status = cli.json("session", "status", sid[:8])
    assert status["state"] == "executing" and status["workflow"]["depth"] == 1
    assert status["workflow"]["breadcrumb"] == "reviewed-change › approve"
    assert status["workflow"]["waiting"]["kind"] == "approval"
    assert "Is the change what the task asked for?" in cli.ok("session", "status", sid[:8])

    before = cli.table_counts()
    refused = cli.fails("workflow", "break", sid[:8])
    assert refused == f"error: workflow_break leaves a nested frame; session {sid} is at depth 1"
    assert cli.table_counts() == before

    decision = ("session", "decide", sid[:8], "approve", "--expected-version", str(version), "--reason", "as asked")
    decided = cli.ok(*decision)
    assert "approve by alice" in decided
    assert "✓ reviewed-change › approve approved: as asked" in decided
    assert "✓ reviewed-change › check succeeded: done" in decided
    assert f"finished: the workflow is done and session {sid} is verifying" in decided
    assert cli.json("session", "show", sid)["state"] == "verifying"
    again = cli.ok(*decision)
    assert "first result returned, nothing written" in again  # the same command again decides nothing new

    runs = cli.json("workflow", "steps", sid[:8])
    assert [(r["step_id"], r["depth"], r["attempt"], r["status"]) for r in runs] == [
        ("make", 1, 1, "succeeded"),
        ("approve", 1, 1, "approved"),
        ("check", 1, 1, "succeeded"),
    ]
    assert all(len(r["agent_ids"]) == 1 for r in (runs[0], runs[2])) and runs[1]["agent_ids"] == []
    table = cli.ok("workflow", "steps", sid[:8])
    assert "make" in table and "approved" in table
    assert cli.json("session", "status", sid)["workflow"] == {
        "session_id": sid, "state": "verifying", "depth": 0, "breadcrumb": "", "frames": [], "waiting": None,
    }  # fmt: skip


def test_an_unknown_workflow_is_refused_naming_the_known_ones_and_nothing_is_written(cli: Cli):
    before = cli.table_counts()
    message = cli.fails("workflow", "run", "nope", "--task", "DEMO-3")
    # the project's and the built-in ones
    known = "known: breaks, bug-fix, comprehensive-test, feature-development, refactor, reviewed-change"
    assert "nope" in message and known in message
    assert known in cli.fails("session", "start", "DEMO-3", "--workflow", "nope")
    assert "give either --task TASK or --session ID" in cli.fails("workflow", "run", "reviewed-change")
    assert cli.table_counts() == before
    assert [s["state"] for s in cli.json("session", "list", "--all")] == []


def test_a_failing_workflow_exits_1_with_the_reason_after_its_retries(cli: Cli):
    done = cli.run("workflow", "run", "breaks", "--task", "DEMO-3")
    assert done.returncode == 1, done.stderr
    assert "✗ breaks › try failed: 0 of 1 agents succeeded" in done.stdout
    assert "▶ breaks › try (attempt 2) running" in done.stdout
    sid = done.stdout.split()[1]
    assert f"failed: session {sid} is failed: step 'try' of breaks failed" in done.stdout
    assert f"try again: taskgate session fire {sid} retry" in done.stdout
    runs = cli.json("workflow", "steps", sid)
    assert [(r["attempt"], r["status"]) for r in runs] == [(1, "failed"), (2, "failed")]


def test_a_checklist_is_pushed_ticked_and_lets_the_session_finish(cli: Cli):
    sid = cli.json("session", "start", "DEMO-3")["id"]
    pushed = cli.json("checklist", "push", sid[:8], "ship")
    assert pushed["depth"] == 1 and pushed["breadcrumb"] == "checklist ship"
    assert pushed["waiting"]["kind"] == "checklist" and pushed["waiting"]["missing"] == ["notes", "tagged"]
    text = cli.ok("session", "status", sid[:8])
    assert "tick notes, tagged" in text and f"continue: taskgate checklist check {sid} notes" in text

    assert cli.json("checklist", "check", sid[:8], "notes")["waiting"]["missing"] == ["tagged"]
    assert cli.json("checklist", "check", sid[:8], "notes")["waiting"]["missing"] == ["tagged"]  # twice: once
    before = cli.table_counts()
    assert "checklist item 'nope' is not on the list; items: notes, tagged, tweet" in cli.fails(
        "checklist", "check", sid[:8], "nope"
    )
    assert cli.table_counts() == before
    ticked = cli.ok("checklist", "check", sid[:8], "tagged")
    assert "ticked tagged" in ticked and "every required item is ticked" in ticked
    assert f"run it: taskgate session execute {sid}" in ticked

    executed = cli.ok("session", "execute", sid[:8])  # the ticked checklist pops, the stack is empty: work done
    assert f"finished: the workflow is done and session {sid} is verifying" in executed
    assert cli.json("session", "show", sid)["state"] == "verifying"


def test_workflow_run_on_an_existing_session_pushes_onto_an_empty_stack(cli: Cli):
    sid = cli.json("session", "start", "DEMO-3")["id"]
    out = cli.ok("workflow", "run", "reviewed-change", "--session", sid[:8])
    assert f"workflow reviewed-change pushed onto session {sid}" in out and "paused:" in out
    again = cli.ok("workflow", "run", "reviewed-change", "--session", sid[:8])  # already on it: goes on waiting
    assert "paused:" in again and "▶" not in again
    assert [r["step_id"] for r in cli.json("workflow", "steps", sid)] == ["make", "approve"]


def test_listing_by_pattern(offline: Cli):
    cli = offline
    assert [w["id"] for w in cli.json("workflow", "list", "review*")] == ["reviewed-change"]
    assert [w["id"] for w in cli.json("workflow", "list", "approved")] == ["reviewed-change"]  # description words
    assert cli.json("workflow", "list", "nothing-like-it") == []
    assert cli.json("workflow", "list", "--category", "other") == []
    assert [c["id"] for c in cli.json("checklist", "list", "release")] == ["release", "ship"]  # built-in, project
    assert cli.json("checklist", "list", "x*") == []


ASKS = """
id: asks
description: a run's input and context reach the prompt
steps:
  - id: make
    type: agent
    agent: echo
    prompt: "make {{task.title}} in {{context.area}} (strict: {{context.strict}})"
  - id: nested
    type: workflow
    workflow: asks-child
"""
ASKS_CHILD = """
id: asks-child
description: sees the run's input too
steps:
  - id: more
    type: agent
    agent: echo
    prompt: "and then {{input}}"
"""


def test_a_run_takes_input_and_context_its_prompts_and_manifest_show_them(cli: Cli):
    config = cli.workdir / "config"
    (config / "workflows" / "e2e" / "asks.yaml").write_text(ASKS)
    (config / "workflows" / "e2e" / "asks-child.yaml").write_text(ASKS_CHILD)
    echo = json.dumps([sys.executable, "-c", "import sys; print(sys.argv[1])", "{prompt}"])
    with (config / "taskgate.toml").open("a") as toml:
        toml.write(f"\n[agents.echo]\ncommand = {echo}\n")
    (config / "workflows" / "e2e" / "misnamed.yaml").write_text(ASKS.replace("id: asks", "id: misnamed").replace(
        "steps:", "variables:\n  instructions: x.md\nsteps:"))  # fmt: skip
    before = cli.table_counts()
    broken = cli.fails("workflow", "run", "misnamed", "--task", "DEMO-3")
    assert broken.startswith("error: workflow misnamed has problems: ") and "misnamed.yaml:5: variable 'instructions'" \
        " is reserved" in broken  # fmt: skip
    bad = cli.fails("workflow", "run", "asks", "--task", "DEMO-3", "--context", '["api"]')
    assert bad == "error: --context must be a JSON object of names to values, not list"
    assert "--context is not JSON" in cli.fails("workflow", "run", "asks", "--task", "DEMO-3", "--context", "{area")
    assert cli.table_counts() == before

    out = cli.ok("workflow", "run", "asks", "--task", "DEMO-3", "--input", "Build the login page",
                 "--context", '{"area": "api", "strict": true}')  # fmt: skip
    sid = out.split()[1]
    assert f"finished: the workflow is done and session {sid} is verifying" in out
    assert "✓ asks › make succeeded: make Release it in api (strict: true)" in out
    outputs = cli.json("session", "outputs", sid)
    given = outputs["inputs"]
    assert given["run/asks"] == {"input": "Build the login page", "context": {"area": "api", "strict": "true"}}
    (make,) = given["asks/make"]["prompts"]
    assert make["prompt"] == "make Release it in api (strict: true)\n\nThe run's input:\nBuild the login page"
    assert given["asks-child/more"]["prompts"][0]["prompt"] == "and then Build the login page"
    assert outputs["workflow"] == {"name": "asks", "description": "a run's input and context reach the prompt"}
    assert outputs["execution"]["status"] == "completed" and outputs["execution"]["user"] == "alice"
    runs = cli.json("workflow", "steps", sid[:8])
    assert [(r["step_id"], r["status"]) for r in runs] == [("make", "succeeded"), ("nested", "succeeded"),
                                                            ("more", "succeeded")]  # fmt: skip
    # the workflow's agents, the nested workflow's included, ran in the sandbox where the host has one
    expected = "bwrap; network" if bwrap.probe().available else "off:"
    assert all(a["sandbox"].startswith(expected) for a in cli.json("session", "status", sid)["agents"])


OUTER = """
id: outer
description: runs inner, then goes on
steps:
  - id: sub
    type: workflow
    workflow: inner
  - id: after
    type: agent
    agent: echo
    prompt: "inner: {{steps.sub.summary}}"
"""
INNER = """
id: inner
description: makes, then waits at a gate
steps:
  - id: make
    type: agent
    agent: ok
    prompt: make
  - id: gate
    type: approval
    message: inner gate
"""


def test_workflow_continue_ends_the_nested_workflow_early_and_the_outer_one_goes_on(cli: Cli):
    config = cli.workdir / "config"
    (config / "workflows" / "e2e" / "outer.yaml").write_text(OUTER)
    (config / "workflows" / "e2e" / "inner.yaml").write_text(INNER)
    echo = json.dumps([sys.executable, "-c", "import sys; print(sys.argv[1])", "{prompt}"])
    with (config / "taskgate.toml").open("a") as toml:
        toml.write(f"\n[agents.echo]\ncommand = {echo}\n")
    out = cli.ok("workflow", "run", "outer", "--task", "DEMO-3")
    sid = out.split()[1]
    assert f"paused: session {sid} (executing) at outer › sub › inner › gate" in out
    went_on = cli.ok("workflow", "continue", sid[:8])
    assert went_on.startswith("ended the frame early: outer › sub")
    assert "✓ outer › after succeeded: inner: - make: succeeded: done" in went_on
    assert f"finished: the workflow is done and session {sid} is verifying" in went_on
    runs = cli.json("workflow", "steps", sid[:8])
    assert [(r["step_id"], r["status"]) for r in runs] == [("sub", "succeeded"), ("make", "succeeded"),
                                                            ("gate", "cancelled"), ("after", "succeeded")]  # fmt: skip
