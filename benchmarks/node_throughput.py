"""Transitions per second of 1, 2 and 3 taskgate nodes (separate OS processes) sharing one PostgreSQL database.

The script creates a fresh database (a unique name) on the server `--pg-url` names, migrates it through `bootstrap`
(taskgate's own Alembic chain), registers one project (a scratch git repository), and for each node count starts
that many node processes, each with its own node id (`TASKGATE_NODE__ID`) and data dir. A node process builds the
real services with `bootstrap` (as `taskgate serve` does: the SQL unit of work, every effect, the configured
policies), heartbeats as a node, and creates its own sessions (`--sessions`, in plans of 10 tasks): created
through `SessionService.create_session`, so the node is their owner, then `fail` and `retry` to bring them into
`executing` without git or agents (untimed). When every node is ready, the parent gives one start time; from then
on each node cycles `suspend` / `resume` on all its sessions at once (one coroutine per session, one fire after the
other) for `--duration` seconds. `resume` enters the WIP window, so it runs the guards and locks the plan row,
as `transition_cost.py`'s `start` does. Each node reports how many transitions were applied and when its last
one returned; the parent checks that count against the applied `suspend`/`resume` rows in `transition_log`
(each node writes under its own actor name) and fails loudly on any difference, error or refused row.

Node counts run in a rotating order in each run (1, 2, 3; then 2, 3, 1; ...), so that each sees the machine in
every position; the ratio of 2 and 3 nodes is against the 1-node figure of the same run. The database is dropped
at the end.

Run:  .venv/bin/python benchmarks/node_throughput.py [--runs 3] [--duration 10] [--sessions 50] [--nodes 1,2,3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from bench_support import git_repo
from sqlalchemy.engine import make_url

from taskgate.application.sessions.commands import CreateSession, FireTrigger
from taskgate.application.trackers.builtin import AddTask
from taskgate.bootstrap import bootstrap, database_report, load_settings
from taskgate.domain.errors import TaskgateError
from taskgate.domain.states import SessionState

PG_URL = os.environ.get("TASKGATE_BENCH_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
TASKS_PER_PLAN = 10
CYCLE = ("suspend", "resume")
POOL_PER_NODE = 30  # the engine's pool_size + max_overflow (infrastructure/db/engine.py): a node's most connections
READY_TIMEOUT_S = 600.0
WORKER_FLAG = "--worker"


# -- the node process -------------------------------------------------------------------------------------------


async def node_setup(app: Any, project_id: int, actor: str, count: int) -> list[str]:
    """`count` sessions of this node in `executing`: tasks in plans of TASKS_PER_PLAN, each session created here
    (so this node owns it), then `fail` and `retry` (the way into the WIP window that needs no git or agent)."""
    tasks, plan_id = [], 0
    for number in range(count):  # one at a time: task numbers are allocated on the (shared) project row
        if number % TASKS_PER_PLAN == 0:
            plan_id = (await app.tracker.add_plan(project_id, f"{actor} plan {number // TASKS_PER_PLAN}")).id
        tasks.append(await app.tracker.add_task(AddTask(project_id, f"{actor} task {number}", plan_id=plan_id)))

    async def prepare(task_id: str) -> str:
        session = await app.sessions.create_session(CreateSession(task_id, actor))
        for trigger in ("fail", "retry"):
            result = await app.sessions.fire(FireTrigger(session.id, trigger, actor, reason="benchmark set-up"))
        if result.session.state != SessionState.EXECUTING:
            raise RuntimeError(f"session {session.id} is in {result.session.state}, not executing, after set-up")
        return session.id

    return list(await asyncio.gather(*(prepare(task.id) for task in tasks)))


@dataclass
class Cycler:
    """The timed loop of one node: every session cycles suspend/resume until the deadline (wall clock)."""

    app: Any
    actor: str
    deadline: float
    applied: int = 0
    last_done: float = 0.0

    def __post_init__(self) -> None:
        self.errors: Counter[str] = Counter()
        self.latencies_ns: list[int] = []

    async def cycle(self, session_id: str) -> None:
        """suspend, resume, suspend, ... one after the other; checks the deadline before each fire. An error ends
        this session's loop (it is counted and the run fails)."""
        step = 0
        while time.time() < self.deadline:
            trigger = CYCLE[step % 2]
            begin = time.perf_counter_ns()
            try:
                await self.app.sessions.fire(FireTrigger(session_id, trigger, self.actor))
            except TaskgateError as exc:
                self.errors[f"{trigger}: {type(exc).__name__}: {exc}"[:300]] += 1
                return
            self.latencies_ns.append(time.perf_counter_ns() - begin)
            self.applied += 1
            self.last_done = time.time()
            step += 1


