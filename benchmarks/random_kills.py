"""Random kills (issue 36's figure): session lifecycles against a real `taskgate serve --http` that is SIGKILLed at
random moments and started again on the same data, on SQLite and on PostgreSQL.

Per database, on a fresh git repository and data dir of its own (PostgreSQL: a fresh database created on the server
and dropped at the end), N lifecycles one after another (`--concurrency`: several at a time), each a session of its
own task driven over MCP (streamable HTTP, operator token) as an operator would: start, execute with a scripted
agent that commits, and by the seeded plan request changes, a flaky agent and a retry, main moved so the merge must
rebase, then approve and merge, or reject with auto_revert, or cancel. The plan also says where the server dies: 0-3
timer kills per lifecycle, sometimes a named crash point armed (`TASKGATE_CRASH_AT`, the server kills itself there),
sometimes a second kill during the start-up (recovery) that follows. The harness is `tests/support/random_kills.py`;
its docstring says exactly what is counted.

Figures per database: lifecycles, kills, acknowledged writes (a write call that returned success; how many of
them were looked up again after a later kill), **lost** (an acknowledged write missing from the log after a
restart; goal 0), **stuck** (a session that, after the last restart, stays `stuck_after` seconds in a state no
operator call moves on; goal 0), and other faults (work on main twice or not at all, a worktree or branch left
behind, a server that exited by itself, a traceback in a server log). Each case is listed with its session, its
last transitions and the errors the server answered. Exit status 1 when anything was found.

Run:  .venv/bin/python benchmarks/random_kills.py [--lifecycles 60] [--seed N] [--concurrency 1] [--skip-sqlite]
                                                  [--skip-pg] [--pg-url URL] [--stuck-after 60] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.random_kills import Finding, Report, run_random_kills  # noqa: E402

PG_URL = os.environ.get("TASKGATE_BENCH_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")


def cpu_model() -> str:
    """The CPU model as /proc/cpuinfo names it (figures move with it: write it beside them)."""
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


async def _admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def on_database(label: str, server_url: str | None, args: argparse.Namespace) -> Report:
    """One database's run in a scratch folder (kept with --keep, or when something was found)."""
    root = Path(tempfile.mkdtemp(prefix=f"taskgate-kills-{label.lower()}-"))
    name = f"taskgate_kills_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    url = None
    if server_url is not None:
        asyncio.run(_admin(server_url, f'CREATE DATABASE "{name}"'))
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    print(f"\n{label}: {args.lifecycles} lifecycles in {root}" + (f", database {name}" if url else ""), flush=True)
    try:
        report = run_random_kills(root, label, url, args.lifecycles, args.seed, concurrency=args.concurrency,
                                  stuck_after_s=args.stuck_after, say=lambda line: print(line, flush=True))  # fmt: skip
    finally:
        if url is not None:
            asyncio.run(_admin(server_url or "", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    if report.failed or args.keep:
        print(f"kept {root} (server logs: server-N.log, the repository: repo/)")
    else:
        shutil.rmtree(root, ignore_errors=True)
    print_report(report)
    return report


def print_report(r: Report) -> None:
    """One database's table, then every lost/stuck/faulty case, then what the kills hit and what was answered."""
    points = {k.removeprefix("point:"): n for k, n in r.kills.items() if k.startswith("point:")}
    kills = sum(r.kills.values())
    print(f"\n### {r.database} (seed {r.seed}, {r.seconds:.0f} s)\n")
    print("| lifecycles | kills (timer / armed point / during start-up) | acknowledged writes (looked up after a "
          "later kill) | lost | stuck | other faults |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    print(f"| {r.lifecycles} | {kills} ({r.kills['timer']} / {sum(points.values())} / {r.kills['start-up']}) "
          f"| {r.acknowledged} ({r.checked_after_kill}) | {len(r.of_kind('lost'))} | {len(r.of_kind('stuck'))} "
          f"| {len(r.of_kind('fault'))} |")  # fmt: skip
    print(f"\noutcomes: {_counts(r.outcomes)}")
    print(f"armed points that fired: {_counts(points) or 'none'}")
    print(f"kills by the state the operator last saw: {_counts(r.kill_states)}")
    for kind in ("lost", "stuck", "fault"):
        for finding in r.of_kind(kind):
            _print_finding(finding)
    if r.errors:
        print("\nerrors the server answered (ids, paths and numbers blanked), most frequent first:")
        for text, n in r.errors.most_common():
            print(f"  {n:4d} × {text}")


def _print_finding(f: Finding) -> None:
    print(f"\n{f.kind.upper()} {f.task} session {f.session_id or '-'}: {f.what}")
    if f.scenario:
        print(f"  plan: {f.scenario}")
        print(f"  killed: {', '.join(f.kills) or 'never'}")
    for line in f.last_states:
        print(f"  log: {line}")
    for line in f.errors:
        print(f"  error: {line}")


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lifecycles", type=int, default=60, help="lifecycles per database (60)")
    parser.add_argument("--concurrency", type=int, default=1, help="lifecycles at a time (1)")
    parser.add_argument("--seed", type=int, default=None, help="the plan's seed (default: a random one, printed)")
    parser.add_argument("--skip-sqlite", action="store_true", help="PostgreSQL only")
    parser.add_argument("--skip-pg", action="store_true", help="SQLite only")
    parser.add_argument("--pg-url", default=PG_URL, help=f"server and admin database ({PG_URL}, or "
                        "TASKGATE_BENCH_PG_URL); a fresh database is made there and dropped")  # fmt: skip
    stuck = "seconds unchanged after the last restart before a session counts as stuck (60)"
    parser.add_argument("--stuck-after", type=float, default=60.0, help=stuck)
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders (kept anyway on a finding)")
    args = parser.parse_args()
    if args.lifecycles < 1 or args.concurrency < 1 or args.stuck_after <= 0:
        parser.error("--lifecycles and --concurrency must be ≥ 1, --stuck-after > 0")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 1_000_000)
    return args


def main() -> int:
    args = parse_args()
    started = time.monotonic()
    print(f"random kills: seed {args.seed}, {args.lifecycles} lifecycles per database, {args.concurrency} at a time")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    reports = []
    if not args.skip_sqlite:
        reports.append(on_database("SQLite", None, args))
    if not args.skip_pg:
        reports.append(on_database("PostgreSQL", args.pg_url, args))
    print(
        f"\n## Summary (seed {args.seed}; {cpu_model()}, {os.cpu_count()} cores; {time.monotonic() - started:.0f} s)\n"
    )
    print(
        "| database | lifecycles | kills | acknowledged writes | lost (goal 0) | stuck (goal 0) | other faults | time |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in reports:
        print(f"| {r.database} | {r.lifecycles} | {sum(r.kills.values())} | {r.acknowledged} | "
              f"{len(r.of_kind('lost'))} | {len(r.of_kind('stuck'))} | {len(r.of_kind('fault'))} | "
              f"{r.seconds:.0f} s |")  # fmt: skip
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if any(r.failed for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
