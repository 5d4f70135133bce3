"""The Beads import as a user meets it: `taskgate task import-beads` on a large export, then `taskgate task ready`.

A synthetic export is generated per size (not timed), shaped as Beads writes `.beads/issues.jsonl`: one issue a
line, sorted by id, hash ids in base36 (`bd-a1b2`, longer as the database grows; `bd-a1b2.3` for children made
with `--parent`), a title and a description of 50-300 characters (a little non-ASCII), a status mix (~62%
closed, ~30% open, some in_progress, blocked, deferred with `defer_until`, hooked, pinned, tombstone), priority
0-4, issue types task/bug/feature/chore/epic and a few molecule/gate/message (half the messages ephemeral),
RFC 3339 times, labels, and dependencies as Beads writes them (`{issue_id, depends_on_id, type, created_at,
created_by}`): parent-child to epics, blocks, related, discovered-from, waits-for from gates to molecules (some with
the any-children gate in `metadata`), a few on missing ids and on `external:proj:cap`. About 640 bytes a line, so
80,000 issues are 51.5 MB.

For each size and round, in a fresh git repository set up with the real `taskgate init` (SQLite in
.taskgate/data), every command runs as the real CLI in a subprocess, as a user runs it (stdout to a file):

- **first import**: `taskgate task import-beads FILE`, wall time and peak RSS of that child (`os.wait4`);
- **re-import** of the same file (nothing changes: every issue `unchanged`);
- **`task ready`** (the table; it prints every ready task, no paging) and **`task ready --json`**, --runs each.

Baselines in the same run, interleaved with ours: for the import, the **parse floor** (a fresh `python` that reads
the file and `json.loads` every line: the least any import does); for `task ready`, the **CLI start floor**
(`taskgate version`, which imports what every command imports), the **open floor** (`taskgate project list`: the
same start plus what every command that opens taskgate does: settings, bootstrap, the migration check, the local
agent endpoint, the project lookup, one small query), the interpreter floor (`python -c pass`), and the
**ready SQL** alone: the same SELECT as `TaskRepository.ready` (the NOT EXISTS shape of
infrastructure/db/work_store.py) through bare `sqlite3` on the database file, in this process, plus the second
query that reads the listed tasks' blockers. Each figure is the median of its runs.

With --profile, the largest size is imported once more under cProfile (fresh repository: first import, re-import,
`task ready`, `task ready --json`) and the top functions by cumulative and by own time are printed.

Run:  .venv/bin/python benchmarks/beads_import.py                  # --sizes 10000 80000; ~5-10 min on 2 cores
      .venv/bin/python benchmarks/beads_import.py --sizes 10000 --rounds 3 --profile
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench_support import git_repo

from taskgate.domain.beads import WAITS_FOR_ANY
from taskgate.domain.entities import PlanStatus, TaskStatus
from taskgate.domain.states import TERMINAL_STATES

BIN = Path(sys.executable).parent
TASKGATE, PYTHON = str(BIN / "taskgate"), sys.executable
PARSE_FLOOR = (
    "import json, sys\n"
    "data = open(sys.argv[1], 'rb').read()\n"
    "issues = [json.loads(line) for line in data.split(b'\\n') if line.strip()]\n"
    "assert all(isinstance(i, dict) for i in issues)\n"
)
OURS = r"taskgate/(application|domain|infrastructure|entrypoints/(render|cli/common))|rich/console.py:\d+\(print\)"
SUMMARY = re.compile(r"(\d+) created, (\d+) updated, (\d+) unchanged, (\d+) deleted, (\d+) skipped, (\d+) ready")

# --- the synthetic export ----------------------------------------------------------------------------------------

B36 = "0123456789abcdefghijklmnopqrstuvwxyz"
STATUSES = [("closed", 620), ("open", 300), ("in_progress", 30), ("blocked", 15), ("deferred", 10), ("hooked", 5),
            ("pinned", 5), ("tombstone", 15)]  # fmt: skip
TYPES = [("task", 440), ("bug", 200), ("feature", 180), ("chore", 50), ("epic", 80), ("molecule", 15),
         ("gate", 15), ("message", 20)]  # fmt: skip
PEOPLE = ["alice", "bob", "carol", "dmitri", "eve", "farah", "agent-claude-1", "agent-codex-2", "polecat-7"]
LABELS = ["backend", "frontend", "api", "db", "infra", "docs", "tests", "perf", "security", "ux", "ci", "cli",
          "tech-debt", "p-sprint-12", "needs-review", "good-first-issue"]  # fmt: skip
VERBS = ["Add", "Fix", "Refactor", "Remove", "Document", "Speed up", "Test", "Migrate", "Split", "Validate", "Cache",
         "Retry", "Log", "Expose", "Harden"]  # fmt: skip
THINGS = ["the session sweeper", "webhook delivery", "the import of Beads exports", "plan closing", "token revocation",
          "the worktree reconciler", "the MCP stdio transport", "audit queries by actor", "the console board",
          "agent heartbeats", "the WIP guard", "priority ordering", "retry back-off", "the config loader",
          "PostgreSQL advisory locks", "log tails", "the merge step", "checklist rendering"]  # fmt: skip
WORDS = (  # noqa: SIM905 (prose vocabulary, read as a sentence)
    "the a when if then because so that this it we our user agent session task plan import export database row "
    "column index query latency timeout retry error warning lock commit rollback transaction branch worktree "
    "merge review approve reject status priority blocker dependency parent child epic gate molecule ready "
    "should must may never always before after during until unless while fast slow large small empty full "
    "returns raises writes reads keeps drops adds removes checks counts waits starts stops fails passes "
    "see docs/trackers.md repro steps expected actual logs attached — naïve café über"
).split()


def _b36(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(B36) for _ in range(length))


def _pick(rng: random.Random, weighted: list[tuple[str, int]]) -> str:
    return rng.choices([w for w, _ in weighted], [n for _, n in weighted])[0]


def _when(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond:06d}Z"


def _prose(rng: random.Random, chars: int) -> str:
    out, size = [], 0
    while size < chars:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16)))
        sentence = sentence[0].upper() + sentence[1:] + "."
        out.append(sentence)
        size += len(sentence) + 1
        if rng.random() < 0.12:
            out.append("\n\n")
    return " ".join(out).replace(" \n\n ", "\n\n")


def generate_export(count: int, seed: int = 17) -> list[str]:
    """`count` Beads issues as JSONL lines, sorted by id. Issues are made in time order, so a dependency points at
    an issue made earlier (as in Beads: no blocking cycles); sorting by id then scatters them through the file."""
    rng = random.Random(seed)
    length = 4 if count <= 15_000 else 5 if count <= 500_000 else 6
    used: set[str] = set()
    start = datetime(2024, 1, 8, 9, 0, tzinfo=UTC)
    span = timedelta(days=700)
    now = datetime.now(UTC)
    epics: list[str] = []
    molecules: list[str] = []
    children: dict[str, int] = {}
    made: list[str] = []
    issues: list[dict] = []
    for n in range(count):
        jitter = timedelta(seconds=rng.randint(0, 3000), microseconds=rng.randint(0, 10**6 - 1))
        created = start + span * (n / count) + jitter
        kind = _pick(rng, TYPES)
        parent = None
        if epics and kind not in ("epic", "molecule", "message") and rng.random() < 0.45:
            parent = rng.choice(epics[-150:])
        if parent and rng.random() < 0.4:  # made with `bd create --parent`: a hierarchical id
            children[parent] = children.get(parent, 0) + 1
            issue_id = f"{parent}.{children[parent]}"
        else:
            issue_id = f"bd-{_b36(rng, length)}"
            while issue_id in used:
                issue_id = f"bd-{_b36(rng, length)}"
        used.add(issue_id)
        status = _pick(rng, STATUSES)
        if n > count * 0.85 and status == "closed" and rng.random() < 0.6:
            status = "open"  # recent work is more often still open
        owner = rng.choice(PEOPLE)
        updated = min(created + timedelta(hours=rng.randint(0, 24 * 40)), now)
        issue: dict = {
            "id": issue_id,
            "title": f"{rng.choice(VERBS)} {rng.choice(THINGS)}" + (f" ({_b36(rng, 3)})" if rng.random() < 0.5 else ""),
            "description": _prose(rng, rng.randint(50, 200)),
        }
        if rng.random() < 0.08:
            issue["acceptance_criteria"] = "- " + _prose(rng, rng.randint(30, 80))
        issue |= {"status": status, "priority": rng.choices(range(5), [5, 20, 45, 22, 8])[0], "issue_type": kind}
        if status in ("in_progress", "hooked") or rng.random() < 0.2:
            issue["assignee"] = rng.choice(PEOPLE)
        issue |= {"owner": owner, "created_at": _when(created), "created_by": owner, "updated_at": _when(updated)}
        if status == "closed":
            reason = rng.choice(["Done", "Completed", "Fixed", "Duplicate", "Won't fix"])
            issue |= {"closed_at": _when(updated), "close_reason": reason}
        elif status == "deferred":
            issue["defer_until"] = _when(now + timedelta(days=rng.randint(3, 90)))
        elif status == "pinned":
            issue["pinned"] = True
        elif status == "tombstone":
            issue |= {"deleted_at": _when(updated), "deleted_by": owner, "delete_reason": "duplicate"}
            issue["original_type"] = kind
        if kind == "message" and rng.random() < 0.5:
            issue["ephemeral"] = True
        if rng.random() < 0.7:
            issue["labels"] = sorted(rng.sample(LABELS, rng.randint(1, 3)))
        deps: list[tuple[str, str, str | None]] = []  # (target, type, metadata)
        if parent:
            deps.append((parent, "parent-child", None))
        if made and rng.random() < 0.28:
            for target in {rng.choice(made[-2000:]) for _ in range(rng.randint(1, 2))}:
                deps.append((target, "blocks", None))
        if made and rng.random() < 0.08:
            deps.append((rng.choice(made), "related", None))
        if made and rng.random() < 0.07:
            deps.append((rng.choice(made[-500:]), "discovered-from", None))
        if molecules and (kind == "gate" or rng.random() < 0.003):
            gate = '{"gate":"any-children"}' if rng.random() < 0.4 else None
            deps.append((rng.choice(molecules[-50:]), "waits-for", gate))
        if rng.random() < 0.01:  # a blocker that is not in the export (deleted long ago, another clone's)
            deps.append((f"bd-{_b36(rng, length + 1)}", "blocks", None))
        if rng.random() < 0.005:
            project, capability = rng.choice(["infra", "web", "sdk"]), rng.choice(["deploy-api", "auth-v2", "quota"])
            deps.append((f"external:{project}:{capability}", "blocks", None))
        if deps:
            issue["dependencies"] = [
                {"issue_id": issue_id, "depends_on_id": target, "type": dtype,
                 "created_at": _when(created + timedelta(minutes=rng.randint(0, 600))), "created_by": owner}
                | ({"metadata": meta} if meta else {})
                for target, dtype, meta in deps if target != issue_id
            ]  # fmt: skip
        if rng.random() < 0.25:
            issue["comment_count"] = rng.randint(1, 6)
        issues.append(issue)
        made.append(issue_id)
        if kind == "epic":
            epics.append(issue_id)
        elif kind == "molecule":
            molecules.append(issue_id)
    issues.sort(key=lambda i: i["id"])
    return [json.dumps(i, ensure_ascii=False, separators=(",", ":")) for i in issues]


# --- running the CLI as a user does ------------------------------------------------------------------------------


class Run:
    def __init__(self, wall: float, rss_kb: int, code: int, out: Path) -> None:
        self.wall, self.rss_mb, self.code, self.out = wall, rss_kb / 1024, code, out


# Linux carries a process's RSS high-water mark across fork and exec, so a child forked from this script (which holds
# the export) would report this script's RSS as its own peak. A tiny launcher forks the command instead, and reports
# the command's own peak from `os.wait4`.
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def spawn(argv: list[str], cwd: Path, env: dict[str, str], out: Path) -> Run:
    """Wall time (the launcher's start, ~15 ms, included) and the command's own peak RSS."""
    rss = out.with_suffix(".rss")
    with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
        began = time.perf_counter()
        proc = subprocess.run([PYTHON, "-c", LAUNCHER, str(rss), *argv], cwd=cwd, env=env, stdout=stdout,
                              stderr=stderr)  # fmt: skip
        wall = time.perf_counter() - began
    return Run(wall, int(rss.read_text()), proc.returncode, out)


def must(run: Run, *codes: int) -> Run:
    if run.code not in (codes or (0,)):
        err = run.out.with_suffix(".err").read_text(errors="replace")[-2000:]
        raise SystemExit(f"exit {run.code} ({run.out.name}): {err}")
    return run


def fresh_repo(root: Path, env: dict[str, str]) -> Path:
    repo = git_repo(root)
    must(spawn([TASKGATE, "init", "--name", "bench"], repo, env, root / "init.out"))
    return repo


def summary(run: Run) -> dict[str, int]:
    found = SUMMARY.search(run.out.read_text(errors="replace"))
    if not found:
        raise SystemExit(f"no summary line in {run.out}")
    keys = ["created", "updated", "unchanged", "deleted", "skipped", "ready"]
    return dict(zip(keys, map(int, found.groups()), strict=True))


# --- the ready SQL alone -----------------------------------------------------------------------------------------

_TERMINAL = ", ".join(f"'{s.value}'" for s in TERMINAL_STATES)
READY_SQL = f"""
SELECT tk.* FROM tasks AS tk
WHERE tk.project_id = ? AND tk.status = '{TaskStatus.OPEN.value}' AND tk.hold IS NULL
  AND NOT EXISTS (SELECT 1 FROM sessions AS s WHERE s.task_id = tk.id AND s.state NOT IN ({_TERMINAL}))
  AND NOT EXISTS (
    SELECT 1 FROM task_dependencies AS dep, tasks AS blocker
    WHERE dep.task_id = tk.id AND dep.depends_on_id = blocker.id AND blocker.status != '{TaskStatus.COMPLETED.value}'
      AND (dep.type != '{WAITS_FOR_ANY}' OR NOT EXISTS (
        SELECT 1 FROM task_dependencies AS dep_any, tasks AS done_any
        WHERE dep_any.task_id = tk.id AND dep_any.type = '{WAITS_FOR_ANY}' AND dep_any.depends_on_id = done_any.id
          AND done_any.status = '{TaskStatus.COMPLETED.value}')))
  AND NOT EXISTS (SELECT 1 FROM plans AS pl WHERE pl.id = tk.plan_id AND pl.status = '{PlanStatus.CLOSED.value}')
ORDER BY tk.priority, tk.created_at, tk.id
"""
BLOCKERS_SQL = "SELECT task_id, depends_on_id FROM task_dependencies WHERE task_id IN"  # + the listed ids


IN_PROCESS = """
import asyncio, json, sys, time
from taskgate.bootstrap import bootstrap, load_settings

async def main(runs):
    app = await bootstrap(load_settings())
    try:
        project = (await app.tracker.list_projects())[0]
        out = {"page": [], "all": []}
        for key, limit in (("page", 100), ("all", None)):
            for n in range(runs + 1):  # the first warms caches and is dropped
                began = time.perf_counter()
                await app.tracker.ready_tasks(project.id, limit)
                if n:
                    out[key].append(time.perf_counter() - began)
        print(json.dumps(out))
    finally:
        await app.close()

asyncio.run(main(int(sys.argv[1])))
"""
"""`TrackerService.ready_tasks` in a process that has taskgate open (what project_ready_tasks and the console pay):
the first page (100, the CLI's default) and the whole list."""


def ready_sql(db: Path, runs: int) -> tuple[list[float], list[float], int, list[str]]:
    """Per run: the ready SELECT + fetchall (s), and with the blockers query of the listed tasks; rows; the plan."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        project_id = conn.execute("SELECT id FROM projects").fetchone()[0]
        plan = [row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + READY_SQL, (project_id,))]
        alone, both, rows = [], [], 0
        for _ in range(runs + 1):  # the first warms the page cache and is dropped
            began = time.perf_counter()
            found = conn.execute(READY_SQL, (project_id,)).fetchall()
            mid = time.perf_counter()
            ids = [r[0] for r in found]
            for i in range(0, len(ids), 30_000):  # (SQLite's 32,766 variables)
                chunk = ids[i : i + 30_000]
                marks = ",".join("?" * len(chunk))
                conn.execute(f"{BLOCKERS_SQL} ({marks})", chunk).fetchall()
            end = time.perf_counter()
            alone.append(mid - began)
            both.append(end - began)
            rows = len(found)
        return alone[1:], both[1:], rows, plan
    finally:
        conn.close()


# --- one size ----------------------------------------------------------------------------------------------------


def med(values: list[float]) -> float:
    return statistics.median(values)


def one_size(size: int, rounds: int, runs: int, tmp: Path | None, keep: dict) -> dict:
    began = time.perf_counter()
    lines = generate_export(size)
    data = ("\n".join(lines) + "\n").encode()
    print(f"\n== {size:,} issues: export {len(data) / 1e6:.1f} MB, {len(data) / size:.0f} bytes a line "
          f"(generated in {time.perf_counter() - began:.1f} s, not timed)", flush=True)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    env |= {"TASKGATE_OPERATOR__DEFAULT": "alice", "COLUMNS": "200"}
    fig: dict[str, list[float]] = {k: [] for k in ("first", "first_rss", "again", "again_rss", "parse", "parse_rss",
                                                   "ready", "ready_rss", "json", "json_rss", "start", "open", "pass",
                                                   "sql", "sql_both", "use_case_page", "use_case_all")}  # fmt: skip
    counts: dict = {}
    with tempfile.TemporaryDirectory(prefix="tg-beads-", dir=tmp) as scratch:
        root = Path(scratch)
        export = root / "issues.jsonl"
        export.write_bytes(data)
        del data, lines
        for r in range(rounds):
            work = root / f"round{r}"
            work.mkdir()
            repo = fresh_repo(work, env)
            parse = must(spawn([PYTHON, "-c", PARSE_FLOOR, str(export)], repo, env, work / "parse.out"))
            first = must(spawn([TASKGATE, "task", "import-beads", str(export)], repo, env, work / "first.out"), 0, 3)
            parse2 = must(spawn([PYTHON, "-c", PARSE_FLOOR, str(export)], repo, env, work / "parse2.out"))
            again = must(spawn([TASKGATE, "task", "import-beads", str(export)], repo, env, work / "again.out"), 0, 3)
            made, same = summary(first), summary(again)
            print(f"  round {r + 1}: first import {first.wall:.2f} s ({first.rss_mb:.0f} MB), re-import "
                  f"{again.wall:.2f} s ({again.rss_mb:.0f} MB), parse floor {parse.wall:.2f} / {parse2.wall:.2f} s; "
                  f"first: {made}; again: {same}", flush=True)  # fmt: skip
            assert made["created"] + made["skipped"] == size, made
            assert same["created"] == same["updated"] == same["deleted"] == 0, same
            fig["first"].append(first.wall)
            fig["first_rss"].append(first.rss_mb)
            fig["again"].append(again.wall)
            fig["again_rss"].append(again.rss_mb)
            fig["parse"] += [parse.wall, parse2.wall]
            fig["parse_rss"] += [parse.rss_mb, parse2.rss_mb]
            counts = {"report": made, "warnings": first.out.read_text(errors="replace").count("  note, line ")}
            for _ in range(runs):
                start = must(spawn([TASKGATE, "version"], repo, env, work / "version.out"))
                opened = must(spawn([TASKGATE, "project", "list"], repo, env, work / "projects.out"))
                ready = must(spawn([TASKGATE, "task", "ready"], repo, env, work / "ready.out"))
                listed = must(
                    spawn([TASKGATE, "task", "ready", "--json", "--limit", "0"], repo, env, work / "ready.json")
                )
                bare = must(spawn([PYTHON, "-c", "pass"], repo, env, work / "pass.out"))
                fig["start"].append(start.wall)
                fig["open"].append(opened.wall)
                fig["ready"].append(ready.wall)
                fig["ready_rss"].append(ready.rss_mb)
                fig["json"].append(listed.wall)
                fig["json_rss"].append(listed.rss_mb)
                fig["pass"].append(bare.wall)
            rows = json.loads((work / "ready.json").read_text())
            table_lines = (work / "ready.out").read_text().count("\n")
            db = repo / ".taskgate" / "data" / "taskgate.db"
            alone, both, sql_rows, plan = ready_sql(db, max(runs, 5))
            fig["sql"] += alone
            fig["sql_both"] += both
            timed = json.loads(must(spawn([PYTHON, "-c", IN_PROCESS, str(max(runs, 5))], repo, env,
                                          work / "inproc.out")).out.read_text())  # fmt: skip
            fig["use_case_page"] += timed["page"]
            fig["use_case_all"] += timed["all"]
            counts |= {"ready_rows": len(rows), "sql_rows": sql_rows, "table_lines": table_lines,
                       "ready_out_kb": (work / "ready.out").stat().st_size / 1024,
                       "json_out_kb": (work / "ready.json").stat().st_size / 1024,
                       "db_mb": db.stat().st_size / 1e6, "plan": plan}  # fmt: skip
            assert len(rows) == sql_rows == made["ready"], (len(rows), sql_rows, made["ready"])
            if keep.get("profile_size") == size and r == rounds - 1:
                keep["export"] = export.read_bytes()
    out = {k: med(v) for k, v in fig.items()} | {"size": size, **counts}
    print(f"  ready rows: {counts['ready_rows']:,} (= the import's `ready` count and the bare SQL's); `task ready` "
          f"prints the first 100: {counts['table_lines']:,} lines, {counts['ready_out_kb']:.0f} KiB (--json --limit 0 "
          f"{counts['json_out_kb']:.0f} KiB); import notes (blockers not in the export): {counts['warnings']:,}; "
          f"database {counts['db_mb']:.1f} MB")  # fmt: skip
    print("  ready SQL plan: " + " | ".join(counts["plan"]))
    return out


def profile(size: int, tmp: Path | None, data: bytes, top: int) -> None:
    """Under cProfile, on a fresh repository of `size` issues: the first import, the re-import, `task ready` and
    `task ready --json`. Printed: taskgate's own functions by cumulative time (the CLI and asyncio frames above them
    left out), then every function by own time."""
    import pstats

    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    env |= {"TASKGATE_OPERATOR__DEFAULT": "alice", "COLUMNS": "200"}
    with tempfile.TemporaryDirectory(prefix="tg-beads-prof-", dir=tmp) as scratch:
        root = Path(scratch)
        export = root / "issues.jsonl"
        export.write_bytes(data)
        repo = fresh_repo(root, env)
        commands = [("first import", ["import-beads", str(export)]), ("re-import", ["import-beads", str(export)]),
                    ("task ready", ["ready"]),
                    ("task ready --json --limit 0", ["ready", "--json", "--limit", "0"])]  # fmt: skip
        for n, (name, args) in enumerate(commands):
            prof = root / f"{n}.prof"
            argv = [PYTHON, "-m", "cProfile", "-o", str(prof), TASKGATE, "task", *args]
            run = must(spawn(argv, repo, env, root / f"{n}.out"), 0, 3)
            print(f"\n== cProfile, {name} ({size:,} issues): {run.wall:.2f} s under the profiler")
            stats = pstats.Stats(str(prof))
            stats.sort_stats("cumulative").print_stats(OURS, top)
            stats.sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 80_000])
    parser.add_argument("--rounds", type=int, help="fresh imports per size (default 2 up to 20,000, else 1)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each `task ready` command per round")
    parser.add_argument("--tmp", type=Path, default=None, help="where the scratch repositories go (default $TMPDIR)")
    parser.add_argument("--profile", action="store_true", help="also profile the import of the largest size")
    parser.add_argument("--profile-top", type=int, default=25)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores); sqlite {sqlite3.sqlite_version}")
    keep: dict = {"profile_size": max(args.sizes) if args.profile else None}
    results = []
    for size in args.sizes:
        rounds = args.rounds or (2 if size <= 20_000 else 1)
        results.append(one_size(size, rounds, args.runs, args.tmp, keep))

    print("\nmedians; ratio = ours / baseline of the same run")
    print(f"{'issues':>8} | {'first import':>12} | {'peak RSS':>8} | {'re-import':>9} | {'parse floor':>11} | "
          f"{'first/floor':>11} | {'re/floor':>8} | {'task ready':>10} | {'--json':>8} | {'version':>7} | "
          f"{'project list':>12} | {'ready/list':>10} | {'ready SQL':>9} | {'SQL+blockers':>12} | "
          f"{'ready rows':>10}")  # fmt: skip
    for f in results:
        print(f"{f['size']:>8,} | {f['first']:>10.2f} s | {f['first_rss']:>5.0f} MB | {f['again']:>7.2f} s | "
              f"{f['parse']:>7.2f} s ({f['parse_rss']:.0f} MB) | {f['first'] / f['parse']:>10.1f}x | "
              f"{f['again'] / f['parse']:>7.1f}x | {f['ready'] * 1e3:>7.0f} ms | {f['json'] * 1e3:>5.0f} ms | "
              f"{f['start'] * 1e3:>4.0f} ms | {f['open'] * 1e3:>9.0f} ms | {f['ready'] / f['open']:>9.2f}x | "
              f"{f['sql'] * 1e3:>6.1f} ms | "
              f"{f['sql_both'] * 1e3:>9.1f} ms | {f['ready_rows']:>10,}")  # fmt: skip
    for f in results:
        print(f"{f['size']:,} issues: peak RSS re-import {f['again_rss']:.0f} MB, task ready {f['ready_rss']:.0f} MB "
              f"(--json {f['json_rss']:.0f} MB); python -c pass {f['pass'] * 1e3:.0f} ms; task ready above "
              f"`project list` {(f['ready'] - f['open']) * 1e3:.0f} ms (--json {(f['json'] - f['open']) * 1e3:.0f} "
              f"ms), {(f['ready'] - f['open']) / max(f['sql_both'], 1e-6):.0f}x the bare SQL; --json / project list "
              f"{f['json'] / f['open']:.2f}x")  # fmt: skip
    for f in results:
        print(f"{f['size']:,} issues, in a process with taskgate open (project_ready_tasks, the console): "
              f"ready_tasks first page (100) {f['use_case_page'] * 1e3:.1f} ms, whole list ({f['ready_rows']:,}) "
              f"{f['use_case_all'] * 1e3:.0f} ms; the bare SQL of the whole list {f['sql_both'] * 1e3:.0f} ms "
              f"(page / bare SQL {f['use_case_page'] / f['sql_both']:.2f}x)")  # fmt: skip
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if args.profile:
        profile(keep["profile_size"], args.tmp, keep["export"], args.profile_top)


if __name__ == "__main__":
    main()
