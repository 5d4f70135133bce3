"""The audit linker: every audited record committed so far gets its link, after its commit, in batches.

Writers of transition rows, decisions and events only insert them: no chain is read, locked or moved in their
transaction (docs/decisions.md, "Audit records linked after their commit"). `link_pending` links the records of
each table above its mark (`audit_marks`), up to the largest id no uncommitted transaction can still hold, in
batches of `LINK_BATCH` per table, and moves the marks. It runs before every checkpoint, verify, export and prune,
and every `[audit] link_interval_s` in `taskgate serve` (`run_linker`).

Why a record cannot be skipped: on PostgreSQL a record's id is taken from a sequence before its transaction
commits, so ids commit out of order. The ids the linker may link are read under a SHARE lock on the three tables
(`committed_tops`), which waits for every transaction that has inserted into them: no id at or below those tops
can commit afterwards. On SQLite the writers take turns and every visible row is committed (or in the linker's own
commit group, committed or rolled back with it).

Why linkers never race: each holds the marks for its transaction (PostgreSQL: FOR UPDATE; SQLite: the write
lock), so a second linker waits, then starts from the marks the first moved. The chains' head rows are written
only by linkers, checkpoints (their `signed_seq`) and prunes, each in one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Iterator

from taskgate.application.audit.ports import AuditUnitOfWorkFactory
from taskgate.domain.errors import ConcurrentModification

LINK_BATCH = 500  # records per table per transaction: on SQLite a batch holds the write lock (~20 ms for 500)
TOPS_PATIENCE_S = 10.0
"""How long a linker keeps trying to read the committed tops while writers hold the audited tables."""

_log = logging.getLogger("taskgate.audit")


async def link_pending(uow: AuditUnitOfWorkFactory, *, batch: int = LINK_BATCH) -> int:
    """Link every audited record committed before this call (and any committed meanwhile within the tops read);
    returns how many were linked. Nothing pending costs one read."""
    tops = await _committed_tops(uow)
    if tops is None:
        return 0
    total, more = 0, True
    while more:
        with collector_paused():
            async with uow(write=True) as unit:
                linked, more = await unit.audit.link_pending(tops, batch)
                await unit.commit()
        total += linked
    return total


async def _committed_tops(uow: AuditUnitOfWorkFactory) -> dict[str, int] | None:
    """The tops no uncommitted record can be below (None: nothing pending). On PostgreSQL the SHARE lock gives way
    after a short wait rather than deadlock with a writer (audit_link_store.py, `_LOCK_TIMEOUT`): it is tried again,
    with a growing pause, for up to TOPS_PATIENCE_S. Raises: ConcurrentModification when it never got the lock."""
    loop = asyncio.get_running_loop()
    deadline, pause = loop.time() + TOPS_PATIENCE_S, 0.01
    while True:
        try:
            async with uow(write=False) as unit:  # PostgreSQL: the SHARE lock, if taken, ends with this transaction
                return await unit.audit.committed_tops()
        except ConcurrentModification:
            if loop.time() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.5)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for one batch, back on after it (if it was on).

    A batch builds thousands of short-lived dicts and lists (the records' fields, their links) that live until
    the batch ends and hold no cycles: refcounting frees them all. With the collector on, they drive its young
    generations over their thresholds again and again, each collection walks them, and every few of those a full
    collection walks the whole process heap: 7-8 µs a record in a service holding a few thousand sessions' worth
    of objects, a quarter of a batch (benchmarks/README.md, "2026-11-27, night"). Other tasks that run while a
    batch awaits its database (PostgreSQL) also run with the collector off, for the batch's tens of milliseconds;
    their cycles are collected after it. Two batches at once: the first to end turns it back on, which is safe.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def run_linker(uow: AuditUnitOfWorkFactory, interval_s: float, stop: asyncio.Event) -> None:
    """`link_pending` every `interval_s` until `stop` is set. A failed pass is logged and tried again next time
    (its transaction rolled back whole: nothing half-linked stays)."""
    while not stop.is_set():
        try:
            await link_pending(uow)
        except Exception as exc:  # the service goes on; the records stay pending, to be linked by the next pass
            _log.warning("audit: linking failed, will try again: %s: %s", type(exc).__name__, exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
