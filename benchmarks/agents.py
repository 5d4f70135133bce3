"""Engine overhead of running agents: `--sessions` sessions × `--agents` scripted agents, against bare subprocesses.

The service is the real one: `bootstrap(load_settings(...))` on a fresh SQLite file migrated by Alembic, a real git
repository (one worktree per session), the `AgentService` with `SubprocessAgentRunner` (each agent through the
`agent_exec` wrapper, in its own process group, output to its session folder, a token per agent, the manifest kept
current, heartbeats, `work_complete` when the session's last agent ended). The WIP limit and the operator's
capacity are raised so every session can start.

The agent does next to nothing (`python -c pass` by default), so what is measured is the engine, not the agent.

One round: `--sessions` sessions are started (ready → planning, worktree created: setup, untimed), then

- **baseline**: the same `sessions × agents` processes (same argv, no wrapper) started with plain
  `asyncio.create_subprocess_exec` in a session's worktree, stdout to a log file, and waited, at most
  `--max-total` at once (a semaphore), the concurrency taskgate is given;
- **wrapper**: the same through `python -m taskgate.infrastructure.agent_exec` (what the wrapper alone costs);
- **taskgate**: `AgentService.execute(session, actor, ["noop"] * agents)` for every session at once, then
  `wait` for all of them; timed until every session reached `verifying`.

The three alternate (and rotate who goes first) over `--rounds` rounds, so they see the same machine noise.
Overhead per agent launch = (taskgate − baseline) / agents run; per completed session = (taskgate − baseline) /
sessions; ratio = taskgate / baseline. Also the CPU time of this process (the service; children not included)
per agent, and the peak RSS of this process (`ru_maxrss`; agents are separate processes and not counted: the agent
processes themselves are the same on every side).

Run:  .venv/bin/python benchmarks/agents.py [--sessions 50] [--agents 4] [--rounds 3] [--max-total 16]
          [--max-per-session 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from taskgate.application.sessions.commands import StartTask
from taskgate.application.trackers.builtin import AddTask
from taskgate.bootstrap import App, bootstrap, load_settings
from taskgate.domain.entities import AgentStatus, Session
from taskgate.domain.states import SessionState

OPERATOR = "bench-operator"
ACTOR = f"operator:{OPERATOR}"
AGENT_ARGV = [sys.executable, "-c", "pass"]
WRAPPER = [sys.executable, "-m", "taskgate.infrastructure.agent_exec"]


@dataclass
class Round:
    """Seconds and this process's CPU seconds of one round, per variant."""

    wall: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def make_repo(root: Path) -> Path:
    """A git repository with one commit on `main`."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text("agents benchmark\n")
    identity = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    for args in (["init", "-q", "-b", "main"], ["add", "README.md"], [*identity, "commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


def cpu_seconds() -> float:
    """User + system CPU of this process (the service), children excluded."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mib(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident set size (`ru_maxrss`, KiB on Linux) in MiB."""
    return resource.getrusage(who).ru_maxrss / 1024


