"""A separate OS process contending for the sweeper lease on a shared database (driven by test_leases.py).

Self-contained on purpose: it imports only `taskgate`, never the `tests` package.

argv[1] is a JSON spec {"url", "node", "seconds", "ttl_s", "seed"}. The worker prints `ready`, waits for one line on
stdin (so that all workers start together), then for `seconds` tries to take or renew the lease every 20 ms. Now and
then (by its seed) it stops renewing for a while, or releases the lease, so that the lease changes hands. It prints
one JSON line: the spans during which it held the lease, each [taken (when the statement that took it returned),
the last expiry the database granted it, or the moment before it released it].
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

from taskgate.application.nodes.heartbeats import SWEEPER_LEASE, NodeIdentity, NodeService
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from taskgate.infrastructure.system import SystemClock


async def main(spec: dict) -> None:
    database = Database(spec["url"], pool_size=2, max_overflow=2)

    def uow(*, write: bool) -> SqlAlchemyUnitOfWork:
        return SqlAlchemyUnitOfWork(database, write=write)

    identity = NodeIdentity(spec["node"], "host", "/data", 0, "test")
    node = NodeService(uow, SystemClock(), identity, heartbeat_s=1.0)
    rng = random.Random(spec["seed"])
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    spans: list[list[float]] = []
    holding = False
    end = time.time() + spec["seconds"]
    while time.time() < end:
        lease = await node.hold(SWEEPER_LEASE, spec["ttl_s"])
        mine = lease.holder == node.holder
        if mine and not holding:  # it counts on the lease from when the statement that took it returned
            spans.append([time.time(), lease.expires_at.timestamp()])
        elif mine:
            spans[-1][1] = lease.expires_at.timestamp()
        holding = mine
        roll = rng.random()
        if holding and roll < 0.03:  # a pause longer than the lease: it lapses and another takes it over
            await asyncio.sleep(spec["ttl_s"] * 1.5)
            holding = False
        elif holding and roll < 0.06:  # a clean hand-over: it stops counting on the lease before giving it up
            spans[-1][1] = time.time()
            await node.release(SWEEPER_LEASE)
            holding = False
        await asyncio.sleep(0.02)
    await database.dispose()
    print(json.dumps({"node": spec["node"], "spans": spans}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