async def node_main(spec: dict[str, Any]) -> int:
    """One node: bootstrap from the environment, set up, print `ready`, wait for `go <start>`, run, report."""
    app = await bootstrap(load_settings(), migrate=False)
    assert app.nodes is not None
    await app.nodes.beat()  # as `serve` does before its first request, then every [node] heartbeat_s
    stop = asyncio.Event()
    heartbeat = asyncio.create_task(app.nodes.run(stop))
    try:
        begin = time.perf_counter()
        ids = await node_setup(app, spec["project_id"], spec["actor"], spec["sessions"])
        print(json.dumps({"ready": app.nodes.identity.id, "setup_s": time.perf_counter() - begin}), flush=True)
        words = (await asyncio.to_thread(sys.stdin.readline)).split()
        if len(words) != 2 or words[0] != "go":
            return 3
        start = float(words[1])
        cycler = Cycler(app, spec["actor"], start + spec["duration"])
        await asyncio.sleep(max(0.0, start - time.time()))
        cpu = time.process_time()
        await asyncio.gather(*(cycler.cycle(session_id) for session_id in ids))
        cpu = time.process_time() - cpu
        elapsed = max(cycler.last_done, start + spec["duration"]) - start
        latencies = sorted(cycler.latencies_ns) or [0]
        report = {
            "node": app.nodes.identity.id,
            "actor": spec["actor"],
            "applied": cycler.applied,
            "elapsed_s": elapsed,
            "last_done": cycler.last_done,
            "cpu_s": cpu,
            "p50_ms": latencies[len(latencies) // 2] / 1e6,
            "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] / 1e6,
            "errors": dict(cycler.errors),
        }
        print(json.dumps({"report": report}), flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # `exit`: the parent has read the server's CPU meanwhile
        return 0
    finally:
        stop.set()
        await heartbeat
        await app.close()


# -- the parent -------------------------------------------------------------------------------------------------


def admin_dsn(url: str, database: str | None = None) -> str:
    """An asyncpg DSN for `url`'s server (and `database`, else the URL's own)."""
    parsed = make_url(url).set(drivername="postgresql")
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.render_as_string(hide_password=False)


async def admin(url: str, sql: str) -> None:
    """One statement on the server's admin connection (the database `--pg-url` names)."""
    conn = await asyncpg.connect(admin_dsn(url), timeout=10)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@dataclass
class Bench:
    """What every node count shares: the database, the scratch folder, the project and the environment."""

    url: str  # the benchmark database's SQLAlchemy URL
    folder: Path
    config: Path
    project_id: int
    sessions: int
    duration: float

    def env(self, node_id: str) -> dict[str, str]:
        """The environment of one node process: its own node id and data dir, the shared database and config."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
        return {
            **keep,
            "TASKGATE_CONFIG": str(self.config),
            "TASKGATE_DATABASE_URL": self.url,
            "TASKGATE_DATA_DIR": str(self.folder / node_id),
            "TASKGATE_NODE__ID": node_id,
        }


@dataclass
class Outcome:
    """One node count measured once."""

    nodes: int
    rate: float  # transitions/s of all nodes together
    reports: list[dict[str, Any]]
    setup_s: float
    load: tuple[float, float]
    checked_rows: int
    cpu: str  # the machine's CPU share and the server's CPU per transition during the window


class Worker:
    """One node process and its protocol lines (stderr goes to a file, shown if the node fails)."""

    def __init__(self, proc: asyncio.subprocess.Process, node_id: str, stderr: Path) -> None:
        self.proc, self.node_id, self.stderr = proc, node_id, stderr

    async def line(self, key: str, timeout: float) -> dict[str, Any]:
        """The next JSON line holding `key` (other output is skipped)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout=max(0.1, deadline - time.monotonic()))
            if not raw:
                raise RuntimeError(f"node {self.node_id} exited before '{key}':\n{self.stderr_tail()}")
            text = raw.decode().strip()
            if text.startswith("{") and key in (found := json.loads(text)):
                return found

    def stderr_tail(self) -> str:
        """The last lines of the node's stderr."""
        lines = self.stderr.read_text(errors="replace").splitlines() if self.stderr.exists() else []
        return "\n".join(lines[-30:]) or "(no stderr)"


async def spawn(bench: Bench, node_id: str, actor: str) -> Worker:
    """Start one node process (this script in worker mode) with its spec on the command line."""
    spec = {"project_id": bench.project_id, "actor": actor, "sessions": bench.sessions, "duration": bench.duration}
    stderr = bench.folder / f"{actor}.stderr"
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).resolve()), WORKER_FLAG, json.dumps(spec),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err,
            env=bench.env(node_id), cwd=bench.folder,
        )  # fmt: skip
    return Worker(proc, node_id, stderr)


