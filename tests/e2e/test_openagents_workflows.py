"""OpenAgents-style workflows and Vibe Kanban's checklist in a fresh repository, through the real `taskgate`
executable: `taskgate init`, the fixtures copied into `.taskgate/`, OpenAgents' agent names configured as the
scripted example agents (no model), `workflow validate`, then `workflow run` to the end with real agent processes,
and `visible_to` refusing the local operator before anything is written (docs/workflows.md)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.e2e.test_init import User, fresh_repo

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "workflows"
# OpenAgents' agent names (its examples use OpenCode's built-in plan, build, test, review and the custom
# researcher and reviewer) as agent types running taskgate's scripted examples
AGENTS = """
[agents.plan]
preset = "coder"
[agents.build]
preset = "coder"
[agents.test]
preset = "tester"
[agents.review]
preset = "reviewer"
[agents.researcher]
preset = "reviewer"
"""
OPENAGENTS_IDS = ["careful-refactor", "feature-flow", "gated-feature", "quick-plan", "resilient-change", "study-code"]
BOBS_ONLY = """{
  "id": "bobs-only",
  "description": "A workflow only operator bob may run",
  "visible_to": ["operator:bob"],
  "max_duration_ms": 600000,
  "steps": [{"id": "outline", "agent": "plan"}]
}"""


@pytest.fixture
def user(tmp_path: Path) -> User:
    """A fresh repository after `taskgate init`, with the fixtures in its `.taskgate/` and the agent names set."""
    user = User(fresh_repo(tmp_path / "repo"))
    user.ok("init")
    folder = user.repo / ".taskgate"
    shutil.copytree(FIXTURES / "openagents", folder / "workflows" / "openagents")
    shutil.copytree(FIXTURES / "vibe" / "workflows", folder / "workflows" / "vibe")
    shutil.copytree(FIXTURES / "vibe" / "checklists", folder / "checklists", dirs_exist_ok=True)
    (folder / "taskgate.toml").write_text((folder / "taskgate.toml").read_text() + AGENTS)
    return user


def task(user: User, title: str) -> str:
    return user.json("task", "add", title)["id"]


def steps_of(user: User, sid: str) -> list[tuple[str, int, str]]:
    return [(r["step_id"], r["attempt"], r["status"]) for r in user.json("workflow", "steps", sid)]


def rows(user: User) -> dict[str, int]:
    with sqlite3.connect(user.repo / ".taskgate" / "data" / "taskgate.db") as conn:
        names = [r[0] for r in conn.execute("select name from sqlite_master where type='table'")]
        return {n: conn.execute(f'select count(*) from "{n}"').fetchone()[0] for n in names}


def test_the_fixtures_validate_with_notes_on_how_the_openagents_files_were_read(user: User):
    report = user.json("workflow", "validate")
    assert report["ok"] is True and report["problems"] == []
    assert set(OPENAGENTS_IDS) | {"criteria-feature"} <= set(report["workflows"])
    assert "acceptance-criteria" in report["checklists"]
    read_as = sorted(Path(n["file"]).name for n in report["notes"] if n["message"].startswith("read as"))
    assert read_as == ["analyze.json", "feature.json", "gated-feature.json", "refactor.json", "resilient.json",
                       "simple.json"]  # fmt: skip
    text = user.ok("workflow", "validate", ".taskgate/workflows/openagents/gated-feature.json")
    assert text.strip().endswith("ok: 1 workflow(s) and 0 checklist(s) are valid")
    assert (
        ".taskgate/workflows/openagents/gated-feature.json:32: note: step 'test': 'retry_delay' is a deprecated name "
        "of 'retry_delay_ms' (the first retry's wait in milliseconds) (hint: rename it to retry_delay_ms)"
    ) in text
    shown = user.json("workflow", "show", "feature-flow")
    assert shown["format"] == "openagents" and shown["max_duration_s"] == 600.0
    assert [s.get("max_retries", 0) for s in shown["steps"]] == [0, 1, 0]


@pytest.mark.parametrize(
    ("workflow", "ran"),
    [
        ("quick-plan", ["outline"]),
        ("feature-flow", ["outline", "implement", "check"]),
        ("study-code", ["study", "assess"]),
        ("careful-refactor", ["survey", "restructure", "verify", "inspect"]),  # not `recover`: nothing failed
        ("resilient-change", ["outline", "implement", "check"]),
    ],
)
def test_an_openagents_example_runs_to_the_end_with_the_scripted_agents(user: User, workflow: str, ran: list[str]):
    out = user.ok("workflow", "run", workflow, "--task", task(user, f"Try {workflow}"))
    sid = out.split()[1]
    assert f"finished: the workflow is done and session {sid} is verifying" in out, out
    assert steps_of(user, sid) == [(step, 1, "succeeded") for step in ran]
    assert user.json("session", "show", sid)["state"] == "verifying"


def test_the_guide_style_example_with_context_and_approvals_runs_through_its_two_decisions(user: User):
    out = user.ok("workflow", "run", "gated-feature", "--task", task(user, "Add refunds"))
    sid = out.split()[1]
    assert f"paused: session {sid} (executing) at gated-feature › approve-outline" in out
    assert "Does the outline cover the task?" in out
    second = user.ok("session", "decide", sid, "approve", "--reason", "the outline is fine")
    assert f"paused: session {sid} (executing) at gated-feature › approve-merge" in second, second
    done = user.ok("session", "decide", sid, "approve", "--reason", "merge it")
    assert f"session {sid} is awaiting_merge" in done  # the last approval is the verification's (one approval)
    assert [(s, status) for s, _, status in steps_of(user, sid)] == [
        ("outline", "succeeded"), ("approve-outline", "approved"), ("implement", "succeeded"),
        ("test", "succeeded"), ("review", "succeeded"), ("approve-merge", "approved"),
    ]  # fmt: skip


def test_vibes_acceptance_criteria_pause_the_run_until_their_required_items_are_ticked(user: User):
    out = user.ok("workflow", "run", "criteria-feature", "--task", task(user, "Add search"))
    sid = out.split()[1]
    assert "waits for checklist step 'criteria' (acceptance-criteria): tick behaves-as-specified, unit-tests, docs" in (
        out
    )
    for item in ("behaves-as-specified", "unit-tests"):
        assert f"ticked {item}" in user.ok("checklist", "check", sid, item)
    finished = user.ok("checklist", "check", sid, "docs")
    assert f"finished: the workflow is done and session {sid} is verifying" in finished
    assert steps_of(user, sid) == [("build", 1, "succeeded"), ("criteria", 1, "succeeded")]


def test_visible_to_hides_and_refuses_a_workflow_the_local_operator_is_not_named_in(user: User):
    (user.repo / ".taskgate" / "workflows" / "private").mkdir()
    (user.repo / ".taskgate" / "workflows" / "private" / "bobs-only.json").write_text(BOBS_ONLY)
    assert user.json("workflow", "validate")["ok"] is True
    listed = user.run("workflow", "list", "--category", "private")
    assert listed.returncode == 0 and "bobs-only" not in listed.stdout
    assert "1 workflow(s) not shown: their visible_to does not name operator:" in listed.stderr
    assert [w["id"] for w in user.json("workflow", "list", "--category", "openagents")] == OPENAGENTS_IDS
    bob = User(user.repo)
    bob.env = {**user.env, "TASKGATE_OPERATOR__DEFAULT": "bob"}
    assert [w["id"] for w in bob.json("workflow", "list", "--category", "private")] == ["bobs-only"]

    key = task(user, "Secret work")
    before = rows(user)
    refused = user.fails("workflow", "run", "bobs-only", "--task", key)
    assert "workflow 'bobs-only' is visible_to [operator:bob] only, not to operator:" in refused
    assert "visible_to [operator:bob] only" in user.fails("session", "start", key, "--workflow", "bobs-only")
    assert rows(user) == before  # nothing written: no session, no event
    sid = user.json("session", "start", key)["id"]
    assert "visible_to [operator:bob] only" in user.fails("workflow", "push", sid, "bobs-only")
    assert user.json("session", "status", sid)["workflow"]["depth"] == 0
