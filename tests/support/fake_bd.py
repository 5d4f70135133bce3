"""A stand-in for Beads' `bd` built from Beads' own source (gastownhall/beads v1.0.3), for the commands taskgate
runs. It does not import taskgate: its ready rule is written again here from the Go code, so the contract
suite (tests/contract/test_bd_contract.py) compares two independent readings, and runs against a real `bd`
too when one is on PATH.

State is `.beads/issues.jsonl` in the working directory (one `types.Issue` per line with `labels` and
`dependencies` records). What it answers, as bd does:

- `ready --json` (`cmd/bd/ready.go`, `issueops.GetReadyWorkInTx`): `status = 'open'`, not pinned, not ephemeral,
  not of the types merge-request/gate/molecule/message/agent/role/rig (unless `--type`), not deferred
  (`--include-deferred`), not in the blocked set, not a direct child of a blocked or deferred parent. Blocked
  (`ComputeBlockedIDsInTx`): an active issue (status not closed/pinned) with a `blocks`/`conditional-blocks`
  dependency on an active one, or a `waits-for` on a spawner whose children are active (all-children) / none
  closed and some active (any-children). Filters `--assignee`, `--unassigned`, `--priority`, `--label`,
  `--type`, `--exclude-type`; `--sort priority|hybrid|oldest` (default priority), `--limit` (default 100).
- `list --json`: `IssueWithCounts`; without `--all`/`--status` closed and pinned are left out; `--limit` 50.
- `show ID… --json`: an array of `IssueDetails`; an unknown id is a line on stderr; none found:
  `{"error": "no issues found matching the provided IDs", "schema_version": 1}` on stdout, exit 1.
- `update ID --claim` (`ClaimIssueInTx`): open and unassigned (or ours) → assignee = actor, in_progress;
  else `Error claiming ID: issue already claimed by X` / `issue not claimable: status S` on stderr, exit 1.
  `--status S`, `--assignee A` (empty clears). Prints the updated issues as an array.
- `close ID --reason R` refuses, on stderr and exit 1 when nothing closed, a pinned issue, an epic with open
  children, and an issue with open blockers, unless `--force`; an unknown id is an error object on stdout.
- `version --json`: `{"version": …, "build": "dev", "schema_version": 1}`.
- JSON: objects get `schema_version` injected; `BD_JSON_ENVELOPE=1` wraps every payload in
  `{"schema_version": 1, "data": …}`.

Knobs: FAKE_BD_FAIL=1 fails every command (exit 1, a bd-like error on stderr); FAKE_BD_SLEEP=seconds sleeps
first; FAKE_BD_GARBAGE=1 prints something that is not JSON; FAKE_BD_LOG=path appends each argv as JSON;
FAKE_BD_VERSION=x.y.z is the version it reports; FAKE_BD_FAIL_ON=verb fails only that verb (e.g. close).
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
VERSION = "1.0.3"
BOOL_FLAGS = {"--json", "--all", "--claim", "--force", "--unassigned", "--include-deferred", "--include-ephemeral"}
VALUE_FLAGS = {
    "ready": {
        "--limit",
        "-n",
        "--sort",
        "-s",
        "--assignee",
        "-a",
        "--priority",
        "-p",
        "--label",
        "-l",
        "--type",
        "-t",
        "--exclude-type",
    },
    "list": {"--limit", "-n", "--status"},
    "show": set(),
    "update": {"--status", "--assignee", "--actor"},
    "close": {"--reason", "--actor"},
    "version": set(),
}
NOT_WORK = ["merge-request", "gate", "molecule", "message", "agent", "role", "rig"]
INACTIVE = {"closed", "pinned"}


class Usage(Exception):
    pass


def main(argv: list[str]) -> int:
    if os.environ.get("FAKE_BD_LOG"):
        with open(os.environ["FAKE_BD_LOG"], "a", encoding="utf-8") as log:
            log.write(json.dumps(argv) + "\n")
    if os.environ.get("FAKE_BD_SLEEP"):
        time.sleep(float(os.environ["FAKE_BD_SLEEP"]))
    if os.environ.get("FAKE_BD_FAIL") or (argv and os.environ.get("FAKE_BD_FAIL_ON") == argv[0]):
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
    handler = {"ready": ready, "list": list_, "show": show, "update": update, "close": close, "version": version}
    return handler[command](load(), positional, flags)


def parse(argv: list[str]) -> tuple[str, list[str], dict[str, Any]]:
    if not argv or argv[0] not in VALUE_FLAGS:
        raise Usage(f'unknown command {argv[0] if argv else ""!r} for "bd"')
    command, rest = argv[0], argv[1:]
    positional: list[str] = []
    flags: dict[str, Any] = {}
    i = 0
    while i < len(rest):
        arg = rest[i]
        name, has_value, inline = arg.partition("=")
        if name in BOOL_FLAGS:
            flags[name] = True
        elif name in VALUE_FLAGS[command]:
            if not has_value:
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


def flag(flags: dict[str, Any], long: str, short: str | None = None, default: Any = None) -> Any:
    return flags.get(long, flags.get(short, default) if short else default)


def load() -> dict[str, dict[str, Any]]:
    if not STATE.exists():
        return {}
    lines = STATE.read_bytes().split(b"\n")
    items = (json.loads(line) for line in lines if line.strip())
    return {item["id"]: item for item in items if item.get("status") != "tombstone"}  # as `bd import` skips them


def save(issues: dict[str, dict[str, Any]]) -> None:
    STATE.parent.mkdir(exist_ok=True)
    text = "".join(json.dumps(issues[i], separators=(",", ":")) + "\n" for i in sorted(issues))
    STATE.write_text(text, encoding="utf-8")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def emit(value: Any, stream=sys.stdout) -> None:
    """bd's JSON output: objects get `schema_version`; BD_JSON_ENVELOPE=1 wraps everything."""
    if os.environ.get("BD_JSON_ENVELOPE") == "1":
        value = {"schema_version": 1, "data": value}
    elif isinstance(value, dict):
        value = {**value, "schema_version": 1}
    print(json.dumps(value, indent=2), file=stream)


