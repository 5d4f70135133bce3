"""Issue 20's table: every row of the hot path, each against its baseline measured in the same run, three runs
(and issue 21's: what the audit chains add to a transition).

Runs the scripts that measure the rows (each prints `ROW|measure|ours|baseline|unit|ratio|goal` lines,
see `bench_support.emit_row`), `--runs` times each, with the machine's load average before and after every run,
then prints one table: per measure, its goal, each run's figures and ratio, the median ratio and the verdict.
Rows come on SQLite (the default) and on PostgreSQL where they apply (`--skip-pg` to leave those out).

| row | script |
|---|---|
| guarded `start`, `plan_complete` (SQLite FULL, PostgreSQL) vs a bare UPDATE+INSERT+COMMIT | transition_cost.py |
| 200 concurrent sessions vs the floor of bare commits (SQLite, PostgreSQL) | transition_cost.py |
| MCP stdio state change vs `ping` (SQLite, PostgreSQL) | mcp_latency.py |
| `project_decide` vs `session_status` (SQLite, PostgreSQL) | decision_latency.py |
| workflow engine bare agent step vs one transition (SQLite, PostgreSQL) | workflow_overhead.py |
| `taskgate --help` vs `python -c pass`; `serve` until `tools/list` vs a bare MCPServer | cli_startup.py |
| issue 21: a transition plus its share of the audit linker vs alone; 200 walks (SQLite, PostgreSQL) | audit_cost.py |
| issue 43: PostgreSQL `start`, `plan_complete` vs a LangGraph step, vs bare asyncpg; 200 walks | langgraph_step.py |

Run:  .venv/bin/python benchmarks/hot_path.py [--runs 3] [--skip-pg]      (~15 min on 2 cores; `make bench`)
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable


@dataclass(frozen=True)
class Figure:
    """One run's figures of one measure."""

    ours: float
    baseline: float
    unit: str
    ratio: float
    goal: str


def scripts(skip_pg: bool) -> list[list[str]]:
    """The commands of one run, each printing ROW lines."""
    found = [
        ["transition_cost.py", "--n", "200", "--warmup", "20", "--synchronous", "FULL", *(["--skip-pg"] * skip_pg)],
        ["mcp_latency.py", "--n", "150", "--skip-http"],
        ["decision_latency.py", "--n", "30", "--warmup", "5"],
        ["workflow_overhead.py", "--runs", "3"],
        ["cli_startup.py", "--rounds", "1"],
        ["audit_cost.py", "--n", "750", "--walks", "200"],
    ]
    if not skip_pg:
        found += [
            ["mcp_latency.py", "--n", "150", "--skip-http", "--postgres"],
            ["decision_latency.py", "--n", "30", "--warmup", "5", "--postgres"],
            ["workflow_overhead.py", "--runs", "3", "--postgres"],
            ["audit_cost.py", "--n", "750", "--walks", "200", "--postgres"],
            ["langgraph_step.py", "--n", "300", "--warmup", "30"],
        ]
    return found


def load() -> str:
    """The 1-minute load average and the core count."""
    return f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def run_script(args: list[str], log: Path) -> tuple[list[tuple[str, Figure]], str]:
    """Run one script; its ROW lines and the load before → after. Its whole output is appended to `log`."""
    before = load()
    started = time.monotonic()
    done = subprocess.run([PYTHON, str(HERE / args[0]), *args[1:]], capture_output=True, text=True, cwd=HERE.parent)
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(args)}  ({before})\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({done.returncode}); its output is in {log}:\n{done.stderr[-2000:]}")
    rows = []
    for line in done.stdout.splitlines():
        if line.startswith("ROW|"):
            _, name, ours, baseline, unit, ratio, goal = line.split("|")
            rows.append((name, Figure(float(ours), float(baseline), unit, float(ratio), goal)))
    return rows, f"{before} → {load()}, {time.monotonic() - started:.0f} s"


def verdict(ratio: float, ours: float, goal: str) -> str:
    """'met' or 'MISSED' for a goal like `≤ 1.5×`, `≥ 2×` or `≤ 1.2×; ≤ 2 ms` (the last part on ours itself)."""
    met = True
    for part in goal.split(";"):
        match = re.fullmatch(r"\s*([≤≥])\s*([\d.]+)\s*(×|ms)\s*", part)
        if match is None:
            return f"? ({goal})"
        sign, bound, unit = match.group(1), float(match.group(2)), match.group(3)
        value = ratio if unit == "×" else ours
        met &= value <= bound if sign == "≤" else value >= bound
    return "met" if met else "MISSED"


def report(figures: dict[str, list[Figure]]) -> None:
    """The table: per measure, each run's `ours / baseline = ratio`, the median ratio and the verdict."""
    print("\n| measure | goal | " + " | ".join(f"run {i + 1}" for i in range(max(map(len, figures.values())))) +
          " | median ratio | verdict |")  # fmt: skip
    print("|---|---|" + "---|" * max(map(len, figures.values())) + "---|---|")
    for name, runs in figures.items():
        cells = [f"{f.ours:.4g} / {f.baseline:.4g} {f.unit} = {f.ratio:.2f}×" for f in runs]
        ratio = statistics.median(f.ratio for f in runs)
        ours = statistics.median(f.ours for f in runs)
        print(
            f"| {name} | {runs[0].goal} | "
            + " | ".join(cells)
            + f" | {ratio:.2f}× | {verdict(ratio, ours, runs[0].goal)} |"
        )


def main() -> None:
    """Run every script `--runs` times (all scripts once per round, so rounds see the same machine), then report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each script (default 3)")
    parser.add_argument("--skip-pg", action="store_true", help="leave out the PostgreSQL rows")
    parser.add_argument("--log", type=Path, default=Path("/tmp/taskgate-hot-path.log"), help="every script's output")
    args = parser.parse_args()
    args.log.write_text(f"hot_path.py {time.strftime('%Y-%m-%d %H:%M:%S')} ({load()})\n")
    figures: dict[str, list[Figure]] = defaultdict(list)
    for round_no in range(args.runs):
        for command in scripts(args.skip_pg):
            print(f"run {round_no + 1}/{args.runs}: {' '.join(command)} ...", end=" ", flush=True)
            rows, how = run_script(command, args.log)
            print(how, flush=True)
            for name, figure in rows:
                figures[name].append(figure)
    report(figures)
    print(f"\n{time.strftime('%Y-%m-%d')}, {load()}; every script's output: {args.log}")


if __name__ == "__main__":
    main()
