"""The CLI's everyday read commands in a repository with 50 sessions, next to `python -c pass` (issue 43).

A fresh git repository is set up with `taskgate init` (SQLite, the default), 60 tasks are added and 50 sessions
started (in-process through `bootstrap`, for speed; the WIP limit raised to allow them), and then each of
`taskgate session list`, `taskgate session show ID` and `taskgate task ready` is timed as a whole process, wall time
from launch to exit, alternating with `python -c pass` on the same interpreter (`--n` pairs a round, `--rounds`
rounds; the row is the median of the rounds' median ratios). The same commands with `TASKGATE_FULL_READS=1` (the
full path: settings models, SQLAlchemy's asyncio engine, Alembic's check) are timed too, for the before/after.
Bytecode is cached under the run's folder after a warm-up, so the figures are what a user sees from the second
run on; the load average is printed before and after. With `--postgres` the repository's database is PostgreSQL
(TASKGATE_DATABASE_URL, its schema reset first), read by the fast path with asyncpg alone.

Run:  .venv/bin/python benchmarks/cli_reads.py [--n 9] [--rounds 3] [--postgres [URL]]   (~1.5 min on 2 vCPUs)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_support import emit_row, git_repo, reset_pg_schema

TASKGATE = str(Path(sys.executable).with_name("taskgate"))
PG_READS_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/taskgate_bench_reads"
GOAL = 15.0


def load() -> str:
    """The 1-, 5- and 15-minute load averages."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


async def _fill(repo: Path, sessions: int) -> str:
    """60 tasks and `sessions` started sessions in `repo`'s database; the id of the last session."""
    from taskgate.application.sessions.commands import StartTask
    from taskgate.application.trackers.builtin import AddTask
    from taskgate.bootstrap import bootstrap, load_settings

    app = await bootstrap(load_settings(cwd=repo))
    try:
        project = await app.tracker.resolve_project(None, str(repo))
        people = [f"bench{n}" for n in range(sessions // 10 + 1)]  # each operator may have 10 in progress
        for person in people:
            await app.tracker.ensure_operator(person)
        tasks = [await app.tracker.add_task(AddTask(project.id, f"task {n}")) for n in range(sessions + 10)]
        for n, task in enumerate(tasks[:sessions]):
            person = people[n // 10]
            last = await app.sessions.start_task(StartTask(task.id, f"operator:{person}", person))
        return last.session.id
    finally:
        await app.close()


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def pair(label: str, argv: list[str], env: dict[str, str], cwd: Path, n: int, rounds: int, goal: float | None) -> None:
    """`argv` against `python -c pass`, alternating; print each round and emit the row."""
    base = [sys.executable, "-c", "pass"]
    _run(argv, env, cwd), _run(base, env, cwd)  # warm-up: bytecode cached, files in the page cache
    ours, theirs, ratios = [], [], []
    for index in range(rounds):
        a, b = [], []
        for _ in range(n):
            a.append(_run(argv, env, cwd))
            b.append(_run(base, env, cwd))
        ma, mb = statistics.median(a), statistics.median(b)
        ours.append(ma), theirs.append(mb), ratios.append(ma / mb)
        print(f"  {label:<44} round {index + 1}: {ma * 1e3:7.1f} ms vs {mb * 1e3:5.1f} ms = {ma / mb:5.2f}×")
    ma, mb = statistics.median(ours), statistics.median(theirs)
    print(f"  {label:<44} median : {ma * 1e3:7.1f} ms vs {mb * 1e3:5.1f} ms = {statistics.median(ratios):5.2f}×")
    if goal is not None:
        emit_row(f"{label} vs python -c pass", ma * 1e3, mb * 1e3, "ms", f"≤ {goal:g}×")


def main() -> None:
    """Build the repository, then time every command both ways."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=9, help="pairs per round (default 9)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--sessions", type=int, default=50, help="sessions in the repository (default 50)")
    parser.add_argument("--postgres", nargs="?", const=PG_READS_URL, default=None,
                        help=f"on PostgreSQL at this URL (default {PG_READS_URL}; its schema is reset)")  # fmt: skip
    args = parser.parse_args()
    store = "PostgreSQL" if args.postgres else "SQLite"
    print(f"cli_reads: {args.sessions} sessions on {store}, {args.rounds} rounds of {args.n} pairs; {load()}")
    with tempfile.TemporaryDirectory(prefix="taskgate-reads-") as tmp:
        root = Path(tmp)
        repo = git_repo(root)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env |= {"PYTHONPYCACHEPREFIX": str(root / "pycache"), "XDG_CACHE_HOME": str(root / "cache"), "COLUMNS": "200"}
        if args.postgres:
            reset_pg_schema(args.postgres)
            env["TASKGATE_DATABASE_URL"] = os.environ["TASKGATE_DATABASE_URL"] = args.postgres
        subprocess.run([TASKGATE, "init", "."], cwd=repo, env=env, check=True, capture_output=True)
        config = repo / ".taskgate" / "taskgate.toml"
        text = config.read_text()
        config.write_text(text.replace("[policies.wip_limit]", f"[policies.wip_limit]\nlimit = {args.sessions + 10}")
                          .replace("\nlimit = 3\n", "\n", 1))  # fmt: skip
        os.environ["XDG_CACHE_HOME"] = env["XDG_CACHE_HOME"]
        session_id = asyncio.run(_fill(repo, args.sessions))
        subprocess.run([TASKGATE, "project", "list"], cwd=repo, env=env, check=True, capture_output=True)  # a start
        commands = {"session list": ["session", "list"], "session show ID": ["session", "show", session_id[:8]],
                    "task ready": ["task", "ready"]}  # fmt: skip
        full = env | {"TASKGATE_FULL_READS": "1"}
        for label, words in commands.items():
            pair(f"taskgate {label} ({args.sessions} sessions, {store})", [TASKGATE, *words], env, repo, args.n,
                 args.rounds, GOAL)  # fmt: skip
        for label, words in commands.items():
            pair(f"  the full path: {label}", [TASKGATE, *words], full, repo, max(3, args.n // 3), args.rounds, None)
    print(load())


if __name__ == "__main__":
    main()
