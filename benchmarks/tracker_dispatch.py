"""What polling a tracker costs and how fast dispatch answers (issue 41), each figure against a baseline measured in
the same run; 3 runs each, median and range.

1. **API calls per poll, 1,000 open issues**, provider level (`provider.list(project)` on a dummy Project):
   GitHub Issues on the stand-in (tests/support/github_api; 50 of the issues blocked by another open one) cold (a
   fresh provider), warm (nothing changed: every GET revalidated, 304) and after one issue changed; Linear on its
   stand-in (tests/support/linear_api; 1,000 issues in Todo), cold and warm. Seconds per poll too. Baseline: the
   pages any poller must read, ceil(1000 / 100) = 10.
2. **poll → session started**: a real `taskgate serve --http` (SQLite, `[sweeper] interval_s = 1`, `[dispatch]
   auto_start, max_running = 10`, GitHub tracker on the stand-in, a `task_ready` workflow, a worker agent that
   writes a start marker): one labelled issue added while serve runs; time to the agent's start marker and to the
   session row (its `created_at`, and when `taskgate session list --json` first shows it). Baseline: `taskgate
   session start` of a built-in task by hand, until the session is planning (the CLI returns then).
3. **100 ready issues, cap 10**: from serve's start until ten agents run; agents released ~0.5 s after they start;
   `session list --json` sampled back to back (~0.2 s apart plus the CLI's own time) for the most sessions in
   planning + executing; the most agents running at once from the markers; serve start → all 100 verifying and
   sessions/min. Baseline: the same with the built-in tracker (100 `taskgate task add`, no plan).

Run:  PYTHONPATH=src:. .venv/bin/python benchmarks/tracker_dispatch.py [--runs 3] [--parts 123] [--issues 100]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]  # this worktree's taskgate and tests, whatever the venv points at

from tests.support.github_api import GitHubStandIn  # noqa: E402
from tests.support.linear_api import LinearStandIn  # noqa: E402
from tracker_support import TOKEN, Deployment, cpu_model, most_at_once, timestamp_ns  # noqa: E402

from taskgate.domain.entities import Project  # noqa: E402
from taskgate.infrastructure.trackers.github_issues import GitHubIssuesTracker  # noqa: E402
from taskgate.infrastructure.trackers.linear import LinearTracker  # noqa: E402

ISSUES, PAGE, BOT = 1000, 100, "taskgate-bot"
PROJECT = Project(1, "shop", "SHOP", "/nonexistent", created_at=datetime.now(UTC))
ACTIVE = ("planning", "executing")


def summary(values: list[float], fmt: str = "{:.3g}") -> str:
    """Median (min–max)."""
    med, lo, hi = statistics.median(values), min(values), max(values)
    return f"{fmt.format(med)} ({fmt.format(lo)}–{fmt.format(hi)})"


# -- 1. API calls per poll ---------------------------------------------------------------------------------------


async def timed_poll(provider: GitHubIssuesTracker | LinearTracker) -> tuple[int, int, float]:
    """One `list`: (requests, 304s among them, seconds)."""
    calls, not_modified, started = provider.calls, provider.not_modified, time.perf_counter()
    found = await provider.list(PROJECT)
    assert len(found) == ISSUES, len(found)
    return provider.calls - calls, provider.not_modified - not_modified, time.perf_counter() - started


async def github_polls(root: Path) -> dict[str, tuple[int, int, float]]:
    bare = root / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    with GitHubStandIn(bare, token=TOKEN, login=BOT) as gh:
        for i in range(ISSUES):  # every 20th issue is blocked by the one before it (open): 50 blocked
            gh.add_issue(f"issue {i}", labels=["taskgate"], blocked_by=[i] if i % 20 == 19 else [])
        provider = GitHubIssuesTracker(gh.url, "acme/shop", TOKEN, "GITHUB_TOKEN", assignee=BOT)
        figures = {"cold": await timed_poll(provider), "warm": await timed_poll(provider)}
        gh.edit_issue(ISSUES // 2, title="changed")
        figures["one changed"] = await timed_poll(provider)
    return figures


async def linear_polls() -> dict[str, tuple[int, int, float]]:
    with LinearStandIn() as linear:
        for i in range(ISSUES):
            linear.add_issue("ENG", f"issue {i}", state="Todo")
        provider = LinearTracker(linear.url, "ENG", linear.key, "LINEAR_API_KEY")
        try:
            return {"cold": await timed_poll(provider), "warm": await timed_poll(provider)}
        finally:
            await provider.aclose()


def api_calls(runs: int) -> None:
    floor = math.ceil(ISSUES / PAGE)
    print(f"\n1. API calls per poll, {ISSUES} open issues (provider.list); baseline: {floor} pages of {PAGE}")
    results: dict[str, list[tuple[int, int, float]]] = {}
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="tg-tracker-bench-") as tmp:
            for kind, (calls, nm, secs) in asyncio.run(github_polls(Path(tmp))).items():
                results.setdefault(f"GitHub, {kind}", []).append((calls, nm, secs))
        for kind, figure in asyncio.run(linear_polls()).items():
            results.setdefault(f"Linear, {kind}", []).append(figure)
    for name, figures in results.items():
        calls = [c for c, _, _ in figures]
        print(f"  {name}: {summary(calls)} calls ({', '.join(str(n) for _, n, _ in figures)} of them 304), "
              f"{summary([s for _, _, s in figures])} s per poll; {statistics.median(calls) / floor:.2f}× the "
              f"{floor} pages (runs: calls {calls})")  # fmt: skip


# -- 2. poll → session started -------------------------------------------------------------------------------


def first_seen(deployment: Deployment, task: str, out: dict[str, float]) -> None:
    """`session list --json` back to back until it shows `task`'s session: when that answer came (time.time())."""
    while not any(s["task_id"] == task for s in deployment.sessions()):
        time.sleep(0.05)
    out["seen"] = time.time()


