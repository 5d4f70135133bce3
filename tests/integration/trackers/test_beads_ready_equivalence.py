"""After an import, `task ready` lists exactly what `bd ready` would: random Beads graphs, imported for real,
compared with the rule of domain/beads.py (itself checked case by case in
tests/unit/trackers/test_beads_ready_rule.py)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

from taskgate.application.trackers.beads_import import BeadsImporter, ImportBeads, parse_beads_jsonl
from taskgate.domain.beads import BeadsGraph
from taskgate.infrastructure.system import SystemClock
from tests.conftest import make_git_repo
from tests.support import bead, jsonl

IDS = [f"bd-{n}" for n in range(8)]
STATUSES = ["open", "open", "open", "closed", "closed", "in_progress", "blocked", "deferred", "hooked", "pinned",
            "tombstone", "review"]  # fmt: skip
TYPES = ["task", "task", "epic", "bug", "molecule", "gate"]
KINDS = ["blocks", "blocks", "parent-child", "parent-child", "conditional-blocks", "waits-for", "related"]
TARGETS = [*IDS, "bd-gone", "external:shop:payments"]


def export(rng: random.Random) -> str:
    """A random export of IDS: statuses, types, pins, wisps, deferrals, and dependencies of every kind on each
    other, on missing issues and on external capabilities (waits-for gates any- or all-children)."""
    now, lines = datetime.now(UTC), []
    for issue_id in IDS:
        deps = {rng.choice(TARGETS): rng.choice(KINDS) for _ in range(rng.randint(0, 3))}
        deps.pop(issue_id, None)
        extra: dict[str, object] = {"issue_type": rng.choice(TYPES)}
        if rng.random() < 0.1:
            extra["pinned"] = True
        if rng.random() < 0.1:
            extra["ephemeral"] = True
        if rng.random() < 0.12:
            extra["defer_until"] = (now + timedelta(days=rng.choice([-3, 3]))).isoformat()
        line = bead(issue_id, status=rng.choice(STATUSES), deps=list(deps.items()), **extra)
        for dep in line.get("dependencies", []):
            if dep["type"] == "waits-for" and rng.random() < 0.5:
                dep["metadata"] = json.dumps({"gate": "any-children"})
        lines.append(line)
    return jsonl(*lines)


def expected_ready(export: str) -> set[str]:
    parsed = parse_beads_jsonl(export)
    return set(BeadsGraph({i.id: i.node() for i in parsed.issues}).ready(datetime.now(UTC)))


async def ready_after_import(services, project_id: int, export: str) -> set[str]:
    await BeadsImporter(services.uow, SystemClock()).import_jsonl(ImportBeads(project_id, export.encode()))
    return {t.external_id for t in await services.tracker.ready_tasks(project_id)}


async def test_the_ready_set_after_an_import_is_bd_readys(services, tmp_path) -> None:
    """Random graphs (seeded, so a failure repeats) on memory, SQLite and PostgreSQL; each in its own project."""
    rng = random.Random(17)
    for n in range(150 if services.backend == "memory" else 40):
        text = export(rng)
        project = await services.tracker.init_project(str(make_git_repo(tmp_path / f"repo-{n}")))
        assert await ready_after_import(services, project.id, text) == expected_ready(text), text
