"""Failover detection: how long after a node's SIGKILL a surviving node marks it down (docs/nodes.md).

Two `taskgate serve --http` nodes (a survivor and a victim, distinct node ids) on one fresh PostgreSQL database,
with `[node] heartbeat_s`, `lease_s` and `[sweeper] interval_s` as given. `--kills` times: wait until the victim
beats, SIGKILL it at a random moment of its heartbeat cycle, poll `nodes.down_at` every 10 ms until the survivor's
sweeper has marked it down, then restart it. Each kill prints the detection time (kill to mark), the same-run
baseline (kill to the earliest moment the lease allows: last heartbeat + lease_s) and their ratio; the summary gives
min, median, max, spread and standard deviation.

    .venv/bin/python benchmarks/failover.py [--pg-url URL] [--kills 10] [--heartbeat 1] [--lease 3] [--interval 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from node_throughput import PG_URL, admin, admin_dsn
from sqlalchemy.engine import make_url

TASKGATE = str(Path(sys.executable).with_name("taskgate"))


@dataclass
class Kill:
    detection_s: float  # SIGKILL to the survivor's mark
    earliest_s: float  # SIGKILL to last heartbeat + lease_s: no survivor may mark it sooner


class Node:
    """One `serve --http` process of the benchmark's database."""

    def __init__(self, node_id: str, folder: Path, env: dict[str, str]) -> None:
        self.id, self.folder, self.port = node_id, folder, _free_port()
        self.env = env | {"TASKGATE_NODE__ID": node_id, "TASKGATE_DATA_DIR": str(folder / node_id)}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.folder / f"{self.id}.log").open("a")
        self.process = subprocess.Popen(
            [TASKGATE, "serve", "--http", "--host", "127.0.0.1", "--port", str(self.port)], cwd=self.folder,
            env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"{self.id} exited: {(self.folder / f'{self.id}.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        sys.exit(f"{self.id} did not listen within 60 s")

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=15)
            self.process = None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _row(conn: asyncpg.Connection, node_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT heartbeat_at, down_at FROM nodes WHERE id = $1", node_id)


async def one_kill(conn: asyncpg.Connection, victim: Node, heartbeat_s: float, lease_s: float) -> Kill:
    """Wait for a fresh beat of the victim, kill it at a random point of its cycle, time the mark."""
    while (row := await _row(conn, victim.id)) is None or row["down_at"] is not None:
        await asyncio.sleep(0.02)
    await asyncio.sleep(random.uniform(0, heartbeat_s))
    killed_at = time.time()
    victim.kill()
    while (row := await _row(conn, victim.id))["down_at"] is None:
        await asyncio.sleep(0.01)
    seen_at = time.time()
    earliest = row["heartbeat_at"].timestamp() + lease_s
    return Kill(seen_at - killed_at, max(0.0, earliest - killed_at))


def parse_args() -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default=PG_URL, help=f"server and admin database ({PG_URL})")
    parser.add_argument("--kills", type=int, default=10, help="kills to time (10)")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="[node] heartbeat_s (1)")
    parser.add_argument("--lease", type=float, default=3.0, help="[node] lease_s (3)")
    parser.add_argument("--interval", type=float, default=1.0, help="[sweeper] interval_s (1)")
    args = parser.parse_args()
    if args.kills < 1 or args.lease <= args.heartbeat:
        parser.error("--kills must be ≥ 1 and --lease longer than --heartbeat")
    return args


async def main() -> None:
    """Create the database, start the two nodes, time every kill, print each and the summary, drop it."""
    args = parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print(f"heartbeat_s {args.heartbeat:g}, lease_s {args.lease:g}, sweeper interval_s {args.interval:g}: "
          f"a mark is due within lease_s + interval_s = {args.lease + args.interval:g} s of the last beat")  # fmt: skip
    name = f"taskgate_failover_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    url = make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
    await admin(args.pg_url, f'CREATE DATABASE "{name}"')
    kills: list[Kill] = []
    try:
        with tempfile.TemporaryDirectory(prefix="taskgate-failover-") as tmp:
            folder = Path(tmp)
            config = folder / "taskgate.toml"
            config.write_text(f"[node]\nheartbeat_s = {args.heartbeat}\nlease_s = {args.lease}\n\n"
                              f"[sweeper]\ninterval_s = {args.interval}\n")  # fmt: skip
            env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
            env |= {"TASKGATE_CONFIG": str(config), "TASKGATE_DATABASE_URL": url}
            survivor, victim = Node("survivor", folder, env), Node("victim", folder, env)
            survivor.start()
            victim.start()
            conn = await asyncpg.connect(admin_dsn(url), timeout=10)
            try:
                for n in range(1, args.kills + 1):
                    kill = await one_kill(conn, victim, args.heartbeat, args.lease)
                    kills.append(kill)
                    ratio = kill.detection_s / kill.earliest_s if kill.earliest_s else float("nan")
                    print(f"kill {n:2}: found down after {kill.detection_s:5.2f} s; lease lapsed after "
                          f"{kill.earliest_s:5.2f} s (baseline); ratio {ratio:4.2f}×", flush=True)  # fmt: skip
                    victim.start()
            finally:
                await conn.close()
                victim.stop()
                survivor.stop()
    finally:
        await admin(args.pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print_summary(kills)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


def print_summary(kills: list[Kill]) -> None:
    """Min, median, max, spread and standard deviation of the detection times, and of the ratio to baseline."""
    found = [k.detection_s for k in kills]
    ratios = [k.detection_s / k.earliest_s for k in kills if k.earliest_s]
    spread = max(found) - min(found)
    deviation = statistics.stdev(found) if len(found) > 1 else 0.0
    print(f"\ndetection over {len(found)} kills: min {min(found):.2f} s, median {statistics.median(found):.2f} s, "
          f"max {max(found):.2f} s, spread {spread:.2f} s, stdev {deviation:.2f} s")  # fmt: skip
    if ratios:
        print(f"ratio to the lease's earliest moment: median {statistics.median(ratios):.2f}×, max {max(ratios):.2f}×")


if __name__ == "__main__":
    asyncio.run(main())
