"""What taskgate relies on from `bd`, asked of the fake `bd` (tests/support/fake_bd.py) and, when a real `bd` is on
PATH, of it too: the same cases, the same expectations. The fake's ready rule is a second, independent reading of
Beads' source; random graphs check it agrees with taskgate's (domain/beads.py).

A real `bd` cannot be installed on this project's machines: the npm package `@beads/bd` downloads its binary from
GitHub at install time and Beads has no PyPI release, so those cases skip here with that reason.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from taskgate.application.trackers.beads_import import parse_beads_jsonl
from taskgate.domain.beads import BeadsGraph
from tests.integration.trackers.test_beads_ready_equivalence import export as random_export
from tests.support import bead, install_fake_bd, jsonl, write_beads_state

REAL_BD = shutil.which("bd")


@dataclass
class Bd:
    """One `bd` over one repository's issues."""

    argv0: str
    root: Path
    real: bool

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "BEADS_ACTOR": "taskgate", **(env or {})}
        return subprocess.run([self.argv0, *args], cwd=self.root, env=full_env, capture_output=True, text=True,
                              timeout=60)  # fmt: skip

    def json(self, *args: str, env: dict[str, str] | None = None) -> Any:
        done = self.run(*args, "--json", env=env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@pytest.fixture(params=["fake", "real"])
def make_bd(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "real" and REAL_BD is None:
        pytest.skip("no real bd on PATH (@beads/bd fetches its binary from GitHub at install; not reachable here)")

    def make(*issues: dict[str, Any]) -> Bd:
        root = tmp_path / f"repo-{len(list(tmp_path.iterdir()))}"
        root.mkdir()
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        write_beads_state(root, *issues)
        if request.param == "real":
            bd = Bd(REAL_BD, root, True)
            done = bd.run("init", "--quiet", "--skip-hooks", "--skip-agents", "--non-interactive", "--from-jsonl")
            assert done.returncode == 0, done.stderr
            return bd
        return Bd(str(install_fake_bd(tmp_path / "bin")), root, False)

    return make


GRAPH = [
    bead("c-epic", "Epic", issue_type="epic", priority=1),
    bead("c-kid", "Child", deps=[("c-epic", "parent-child")]),
    bead("c-blocker", "Blocker", priority=0),
    bead("c-blocked", "Blocked", deps=[("c-blocker", "blocks")]),
    bead("c-gone", "Blocked by a missing issue", deps=[("c-nowhere", "blocks")]),
    bead("c-hooked", "On someone's hook", status="hooked"),
    bead("c-mol", "A molecule", issue_type="molecule"),
    bead("c-pinned", "Pinned", pinned=True),
    bead("c-under", "Under a blocked parent", deps=[("c-blocked", "parent-child")]),
]


def test_ready_lists_what_the_rule_says(make_bd) -> None:
    bd = make_bd(*GRAPH)
    ready = {i["id"] for i in bd.json("ready", "--limit", "0")}
    assert ready == {"c-epic", "c-kid", "c-blocker", "c-gone"}


def test_the_fakes_ready_agrees_with_taskgates_rule_on_random_graphs(tmp_path: Path) -> None:
    rng, fake = random.Random(29), str(install_fake_bd(tmp_path / "bin"))
    for n in range(60):
        text = random_export(rng)
        root = tmp_path / f"g{n}"
        (root / ".beads").mkdir(parents=True)
        (root / ".beads" / "issues.jsonl").write_text(text)
        out = subprocess.run([fake, "ready", "--limit", "0", "--json"], cwd=root, capture_output=True, text=True)
        parsed = parse_beads_jsonl(text)
        expected = BeadsGraph({i.id: i.node() for i in parsed.issues}).ready(datetime.now(UTC))
        assert sorted(i["id"] for i in json.loads(out.stdout)) == expected, text


def test_show_of_an_unknown_id_exits_1_with_an_error_object_on_stdout(make_bd) -> None:
    done = make_bd(*GRAPH).run("show", "c-nope", "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["error"] == "no issues found matching the provided IDs"


def test_close_refuses_an_epic_with_open_children_a_blocked_issue_and_a_pinned_one(make_bd) -> None:
    bd = make_bd(*GRAPH, bead("c-pin", "Pinned status", status="pinned"))
    for issue_id, words in (("c-epic", "open child issue(s)"), ("c-blocked", "blocked by open issues [c-blocker]"),
                            ("c-pin", "cannot modify pinned issue c-pin")):  # fmt: skip
        done = bd.run("close", issue_id, "--json")
        assert done.returncode == 1 and words in done.stderr, done.stderr
    assert bd.json("close", "c-blocked", "--force")[0]["status"] == "closed"


def test_claim_is_a_compare_and_swap(make_bd) -> None:
    bd = make_bd(*GRAPH)
    claimed = bd.json("update", "c-blocker", "--claim", env={"BEADS_ACTOR": "alice"})[0]
    assert (claimed["status"], claimed["assignee"]) == ("in_progress", "alice")
    assert bd.run("update", "c-blocker", "--claim", "--json", env={"BEADS_ACTOR": "alice"}).returncode == 0
    refused = bd.run("update", "c-blocker", "--claim", "--json", env={"BEADS_ACTOR": "bob"})
    assert refused.returncode == 1 and "already claimed by alice" in refused.stderr
    not_open = bd.run("update", "c-hooked", "--claim", "--json", env={"BEADS_ACTOR": "bob"})
    assert not_open.returncode == 1 and "not claimable" in not_open.stderr


def test_the_json_envelope_wraps_every_payload(make_bd) -> None:
    bd = make_bd(*GRAPH)
    wrapped = bd.json("ready", "--limit", "0", env={"BD_JSON_ENVELOPE": "1"})
    assert wrapped["schema_version"] == 1 and {i["id"] for i in wrapped["data"]} >= {"c-epic"}
    assert bd.json("version")["schema_version"] == 1 and bd.json("version")["version"]


def test_the_fake_reads_its_state_like_the_export_it_is(tmp_path: Path) -> None:
    """The fake keeps an export: what it writes imports as it reads (no stray field breaks either)."""
    root = tmp_path / "repo"
    write_beads_state(root, *GRAPH)
    fake = str(install_fake_bd(tmp_path / "bin"))
    subprocess.run([fake, "close", "c-blocker", "--json"], cwd=root, check=True, capture_output=True)
    parsed = parse_beads_jsonl((root / ".beads" / "issues.jsonl").read_bytes())
    assert not parsed.problems and {i.id: i.status for i in parsed.issues}["c-blocker"] == "closed"
    assert jsonl(*GRAPH).count("\n") == len(parsed.issues)