async def applied_rows(bench: Bench, actor: str) -> Counter[str]:
    """The node's rows of the timed loop in transition_log, by outcome (every one must be `applied`)."""
    conn = await asyncpg.connect(admin_dsn(bench.url), timeout=10)
    try:
        rows = await conn.fetch(
            "SELECT outcome, count(*) AS n FROM transition_log WHERE actor = $1 AND trigger = ANY($2::text[]) "
            "GROUP BY outcome",
            actor,
            list(CYCLE),
        )
    finally:
        await conn.close()
    return Counter({row["outcome"]: row["n"] for row in rows})


async def owners(bench: Bench, actor: str) -> Counter[str | None] | None:
    """The recorded owner (`sessions.node_id`, migration 0013) of each session the node created, by node id; None
    when the schema has no such column."""
    conn = await asyncpg.connect(admin_dsn(bench.url), timeout=10)
    try:
        if not await conn.fetchval(
            "SELECT count(*) FROM information_schema.columns WHERE table_name = 'sessions' AND column_name = 'node_id'"
        ):
            return None
        rows = await conn.fetch(
            "SELECT s.node_id, count(*) AS n FROM sessions s JOIN transition_log t ON t.session_id = s.id "
            "WHERE t.trigger = 'create' AND t.actor = $1 GROUP BY s.node_id",
            actor,
        )
    finally:
        await conn.close()
    return Counter({row["node_id"]: row["n"] for row in rows})


async def connection_room(bench: Bench) -> tuple[int, int]:
    """(max_connections, connections open now) on the server."""
    conn = await asyncpg.connect(admin_dsn(bench.url), timeout=10)
    try:
        limit = int(await conn.fetchval("SHOW max_connections"))
        used = int(await conn.fetchval("SELECT count(*) FROM pg_stat_activity"))
    finally:
        await conn.close()
    return limit, used


async def measure(bench: Bench, nodes: int, run: int) -> Outcome:
    """Start `nodes` node processes, wait until all are set up, give them one start time, collect and check."""
    limit, used = await connection_room(bench)
    if used + nodes * POOL_PER_NODE > limit:
        print(f"  warning: {nodes} nodes may open {nodes * POOL_PER_NODE} connections; the server allows {limit}, "
              f"{used} are open")  # fmt: skip
    workers = []
    try:
        for index in range(1, nodes + 1):
            workers.append(await spawn(bench, f"bench-node-{index}", f"bench-r{run}-n{nodes}-node{index}"))
        ready = [await w.line("ready", READY_TIMEOUT_S) for w in workers]
        load_before = os.getloadavg()[0]
        start = time.time() + 0.5
        for worker in workers:
            await tell(worker, f"go {start!r}")
        await asyncio.sleep(max(0.0, start - time.time()))
        cpu_before = cpu_snapshot(make_url(bench.url).database)
        reports = [(await w.line("report", bench.duration + 120))["report"] for w in workers]
        cpu_after = cpu_snapshot(make_url(bench.url).database)  # before the nodes close their connections
        load_after = os.getloadavg()[0]
        for worker in workers:
            await tell(worker, "exit")
        for worker in workers:
            if await asyncio.wait_for(worker.proc.wait(), 60) != 0:
                raise RuntimeError(f"node {worker.node_id} exited {worker.proc.returncode}:\n{worker.stderr_tail()}")
    finally:
        for worker in workers:
            if worker.proc.returncode is None:
                worker.proc.kill()
                await worker.proc.wait()
    checked = 0
    for report in reports:
        if report["errors"]:
            raise SystemExit(f"FAILED: node {report['node']} had errors: {report['errors']}")
        rows = await applied_rows(bench, report["actor"])
        if rows != Counter({"applied": report["applied"]}):
            raise SystemExit(
                f"FAILED: node {report['node']} reported {report['applied']} applied transitions, transition_log "
                f"holds {dict(rows)} for its actor {report['actor']}"
            )
        checked += rows["applied"]
        held = await owners(bench, report["actor"])
        if held is not None and set(held) - {report["node"], None}:
            raise SystemExit(f"FAILED: sessions created by node {report['node']} are recorded as {dict(held)}")
        report["owned"] = "(no sessions.node_id column)" if held is None else f"{held[report['node']]}/{held.total()}"
        if held and held[None]:
            report["owned"] += f" ({held[None]} recorded with no node)"
    total_elapsed = max(max(r["last_done"] for r in reports) - start, bench.duration)
    rate = sum(r["applied"] for r in reports) / total_elapsed
    applied = sum(r["applied"] for r in reports)
    cpu = cpu_use(cpu_before, cpu_after, applied)
    return Outcome(nodes, rate, reports, max(r["setup_s"] for r in ready), (load_before, load_after), checked, cpu)


