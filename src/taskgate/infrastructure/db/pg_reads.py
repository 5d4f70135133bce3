"""The CLI's read statements run on asyncpg alone, for a PostgreSQL database: no SQLAlchemy, no Alembic.

The PostgreSQL twin of `fast_reads.py`. The SQL is `read_sql.py`'s, compiled with SQLAlchemy's asyncpg dialect
from the statements the repositories run, so the server sees what the full path sends (each parameter cast to
its column's type); its `:name` parameters are numbered `$1, $2, …` here, which is exact because the generator
refuses a statement with a literal string (read_statements.compile_for_postgresql). Each value is turned into
what SQLAlchemy's result would hold (aware UTC datetimes, parsed JSON), so the rows map to records through the
repositories' own mappings.

All reads of one command run in one read-only REPEATABLE READ transaction: one snapshot, as on SQLite. A database
this path cannot read as it is (unreachable, refused, not at the schema these statements were compiled for) is
`Unavailable`, and the caller takes the full path, which reports it in its own words.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncpg

from taskgate.infrastructure.db.fast_reads import Unavailable, as_records, expanded
from taskgate.infrastructure.db.read_sql import POSTGRESQL, SCHEMA_HEAD

CONNECT_TIMEOUT_S = 5.0
"""How long the read path tries to connect before it leaves the database to the full path."""

_NAMED = re.compile(r"(?<!:):(\w+)")  # `:name`, not the second colon of a `::TYPE` cast
_ERRORS = (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


def connect_kwargs(url: str) -> dict[str, Any]:
    """asyncpg's keywords for `postgresql+asyncpg://user:password@host:port/database`, as SQLAlchemy's asyncpg
    dialect passes them (what it leaves out, asyncpg takes from the PG* variables and ~/.pgpass, as there).

    Raises: Unavailable for another database, or a URL with options (`?…`) or several hosts: the dialect turns
    those into keywords of its own, which this path does not copy.
    """
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in ("postgresql+asyncpg", "postgresql", "postgres"):
        raise Unavailable(f"not a PostgreSQL URL: {scheme}")
    parts = urlsplit(url)
    if parts.query or parts.fragment or "," in parts.netloc:
        raise Unavailable("a PostgreSQL URL with options or several hosts")
    kwargs = {
        "user": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password is not None else None,
        "host": unquote(parts.hostname) if parts.hostname else None,
        "port": parts.port,
        "database": unquote(parts.path[1:]) if len(parts.path) > 1 else None,
    }
    return {key: value for key, value in kwargs.items() if value is not None}


def numbered(text: str, values: dict[str, Any]) -> tuple[str, list[Any]]:
    """`text` with its `:name` parameters numbered `$1, $2, …` in order of first use, and their values in that
    order. Raises: Unavailable when a parameter has no value."""
    order: dict[str, int] = {}

    def number(found: re.Match[str]) -> str:
        name = found.group(1)
        if name not in values:
            raise Unavailable(f"no value for parameter {name}")
        return f"${order.setdefault(name, len(order) + 1)}"

    text = _NAMED.sub(number, text)
    return text, [values[name] for name in order]


def _utc(value: datetime | None) -> datetime | None:
    # UtcDateTime.process_result_value: asyncpg gives TIMESTAMP WITH TIME ZONE aware; normalised to UTC
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _json(value: Any) -> Any:
    # SQLAlchemy's asyncpg dialect has JSON come back as text and parses it with json.loads: the same here
    return json.loads(value) if isinstance(value, str | bytes) else value


_CONVERT = {"utc": _utc, "json": _json, "bool": lambda value: None if value is None else bool(value)}


class PgReads:
    """One connection to taskgate's PostgreSQL database in one read-only snapshot, from `open` to `close`, that
    runs the named statements of `read_sql.py`. Its methods are synchronous: it drives its own event loop, since
    the read commands have none."""

    def __init__(self, url: str, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        kwargs = connect_kwargs(url)
        self._loop = asyncio.new_event_loop()
        self._conn: asyncpg.Connection | None = None
        try:
            self._conn = self._run(asyncpg.connect(timeout=connect_timeout_s, **kwargs))
            self._run(self._conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"))
            head = self._run(self._conn.fetchval("SELECT version_num FROM alembic_version"))
        except _ERRORS as exc:
            self.close()
            raise Unavailable(f"cannot read the PostgreSQL database: {type(exc).__name__}: {exc}") from None
        if head != SCHEMA_HEAD:
            self.close()
            raise Unavailable(f"schema {head} is not {SCHEMA_HEAD}: the full path migrates or refuses")

    def rows(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """The rows of statement `name` with `params` (a list for a parameter that expands, `IN (…)`), each a
        dict of column → value as SQLAlchemy would give it."""
        text, columns, fixed = POSTGRESQL[name]
        text, values = expanded(text, {**fixed, **params})
        text, args = numbered(text, values)
        assert self._conn is not None
        try:
            raw = self._run(self._conn.fetch(text, *args))
        except _ERRORS as exc:
            raise Unavailable(f"cannot read: {type(exc).__name__}: {exc}") from None
        return as_records(columns, raw, _CONVERT)

    def close(self) -> None:
        """End the snapshot (nothing was written: the transaction is read-only) and close the connection."""
        conn, self._conn = self._conn, None
        try:
            if conn is not None:
                try:
                    self._run(conn.close(timeout=CONNECT_TIMEOUT_S))
                except _ERRORS:
                    conn.terminate()
        finally:
            self._loop.close()

    def _run(self, work: Any) -> Any:
        return self._loop.run_until_complete(work)
