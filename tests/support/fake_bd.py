"""A small stand-in for Beads' `bd`, answering the commands taskgate uses with JSON shaped like bd's.

State is `.beads/issues.jsonl` in the working directory, in Beads' export format (one `types.Issue` per line,
with `labels` and `dependencies` records). Shapes follow steveyegge/beads:

- `ready --json`: an array of `types.Issue` (open or in_progress, not blocked), by priority then created_at;
- `list --json`: an array of `IssueWithCounts` (issue fields, `labels`, `dependencies` records,
  `dependency_count`, `dependent_count`); closed issues only with `--all`; `--limit` (0 = all, default 50);
- `show ID --json`: an array of `IssueDetails`, whose `dependencies`/`dependents` are whole issues with a
  `dependency_type`; an unknown id prints `Error fetching ID: no issue found matching "ID"` on stderr and
  nothing on stdout, exit 0 (as bd does);
- `update ID --status S --json`, `close ID --reason R --json`: the changed issues as an array; an unknown id
  prints `Error resolving ID: no issue found matching "ID"` and exits 1.

Blocked follows bd's blocked_issues_cache: a `blocks`/`conditional-blocks` dependency on an issue that is not
closed, a `waits-for` on a spawner with a child that is not closed, or a `parent-child` on a blocked parent.

Knobs: FAKE_BD_FAIL=1 fails every command (exit 1, a bd-like error on stderr); FAKE_BD_SLEEP=seconds sleeps
first; FAKE_BD_GARBAGE=1 prints something that is not JSON; FAKE_BD_LOG=path appends each argv as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

STATE = Path(".beads") / "issues.jsonl"
BOOL_FLAGS = {"--json", "--all"}
VALUE_FLAGS = {
    "ready": {"--limit", "--sort"},
    "list": {"--limit", "--status"},
    "show": set(),
    "update": {"--status"},
    "close": {"--reason"},
}


class Usage(Exception):
    pass


def main(argv: list[str]) -> int:
    if os.environ.get("FAKE_BD_LOG"):
        with open(os.environ["FAKE_BD_LOG"], "a", encoding="utf-8") as log:
            log.write(json.dumps(argv) + "\n")
    if os.environ.get("FAKE_BD_SLEEP"):
        time.sleep(float(os.environ["FAKE_BD_SLEEP"]))
    if os.environ.get("FAKE_BD_FAIL"):
        print("Error: failed to open database: simulated failure (FAKE_BD_FAIL)", file=sys.stderr)
        return 1
    if os.environ.get("FAKE_BD_GARBAGE"):
        print("✨ this is not JSON")
        return 0
    try:
        command, positional, flags = parse(argv)
    except Usage as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    issues = load()
    handler = {"ready": ready, "list": list_, "show": show, "update": update, "close": close}[command]
    return handler(issues, positional, flags)


def parse(argv: list[str]) -> tuple[str, list[str], dict[str, Any]]:
    if not argv or argv[0] not in VALUE_FLAGS:
        raise Usage(f'unknown command {argv[0] if argv else ""!r} for "bd"')
    command, rest = argv[0], argv[1:]
    positional: list[str] = []
    flags: dict[str, Any] = {}
    i = 0
    while i < len(rest):
        arg = rest[i]
        name, _, inline = arg.partition("=")
        if name in BOOL_FLAGS:
            flags[name] = True
        elif name in VALUE_FLAGS[command]:
            if not inline and "=" not in arg:
                i += 1
                if i >= len(rest):
                    raise Usage(f"flag needs an argument: {name}")
                inline = rest[i]
            flags[name] = inline
        elif arg.startswith("-"):
            raise Usage(f"unknown flag: {name}")
        else:
            positional.append(arg)
        i += 1
    return command, positional, flags


def load() -> dict[str, dict[str, Any]]:
    if not STATE.exists():
        return {}
    lines = STATE.read_text(encoding="utf-8").splitlines()
    return {item["id"]: item for item in (json.loads(line) for line in lines if line.strip())}


def save(issues: dict[str, dict[str, Any]]) -> None:
    STATE.parent.mkdir(exist_ok=True)
    text = "".join(json.dumps(issues[i], separators=(",", ":")) + "\n" for i in sorted(issues))
    STATE.write_text(text, encoding="utf-8")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def emit(value: Any) -> None:
    print(json.dumps(value, indent=2))


def bare(issue: dict[str, Any]) -> dict[str, Any]:
    """The issue as `types.Issue` marshals it without relational data."""
    return {k: v for k, v in issue.items() if k not in ("labels", "dependencies", "comments")}


def blocked(issue_id: str, issues: dict[str, dict[str, Any]], seen: frozenset[str] = frozenset()) -> bool:
    if issue_id in seen or issue_id not in issues:
        return False
    for dep in issues[issue_id].get("dependencies") or []:
        target, kind = dep["depends_on_id"], dep["type"]
        if kind in ("blocks", "conditional-blocks") and issues.get(target, {}).get("status") != "closed":
            return True
        if kind == "waits-for" and any(
            child.get("status") != "closed"
            for child in issues.values()
            if any(
                d["depends_on_id"] == target and d["type"] == "parent-child" for d in child.get("dependencies") or []
            )
        ):
            return True
        if kind == "parent-child" and blocked(target, issues, seen | {issue_id}):
            return True
    return False


def ready(issues: dict[str, dict[str, Any]], _positional: list[str], flags: dict[str, Any]) -> int:
    found = [
        bare(issue)
        for issue in issues.values()
        if issue.get("status", "open") in ("open", "in_progress") and not blocked(issue["id"], issues)
    ]
    found.sort(key=lambda i: (i["priority"], i["created_at"]))
    limit = int(flags.get("--limit", 10))
    emit(found[:limit] if limit > 0 else found)
    return 0


def list_(issues: dict[str, dict[str, Any]], _positional: list[str], flags: dict[str, Any]) -> int:
    found = [i for i in issues.values() if flags.get("--all") or i.get("status") != "closed"]
    found.sort(key=lambda i: (i["priority"], i["created_at"]))
    limit = int(flags.get("--limit", 50))
    rows = []
    for issue in found[:limit] if limit > 0 else found:
        dependents = sum(
            1 for other in issues.values() for d in other.get("dependencies") or [] if d["depends_on_id"] == issue["id"]
        )
        rows.append({**issue, "dependency_count": len(issue.get("dependencies") or []), "dependent_count": dependents})
    emit(rows)
    return 0


def show(issues: dict[str, dict[str, Any]], positional: list[str], _flags: dict[str, Any]) -> int:
    if not positional:
        print("Error: at least one issue ID is required", file=sys.stderr)
        return 1
    details = []
    for issue_id in positional:
        issue = issues.get(issue_id)
        if issue is None:
            print(f'Error fetching {issue_id}: no issue found matching "{issue_id}"', file=sys.stderr)
            continue
        deps = [
            {**bare(issues[d["depends_on_id"]]), "dependency_type": d["type"]}
            for d in issue.get("dependencies") or []
            if d["depends_on_id"] in issues
        ]
        dependents = [
            {**bare(other), "dependency_type": d["type"]}
            for other in issues.values()
            for d in other.get("dependencies") or []
            if d["depends_on_id"] == issue_id
        ]
        detail = {**bare(issue), "labels": issue.get("labels") or None, "dependencies": deps or None}
        detail["dependents"] = dependents or None
        parent = next((d["id"] for d in deps if d["dependency_type"] == "parent-child"), None)
        detail["parent"] = parent
        details.append({k: v for k, v in detail.items() if v is not None})  # omitempty
    if details:
        emit(details)
    return 0


def update(issues: dict[str, dict[str, Any]], positional: list[str], flags: dict[str, Any]) -> int:
    return _change(issues, positional, "update", status=flags.get("--status"))


def close(issues: dict[str, dict[str, Any]], positional: list[str], flags: dict[str, Any]) -> int:
    return _change(issues, positional, "close", status="closed", reason=flags.get("--reason", "Closed"))


def _change(
    issues: dict[str, dict[str, Any]], ids: list[str], verb: str, status: str | None, reason: str | None = None
) -> int:
    if not ids:
        print(f"Error: {verb} requires at least one issue ID", file=sys.stderr)
        return 1
    changed = []
    for issue_id in ids:
        issue = issues.get(issue_id)
        if issue is None:
            print(f'Error resolving {issue_id}: no issue found matching "{issue_id}"', file=sys.stderr)
            return 1
        if status:
            issue["status"] = status
            stamp = now()
            issue["updated_at"] = stamp
            if status == "closed":
                issue["closed_at"] = stamp
                if reason:
                    issue["close_reason"] = reason
            else:
                issue.pop("closed_at", None)
                issue.pop("close_reason", None)
        changed.append(bare(issue))
    save(issues)
    emit(changed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