def fatal(message: str) -> int:
    """`FatalErrorRespectJSON`: the error object on stdout, exit 1."""
    emit({"error": message})
    return 1


def bare(issue: dict[str, Any]) -> dict[str, Any]:
    """The issue as `types.Issue` marshals it without relational data."""
    return {k: v for k, v in issue.items() if k not in ("labels", "dependencies", "comments")}


def deps(issue: dict[str, Any]) -> list[dict[str, Any]]:
    return issue.get("dependencies") or []


def status(issue: dict[str, Any]) -> str:
    return issue.get("status") or "open"


def active(issues: dict[str, dict[str, Any]], issue_id: str) -> bool:
    return issue_id in issues and status(issues[issue_id]) not in INACTIVE


def children(issues: dict[str, dict[str, Any]], parent: str) -> list[str]:
    return [i for i, issue in issues.items() if any(d["depends_on_id"] == parent and d["type"] == "parent-child"
                                                     for d in deps(issue))]  # fmt: skip


def gate(dep: dict[str, Any]) -> str:
    try:
        meta = json.loads(dep.get("metadata") or "{}")
    except ValueError:
        return "all-children"
    return "any-children" if isinstance(meta, dict) and meta.get("gate") == "any-children" else "all-children"


def blocked_ids(issues: dict[str, dict[str, Any]]) -> set[str]:
    """`ComputeBlockedIDsInTx`."""
    found = set()
    for issue_id, issue in issues.items():
        if not active(issues, issue_id):
            continue
        for dep in deps(issue):
            target, kind = dep["depends_on_id"], dep["type"]
            if kind in ("blocks", "conditional-blocks") and active(issues, target):
                found.add(issue_id)
            elif kind == "waits-for":
                kids = children(issues, target)
                if gate(dep) == "any-children":
                    closed = any(status(issues[k]) == "closed" for k in kids)
                    if kids and not closed and any(active(issues, k) for k in kids):
                        found.add(issue_id)
                elif any(active(issues, k) for k in kids):
                    found.add(issue_id)
    return found


def deferred(issue: dict[str, Any]) -> bool:
    until = issue.get("defer_until")
    return bool(until) and datetime.fromisoformat(until.replace("Z", "+00:00")) > datetime.now(UTC)


def parents(issue: dict[str, Any]) -> list[str]:
    return [d["depends_on_id"] for d in deps(issue) if d["type"] == "parent-child"]


def with_counts(issues: dict[str, dict[str, Any]], issue: dict[str, Any]) -> dict[str, Any]:
    dependents = sum(1 for other in issues.values() for d in deps(other) if d["depends_on_id"] == issue["id"])
    row = {**issue, "dependency_count": len(deps(issue)), "dependent_count": dependents, "comment_count": 0}
    parent = next(iter(parents(issue)), None)
    return row | ({"parent": parent} if parent else {})