def poll_to_start(runs: int) -> None:
    print("\n2. poll → session started (one issue added while serve runs; [sweeper] interval_s = 1)")
    marker, row, seen = [], [], []
    with tempfile.TemporaryDirectory(prefix="tg-tracker-bench-") as tmp:
        deployment = Deployment(Path(tmp), github=True)
        assert deployment.github is not None
        try:
            deployment.start()
            for _ in range(runs):
                time.sleep(random.uniform(0.5, 1.5))  # a random phase of the sweep
                added_ns = time.time_ns()
                task = f"gh-{deployment.github.add_issue('one more', 'body', ['taskgate'])}"
                found: dict[str, float] = {}
                watcher = threading.Thread(target=first_seen, args=(deployment, task, found))
                watcher.start()
                started = deployment.until(f"start {task}'s agent", lambda t=task: deployment.starts().get(t), 0.005)
                watcher.join()
                session = next(s for s in deployment.sessions() if s["task_id"] == task)
                marker.append((started - added_ns) / 1e9)
                row.append((timestamp_ns(session["created_at"]) - added_ns) / 1e9)
                seen.append(found["seen"] - added_ns / 1e9)
                deployment.release(task)
                deployment.until(f"bring {task} to verifying", lambda t=task: _state(deployment, t) == "verifying", 0.2)
        finally:
            deployment.close()
    by_hand = session_start_by_hand(runs)
    print(f"  add_issue → agent's start marker: {summary(marker)} s (runs {[round(x, 2) for x in marker]})")
    print(f"  add_issue → session row created (its created_at): {summary(row)} s (runs {[round(x, 2) for x in row]})")
    print(f"  add_issue → `session list --json` shows it: {summary(seen)} s (runs {[round(x, 2) for x in seen]})")
    print(f"  baseline, `taskgate session start` by hand until planning: {summary(by_hand)} s; marker "
          f"{statistics.median(marker) / statistics.median(by_hand):.2f}× the baseline; sweep interval 1 s "
          f"(expected wait 0.5 s + the start)")  # fmt: skip


def _state(deployment: Deployment, task: str) -> str | None:
    return next((s["state"] for s in deployment.sessions() if s["task_id"] == task), None)


def session_start_by_hand(runs: int) -> list[float]:
    """`taskgate session start` of a built-in task (no dispatch, no serve), until the CLI returns it planning."""
    took = []
    with tempfile.TemporaryDirectory(prefix="tg-tracker-bench-") as tmp:
        deployment = Deployment(Path(tmp), github=False, dispatch=False)
        try:
            tasks = [deployment.json("task", "add", f"by hand {i}")["id"] for i in range(runs)]
            for task in tasks:
                started = time.perf_counter()
                session = deployment.json("session", "start", task)
                took.append(time.perf_counter() - started)
                assert session["state"] == "planning", session
        finally:
            deployment.close()
    return took


# -- 3. 100 ready issues, cap 10 --------------------------------------------------------------------------------


def releaser(deployment: Deployment, hold_s: float, stop: threading.Event) -> None:
    """Release each agent `hold_s` after its start marker."""
    released: set[str] = set()
    while not stop.is_set():
        now = time.time_ns()
        for task, started in deployment.starts().items():
            if task not in released and now - started >= hold_s * 1e9:
                deployment.release(task)
                released.add(task)
        time.sleep(0.02)


