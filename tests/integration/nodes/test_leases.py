"""The sweeper lease across processes (application/nodes/heartbeats.py): three OS processes contend for it on one
database for several seconds, each now and then pausing longer than the lease or releasing it. The spans during which
each believed it held the lease never overlap, and the lease changed hands many times. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("_lease_worker.py")
SECONDS, TTL_S = 6.0, 0.3


async def _spawn(spec: dict) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), json.dumps(spec),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    assert line.strip() == b"ready", line + (await process.stderr.read() if process.stderr else b"")
    return process


async def _result(process: asyncio.subprocess.Process) -> dict:
    out, err = await asyncio.wait_for(process.communicate(), SECONDS + 60)
    assert process.returncode == 0, err.decode()
    return json.loads(out.decode().strip().splitlines()[-1])


async def test_three_processes_never_hold_the_sweeper_lease_at_once(sql_services):
    assert sql_services.url is not None
    specs = [{"url": sql_services.url, "node": f"node-{n}", "seconds": SECONDS, "ttl_s": TTL_S, "seed": n}
             for n in range(3)]  # fmt: skip
    workers = [await _spawn(spec) for spec in specs]
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write(b"go\n")
        await worker.stdin.drain()
    results = [await _result(worker) for worker in workers]

    spans = [(r["node"], start, end) for r in results for start, end in r["spans"]]
    for (a, a_start, a_end), (b, b_start, b_end) in itertools.combinations(spans, 2):
        if a != b:
            assert a_end <= b_start or b_end <= a_start, (
                f"{a} held [{a_start}, {a_end}] while {b} held [{b_start}, {b_end}]"
            )
    ordered = sorted(spans, key=lambda s: s[1])
    handovers = sum(1 for x, y in itertools.pairwise(ordered) if x[0] != y[0])
    assert handovers >= 5, f"the lease changed hands only {handovers} times: {ordered}"
    assert {r["node"] for r in results if r["spans"]} == {"node-0", "node-1", "node-2"}