def ready(issues: dict[str, dict[str, Any]], _positional: list[str], flags: dict[str, Any]) -> int:
    blocked = blocked_ids(issues)
    types = flag(flags, "--type", "-t")
    excluded = [] if types else NOT_WORK + [t for t in (flags.get("--exclude-type") or "").split(",") if t]
    found = []
    for issue_id, issue in issues.items():
        if status(issue) != "open" or issue.get("pinned") or issue_id in blocked:
            continue
        if issue.get("ephemeral") and not flags.get("--include-ephemeral"):
            continue
        if (types and issue.get("issue_type", "task") != types) or issue.get("issue_type", "task") in excluded:
            continue
        if not flags.get("--include-deferred") and (
            deferred(issue) or any(p in issues and deferred(issues[p]) for p in parents(issue))
        ):
            continue
        if any(p in blocked for p in parents(issue)):
            continue
        if not matches(issue, flags):
            continue
        found.append(issue)
    emit([with_counts(issues, i) for i in limited(sort(found, flag(flags, "--sort", "-s", "priority")), flags, 100)])
    return 0


def matches(issue: dict[str, Any], flags: dict[str, Any]) -> bool:
    assignee, priority = flag(flags, "--assignee", "-a"), flag(flags, "--priority", "-p")
    label = flag(flags, "--label", "-l")
    if flags.get("--unassigned") and issue.get("assignee"):
        return False
    if assignee and not flags.get("--unassigned") and issue.get("assignee") != assignee:
        return False
    if priority is not None and issue.get("priority") != int(priority):
        return False
    return not label or label in (issue.get("labels") or [])


def sort(found: list[dict[str, Any]], policy: str) -> list[dict[str, Any]]:
    if policy == "oldest":
        return sorted(found, key=lambda i: (i.get("created_at", ""), i["id"]))
    if policy not in ("priority", "hybrid"):
        raise SystemExit(fatal(f"invalid sort policy '{policy}'. Valid values: hybrid, priority, oldest"))
    by_id = sorted(found, key=lambda i: i["id"])
    by_created = sorted(by_id, key=lambda i: i.get("created_at", ""), reverse=True)  # newest first, id ascending
    return sorted(by_created, key=lambda i: i.get("priority", 2))


def limited(found: list[Any], flags: dict[str, Any], default: int) -> list[Any]:
    limit = int(flag(flags, "--limit", "-n", default))
    return found[:limit] if limit > 0 else found


def list_(issues: dict[str, dict[str, Any]], _positional: list[str], flags: dict[str, Any]) -> int:
    wanted = set((flags.get("--status") or "").split(",")) - {""}
    if wanted:
        found = [i for i in issues.values() if status(i) in wanted]
    else:
        found = [i for i in issues.values() if flags.get("--all") or status(i) not in INACTIVE]
    found.sort(key=lambda i: (i.get("priority", 2), i.get("created_at", ""), i["id"]))
    emit([with_counts(issues, i) for i in limited(found, flags, 50)])
    return 0


def show(issues: dict[str, dict[str, Any]], positional: list[str], _flags: dict[str, Any]) -> int:
    if not positional:
        return fatal("at least one issue ID is required")
    details = []
    for issue_id in positional:
        issue = issues.get(issue_id)
        if issue is None:
            print(f'Error fetching {issue_id}: no issue found matching "{issue_id}"', file=sys.stderr)
            continue
        details.append(detail(issues, issue))
    if not details:
        return fatal("no issues found matching the provided IDs")
    emit(details)
    return 0


def detail(issues: dict[str, dict[str, Any]], issue: dict[str, Any]) -> dict[str, Any]:
    """`IssueDetails`: dependencies and dependents are whole issues with a `dependency_type`."""
    linked = [{**bare(issues[d["depends_on_id"]]), "dependency_type": d["type"]}
              for d in deps(issue) if d["depends_on_id"] in issues]  # fmt: skip
    dependents = [{**bare(other), "dependency_type": d["type"]}
                  for other in issues.values() for d in deps(other) if d["depends_on_id"] == issue["id"]]  # fmt: skip
    found = {**bare(issue), "labels": issue.get("labels") or None, "dependencies": linked or None,
             "dependents": dependents or None, "parent": next(iter(parents(issue)), None)}  # fmt: skip
    return {k: v for k, v in found.items() if v is not None}  # omitempty


