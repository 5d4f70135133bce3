"""`taskgate workflow …` and `taskgate checklist …` as a user runs them: a copy of the shipped config dir, real
subprocesses, no database."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.test_cli import Cli

ROOT = Path(__file__).resolve().parents[2]
BROKEN = ROOT / "tests" / "fixtures" / "workflows" / "broken"


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    for folder in ("workflows", "checklists"):
        shutil.copytree(ROOT / "src" / "taskgate" / "catalogue" / folder, tmp_path / "config" / folder)
    return Cli(tmp_path)


def test_validate_the_shipped_catalogue(cli: Cli):
    assert cli.ok("workflow", "validate").strip() == "ok: 4 workflow(s) and 3 checklist(s) are valid"
    report = cli.json("workflow", "validate")
    assert report["ok"] is True and report["problems"] == []
    assert report["workflows"] == ["bug-fix", "comprehensive-test", "feature-development", "refactor"]
    assert report["checklists"] == ["quality-validation", "release", "security-review"]
    assert not (cli.workdir / "data").exists()  # no database for offline commands


def test_validate_takes_ids_of_the_catalogue_as_well_as_files(cli: Cli):
    assert (
        cli.ok("workflow", "validate", "feature-development").strip()
        == "ok: 1 workflow(s) and 0 checklist(s) are valid"
    )
    both = cli.json("workflow", "validate", "bug-fix", "release")
    assert (both["workflows"], both["checklists"], both["ok"]) == (["bug-fix"], ["release"], True)
    done = cli.run("workflow", "validate", "no-such-workflow")
    assert done.returncode == 1 and "no-such-workflow:1: no such file, nor a workflow or checklist id" in done.stdout


def test_validate_bad_files_prints_one_line_per_problem_and_exits_1(cli: Cli):
    bad = [str(BROKEN / "unreachable.yaml"), str(BROKEN / "checklists" / "duplicate-item.yaml")]
    done = cli.run("workflow", "validate", *bad)
    assert done.returncode == 1
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(
        "checklists/duplicate-item.yaml:7: duplicate checklist item id 'tests' (also line 5) "
        "(hint: give every item its own id)"
    )
    assert "unreachable.yaml:10: step 'b' is unreachable (hint: route to it" in lines[1]
    assert done.stderr.strip() == "error: 2 problem(s) in 2 file(s)"
    report = json.loads(cli.run("workflow", "validate", bad[0], "--json").stdout)
    assert report["ok"] is False and report["problems"][0]["line"] == 10 and report["problems"][0]["hint"]


def test_a_broken_catalogue_file_fails_validate_and_is_marked_in_list(cli: Cli):
    target = cli.workdir / "config" / "workflows" / "development" / "feature-development.yaml"
    target.write_text(target.read_text().replace("on_reject: plan", "on_reject: plann"))
    done = cli.run("workflow", "validate")
    assert done.returncode == 1
    assert done.stdout.strip() == (
        "config/workflows/development/feature-development.yaml:25: step 'approve-plan': on_reject targets "
        "unknown step 'plann' (hint: did you mean 'plan'?)"
    )
    rows = {row["id"]: row["valid"] for row in cli.json("workflow", "list")}
    assert rows["feature-development"] is False and rows["bug-fix"] is True
    assert "workflow 'feature-development' is invalid" in cli.fails("workflow", "show", "feature-development")


def test_list_and_show(cli: Cli):
    rows = cli.json("workflow", "list")
    assert [(r["category"], r["id"]) for r in rows] == [
        ("development", "feature-development"),
        ("maintenance", "bug-fix"),
        ("maintenance", "refactor"),
        ("testing", "comprehensive-test"),
    ]
    assert [r["id"] for r in cli.json("workflow", "list", "--category", "maintenance")] == ["bug-fix", "refactor"]
    table = cli.ok("workflow", "list")
    assert "feature-development" in table and "templates" not in table
    shown = cli.json("workflow", "show", "refactor")
    assert shown["id"] == "refactor" and shown["category"] == "maintenance"
    parallel = next(s for s in shown["steps"] if s["type"] == "parallel")
    assert parallel["min_success"] == 3 and [a["agent"] for a in parallel["agents"]] == ["tester", "tester", "reviewer"]
    text = cli.ok("workflow", "show", "comprehensive-test")
    assert "unit-tests" in text and "then → triage" in text
    assert cli.fails("workflow", "show", "nope") == "error: workflow nope not found"


def test_graph_prints_a_mermaid_flowchart(cli: Cli):
    graph = cli.ok("workflow", "graph", "feature-development")
    assert graph.startswith("flowchart TD\n")
    assert "s1_approve_plan -->|reject| s0_plan" in graph and "-->|error| s5_fix" in graph
    assert cli.fails("workflow", "graph", "nope") == "error: workflow nope not found"


def test_create_from_a_template_validates_and_never_overwrites(cli: Cli):
    out = cli.ok("workflow", "create", "nightly-check", "--template", "reviewed", "--category", "ops")
    assert out.strip() == "created config/workflows/ops/nightly-check.yaml from template reviewed"
    created = cli.workdir / "config" / "workflows" / "ops" / "nightly-check.yaml"
    assert "id: nightly-check\ncategory: ops\n" in created.read_text()
    assert cli.json("workflow", "show", "nightly-check")["category"] == "ops"
    before = created.read_text()
    assert "already exists" in cli.fails("workflow", "create", "nightly-check", "--template", "basic", "-c", "ops")
    assert created.read_text() == before
    assert "already exists" in cli.fails("workflow", "create", "bug-fix", "--template", "basic")
    assert cli.ok("workflow", "create", "my-bugs", "--template", "bug-fix").startswith(
        "created config/workflows/maintenance/my-bugs.yaml"
    )
    assert "unknown template 'nope'; known: basic, reviewed, bug-fix" in cli.fails(
        "workflow", "create", "x", "--template", "nope"
    )
    assert "use lower-case letters" in cli.fails("workflow", "create", "../x", "--template", "basic")
    assert cli.ok("workflow", "validate").startswith("ok: 6 workflow(s)")


def test_checklists(cli: Cli):
    assert [c["id"] for c in cli.json("checklist", "list")] == ["quality-validation", "release", "security-review"]
    release = cli.json("checklist", "show", "release")
    assert release["items"][0] == {"id": "ci-green", "text": "CI is green on the release commit.", "required": True}
    assert "rollback-plan" in cli.ok("checklist", "show", "release")
    assert cli.fails("checklist", "show", "nope") == "error: checklist nope not found"


def test_configured_agent_types_are_checked(cli: Cli):
    ours = cli.workdir / "config" / "workflows" / "ours"
    ours.mkdir(parents=True)
    (ours / "w.yaml").write_text("id: w\ndescription: d\nsteps:\n  - id: s\n    type: agent\n    agent: linter\n"
                                 "    prompt: Lint it.\n")  # fmt: skip
    done = cli.run("workflow", "validate")
    assert done.returncode == 1
    assert "unknown agent type 'linter' (hint: configure [agents.linter] in taskgate.toml" in done.stdout
    (cli.workdir / "config" / "taskgate.toml").write_text('[agents.linter]\ncommand = ["true"]\n')
    done = cli.run("workflow", "validate")  # configured, but its command drops the step's prompt
    assert done.returncode == 1 and "agent type 'linter' has no {prompt} in its command" in done.stdout
    (cli.workdir / "config" / "taskgate.toml").write_text('[agents.linter]\ncommand = ["true", "{prompt}"]\n')
    assert cli.run("workflow", "validate").returncode == 0
