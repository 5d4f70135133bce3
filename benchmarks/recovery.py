"""How long a restarted `taskgate serve` takes to recover 1,000 sessions (issue 13's figure).

Set-up (not timed): a real git repository, SQLite with `synchronous = FULL` built by the real migrations, and
N sessions started through the real engine (each with its own worktree and branch), so N worktrees exist on
disk. Then, for each scenario, the services are built afresh as `serve` builds them (`bootstrap`) and
`Recovery.run()` is timed: exactly what `serve` does before it answers its first request.

- **at rest**: N sessions in planning, nothing owed: disk reconciliation (worktree list, branches) and the scan.
- **owing**: M more sessions left in `created` with a start requested (a start cut off right after `create`,
  the worst case: each needs its worktree made and three transitions); the time per carried-on session.

Baseline, measured in the same run: a restart's floor, `bootstrap` plus one read of every active session (what
any recovery must do), and for the owing case one bare `start_task` of a fresh task (the work each carried-on
session redoes). Each figure is the median of --rounds rounds.

Run:  .venv/bin/python benchmarks/recovery.py [--sessions 1000] [--owing 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from taskgate.application.sessions.commands import CreateSession, StartTask
from taskgate.application.trackers.builtin import AddTask
from taskgate.bootstrap import App, bootstrap, load_settings

ACTOR, OPERATOR = "operator:alice", "alice"


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "init"]):
        subprocess.run(["git", "-c", "user.name=b", "-c", "user.email=b@b.invalid", *args], cwd=path, check=True)
    return path


async def open_app(data: Path, limit: int) -> App:
    settings = load_settings(
        data_dir=data,
        operator={"default": OPERATOR},
        policies={"wip_limit": {"enabled": False}, "operator_capacity": {"enabled": False}},
        sweeper={"enabled": False},
    )
    return await bootstrap(settings)


async def seed(data: Path, repo: Path, sessions: int) -> tuple[int, int]:
    """N planning sessions with worktrees; returns (project id, plan id)."""
    app = await open_app(data, sessions * 3)
    try:
        project = await app.tracker.init_project(str(repo))
        await app.tracker.ensure_operator(OPERATOR)
        plan = await app.tracker.add_plan(project.id, "Phase 1")
        began = time.perf_counter()
        for i in range(sessions):
            task = await app.tracker.add_task(AddTask(project.id, f"task {i}", plan_id=plan.id))
            await app.sessions.start_task(StartTask(task.id, ACTOR, OPERATOR))
            if (i + 1) % 200 == 0:
                print(f"  seeded {i + 1}/{sessions} sessions ({time.perf_counter() - began:.0f} s)", flush=True)
        return project.id, plan.id
    finally:
        await app.close()


async def cut_off_starts(data: Path, project_id: int, plan_id: int, count: int, limit: int) -> None:
    """`count` sessions left in `created` with their start requested, as a crash right after `create` leaves."""
    app = await open_app(data, limit)
    try:
        for i in range(count):
            task = await app.tracker.add_task(AddTask(project_id, f"cut off {i}", plan_id=plan_id))
            await app.sessions.create_session(CreateSession(task.id, ACTOR, OPERATOR, start_requested=True))
    finally:
        await app.close()


async def timed_recovery(data: Path, limit: int) -> tuple[float, int]:
    """Seconds `Recovery.run()` takes on freshly built services, and how many sessions it resumed."""
    app = await open_app(data, limit)
    try:
        assert app.recovery is not None
        began = time.perf_counter()
        report = await app.recovery.run()
        elapsed = time.perf_counter() - began
        assert not report.errors, report.errors
        return elapsed, len(report.resumed)
    finally:
        await app.close()


async def floor(data: Path, limit: int) -> float:
    """The baseline: bootstrap is paid by both; one read of every active session is the least a scan costs."""
    app = await open_app(data, limit)
    try:
        began = time.perf_counter()
        found = await app.sessions.active_sessions()
        assert found
        return time.perf_counter() - began
    finally:
        await app.close()


async def one_start(data: Path, project_id: int, plan_id: int, limit: int) -> float:
    app = await open_app(data, limit)
    try:
        task = await app.tracker.add_task(AddTask(project_id, "baseline", plan_id=plan_id))
        began = time.perf_counter()
        await app.sessions.start_task(StartTask(task.id, ACTOR, OPERATOR))
        return time.perf_counter() - began
    finally:
        await app.close()


async def main(sessions: int, owing: int, rounds: int) -> None:
    limit = (sessions + owing * (rounds + 1) + rounds) * 2
    with tempfile.TemporaryDirectory(prefix="tg-recovery-") as tmp:
        root = Path(tmp)
        repo, data = make_repo(root / "repo"), root / "data"
        print(f"seeding {sessions} sessions with worktrees (not timed) ...", flush=True)
        project_id, plan_id = await seed(data, repo, sessions)

        rest, base = [], []
        for _ in range(rounds):
            base.append(await floor(data, limit))
            elapsed, resumed = await timed_recovery(data, limit)
            assert resumed == 0, f"{resumed} sessions resumed at rest"
            rest.append(elapsed)
        rest_ms, base_ms = statistics.median(rest) * 1e3, statistics.median(base) * 1e3
        print(f"\nat rest, {sessions} sessions: recovery {rest_ms:.1f} ms (min {min(rest) * 1e3:.1f}, "
              f"max {max(rest) * 1e3:.1f}); baseline (read every active session) {base_ms:.1f} ms; "
              f"ratio {rest_ms / base_ms:.1f}x; {rest_ms / sessions * 1e3:.0f} us per session")  # fmt: skip

        per, starts = [], []
        for _ in range(rounds):
            await cut_off_starts(data, project_id, plan_id, owing, limit)
            elapsed, resumed = await timed_recovery(data, limit)
            assert resumed == owing, f"{resumed} of {owing} cut-off starts resumed"
            per.append(elapsed / owing)
            starts.append(await one_start(data, project_id, plan_id, limit))
        per_ms, start_ms = statistics.median(per) * 1e3, statistics.median(starts) * 1e3
        print(f"owing, {owing} cut-off starts among {sessions}+ sessions: {per_ms:.1f} ms per carried-on session "
              f"(min {min(per) * 1e3:.1f}, max {max(per) * 1e3:.1f}); baseline (one start_task) {start_ms:.1f} ms; "
              f"ratio {per_ms / start_ms:.2f}x")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--owing", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.owing, args.rounds))