def actor(flags: dict[str, Any]) -> str:
    return flags.get("--actor") or os.environ.get("BEADS_ACTOR") or os.environ.get("USER") or "unknown"


def update(issues: dict[str, dict[str, Any]], positional: list[str], flags: dict[str, Any]) -> int:
    if not positional:
        return fatal("update requires at least one issue ID")
    new_status = flags.get("--status")
    if new_status and new_status not in ("open", "in_progress", "blocked", "deferred", "closed", "pinned", "hooked"):
        return fatal(f"invalid status {new_status!r} (built-in: open, in_progress, blocked, deferred, closed, pinned, "
                     "hooked; or configure custom statuses via 'bd config set status.custom')")  # fmt: skip
    changed = []
    for issue_id in positional:
        issue = issues.get(issue_id)
        if issue is None:
            print(f'Error resolving {issue_id}: no issue found matching "{issue_id}"', file=sys.stderr)
            continue
        if flags.get("--claim"):
            refused = claim(issue, actor(flags))
            if refused:
                print(f"Error claiming {issue_id}: {refused}", file=sys.stderr)
                continue
        if new_status:
            issue["status"] = new_status
            if new_status != "closed":
                issue.pop("closed_at", None)
        if "--assignee" in flags:
            if flags["--assignee"]:
                issue["assignee"] = flags["--assignee"]
            else:
                issue.pop("assignee", None)
        issue["updated_at"] = now()
        changed.append(bare(issue))
    return saved(issues, changed)


def saved(issues: dict[str, dict[str, Any]], changed: list[dict[str, Any]]) -> int:
    """Keep what changed and print it; nothing changed is exit 1 (bd's refusals were on stderr already)."""
    if not changed:
        return 1
    save(issues)
    emit(changed)
    return 0


def claim(issue: dict[str, Any], who: str) -> str | None:
    """`ClaimIssueInTx`'s compare-and-swap; the refusal's words, or None when claimed."""
    assignee = issue.get("assignee") or ""
    if status(issue) == "open" and assignee in ("", who):
        issue.update(assignee=who, status="in_progress")
        issue.setdefault("started_at", now())
        return None
    if status(issue) == "in_progress" and assignee == who:
        return None  # idempotent: ours already
    if assignee and assignee != who:
        return f"issue already claimed by {assignee}"
    return f"issue not claimable: status {status(issue)}"


def close(issues: dict[str, dict[str, Any]], positional: list[str], flags: dict[str, Any]) -> int:
    if not positional:
        return fatal("close requires at least one issue ID")
    for issue_id in positional:
        if issue_id not in issues:
            return fatal(f'resolving ID {issue_id}: no issue found matching "{issue_id}"')
    closed = []
    for issue_id in positional:
        issue = issues[issue_id]
        refusal = None if flags.get("--force") else close_refusal(issues, issue)
        if refusal:
            print(refusal, file=sys.stderr)
            continue
        stamp = now()
        issue.update(status="closed", closed_at=stamp, updated_at=stamp, close_reason=flags.get("--reason", "Closed"))
        closed.append(bare(issue))
    return saved(issues, closed)


def close_refusal(issues: dict[str, dict[str, Any]], issue: dict[str, Any]) -> str | None:
    issue_id = issue["id"]
    if status(issue) == "pinned":
        return f"cannot modify pinned issue {issue_id} (use --force to override)"
    if issue.get("issue_type") == "epic":
        still_open = [k for k in children(issues, issue_id) if status(issues[k]) != "closed"]
        if still_open:
            return (f"cannot close epic {issue_id}: {len(still_open)} open child issue(s); close children first "
                    "or use --force to override")  # fmt: skip
    if issue_id in blocked_ids(issues):
        blockers = [d["depends_on_id"] + ("" if d["type"] == "blocks" else f" ({d['type']})")
                    for d in deps(issue) if d["type"] in ("blocks", "conditional-blocks", "waits-for")
                    and active(issues, d["depends_on_id"])]  # fmt: skip
        return f"cannot close {issue_id}: blocked by open issues [{' '.join(blockers)}] (use --force to override)"
    return None


def version(_issues: dict[str, dict[str, Any]], _positional: list[str], _flags: dict[str, Any]) -> int:
    emit({"version": os.environ.get("FAKE_BD_VERSION", VERSION), "build": "dev"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
