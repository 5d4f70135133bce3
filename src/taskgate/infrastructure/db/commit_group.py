"""Group commit for SQLite: concurrent write units of work of one process share one COMMIT (one fsync).

SQLite has one writer, so a process's write transactions run one after the other, and with
`synchronous=FULL` each pays a COMMIT that waits for the disk (~0.5 ms here: as much as the whole rest of a
transition). Under load most of that wait is spent while other writers queue behind it. Group commit lets
them share it:

- A write unit of work *joins* the open group, or opens one (`BEGIN IMMEDIATE` on the process's writer
  connection, which stays open). The
  group's connection runs one member at a time: a member holds the group's **turn** (a FIFO `asyncio.Lock`,
  the same queue the writers stood in before) from joining until its commit or rollback.
- Every member after the first runs inside its own `SAVEPOINT`, so a refused guard or an error rolls back
  only its own part (`ROLLBACK TO`). The first member needs none: nothing else is in the transaction yet, so
  its failure rolls the whole transaction back and the group is gone.
- A member's `commit()` releases its savepoint; its work is now part of the group, **not yet durable**. When
  nobody is queued it first lets the loop run once: SQLite statements never yield, so concurrent writers
  reach their `join` only then. If still nobody is queued, or the group is full (`max_members`) or old
  (`max_open_s`), the member commits the group. Otherwise it hands the turn to the next writer and waits for
  the group's COMMIT.
  `commit()` returns only after the shared COMMIT has returned, so nothing is acknowledged before it is
  durable; if the COMMIT fails, every member of the group gets the error (none was acknowledged).
- A lone writer therefore pays what it paid before (BEGIN IMMEDIATE, its statements, COMMIT) plus one pass
  of the event loop; the group grows only with writers that were ready to run anyway.

Why it cannot hang: the group is committed by whichever member finishes last, and "last" is decided while
holding the turn (no writer queued). A queued writer that is cancelled before its turn comes leaves the count
of queued writers; if it was the last one, it starts a closer that takes the turn and commits the group.
A crash anywhere before the COMMIT loses the whole group, none of which was acknowledged (SQLite's COMMIT is
atomic); a crash after it keeps the whole group. `tests/integration/db/test_group_commit.py` kills a process at
both boundaries.

PostgreSQL does not use this: its transactions run concurrently on their own connections, and its WAL writer
already flushes concurrent commits together (docs/decisions.md, "Group commit").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from taskgate.infrastructure.db.driver_statements import run_bare

if TYPE_CHECKING:
    from taskgate.infrastructure.db.connections import InlineConnection

MAX_MEMBERS = 64  # with MAX_OPEN_S, bounds how long the first member of a busy group waits for the COMMIT
MAX_OPEN_S = 0.025


@dataclass
class _Group:
    conn: InlineConnection
    opened_at: float
    members: int = 0  # joined so far; also numbers the savepoints
    released: int = 0  # members whose work is in the transaction, waiting for the COMMIT
    durable: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class Member:
    """One write unit of work's place in a group: the shared connection and its savepoint (None for the first)."""

    group: _Group
    savepoint: str | None

    @property
    def conn(self) -> InlineConnection:
        return self.group.conn


