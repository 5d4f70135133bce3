"""Round trip of taskgate's MCP tools over stdio and streamable HTTP, next to the empty tool `ping`.

A scratch git repository and data directory are seeded through the real CLI (`taskgate init`, `plan add`,
`task add`, `session start`), then the real server is spawned twice, one after the other, on that database:

- stdio: `taskgate serve`, driven by the SDK client over the process's stdin/stdout (`stdio_client`);
- HTTP: `taskgate serve --http --port PORT`, with an operator token from `taskgate token create --operator
  alice --json`, driven by the SDK's `streamable_http_client` with `Authorization: Bearer ...`.

On each, call by call in rotation (so all three see the same machine noise): `ping` (does nothing: the cost
of the protocol, the transport and the SDK), `session_status` (one read: resolve the id, load the session)
and a state change, `session_suspend` and `session_resume` alternating on the one session (one guarded,
logged transaction each; `resume` takes the plan lock and checks the WIP limit). It prints median and p99
(nearest rank) of each and the ratios tool / ping; the goal (issue 20) is a state change ≤ 2× the empty tool at
the median, and each state-change row says whether it was met. The load average is printed before and after.

The servers run with the product defaults (SQLite `synchronous=FULL`: every commit is fsynced; `--synchronous
NORMAL` to compare), in a temporary directory with no config file. Subprocesses are cleaned up on every path:
the SDK's stdio client closes stdin, waits 2 s, then terminates the process tree; the HTTP server is
terminated here and waited for (killed after 10 s).

Run:  .venv/bin/python benchmarks/mcp_latency.py [--n 300] [--warmup 20] [--synchronous FULL|NORMAL]
                                                  [--skip-stdio] [--skip-http]
      (~30-60 s for both transports at n=300 on a 2-vCPU machine)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx2
from bench_support import PG_BENCH_URL, emit_row, reset_pg_schema
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

GOAL_RATIO = 2.0
OPERATOR = "alice"
TASKGATE = Path(sys.executable).with_name("taskgate")
STARTUP_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10
SERIES = ("ping", "session_status", "suspend/resume", "session_suspend", "session_resume")
"""`suspend/resume` is every state change; `session_suspend` and `session_resume` are its two halves."""
GOAL_SERIES = ("suspend/resume", "session_suspend", "session_resume")
"""The rows issue 20's goal is about (a state-changing tool ≤ 2× ping); session_status is shown, with no goal."""


# -- statistics ----------------------------------------------------------------------------------------------


