"""PostgreSQL's write transactions on asyncpg directly: the transaction, the hot statements, and their writes merged.

A transition on PostgreSQL paid two costs per statement: a round trip, and SQLAlchemy's async adapter (~150–250 µs
of CPU per statement here: execution context, a greenlet hop each way, its prepared-statement cache, result set-up).
A write unit of work now runs on `PgWriteConnection`:

- **The transaction is asyncpg's.** The SQLAlchemy connection is checked out with isolation level AUTOCOMMIT (a
  public execution option), so its adapter never begins or commits anything itself; `begin`, `commit` and
  `rollback` run on the driver connection (`PoolProxiedConnection.driver_connection`, public) through asyncpg's
  own `Connection.transaction()`. Statements that still go through SQLAlchemy run inside that transaction: the
  server does not care which object sent BEGIN. The connection is the same one, so the codecs SQLAlchemy's
  dialect set on it at connect (JSON) apply to both paths.
- **The hot statements (`statements.HOT` and the FOR UPDATE reads) run on asyncpg**, compiled once per set of
  parameter names by SQLAlchemy for its asyncpg dialect, with SQLAlchemy's own bind and result processors
  (driver_statements.py's `_Prepared`, shared with SQLite), prepared by asyncpg's own statement cache (public:
  `Connection.fetch`/`execute` prepare and cache by SQL text). A driver error is wrapped as SQLAlchemy wraps it
  (IntegrityError for class 23, OperationalError for lock and serialization failures, else DBAPIError), with the
  asyncpg error as `.orig`, so callers and `unit_of_work._translate` see what they saw before.
- **Writes whose result nobody waits for are merged into the next write** (`defer`): the session's UPDATE, the
  task's and plan's status and the event's INSERT wait in the connection until a statement needs a result. When
  that statement is itself a hot write (the transition row's INSERT, whose seq the caller wants), all of them go
  as one statement of data-modifying CTEs; otherwise (a read, anything through SQLAlchemy, COMMIT) the waiting
  writes are sent first, as one statement, so every read sees every earlier write of its transaction.
  A deferred write's expected row count (the session's `WHERE version = old`: exactly one row) is checked when it is
  sent, and a mismatch raises the error the repository gave, before COMMIT: nothing of the unit commits. Why
  merging is safe: the sub-statements of one statement share its snapshot and cannot see each other's rows, so
  only writes to *different* rows are merged (a statement waits at most once per batch; a second one of the same
  kind sends the batch first), and no read is ever merged with a write. Row locks taken by the UPDATEs are the
  same ones the separate statements took, in the same transaction, after the locks the transition took first
  (session, operator, plan): the lock order is unchanged.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from taskgate.infrastructure.db.driver_statements import DriverResult, _Prepared

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from taskgate.infrastructure.db.pg_kept import KeptWriterConnections

_PLACEHOLDER = re.compile(r"\$(\d+)")
_LOCKING_CLASSES = ("40", "55", "57", "08", "53")  # serialization/deadlock, lock not available, cancel, connection


class _PgPrepared(_Prepared):
    """A hot statement compiled for asyncpg: what `_Prepared` knows, and whether it writes and returns rows."""

    __slots__ = ("returns", "writes")

    def __init__(self, statement: Any, dialect: Dialect, keys: tuple[str, ...]) -> None:
        super().__init__(statement, dialect, keys)
        compiled = self.compiled
        self.writes = bool(compiled.isinsert or compiled.isupdate or compiled.isdelete)
        self.returns = bool(self.columns)  # rows to fetch: a SELECT, or a write's RETURNING (implicit ones too)


class PgStatements:
    """The hot statements of one PostgreSQL (asyncpg) dialect, each compiled on first use per set of parameter names."""

    def __init__(self, dialect: Dialect, statements: Iterable[Any]) -> None:
        self._dialect = dialect
        self._hot = {id(s): s for s in statements}
        self._prepared: dict[tuple[int, tuple[str, ...]], _PgPrepared] = {}

    def runs(self, statement: Any, params: Any) -> bool:
        """Whether `statement` with `params` (one dict of parameters) goes to the driver."""
        return id(statement) in self._hot and isinstance(params, dict)

    def prepared(self, statement: Any, params: dict[str, Any]) -> _PgPrepared:
        """`statement` compiled for the names of `params`."""
        key = (id(statement), tuple(params))
        found = self._prepared.get(key)
        if found is None:
            found = self._prepared[key] = _PgPrepared(statement, self._dialect, key[1])
        return found


class _Deferred:
    """A write waiting to be sent: its SQL and arguments, and the row count it must have (None: any)."""

    __slots__ = ("args", "error", "expect", "sql", "statement")

    def __init__(self, statement: Any, sql: str, args: list[Any], expect: int | None, error: Any) -> None:
        self.statement, self.sql, self.args, self.expect, self.error = statement, sql, args, expect, error


class PgWriteConnection:
    """A PostgreSQL write unit of work's connection: the `AsyncConnection` surface the repositories use, with the
    transaction and the hot statements on asyncpg (see the module docstring)."""

    def __init__(self, conn: AsyncConnection, raw: Any, statements: PgStatements, kept: KeptWriterConnections) -> None:
        self._conn, self._raw, self._statements, self._kept = conn, raw, statements, kept
        self._transaction: Any = None
        self._pending: list[_Deferred] = []
        self._broken = False  # a ROLLBACK failed: the connection is not put back into the pool

    async def begin(self) -> None:
        """BEGIN on the driver connection (READ COMMITTED, the server's default)."""
        transaction = self._raw.transaction()
        try:
            await transaction.start()
        except Exception as exc:
            raise _wrapped("BEGIN", (), exc) from exc
        self._transaction = transaction

    async def defer(
        self,
        statement: Any,
        params: dict[str, Any],
        expect: int | None = None,
        error: Callable[[], Exception] | None = None,
    ) -> bool:
        """Hold a hot write until the next statement that needs a result (see the module docstring); False when the
        statement is not one this connection runs (the caller runs it now). `expect`: the row count it must have;
        otherwise `error()` is raised when it is sent."""
        if not self._statements.runs(statement, params):
            return False
        prepared = self._statements.prepared(statement, params)
        if not prepared.writes:
            return False
        if any(d.statement is statement for d in self._pending):  # never two writes of one kind in one statement
            await self.flush()
        sql, args = prepared.arguments(params)
        self._pending.append(_Deferred(statement, sql, args, expect, error))
        return True

    async def execute(self, statement: Any, parameters: Any = None) -> Any:
        """Run `statement`: a hot one on asyncpg (merged with the waiting writes when it writes too), any other one
        through SQLAlchemy after the waiting writes are sent."""
        if self._statements.runs(statement, parameters):
            prepared = self._statements.prepared(statement, parameters)
            sql, args = prepared.arguments(parameters)
            # a read never shares a statement with the writes before it (it would not see them), nor a write one of
            # its own kind (two updates of one row in one statement apply in no defined order)
            if self._pending and (not prepared.writes or any(d.statement is statement for d in self._pending)):
                await self.flush()
            return await self._run(prepared, sql, args)
        await self.flush()
        return await self._conn.execute(statement, parameters)

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> Any:
        await self.flush()
        return await self._conn.exec_driver_sql(statement, parameters)

    async def run_sync(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        await self.flush()
        return await self._conn.run_sync(fn, *args, **kwargs)

    async def flush(self) -> None:
        """Send the waiting writes (one statement) and check their row counts. Raises: the error a deferred write
        was given when its count differs; SQLAlchemy's DBAPIError subclasses."""
        if not self._pending:
            return
        if len(self._pending) == 1:
            only = self._pending.pop()
            try:
                status = await self._raw.execute(only.sql, *only.args)
            except Exception as exc:
                raise _wrapped(only.sql, only.args, exc) from exc
            _check(only, _count(status))
            return
        await self._run(None, None, None)

    async def _run(self, prepared: _PgPrepared | None, sql: str | None, args: list[Any] | None) -> DriverResult:
        """`sql` alone, or the waiting writes and `sql` (None: none) as one statement of data-modifying CTEs."""
        pending, self._pending = self._pending, []
        if not pending:
            assert prepared is not None and sql is not None and args is not None
            return await self._alone(prepared, sql, args)
        merged, merged_args = _merge(pending, prepared, sql, args)
        try:
            rows = await self._raw.fetch(merged, *merged_args)
        except Exception as exc:
            raise _wrapped(merged, merged_args, exc) from exc
        first = rows[0]
        for position, deferred in enumerate(pending):
            _check(deferred, first[position])
        if prepared is None:
            return DriverResult([], 0, None)
        count = first[len(pending)]
        own = [tuple(row)[len(pending) + 1 :] for row in rows] if count and prepared.returns else []
        return _result(prepared, own, count)

    async def _alone(self, prepared: _PgPrepared, sql: str, args: list[Any]) -> DriverResult:
        try:
            if prepared.returns:
                records = await self._raw.fetch(sql, *args)
                return _result(prepared, [tuple(r) for r in records], len(records))
            status = await self._raw.execute(sql, *args)
        except Exception as exc:
            raise _wrapped(sql, args, exc) from exc
        return DriverResult([], _count(status), None)

    async def commit(self) -> None:
        """Send the waiting writes, then COMMIT. Raises: as `flush`; the COMMIT's error wrapped."""
        await self.flush()
        transaction, self._transaction = self._transaction, None
        if transaction is not None:
            try:
                await transaction.commit()
            except Exception as exc:
                raise _wrapped("COMMIT", (), exc) from exc

    async def rollback(self) -> None:
        """Drop the waiting writes and roll the transaction back."""
        self._pending.clear()
        transaction, self._transaction = self._transaction, None
        if transaction is not None:
            try:
                await transaction.rollback()
            except Exception as exc:
                self._broken = True
                raise _wrapped("ROLLBACK", (), exc) from exc

    async def close(self) -> None:
        """Give the connection back (kept for the next write unit, or to the pool: pg_kept.py); a transaction still
        open is rolled back first (SQLAlchemy's reset on return does not know of it), and a connection that cannot
        roll back is invalidated rather than pooled."""
        try:
            if self._transaction is not None:
                with contextlib.suppress(DBAPIError):  # a failed ROLLBACK marks it broken: invalidated below
                    await self.rollback()
            if self._broken:
                await self._conn.invalidate()
        finally:
            # not kept when the ROLLBACK failed, or when this close was interrupted before its transaction ended
            reusable = not self._broken and self._transaction is None
            await self._kept.give_back(self._conn, self._raw, reusable=reusable)

    def in_transaction(self) -> bool:
        return self._transaction is not None


_AUDITED_ORDER = ("transition_log", "decisions", "events")  # the linker's LOCK TABLE order (audit_link_store.py)
_TARGET = re.compile(r'^\s*(?:INSERT\s+INTO|UPDATE)\s+"?(\w+)"?', re.IGNORECASE)


def _lock_rank(sql: str) -> int:
    """Where a write goes in a merged statement: other tables first, then the audited ones in the linker's order."""
    found = _TARGET.match(sql)
    table = found.group(1) if found else ""
    return _AUDITED_ORDER.index(table) + 1 if table in _AUDITED_ORDER else 0


def _merge(
    pending: list[_Deferred], prepared: _PgPrepared | None, sql: str | None, args: list[Any] | None
) -> tuple[str, list[Any]]:
    """One statement: each waiting write as a CTE returning a row per row written, the last write (if any) too, and a
    SELECT of their row counts, then the last write's own returned columns (one row per returned row; a row of NULLs
    when it returned none). Its arguments are the writes' own, in the order written."""
    writes = [(d.sql, d.args) for d in pending]
    if prepared is not None:
        assert sql is not None and args is not None
        writes.append((sql, args))
    texts = tuple((text, len(values)) for text, values in writes)
    all_args = [value for _text, values in writes for value in values]
    returns = prepared is not None and prepared.returns
    # The text depends only on the writes' texts (and whether the last returns rows): a transition's is built once,
    # not per transition (~40 µs of renumbering). A walk of a session sends ~14 distinct ones; the bound only keeps
    # an unforeseen variety from growing the dict without end.
    key = (texts, returns)
    merged = _MERGED.get(key)
    if merged is None:
        if len(_MERGED) >= _MERGED_MAX:
            _MERGED.clear()
        merged = _MERGED[key] = _merged_text(texts, returns)
    return merged, all_args


_MERGED: dict[tuple[tuple[tuple[str, int], ...], bool], str] = {}
_MERGED_MAX = 512


def _merged_text(texts: tuple[tuple[str, int], ...], returns: bool) -> str:
    """`_merge`'s statement for writes of these texts and numbers of arguments, in this order."""
    parts = []
    # PostgreSQL locks a statement's tables as it parses its CTEs, in their order. The linker takes SHARE locks on
    # the audited tables in _AUDITED_ORDER (audit_link_store.py); a statement inserting the event before the log
    # row held ROW EXCLUSIVE on events while it waited for transition_log, which the linker held while it waited
    # for events: a deadlock. So the CTEs go in that order whatever order the unit wrote in (they are independent:
    # none reads another's rows), each keeping its number, so the counts below stay in the order written.
    order = sorted(range(len(texts)), key=lambda n: (_lock_rank(texts[n][0]), n))
    offsets, offset = [], 0
    for _text, arity in texts:
        offsets.append(offset)
        offset += arity
    for number in order:
        renumbered = _PLACEHOLDER.sub(lambda m, o=offsets[number]: f"${int(m.group(1)) + o}", texts[number][0])
        if " RETURNING " not in renumbered:
            renumbered += " RETURNING 1"
        parts.append(f"w{number} AS ({renumbered})")
    counts = ", ".join(f"(SELECT count(*) FROM w{n}) AS n{n}" for n in range(len(texts)))
    last = len(texts) - 1
    if returns:
        tail = f"SELECT c.*, w{last}.* FROM (SELECT {counts}) AS c LEFT JOIN w{last} ON true"
    else:
        tail = f"SELECT {counts}"
    return f"WITH {', '.join(parts)} {tail}"


def _result(prepared: _PgPrepared, rows: list[tuple[Any, ...]], count: int) -> DriverResult:
    columns = prepared.columns
    converted = [
        {
            key: (convert(value) if convert is not None else value)
            for (key, convert), value in zip(columns, row, strict=True)
        }
        for row in rows
    ]
    # an INSERT's RETURNING of its primary key, for `inserted_primary_key`
    first_key = converted[0][columns[0][0]] if converted and columns and prepared.writes else None
    return DriverResult(converted, count, first_key)


def _count(status: str) -> int:
    """The row count of a command tag (`UPDATE 1`, `INSERT 0 1`)."""
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _check(deferred: _Deferred, count: int) -> None:
    if deferred.expect is not None and count != deferred.expect:
        raise deferred.error()


def _wrapped(sql: str, args: Any, exc: Exception) -> Exception:
    """The SQLAlchemy error `Connection.execute` would have raised for asyncpg's `exc` (`.orig` is `exc`)."""
    if isinstance(exc, DBAPIError):
        return exc
    sqlstate = getattr(exc, "sqlstate", None) or ""
    kind = (
        IntegrityError
        if sqlstate.startswith("23")
        else OperationalError
        if sqlstate[:2] in _LOCKING_CLASSES or not sqlstate
        else DBAPIError
    )
    return kind(sql, args, exc)
