"""How long `taskgate` takes to start, next to the least a Python program on the same interpreter takes.

Each row times whole processes, launched from here (wall time from `Popen` to exit, or to the answer):

- `taskgate --help` vs `python -c pass` (goal ≤ 3×): the top-level help, printed without Typer;
- `taskgate fsm` vs `python -c pass`: a command that opens no database (no SQLAlchemy, Alembic or MCP);
- `taskgate workflow validate` vs `python -c pass`: the built-in catalogue, checked (settings and workflow
  files, no database);
- `taskgate serve` until `tools/list` answers vs a bare `MCPServer` with one tool on stdio, same SDK (goal
  ≤ 1.2×): both get `initialize`, `notifications/initialized` and `tools/list` on stdin at once, and the clock
  stops when the `tools/list` reply is read. `serve` runs on a SQLite database migrated beforehand, with its
  local operator registered (as `taskgate init` leaves it): it answers both from its tool table and reads the
  operator's roles to filter the list, then opens the database (schema check, start-up recovery, a heartbeat)
  behind them (issue 43);
- `taskgate serve` until its first tool call answers vs the same bare server (no goal; what the opening costs
  the first call): the same lines and a `tools/call` of `ping` at once, the clock stopping at the call's reply.

With `--postgres [URL]` both serve rows run on PostgreSQL (default database `taskgate_bench_front`, its schema
`public` dropped and recreated first: never point it at a database you care about). Nothing reads PostgreSQL in
time for the first list, so serve lists what the local operator's grants remembered at its last opening allow
(infrastructure/grants_cache.py); the warm-up run is the one that remembers them, as a user's first serve does.

Each round runs the pair A B A B … `--n` times and prints both medians and the ratio of the medians; the rows
are the medians over `--rounds` rounds. Everything runs in a temporary directory with no config file; bytecode
is cached under it (`PYTHONPYCACHEPREFIX`, after one warm-up run of each command), so the figures are the
start-up a user sees from the second run on, whatever `PYTHONDONTWRITEBYTECODE` says here. The load average
is printed at the start and the end: on a shared machine it says how far to trust the figures.

Run:  .venv/bin/python benchmarks/cli_startup.py [--n 9] [--rounds 3] [--skip-serve | --serve-only] [--postgres [URL]]
      (~1 min on a 2-vCPU machine, most of it `serve`)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_support import emit_row, reset_pg_schema

TASKGATE = str(Path(sys.executable).with_name("taskgate"))
PYTHON = sys.executable
BARE_SERVER = '''"""A bare MCP server: one tool, stdio, the SDK's defaults."""
from mcp.server.mcpserver import MCPServer

server = MCPServer("bare")


@server.tool()
def ping() -> str:
    """Answer pong."""
    return "pong"