async def tell(worker: Worker, line: str) -> None:
    """One protocol line to a node."""
    assert worker.proc.stdin is not None
    worker.proc.stdin.write(f"{line}\n".encode())
    await worker.proc.stdin.drain()


def cpu_snapshot(database: str | None) -> tuple[int, int, int, int]:
    """(busy, total) jiffies of the whole machine (/proc/stat), the jiffies the server's backends of `database`
    used so far and how many there are (found by their process title; 0 when the server is not on this machine).
    Zeros where /proc is missing."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except OSError:
        return 0, 0, 0, 0
    total, idle = sum(fields[:8]), fields[3] + fields[4]  # user..steal; idle + iowait
    backends = jiffies = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not title.startswith("postgres: ") or f" {database} " not in title:
                continue
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        backends += 1
        jiffies += int(stat[11]) + int(stat[12])  # utime, stime (fields 14 and 15 of stat)
    return total - idle, total, jiffies, backends


def cpu_use(before: tuple[int, int, int, int], after: tuple[int, int, int, int], applied: int) -> str:
    """The machine's CPU busy share over the window and the server's CPU per transition, as one phrase."""
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return "CPU not measured (no /proc)"
    cores = os.cpu_count() or 1
    found = f"machine CPU {100 * busy / total:.0f}% busy ({cores} cores)"
    if after[3] and applied:
        per_tx = (after[2] - before[2]) / os.sysconf("SC_CLK_TCK") / applied * 1000
        found += f", PostgreSQL {per_tx:.2f} ms CPU per transition ({after[3]} backends)"
    return found


def print_outcome(outcome: Outcome, baseline: float | None) -> None:
    """One line per node count, then one per node."""
    ratio = f"  {outcome.rate / baseline:5.2f}× 1 node" if baseline else ""
    label = f"{outcome.nodes} node{'s' if outcome.nodes > 1 else ' '}"
    print(
        f"  {label}: {outcome.rate:7.1f} transitions/s{ratio}   (load {outcome.load[0]:.2f} → {outcome.load[1]:.2f}; "
        f"{outcome.checked_rows} applied rows checked in transition_log; set-up {outcome.setup_s:.1f} s)"
    )
    print(f"      {outcome.cpu}")
    for r in outcome.reports:
        per_tx = r["cpu_s"] / r["applied"] * 1000 if r["applied"] else float("nan")
        print(
            f"      {r['node']}: {r['applied'] / r['elapsed_s']:7.1f} tx/s ({r['applied']} in {r['elapsed_s']:.2f} s), "
            f"fire p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms, node CPU {per_tx:.2f} ms per transition "
            f"({r['cpu_s'] / r['elapsed_s']:.2f} of a core), "
            f"sessions recorded as its own {r['owned']}"
        )


async def guard_summary(bench: Bench) -> str:
    """The policies the log recorded for each timed trigger (from one applied row of each)."""
    conn = await asyncpg.connect(admin_dsn(bench.url), timeout=10)
    try:
        found = []
        for trigger in CYCLE:
            raw = await conn.fetchval(
                "SELECT guard_results FROM transition_log WHERE trigger = $1 AND outcome = 'applied' LIMIT 1", trigger
            )
            names = [g["policy"] for g in json.loads(raw)] if raw else []
            found.append(f"{trigger}: {', '.join(names) or 'no policy'}")
    finally:
        await conn.close()
    return "; ".join(found)


def parse_args() -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pg-url",
        default=PG_URL,
        help=f"server and admin database ({PG_URL}, or TASKGATE_BENCH_PG_URL); a fresh database is made and dropped",
    )
    parser.add_argument("--nodes", default="1,2,3", help="node counts to measure (default 1,2,3; 1 is the baseline)")
    parser.add_argument("--sessions", type=int, default=50, help="sessions per node, all cycling at once (50)")
    parser.add_argument("--duration", type=float, default=10.0, help="timed seconds per node count (10)")
    parser.add_argument("--runs", type=int, default=3, help="runs of every node count (3)")
    args = parser.parse_args()
    args.nodes = sorted({int(n) for n in args.nodes.split(",")})
    if args.nodes[0] < 1 or args.sessions < 1 or args.duration <= 0 or args.runs < 1:
        parser.error("node counts, --sessions and --runs must be ≥ 1 and --duration > 0")
    return args


async def prepare(url: str, folder: Path, sessions: int, duration: float) -> Bench:
    """Migrate the fresh database through bootstrap and register the shared project (a scratch repository)."""
    config = folder / "taskgate.toml"
    # WIP limit above a plan's size, so `resume` is never refused: the guard still runs and the plan is locked.
    config.write_text("[policies.wip_limit]\nlimit = 1000\n")
    bench = Bench(url, folder, config, 0, sessions, duration)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(bench.env("bench-setup"))
    try:
        app = await bootstrap(load_settings(folder))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        project = await app.tracker.init_project(str(git_repo(folder)), "bench")
        report = await database_report(app)
    finally:
        await app.close()
    print(f"database {report['database_url']} (schema {report['schema_revision']}, head {report['head_revision']})")
    bench.project_id = project.id
    return bench


async def main() -> None:
    """Create the database, measure every node count `--runs` times, print each run and the medians, drop it."""
    args = parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    name = f"taskgate_nodes_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    url = make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
    await admin(args.pg_url, f'CREATE DATABASE "{name}"')
    results: dict[int, list[Outcome]] = {n: [] for n in args.nodes}
    try:
        with tempfile.TemporaryDirectory(prefix="taskgate-nodes-") as tmp:
            bench = await prepare(url, Path(tmp), args.sessions, args.duration)
            print(
                f"each node: its own process and node id, {args.sessions} sessions of its own (plans of "
                f"{TASKS_PER_PLAN}) cycling {' / '.join(CYCLE)} all at once for {args.duration:g} s from one start"
            )
            for run in range(1, args.runs + 1):
                shift = (run - 1) % len(args.nodes)
                order = args.nodes[shift:] + args.nodes[:shift]
                print(f"\n== run {run}/{args.runs} (order: {', '.join(map(str, order))} nodes) ==")
                measured = {n: await measure(bench, n, run) for n in order}
                base = measured[args.nodes[0]].rate if args.nodes[0] == 1 else None
                for n in args.nodes:
                    print_outcome(measured[n], base if n != 1 else None)
                    results[n].append(measured[n])
            print(f"\nguards recorded: {await guard_summary(bench)}")
    finally:
        await admin(args.pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print_summary(results)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


def print_summary(results: dict[int, list[Outcome]]) -> None:
    """Each node count's runs and median, with the median of the same-run ratios to 1 node."""
    print(f"\n== summary: transitions/s, {len(next(iter(results.values())))} runs ==")
    ones = [o.rate for o in results.get(1, [])]
    for n, outcomes in results.items():
        rates = [o.rate for o in outcomes]
        line = f"  {n} node{'s' if n > 1 else ' '}: " + " / ".join(f"{r:7.1f}" for r in rates)
        line += f"   median {statistics.median(rates):7.1f}"
        if ones and n != 1:
            ratios = [r / one for r, one in zip(rates, ones, strict=True)]
            shown = " / ".join(f"{r:.2f}×" for r in ratios)
            line += f"   ratio to 1 node: {shown}, median {statistics.median(ratios):.2f}×"
        print(line)
    print("  (ratios are against the 1-node figure of the same run; load averages are printed with each figure)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == WORKER_FLAG:
        sys.exit(asyncio.run(node_main(json.loads(sys.argv[2]))))
    asyncio.run(main())
