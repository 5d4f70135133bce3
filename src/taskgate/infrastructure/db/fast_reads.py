"""The CLI's read statements run on sqlite3 alone: no SQLAlchemy, no asyncio, no Alembic.

The SQL is `read_sql.py`'s, compiled from the statements the repositories run (`read_statements.py`), and each
value is turned into what SQLAlchemy's result would hold (aware UTC datetimes, parsed JSON, booleans), so the rows
map to records through the repositories' own mappings (`row_maps.py`). The connection is read-only
(`mode=ro`): nothing here can write, migrate or recover; a database this path cannot read as it is (missing, not
at the schema these statements were compiled for, busy past the timeout) is `Unavailable`, and the caller takes
the full path, which can.
"""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from taskgate.infrastructure.db.read_sql import SCHEMA_HEAD, SQLITE

_EXPANDING = re.compile(r"__\[POSTCOMPILE_(\w+)\]")


class Unavailable(Exception):
    """This path cannot answer; the full path (bootstrap) must."""


def _utc(value: str | None) -> datetime | None:
    # SQLAlchemy's SQLite DateTime stores "YYYY-MM-DD HH:MM:SS.ffffff"; UtcDateTime gives it back aware, in UTC.
    return None if value is None else datetime.fromisoformat(value).replace(tzinfo=UTC)


def _json(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def _bool(value: int | None) -> bool | None:
    return None if value is None else bool(value)


_CONVERT = {"utc": _utc, "json": _json, "bool": _bool}


class SqliteReads:
    """A read-only connection to taskgate's SQLite file, in one read transaction (one snapshot) from `open` to
    `close`, that runs the named statements of `read_sql.py`."""

    def __init__(self, path: Path, busy_timeout_ms: int) -> None:
        if not path.is_file():
            raise Unavailable(f"no database at {path}")
        try:
            self._conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, isolation_level=None)
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            self._conn.execute("BEGIN")  # one snapshot for every read of the command (WAL keeps it)
            head = self._conn.execute("SELECT version_num FROM alembic_version").fetchone()
        except sqlite3.Error as exc:
            raise Unavailable(f"cannot read {path}: {exc}") from None
        if head is None or head[0] != SCHEMA_HEAD:
            self.close()
            raise Unavailable(f"schema {head and head[0]} is not {SCHEMA_HEAD}: the full path migrates or refuses")

    def rows(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """The rows of statement `name` with `params` (a list for a parameter that expands, `IN (…)`), each a
        dict of column → value as SQLAlchemy would give it."""
        text, columns, fixed = SQLITE[name]
        text, values = expanded(text, {**fixed, **params})
        try:
            raw = self._conn.execute(text, values).fetchall()
        except sqlite3.Error as exc:
            raise Unavailable(f"cannot read: {exc}") from None
        return as_records(columns, raw, _CONVERT)

    def close(self) -> None:
        """End the read transaction and close the connection."""
        self._conn.close()


def as_records(columns: Any, raw: Any, convert: dict[str, Any]) -> list[dict[str, Any]]:
    """Each driver row of `raw` as a dict of column → value as SQLAlchemy would give it: `columns` are read_sql.py's
    (name, kind) pairs, `convert` the driver's function per kind."""
    kinds = [(key, convert.get(kind)) for key, kind in columns]
    return [{key: fn(v) if fn else v for (key, fn), v in zip(kinds, row, strict=True)} for row in raw]


def expanded(text: str, values: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """`text` with each list parameter's `__[POSTCOMPILE_name]` made one `:name__n` parameter per item, as
    SQLAlchemy expands it, and the values to go with it. Raises: Unavailable for an empty list."""
    values = dict(values)
    return _EXPANDING.sub(lambda found: _expand(found.group(1), values), text), values


def _expand(name: str, values: dict[str, Any]) -> str:
    """`:name_0, :name_1, …` for the list `values[name]`, whose items become parameters of their own."""
    items = values.pop(name)
    if not items:
        raise Unavailable(f"empty list for {name}")  # SQLAlchemy renders an empty IN its own way: not worth copying
    keys = [f"{name}__{n}" for n in range(len(items))]
    values.update(zip(keys, items))  # noqa: B905
    return ", ".join(f":{key}" for key in keys)