class CommitGroups:
    """The open group of one SQLite database handle, and the turn its writers take.

    `open_transaction` gives the process's writer connection in `BEGIN IMMEDIATE` (it waits out other
    processes' locks); the database handle owns that connection, so a group never closes it.
    """

    def __init__(
        self,
        open_transaction: Callable[[], Awaitable[InlineConnection]],
        *,
        max_members: int = MAX_MEMBERS,
        max_open_s: float = MAX_OPEN_S,
    ) -> None:
        self._open_transaction = open_transaction
        self.max_members, self.max_open_s = max_members, max_open_s
        self._turn = asyncio.Lock()
        self._queued = 0  # writers inside `_take_turn`: a member that finishes while > 0 hands the group on
        self._group: _Group | None = None
        self._closers: set[asyncio.Task[None]] = set()
        self.commits = 0  # COMMITs issued, and members acknowledged by them: the group sizes, for benchmarks
        self.acknowledged = 0

    async def join(self) -> Member:
        """Take the turn and a place in the open group (or open one). Raises: what opening the transaction
        raises (ConcurrentModification when another process holds the lock past the busy timeout)."""
        await self._take_turn()
        try:
            group = self._group
            if group is None:
                conn = await self._open_transaction()
                group = self._group = _Group(conn, asyncio.get_running_loop().time())
                savepoint = None
            else:
                savepoint = f"tg_member_{group.members}"
                _driver_sql(group.conn, f"SAVEPOINT {savepoint}")
            group.members += 1
            return Member(group, savepoint)
        except BaseException:
            self._finish_turn()
            raise

    async def commit(self, member: Member) -> None:
        """Put the member's work into the group and return once the group's COMMIT has returned.

        Raises: what the COMMIT raised (the member's work is then not in the database).
        """
        group = member.group
        try:
            if member.savepoint is not None:
                _driver_sql(group.conn, f"RELEASE SAVEPOINT {member.savepoint}")
            group.released += 1
        except BaseException:
            await self.rollback(member)
            raise
        if self._queued == 0 and group.members < self.max_members:
            # SQLite statements do not yield, so writers that are ready to run have not queued yet: let them
            # run up to their `join` (one pass of the loop) and they join this group instead of paying a COMMIT.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                self._close_or_hand_on(group)
                raise
        self._close_or_hand_on(group)
        # shield: a cancelled caller stops waiting, the group still commits (its work may be in it)
        await asyncio.shield(group.durable)

    def _close_or_hand_on(self, group: _Group) -> None:
        if self._closes_now(group):
            self._close(group)
        self._finish_turn()

    async def rollback(self, member: Member) -> None:
        """Undo the member's own work (the group's other members keep theirs) and give up the turn."""
        try:
            await self._undo(member)
        finally:
            group = self._group
            if group is not None and self._queued == 0:
                self._close(group)
            self._finish_turn()

    async def exclusive(self) -> None:
        """Take the turn with no group open (the open one is committed first): for work that needs a
        transaction of its own, such as a migration. Give it back with `release_exclusive`."""
        await self._take_turn()
        if self._group is not None:
            self._close(self._group)

    def release_exclusive(self) -> None:
        """Give up the turn taken by `exclusive`."""
        self._finish_turn()

    async def _undo(self, member: Member) -> None:
        group = member.group
        if member.savepoint is not None:
            _driver_sql(group.conn, f"ROLLBACK TO SAVEPOINT {member.savepoint}")
            _driver_sql(group.conn, f"RELEASE SAVEPOINT {member.savepoint}")
            return
        # the first member: nothing else is in the transaction, so the whole transaction goes
        self._group = None
        try:
            await group.conn.rollback()
        finally:
            group.durable.cancel()

    def _closes_now(self, group: _Group) -> bool:
        if self._queued == 0 or group.members >= self.max_members:
            return True
        return asyncio.get_running_loop().time() - group.opened_at >= self.max_open_s

    def _close(self, group: _Group) -> None:
        """COMMIT the group (inline: SQLite runs on the loop thread) and wake its members with the outcome."""
        self._group = None
        try:
            if group.released:
                group.conn.sync_connection.commit()
                self.commits += 1
                self.acknowledged += group.released
            else:
                group.conn.sync_connection.rollback()
        except BaseException as exc:
            _settle(group.durable, exc)
            _quietly_rollback(group.conn)
        else:
            _settle(group.durable, None)

    async def _take_turn(self) -> None:
        self._queued += 1
        try:
            await self._turn.acquire()
        except BaseException:
            self._queued -= 1
            if self._queued == 0 and self._group is not None and not self._turn.locked():
                self._start_closer()  # the writer the last member handed the group to is gone
            raise
        self._queued -= 1

    def _finish_turn(self) -> None:
        self._turn.release()

    def _start_closer(self) -> None:
        async def close_when_idle() -> None:
            await self._take_turn()
            try:
                if self._group is not None:
                    self._close(self._group)
            finally:
                self._finish_turn()

        task = asyncio.get_running_loop().create_task(close_when_idle())
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)


def _driver_sql(conn: InlineConnection, statement: str) -> None:
    """A savepoint statement straight on the sqlite3 connection (driver_statements.run_bare), twice per member."""
    run_bare(conn.sync_connection.connection.dbapi_connection, statement)


def _settle(future: asyncio.Future[None], exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)


def _quietly_rollback(conn: InlineConnection) -> None:
    """End the transaction a failed COMMIT left open (SQLite keeps it open, e.g. after a deferred foreign key
    failed), at the driver too: SQLAlchemy already counts its transaction as over, so its rollback alone would
    leave the writer connection inside the failed transaction."""
    with contextlib.suppress(Exception):  # the COMMIT's own error is what the members get
        conn.sync_connection.rollback()
    dbapi = conn.sync_connection.connection.dbapi_connection
    if dbapi is not None and dbapi.in_transaction:
        dbapi.rollback()
