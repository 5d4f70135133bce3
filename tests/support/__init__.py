"""Test support: the fake `bd` and builders of Beads-shaped issues."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

FAKE_BD = Path(__file__).with_name("fake_bd.py")
STAMP = "2026-01-01T09:00:00Z"


def install_fake_bd(bin_dir: Path) -> Path:
    """An executable `bd` in `bin_dir` that runs the fake with this interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "bd"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_BD}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def bead(
    issue_id: str,
    title: str | None = None,
    *,
    status: str = "open",
    priority: int = 2,
    deps: tuple[tuple[str, str], ...] | list[tuple[str, str]] = (),
    description: str = "",
    created_at: str = STAMP,
    **extra: Any,
) -> dict[str, Any]:
    """One issue as Beads exports it (`types.Issue` with `dependencies` records, omitempty fields left out)."""
    issue: dict[str, Any] = {"id": issue_id, "title": title or f"issue {issue_id}"}
    if description:
        issue["description"] = description
    issue |= {"status": status, "priority": priority, "issue_type": "task", "created_at": created_at}
    issue["updated_at"] = created_at
    if status == "closed":
        issue["closed_at"] = created_at
    if deps:
        issue["dependencies"] = [
            {"issue_id": issue_id, "depends_on_id": target, "type": kind, "created_at": created_at}
            for target, kind in deps
        ]
    return issue | extra


def jsonl(*issues: dict[str, Any] | str) -> str:
    """Export lines; a str is written as it is (to make malformed lines)."""
    return "".join((i if isinstance(i, str) else json.dumps(i)) + "\n" for i in issues)


def write_beads_state(root: Path, *issues: dict[str, Any]) -> Path:
    """`.beads/issues.jsonl` of a repository, which the fake `bd` reads and writes."""
    path = root / ".beads" / "issues.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jsonl(*issues))
    return path