def percentile_ms(samples: list[int], pct: float) -> float:
    """Nearest-rank percentile of nanosecond samples, in milliseconds."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)] / 1e6


def median_ms(samples: list[int]) -> float:
    """Median of nanosecond samples, in milliseconds."""
    return statistics.median(samples) / 1e6


# -- setup through the CLI -----------------------------------------------------------------------------------


@dataclass
class Workspace:
    """The scratch directory: a git repository, a data directory, and the environment the CLI and servers get."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    session_id: str = ""
    store: str = "SQLite"  # where the server keeps its state: SQLite, or PostgreSQL (--postgres)

    def cli(self, *args: str) -> str:
        """Run `taskgate ARGS` in the workspace; its stdout. Raises with stderr when it fails."""
        done = subprocess.run(
            [str(TASKGATE), *args], cwd=self.root, env=self.env, capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            raise RuntimeError(f"taskgate {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def cli_json(self, *args: str) -> Any:
        """`cli(..., --json)`, parsed."""
        return json.loads(self.cli(*args, "--json"))


def make_git_repo(path: Path) -> Path:
    """A git repository with one commit on `main`."""
    path.mkdir(parents=True)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=path, check=True)
    (path / "README.md").write_text("bench\n")
    subprocess.run([*git, "add", "README.md"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], cwd=path, check=True)
    return path


def server_env(data_dir: Path, synchronous: str) -> dict[str, str]:
    """The environment without any TASKGATE_* of the caller, with the scratch data directory, the operator and
    SQLite's `synchronous` level."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    return env | {
        "TASKGATE_DATA_DIR": str(data_dir),
        "TASKGATE_OPERATOR__DEFAULT": OPERATOR,
        "TASKGATE_SQLITE__SYNCHRONOUS": synchronous,
    }


def seed(workspace: Workspace) -> None:
    """Project, plan, task and a started session, through the CLI; remembers the session id."""
    repo = make_git_repo(workspace.root / "repo")
    workspace.cli("init", str(repo), "--name", "bench")
    plan = workspace.cli_json("plan", "add", "Phase 1")
    task = workspace.cli_json("task", "add", "measure the MCP round trip", "--plan", str(plan["id"]))
    session = workspace.cli_json("session", "start", task["id"])
    workspace.session_id = session["id"]


# -- the servers ---------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, log: Path) -> None:
    """Until the HTTP server accepts connections; fails if it exits or takes longer than STARTUP_TIMEOUT_S."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"taskgate serve --http exited ({process.returncode}): {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"taskgate serve --http did not listen on {port} within {STARTUP_TIMEOUT_S} s")


@contextmanager
def http_server(workspace: Workspace, port: int) -> Iterator[None]:
    """`taskgate serve --http` running for the duration; terminated and waited for (then killed) afterwards."""
    log = workspace.root / "http-server.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(TASKGATE), "serve", "--http", "--port", str(port)],
            cwd=workspace.root,
            env=workspace.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_port(port, process, log)
            yield
        finally:
            stop(process)


def stop(process: subprocess.Popen) -> None:
    """Terminate `process` and wait for it; kill it if it is still there after STOP_TIMEOUT_S."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)


@asynccontextmanager
async def stdio_connection(workspace: Workspace, errlog: TextIO) -> AsyncIterator[Client]:
    """A client driving `taskgate serve` over its stdin/stdout (the SDK spawns and stops the process)."""
    params = StdioServerParameters(command=str(TASKGATE), args=["serve"], env=workspace.env, cwd=workspace.root)
    async with Client(stdio_client(params, errlog=errlog), cache=None) as client:
        yield client


@asynccontextmanager
async def http_connection(port: int, token: str) -> AsyncIterator[Client]:
    """A client on http://127.0.0.1:PORT/mcp carrying the bearer token on every request."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)
        async with Client(transport, cache=None) as client:
            yield client


# -- measuring -----------------------------------------------------------------------------------------------


async def timed_call(client: Client, tool: str, arguments: dict[str, Any]) -> int:
    """One `call_tool` round trip in nanoseconds. Raises when the tool answers with an error."""
    started = time.perf_counter_ns()
    result = await client.call_tool(tool, arguments)
    elapsed = time.perf_counter_ns() - started
    if result.is_error:
        raise RuntimeError(f"{tool}({arguments}) failed: {result.content[0].text}")
    return elapsed


async def measure(client: Client, session_id: str, n: int, warmup: int) -> dict[str, list[int]]:
    """`n` timed rounds of ping, session_status and suspend-or-resume, after `warmup` untimed rounds."""
    samples: dict[str, list[int]] = {name: [] for name in SERIES}
    status = await client.call_tool("session_status", {"session_id": session_id})
    suspended = status.structured_content["state"] == "suspended"
    for round_no in range(warmup + n):
        change = "session_resume" if suspended else "session_suspend"
        timings = {
            "ping": await timed_call(client, "ping", {}),
            "session_status": await timed_call(client, "session_status", {"session_id": session_id}),
            change: await timed_call(client, change, {"session_id": session_id, "reason": "benchmark"}),
        }
        timings["suspend/resume"] = timings[change]
        suspended = not suspended
        if round_no >= warmup:
            for name, elapsed in timings.items():
                samples[name].append(elapsed)
    return samples


def report(transport: str, samples: dict[str, list[int]], store: str = "SQLite") -> None:
    """Print median and p99 per series, and each tool's ratio to ping."""
    ping_median, ping_p99 = median_ms(samples["ping"]), percentile_ms(samples["ping"], 99)
    print(f"\n{transport}")
    header = f"{'tool':<16} {'n':>4} {'median':>9} {'p99':>9} {'median/ping':>12} {'p99/ping':>9}"
    print(f"  {header}  goal: a state change ≤ {GOAL_RATIO:g}× ping (median)")
    for name in SERIES:
        med, p99 = median_ms(samples[name]), percentile_ms(samples[name], 99)
        ratio = med / ping_median
        verdict = ("met" if ratio <= GOAL_RATIO else "missed") if name in GOAL_SERIES else ""
        n = len(samples[name])
        print(f"  {name:<16} {n:>4} {med:>7.2f}ms {p99:>7.2f}ms {ratio:>11.2f}× {p99 / ping_p99:>8.2f}×  {verdict}")
        if name == "suspend/resume":  # the goal's row: both state changes together
            emit_row(
                f"MCP {transport.split(':')[0]} ({store}): state change vs ping",
                med,
                ping_median,
                "ms",
                f"≤ {GOAL_RATIO:g}×",
            )


async def bench_stdio(workspace: Workspace, n: int, warmup: int) -> None:
    """Measure over stdio; the server's stderr goes to stdio-server.log in the workspace."""
    with (workspace.root / "stdio-server.log").open("w") as errlog:
        async with stdio_connection(workspace, errlog) as client:
            samples = await measure(client, workspace.session_id, n, warmup)
            report("stdio: taskgate serve", samples, workspace.store)


async def bench_http(workspace: Workspace, n: int, warmup: int) -> None:
    """Measure over streamable HTTP with a fresh operator token."""
    token = workspace.cli_json("token", "create", "--operator", OPERATOR, "--label", "benchmark")["token"]
    port = free_port()
    with http_server(workspace, port):
        async with http_connection(port, token) as client:
            samples = await measure(client, workspace.session_id, n, warmup)
    report(f"HTTP: taskgate serve --http (127.0.0.1:{port})", samples, workspace.store)


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="timed rounds per transport (default 300)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed rounds first (default 20)")
    parser.add_argument(
        "--synchronous", choices=["FULL", "NORMAL"], default="FULL", help="SQLite level (default FULL, the default)"
    )
    parser.add_argument("--skip-stdio", action="store_true", help="do not measure over stdio")
    parser.add_argument("--skip-http", action="store_true", help="do not measure over HTTP")
    parser.add_argument(
        "--postgres", nargs="?", const=PG_BENCH_URL, default=None, metavar="URL",
        help=f"serve from PostgreSQL (schema public reset first; default {PG_BENCH_URL})",
    )  # fmt: skip
    return parser.parse_args()


def main() -> None:
    """Seed a scratch workspace through the CLI, then measure each transport in turn."""
    args = parse_args()
    if not TASKGATE.exists():
        sys.exit(f"taskgate executable not found next to {sys.executable}")
    started = time.monotonic()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="taskgate-mcp-bench-") as tmp:
        workspace = Workspace(Path(tmp))
        workspace.env = server_env(workspace.root / "data", args.synchronous)
        if args.postgres:
            reset_pg_schema(args.postgres)
            workspace.env["TASKGATE_DATABASE_URL"] = args.postgres
            workspace.store = "PostgreSQL"
        seed(workspace)
        print(f"seeded {workspace.root} through the CLI; session {workspace.session_id}")
        store = "PostgreSQL" if args.postgres else f"SQLite synchronous={args.synchronous}"
        print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {store}")
        if not args.skip_stdio:
            asyncio.run(bench_stdio(workspace, args.n, args.warmup))
        if not args.skip_http:
            asyncio.run(bench_http(workspace, args.n, args.warmup))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average after: {load}; total {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