def current_rss_mib() -> float:
    """Resident set size right now (VmRSS), in MiB; 0 where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def open_service(root: Path, args: argparse.Namespace) -> App:
    """The real service from settings: one agent type `noop`, the limits of the flags, WIP limit 1000."""
    settings = load_settings(
        cwd=root,
        data_dir=root / "data",
        database_url=None,
        policies={"wip_limit": {"limit": 1000}},
        agents={"noop": {"command": AGENT_ARGV, "timeout_s": 300}},
        execution={"max_agents_total": args.max_total, "max_agents_per_session": args.max_per_session},
    )
    app = await bootstrap(settings)
    await app.tracker.ensure_operator(OPERATOR)
    await app.operators.grant(OPERATOR, max_active_sessions=1000)
    return app


async def planning_sessions(app: App, project_id: int, count: int, label: str) -> list[Session]:
    """`count` sessions in planning (each with its worktree), in a plan of their own: setup, untimed."""
    plan = await app.tracker.add_plan(project_id, f"round {label}")
    sessions = []
    for i in range(count):
        task = await app.tracker.add_task(AddTask(project_id, f"bench {label} task {i}", plan_id=plan.id))
        started = await app.sessions.start_task(StartTask(task.id, ACTOR, OPERATOR))
        sessions.append(started.session)
    return sessions


async def bare(sessions: list[Session], agents: int, limit: int, logs: Path, *, wrapper: bool) -> list[str]:
    """Start and wait the same processes with plain asyncio subprocesses, `limit` at once. Returns failures."""
    slots = asyncio.Semaphore(limit)
    logs.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []

    async def one(session: Session, n: int) -> None:
        log = logs / f"{session.id}-{n}.log"
        argv = [*WRAPPER, f"{log}.exit", "--", *AGENT_ARGV] if wrapper else AGENT_ARGV
        async with slots:
            with open(log, "ab") as out:
                proc = await asyncio.create_subprocess_exec(
                    *argv, cwd=session.worktree_path, stdin=asyncio.subprocess.DEVNULL, stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                )  # fmt: skip
            if await proc.wait() != 0:
                failures.append(f"{argv[0]} exited {proc.returncode}")

    await asyncio.gather(*(one(s, n) for s in sessions for n in range(agents)))
    return failures


async def through_taskgate(app: App, sessions: list[Session], agents: int) -> list[str]:
    """execute() every session at once, wait for all; returns what did not end as it should."""
    assert app.agents is not None
    service = app.agents
    await asyncio.gather(*(service.execute(s.id, ACTOR, ["noop"] * agents) for s in sessions))
    await asyncio.gather(*(service.wait(s.id) for s in sessions))
    failures = []
    for session in sessions:
        state = (await app.sessions.get(session.id)).state
        rows = await service.agents(session.id)
        if state != SessionState.VERIFYING or any(a.status != AgentStatus.COMPLETED for a in rows):
            failures.append(f"session {session.id[:8]}: {state.value}, {[(a.status.value, a.error) for a in rows]}")
    return failures


async def timed(action) -> tuple[float, float, list[str]]:
    """(wall seconds, CPU seconds of this process, failures) of one awaited action."""
    cpu, begin = cpu_seconds(), time.perf_counter()
    failures = await action()
    return time.perf_counter() - begin, cpu_seconds() - cpu, failures


async def run_round(app: App, project_id: int, root: Path, args: argparse.Namespace, index: int) -> Round:
    """One round: fresh planning sessions, then the three variants in a rotating order."""
    sessions = await planning_sessions(app, project_id, args.sessions, str(index))
    variants = {
        "baseline": lambda: bare(sessions, args.agents, args.max_total, root / f"bare-{index}", wrapper=False),
        "wrapper": lambda: bare(sessions, args.agents, args.max_total, root / f"wrap-{index}", wrapper=True),
        "taskgate": lambda: through_taskgate(app, sessions, args.agents),
    }
    names = list(variants)
    order = names[index % 3 :] + names[: index % 3]
    result = Round()
    for name in order:
        wall, cpu, failures = await timed(variants[name])
        result.wall[name], result.cpu[name] = wall, cpu
        result.failures += [f"{name}: {f}" for f in failures]
    return result


def report(rounds: list[Round], args: argparse.Namespace, rss: dict[str, float]) -> None:
    """Per-round figures, then medians, overheads and the ratio against the baseline."""
    agents_run, sessions = args.sessions * args.agents, args.sessions
    print(f"\n{'round':>5}  {'order':<32} {'baseline':>10} {'wrapper':>10} {'taskgate':>10}   taskgate CPU")
    for i, r in enumerate(rounds):
        order = " → ".join(r.wall)
        print(
            f"{i + 1:>5}  {order:<32} {r.wall['baseline']:9.3f}s {r.wall['wrapper']:9.3f}s "
            f"{r.wall['taskgate']:9.3f}s   {r.cpu['taskgate']:.3f}s"
        )
    med = {name: statistics.median(r.wall[name] for r in rounds) for name in ("baseline", "wrapper", "taskgate")}
    cpu = {name: statistics.median(r.cpu[name] for r in rounds) for name in ("baseline", "wrapper", "taskgate")}
    extra = med["taskgate"] - med["baseline"]
    print(f"\n== {sessions} sessions × {args.agents} agents = {agents_run} agents; at most {args.max_total} at once "
          f"({args.max_per_session} per session); medians of {len(rounds)} rounds ==")  # fmt: skip
    print(f"  baseline (bare asyncio subprocesses)     {med['baseline']:8.3f} s   "
          f"{med['baseline'] / agents_run * 1000:6.2f} ms per agent")  # fmt: skip
    print(f"  the same through the agent_exec wrapper  {med['wrapper']:8.3f} s   "
          f"{med['wrapper'] / agents_run * 1000:6.2f} ms per agent")  # fmt: skip
    print(f"  through taskgate (execute … verifying)   {med['taskgate']:8.3f} s   "
          f"{med['taskgate'] / agents_run * 1000:6.2f} ms per agent")  # fmt: skip
    print(f"  ratio taskgate / baseline                {med['taskgate'] / med['baseline']:8.2f}×   "
          f"(wrapper / baseline {med['wrapper'] / med['baseline']:.2f}×)")  # fmt: skip
    wrapper = (med["wrapper"] - med["baseline"]) / agents_run * 1000
    print(f"  engine overhead per agent launch         {extra / agents_run * 1000:8.2f} ms   (wall, amortised over "
          f"{args.max_total} slots; of which the wrapper {wrapper:.2f} ms)")  # fmt: skip
    print(f"  engine overhead per completed session    {extra / sessions * 1000:8.2f} ms   (wall, amortised)")
    print(f"  service CPU per agent (this process)     {cpu['taskgate'] / agents_run * 1000:8.2f} ms   "
          f"(baseline {cpu['baseline'] / agents_run * 1000:.2f} ms: spawning and waiting alone)")  # fmt: skip
    print(
        f"  peak RSS of the service process          {rss['peak']:8.1f} MiB  (ru_maxrss; {rss['start']:.1f} MiB "
        f"after start-up, {rss['before']:.1f} MiB before the first round; RSS now {current_rss_mib():.1f} MiB)"
    )
    failures = [f for r in rounds for f in r.failures]
    print(f"  failures                                 {len(failures):8d}")
    for failure in failures[:5]:
        print(f"    {failure}")


def parse_args() -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50, help="sessions per round (default 50)")
    parser.add_argument("--agents", type=int, default=4, help="agents per session (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each with fresh sessions (default 3)")
    parser.add_argument("--max-total", type=int, default=16, help="agents running at once, both sides (16)")
    parser.add_argument("--max-per-session", type=int, default=4, help="agents running at once per session (4)")
    parser.add_argument("--workdir", type=Path, help="keep the repository and database here (default: a temp dir)")
    return parser.parse_args()


async def main() -> None:
    """Set up the service, run the rounds, report."""
    args = parse_args()
    rss = {"start": rss_mib()}
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores); agent: {' '.join(AGENT_ARGV)}")
    with tempfile.TemporaryDirectory(prefix="taskgate-bench-agents-") as tmp:
        root = (args.workdir or Path(tmp)).resolve()
        root.mkdir(parents=True, exist_ok=True)
        app = await open_service(root, args)
        try:
            project = await app.tracker.init_project(str(make_repo(root)), "bench")
            await bare((await planning_sessions(app, project.id, 1, "warm-up")), 2, 2, root / "warm", wrapper=True)
            rss["before"] = rss_mib()
            rounds = []
            for index in range(args.rounds):
                rounds.append(await run_round(app, project.id, root, args, index))
                print(f"  round {index + 1}/{args.rounds} done", flush=True)
            rss["peak"] = rss_mib()
        finally:
            await app.close()
    report(rounds, args, rss)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