def dispatch_100(github: bool, n: int = 100, cap: int = 10, hold_s: float = 0.5) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="tg-tracker-bench-") as tmp:
        deployment = Deployment(Path(tmp), github=github, max_running=cap)
        stop = threading.Event()
        try:
            if deployment.github is not None:
                for i in range(n):
                    deployment.github.add_issue(f"issue {i}", "body", ["taskgate"])
            else:
                with ThreadPoolExecutor(4) as pool:
                    list(pool.map(lambda i: deployment.cli("task", "add", f"task {i}"), range(n)))
            started = time.monotonic()
            deployment.start()
            listening = time.monotonic() - started
            deployment.until(f"start {cap} agents", lambda: len(deployment.starts()) >= cap, 0.01)
            ten = time.monotonic() - started
            thread = threading.Thread(target=releaser, args=(deployment, hold_s, stop))
            thread.start()
            peak, samples = 0, 0
            while True:
                sessions = deployment.sessions()
                samples += 1
                peak = max(peak, sum(1 for s in sessions if s["state"] in ACTIVE))
                if len(sessions) == n and all(s["state"] == "verifying" for s in sessions):
                    break
                if time.monotonic() - started > 400 or deployment.process.poll() is not None:
                    raise RuntimeError(f"not all {n} verifying: {deployment.log.read_text()[-3000:]}")
                time.sleep(0.2)
            total = time.monotonic() - started
            calls = len(deployment.github.calls) if deployment.github is not None else 0
            passes = sorted({line[:23] for line in deployment.log.read_text().splitlines() if "started with" in line})
            at = [datetime.strptime(p, "%Y-%m-%d %H:%M:%S,%f").timestamp() for p in passes]
            gap = statistics.median(b - a for a, b in itertools.pairwise(at)) if len(at) > 1 else 0.0
            return {"listening": listening, "ten": ten, "peak": peak, "agents": most_at_once(deployment.intervals()),
                    "total": total, "per_min": n / total * 60, "samples": samples, "calls": calls,
                    "passes": len(passes), "gap": gap}  # fmt: skip
        finally:
            stop.set()
            deployment.close()


def dispatch_cap(runs: int, n: int) -> None:
    print(f"\n3. {n} ready issues, max_running = 10, each agent released ~0.5 s after it starts")
    rows: dict[str, list[dict[str, float]]] = {"GitHub tracker": [], "built-in tracker (baseline)": []}
    for _ in range(runs):
        rows["GitHub tracker"].append(dispatch_100(github=True, n=n))
        rows["built-in tracker (baseline)"].append(dispatch_100(github=False, n=n))
    for name, figures in rows.items():
        pick: Callable[[str], list[float]] = lambda key, rows=figures: [f[key] for f in rows]  # noqa: E731
        print(f"  {name}: serve start → listening {summary(pick('listening'))} s, → 10 agents running "
              f"{summary(pick('ten'))} s; most sessions in planning+executing in a sample {max(pick('peak')):.0f} "
              f"(runs {[int(x) for x in pick('peak')]}, {summary(pick('samples'), '{:.0f}')} samples); most agents "
              f"at once {max(pick('agents')):.0f}; all {n} verifying after {summary(pick('total'))} s = "
              f"{summary(pick('per_min'))} sessions/min; dispatch passes that started sessions "
              f"{summary(pick('passes'), '{:.0f}')}, {summary(pick('gap'))} s apart"
              + (f"; {summary(pick('calls'), '{:.0f}')} API calls" if name.startswith("GitHub") else ""))  # fmt: skip
    gh, builtin = (statistics.median(f["total"] for f in rows[k]) for k in rows)
    print(f"  GitHub tracker / built-in: {gh / builtin:.2f}× the time for {n}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--parts", default="123", help="which measures: 1 polls, 2 poll → start, 3 the cap")
    parser.add_argument("--issues", type=int, default=100, help="ready issues in part 3")
    args = parser.parse_args()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"trackers and dispatch (issue 41), {args.runs} run(s); {date.today()}; CPU: {cpu_model()} "
          f"({os.cpu_count()} cores); load average before {load}")  # fmt: skip
    begun = time.monotonic()
    if "1" in args.parts:
        api_calls(args.runs)
    if "2" in args.parts:
        poll_to_start(args.runs)
    if "3" in args.parts:
        dispatch_cap(args.runs, args.issues)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average after {load}; total {time.monotonic() - begun:.0f} s")


if __name__ == "__main__":
    main()
