"""Decision latency over MCP stdio: `project_decide` (approve) next to `session_status` in the same run.

A scratch repository and data directory are set up through the real CLI (`taskgate init`, `plan add`, the
operator's capacity raised), then `taskgate serve` is spawned and driven by the SDK client over stdio. For
each of N tasks, untimed: `task_add`, `project_session_start` (worktree created), `plan_complete`,
`work_complete`; then timed, one after the other: `session_status` and `project_decide(approve)` on that
session. A decision is: authorisation by role, the idempotency lookup (both in one read transaction), the
guarded `approve` transition with the decision row written in its transaction (the operator's row locked), and
the events; the transition reads the session's worktree with git twice (its guards' worktree state before it:
three git processes, two of them in a row; and the head and change the approval records: three side by side),
which is most of its time. Prints median and
p99 of both, the ratio, and whether it meets issue 20's goal (≤ 2× session_status at the median); the load
average before and after. The WIP limit is raised so the sessions can wait in verifying together.

Run:  .venv/bin/python benchmarks/decision_latency.py [--n 100] [--warmup 10] [--synchronous FULL|NORMAL]
      (~1 min at n=100 on a 2-vCPU machine)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from bench_support import PG_BENCH_URL, emit_row, reset_pg_schema
from mcp import Client
from mcp_latency import (
    GOAL_RATIO,
    OPERATOR,
    TASKGATE,
    Workspace,
    make_git_repo,
    median_ms,
    percentile_ms,
    server_env,
    stdio_connection,
    timed_call,
)


async def to_verifying(client: Client, plan_id: int, title: str) -> str:
    """A new task's session, moved to verifying through the tools; its id."""
    task = (await client.call_tool("task_add", {"title": title, "plan_id": plan_id})).structured_content
    session = (await client.call_tool("project_session_start", {"task_id": task["id"]})).structured_content
    for trigger in ("plan_complete", "work_complete"):
        result = await client.call_tool("session_fire", {"session_id": session["id"], "trigger": trigger})
        if result.is_error:
            raise RuntimeError(result.content[0].text)
    return session["id"]


async def measure(client: Client, plan_id: int, n: int, warmup: int) -> dict[str, list[int]]:
    samples: dict[str, list[int]] = {"session_status": [], "project_decide": []}
    for i in range(warmup + n):
        session_id = await to_verifying(client, plan_id, f"decision {i}")
        status = await timed_call(client, "session_status", {"session_id": session_id})
        decide = await timed_call(
            client, "project_decide", {"session_id": session_id, "decision": "approve", "reason": "bench"}
        )
        if i >= warmup:
            samples["session_status"].append(status)
            samples["project_decide"].append(decide)
    return samples


def report(samples: dict[str, list[int]], store: str = "SQLite") -> None:
    """Median and p99 of both tools, the ratio to session_status, and whether the goal was met."""
    base = median_ms(samples["session_status"])
    print(f"\n{'tool':<16} {'n':>4} {'median':>9} {'p99':>9} {'median/status':>14}")
    for name, values in samples.items():
        med = median_ms(values)
        print(f"{name:<16} {len(values):>4} {med:>7.2f}ms {percentile_ms(values, 99):>7.2f}ms {med / base:>13.2f}×")
    ratio = median_ms(samples["project_decide"]) / base
    verdict = "met" if ratio <= GOAL_RATIO else "missed"
    print(f"goal (issue 20): project_decide ≤ {GOAL_RATIO:g}× session_status (median): {ratio:.2f}×, {verdict}")
    decide = median_ms(samples["project_decide"])
    emit_row(f"project_decide vs session_status ({store})", decide, base, "ms", f"≤ {GOAL_RATIO:g}×")


async def bench(workspace: Workspace, plan_id: int, n: int, warmup: int) -> None:
    with (workspace.root / "stdio-server.log").open("w") as errlog:
        async with stdio_connection(workspace, errlog) as client:
            report(await measure(client, plan_id, n, warmup), workspace.store)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
    parser.add_argument(
        "--postgres", nargs="?", const=PG_BENCH_URL, default=None, metavar="URL",
        help=f"serve from PostgreSQL (schema public reset first; default {PG_BENCH_URL})",
    )  # fmt: skip
    args = parser.parse_args()
    if not TASKGATE.exists():
        sys.exit(f"taskgate executable not found next to {sys.executable}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="taskgate-decision-bench-") as tmp:
        workspace = Workspace(Path(tmp))
        workspace.env = server_env(workspace.root / "data", args.synchronous) | {
            "TASKGATE_POLICIES__WIP_LIMIT__LIMIT": "1000"
        }
        if args.postgres:
            reset_pg_schema(args.postgres)
            workspace.env["TASKGATE_DATABASE_URL"] = args.postgres
            workspace.store = "PostgreSQL"
        workspace.cli("init", str(make_git_repo(workspace.root / "repo")), "--name", "bench")
        workspace.cli("operator", "grant", OPERATOR, "--max-active", "1000")
        plan = workspace.cli_json("plan", "add", "Phase 1")
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; synchronous={args.synchronous}")
        asyncio.run(bench(workspace, plan["id"], args.n, args.warmup))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average after: {load}; total {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
