"""Engine time per workflow step with no-op agents (issue 7; goal ≤ 2 ms per step, the seeds' bar 100 ms).

One SQLite file built by the real migrations (synchronous FULL, as shipped), one real git repository with
session worktrees, the real SessionService, AgentService and WorkflowEngine. Agents are no-ops: an in-process
AgentRunner whose agents exit 0 at once, so what is measured is taskgate's own work per step: collecting the
previous step's outcome, routing, claiming the step (its step_runs row, the stack, the events) and the agent
rows (all one transaction), and for AgentService the agents' status changes, tokens and manifest.

Four workflows of `--steps` steps each run to `verifying`, timed from entering `executing` to `verifying`:

- **condition**: condition steps only (no agents: the engine alone, one transaction per step);
- **bare**: one agent per step through a launcher that writes the agent's row already completed, in the
  engine's claim transaction, and tells the engine: the engine's cost per agent step;
- **agent**: one no-op agent per step through the real AgentService (its token, rows, status changes and
  manifest.json writes included: the supervisor's bookkeeping, not the engine's);
- **parallel**: three no-op agents per step through AgentService, joined with min_success 3.

The baseline, measured in the same run on the same database: one bare session transition (`suspend` then
`resume`, halved), the cheapest thing the engine persists. Prints per-step median and p95 over `--runs` runs, the
ratio to the baseline, and the goal each kind is held to: for the engine's own work (condition, bare) ≤ 2 ms per
step and ≤ 1.2× the baseline (issue 20), for steps through the real supervisor the seeds' 100 ms bar. The
machine's load average is printed first: wall times mean little on a loaded machine, so the CPU time of this
process per step (and its ratio to the baseline's) is printed beside them; the goal is judged on wall time.

Run:  .venv/bin/python benchmarks/workflow_overhead.py [--steps 40] [--runs 5] [--tmp DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench_support import PG_BENCH_URL, emit_row, reset_pg_schema

from taskgate.application.agents.ports import AgentExit
from taskgate.application.agents.supervisor import ExecutionOptions
from taskgate.application.sessions.commands import FireTrigger, StartTask
from taskgate.application.trackers.builtin import AddTask
from taskgate.application.workflows.engine import WorkflowEngine, WorkflowOptions
from taskgate.application.workflows.library import WorkflowService
from taskgate.application.workspaces.options import GitOptions
from taskgate.bootstrap import build_agents, build_services, build_workflows, build_workspaces
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.entities import Agent, AgentStatus
from taskgate.domain.policies.book import default_policies
from taskgate.domain.states import SessionState
from taskgate.infrastructure.db import migrations
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from taskgate.infrastructure.git import GitPythonVcs
from taskgate.infrastructure.system import SystemClock, UuidGenerator
from taskgate.infrastructure.workflow_files import WorkflowFiles

SYNC = "FULL"
ACTOR, OPERATOR = "operator:alice", "alice"


class NoopRunner:
    """Agents that exit 0 the moment they start (no process)."""

    def __init__(self) -> None:
        self._pids = itertools.count(10_000)

    async def start(self, command, cwd, env, output_path, inherit=()) -> int:
        return next(self._pids)

    async def wait(self, pid, *, output_path, watching, stop, beat, beat_every_s, started=None) -> AgentExit:
        return AgentExit(0, "exited", "ok")

    def alive(self, pid: int) -> bool:
        return False

    def process_start(self, pid: int) -> int | None:
        return None

    def ended(self, output_path: str) -> AgentExit | None:
        return None

    def started(self, output_path: str | None) -> bool:
        return False

    def locate(self, program: str) -> str | None:
        return f"/usr/bin/{program}"

    def has_credential(self, variables, logins) -> bool:
        return True

    def write_private(self, path: str, text: str) -> None:
        return None

    def read_log(self, output_path: str, max_bytes: int) -> str:
        return "ok"


class BareLauncher:
    """A StepLauncher with no supervisor at all: each agent is one row written already completed, in the
    transaction of the engine's claim, then the engine is told. What remains is the engine's own work."""

    def __init__(self, uow, clock, ids) -> None:
        self.uow, self.clock, self.ids, self.engine = uow, clock, ids, None

    async def launch_step(self, session_id, specs, *, instructions, timeout_s, claim=None):
        now = self.clock.now()
        made = [Agent(self.ids.new_session_id(), session_id, kind, ["noop"], AgentStatus.COMPLETED, 0,
                      started_at=now, completed_at=now) for kind, _ in specs]  # fmt: skip
        async with self.uow(write=True) as uow:
            await claim(uow, tuple(a.id for a in made))
            for agent in made:
                await uow.agents.add(agent)
            await uow.commit()
        self.engine.kick(session_id)
        return made

    async def stop_agents(self, session_id, agent_ids) -> None:
        return None

    async def wait(self, session_id) -> None:
        return None


def workflows(steps: int) -> dict[str, str]:
    def chain(kind: str) -> str:
        body = []
        for i in range(steps):
            if kind == "condition":
                when = f"    when: task.priority >= 0\n    then: {_next(i, steps)}\n"
                body.append(f"  - id: s{i}\n    type: condition\n{when}")
            elif kind == "agent":
                body.append(f"  - id: s{i}\n    type: agent\n    agent: noop\n    prompt: step {i}\n")
            else:
                body.append(f"  - id: s{i}\n    type: parallel\n    agents: [noop, noop, noop]\n    prompt: step {i}\n"
                            "    min_success: 3\n")  # fmt: skip
        return f"id: {kind}\ndescription: {kind} steps\nmax_iterations: {steps + 1}\nsteps:\n" + "".join(body)

    return {kind: chain(kind) for kind in ("condition", "agent", "parallel")} | {
        "bare": chain("agent").replace("id: agent", "id: bare", 1)
    }


def _next(i: int, steps: int) -> str:
    return f"s{i + 1}" if i + 1 < steps else "end"


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    ident = ("-c", "user.name=bench", "-c", "user.email=bench@example.invalid")
    for args in (("init", "-q", "-b", "main"), ("commit", "-q", "--allow-empty", "-m", "init")):
        subprocess.run(["git", *ident, *args], cwd=repo, check=True, capture_output=True)
    return repo


async def main(steps: int, runs: int, tmp: Path, postgres: str | None = None) -> None:
    config = tmp / "config"
    for kind, text in workflows(steps).items():
        (config / "workflows" / "bench").mkdir(parents=True, exist_ok=True)
        (config / "workflows" / "bench" / f"{kind}.yaml").write_text(text)
    catalogue = WorkflowService(WorkflowFiles(config), {"noop"})
    assert catalogue.catalogue().ok, catalogue.catalogue().problems

    database = Database(postgres or f"sqlite:///{tmp / 'bench.db'}", synchronous=SYNC)
    await migrations.upgrade(database)

    def uow(*, write: bool) -> SqlAlchemyUnitOfWork:
        return SqlAlchemyUnitOfWork(database, write=write)

    clock, ids, vcs = SystemClock(), UuidGenerator(), GitPythonVcs()
    sessions, tracker, _, access = build_services(uow, clock=clock, ids=ids, vcs=vcs,
                                                  policies=default_policies(10_000))  # fmt: skip
    build_workspaces(sessions, uow, clock=clock, vcs=vcs, git=GitOptions())
    agents = build_agents(
        sessions, uow, access=access, clock=clock, ids=ids, types={"noop": AgentType("noop", ("noop", "{prompt}"))},
        options=ExecutionOptions(heartbeat_interval_s=60, max_per_session=8), outputs_root=str(tmp / "out"),
        runner=NoopRunner(),
    )  # fmt: skip
    engine = build_workflows(sessions, uow, catalogue=catalogue.catalogue, clock=clock, agents=agents,
                             options=WorkflowOptions())  # fmt: skip
    bare = BareLauncher(uow, clock, ids)
    bare_engine = WorkflowEngine(uow, sessions, catalogue.catalogue, clock, WorkflowOptions(), launcher=bare)
    bare.engine = bare_engine
    project = await tracker.init_project(str(make_repo(tmp)))
    await tracker.ensure_operator(OPERATOR)
    plan = await tracker.add_plan(project.id, "bench")

    async def planning_session():
        task = await tracker.add_task(AddTask(project.id, "bench task", plan_id=plan.id))
        return (await sessions.start_task(StartTask(task.id, ACTOR, OPERATOR))).session

    async def baseline() -> tuple[float, float]:
        session = await planning_session()
        started, cpu = time.perf_counter(), time.process_time()
        for trigger in ("suspend", "resume") * 10:
            await sessions.transition(FireTrigger(session.id, trigger, ACTOR))
        return (time.perf_counter() - started) * 1000 / 20, (time.process_time() - cpu) * 1000 / 20

    async def run(kind: str) -> tuple[float, float]:
        session = await planning_session()
        driver = bare_engine if kind == "bare" else engine
        await driver.add_workflow(session.id, kind, ACTOR)
        started, cpu = time.perf_counter(), time.process_time()
        await sessions.transition(FireTrigger(session.id, "plan_complete", ACTOR))  # no effects: we kick below
        driver.kick(session.id)
        await driver.wait(session.id)
        elapsed, cpu_ms = (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000
        state = (await sessions.get(session.id)).state
        if state != SessionState.VERIFYING:
            runs_ = await driver.step_runs(session.id)
            async with uow(write=False) as u:
                mine = await u.agents.of_session(session.id)
            raise AssertionError(
                f"{kind}: ended {state}; runs {[(r.step_id, r.status, r.error) for r in runs_][-3:]}; "
                f"agents {[(a.status, a.error) for a in mine][-3:]}"
            )
        return elapsed / steps, cpu_ms / steps

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    store = f"PostgreSQL {postgres}" if postgres else f"SQLite FULL at {tmp}"
    print(f"workflow engine overhead: {steps} steps per workflow, {runs} runs, {store}; load {load}")
    await run("condition")  # warm-up (imports, caches, the catalogue)
    base = [await baseline() for _ in range(runs)]
    base_median, base_cpu = (statistics.median(x) for x in zip(*base, strict=True))
    print(f"  baseline: one bare transition            median {base_median:6.2f} ms  (CPU {base_cpu:5.2f} ms)")
    for kind in ("condition", "bare", "agent", "parallel"):
        walls, cpus = zip(*[await run(kind) for _ in range(runs)], strict=True)
        per_step = sorted(walls)
        median, p95 = statistics.median(per_step), per_step[min(len(per_step) - 1, int(0.95 * len(per_step)))]
        ratio, cpu = median / base_median, statistics.median(cpus)
        print(f"  {kind:<9} per step: median {median:6.2f} ms  p95 {p95:6.2f} ms  "
              f"ratio to baseline {ratio:4.2f}x  (CPU {cpu:5.2f} ms, {cpu / base_cpu:4.2f}x)  "
              f"({_verdict(kind, median, ratio)})")  # fmt: skip
        if kind == "bare":
            store = "PostgreSQL" if postgres else "SQLite"
            emit_row(f"workflow engine ({store}): bare agent step vs one transition", median, base_median, "ms",
                     "≤ 1.2×; ≤ 2 ms")  # fmt: skip
    await database.dispose()


def _verdict(kind: str, median: float, ratio: float) -> str:
    """The goal `kind` is held to, and whether it meets it. The engine's own work (condition, bare) has issue 20's
    goal, ≤ 2 ms and ≤ 1.2× one bare transition; through AgentService the supervisor's bookkeeping per agent
    (token, status rows, manifest) is added, held to the seeds' 100 ms bar."""
    if kind not in ("condition", "bare"):
        return f"{'meets' if median <= 100.0 else 'misses'} the 100 ms bar"
    met = [what for what, ok in (("2 ms", median <= 2.0), ("1.2x", ratio <= 1.2)) if ok]
    missed = [what for what in ("2 ms", "1.2x") if what not in met]
    if not missed:
        return "meets the goal: <= 2 ms and <= 1.2x the baseline"
    return f"goal <= 2 ms and <= 1.2x: misses {' and '.join(missed)}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tmp", type=Path, default=None, help="folder for the database (default: a temp dir)")
    parser.add_argument(
        "--postgres", nargs="?", const=PG_BENCH_URL, default=None, metavar="URL",
        help=f"run on PostgreSQL (schema public reset first; default {PG_BENCH_URL})",
    )  # fmt: skip
    args = parser.parse_args()
    if args.postgres:
        reset_pg_schema(args.postgres)
    with tempfile.TemporaryDirectory(dir=args.tmp) as folder:
        asyncio.run(main(args.steps, args.runs, Path(folder), args.postgres))