server.run("stdio")
'''
HANDSHAKE = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        },
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
]
FIRST_CALL = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "ping", "arguments": {}}}
GOALS = {"taskgate --help": 3.0, "taskgate serve until tools/list": 1.2}
PG_FRONT_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/taskgate_bench_front"
"""The database `--postgres` resets and uses by default (created on first use)."""
ROWS: list[str] = []
"""The summary table's rows, one per pair."""


def load() -> str:
    """The 1-, 5- and 15-minute load averages, and how many CPUs share them."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_to_exit(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Seconds from launch to exit of `argv`, and the CPU seconds (user + system) it used; its output is thrown
    away. Raises: CalledProcessError if it fails."""
    cpu, start = _cpu_of_children(), time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start, _cpu_of_children() - cpu


def run_to_tools(argv: list[str], env: dict[str, str], cwd: Path, first_call: bool = False) -> tuple[float, float]:
    """Seconds from launch of the MCP server `argv` until its `tools/list` reply is read (with `first_call`: its
    reply to a `ping` call sent with it), and the CPU seconds it used in all (it is then stopped by closing its
    stdin: its shutdown is in the CPU figure, not in the time)."""
    cpu, start = _cpu_of_children(), time.perf_counter()
    server = subprocess.Popen(
        argv, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert server.stdin is not None and server.stdout is not None
    messages, awaited = [*HANDSHAKE, FIRST_CALL] if first_call else HANDSHAKE, 3 if first_call else 2
    try:
        server.stdin.write(b"".join(json.dumps(message).encode() + b"\n" for message in messages))
        server.stdin.flush()
        while True:
            line = server.stdout.readline()
            if not line:
                raise RuntimeError(f"{argv[0]} closed its stdout before answering request {awaited}")
            reply = json.loads(line)
            if reply.get("id") == awaited:
                elapsed = time.perf_counter() - start
                if reply.get("result", {}).get("isError", "error" in reply):
                    raise RuntimeError(f"request {awaited} failed: {reply}")
                break
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return elapsed, _cpu_of_children() - cpu


Run = Callable[[], tuple[float, float]]


def pair(label: str, ours: Run, base: Run, n: int, rounds: int) -> None:
    """Run `ours` and `base` alternately, `n` times a round; print each round's medians (time, and CPU) and the
    medians over rounds. The goal is judged on time; the CPU ratio says how much of a time ratio is the load."""
    ours(), base()  # warm-up: bytecode compiled and cached, files in the page cache
    medians: list[tuple[float, ...]] = []
    for index in range(rounds):
        a, b = [], []
        for _ in range(n):
            a.append(ours())
            b.append(base())
        medians.append(tuple(statistics.median(run[k] for run in runs) for runs in (a, b) for k in (0, 1)))
        print(f"  {label:<32} round {index + 1}: " + _figures(*medians[-1]))
    ma, ca, mb, cb = (statistics.median(m[k] for m in medians) for k in range(4))
    goal = GOALS.get(label)
    verdict = "" if goal is None else f"  goal ≤ {goal}×: {'met' if ma / mb <= goal else 'not met'}"
    print(f"  {label:<32} median : " + _figures(ma, ca, mb, cb) + verdict)
    if goal is not None:
        emit_row(f"{label} vs {'a bare MCPServer' if 'serve' in label else 'python -c pass'}", ma * 1e3, mb * 1e3, "ms",
                 f"≤ {goal}×")  # fmt: skip
    low, high = min(m[0] / m[2] for m in medians), max(m[0] / m[2] for m in medians)
    ROWS.append(
        f"| {label} | {ma * 1e3:.1f} ms ({ca * 1e3:.0f}) | {mb * 1e3:.1f} ms ({cb * 1e3:.0f}) "
        f"| {ma / mb:.2f}× ({low:.2f}–{high:.2f}) | {ca / cb:.2f}× |"
    )


def _figures(ma: float, ca: float, mb: float, cb: float) -> str:
    return (
        f"{ma * 1e3:7.1f} ms (cpu {ca * 1e3:6.1f})  baseline {mb * 1e3:6.1f} ms (cpu {cb * 1e3:6.1f})  "
        f"{ma / mb:5.2f}× (cpu {ca / cb:4.2f}×)"
    )


def initialised_repo(repo: Path, env: dict[str, str]) -> Path:
    """A git repository set up as a user does (`taskgate init .`: config, database migrated, the local operator an
    admin)."""
    repo.mkdir()
    for argv in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "-c", "user.email=b@b", "-c", "user.name=b", "commit", "-q", "--allow-empty", "-m", "start"],
        [TASKGATE, "init", "."],
    ):
        subprocess.run(argv, env=env, cwd=repo, check=True, capture_output=True)
    return repo


def main() -> None:
    """Run every row and print the summary table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=9, help="runs of each command per round (default 9)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--skip-serve", action="store_true", help="only the CLI rows")
    parser.add_argument("--serve-only", action="store_true", help="only the serve rows")
    parser.add_argument("--postgres", nargs="?", const=PG_FRONT_URL, default=None, metavar="URL",
                        help=f"serve on PostgreSQL (default {PG_FRONT_URL}; its schema is reset)")  # fmt: skip
    args = parser.parse_args()

    store = "PostgreSQL" if args.postgres else "SQLite"
    print(f"cli_startup: {args.rounds} rounds of {args.n} runs each; serve on {store}; {load()}")
    with tempfile.TemporaryDirectory(prefix="taskgate-startup-") as tmp:
        root = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env |= {"PYTHONPYCACHEPREFIX": str(root / "pycache"), "TASKGATE_DATA_DIR": str(root / "data")}
        env |= {"COLUMNS": "120", "XDG_CACHE_HOME": str(root / "cache")}  # what taskgate remembers: this run's own
        if args.postgres:
            reset_pg_schema(args.postgres)
            env["TASKGATE_DATABASE_URL"] = args.postgres
        (root / "bare_server.py").write_text(BARE_SERVER)

        def python_pass() -> float:
            return run_to_exit([PYTHON, "-c", "pass"], env, root)

        def command(*words: str) -> Callable[[], float]:
            return lambda: run_to_exit([TASKGATE, *words], env, root)

        if not args.serve_only:
            pair("taskgate --help", command("--help"), python_pass, args.n, args.rounds)
            pair("taskgate fsm", command("fsm"), python_pass, args.n, args.rounds)
            pair("taskgate workflow validate", command("workflow", "validate"), python_pass, args.n, args.rounds)
        if not args.skip_serve:
            repo = initialised_repo(root / "repo", env)
            bare = [PYTHON, str(root / "bare_server.py")]
            pair(
                "taskgate serve until tools/list",
                lambda: run_to_tools([TASKGATE, "serve"], env, repo),
                lambda: run_to_tools(bare, env, repo),
                args.n,
                args.rounds,
            )
            pair(
                "taskgate serve until a first call",
                lambda: run_to_tools([TASKGATE, "serve"], env, repo, first_call=True),
                lambda: run_to_tools(bare, env, repo, first_call=True),
                args.n,
                args.rounds,
            )
    print(f"\n{load()}\n")
    print("| row | taskgate (cpu ms) | baseline (cpu ms) | ratio (rounds' range) | cpu ratio |")
    print("|---|---|---|---|---|")
    print("\n".join(ROWS))


if __name__ == "__main__":
    main()
