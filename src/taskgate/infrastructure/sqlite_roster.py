"""One operator's roles and grants, read from a SQLite database with the standard library's `sqlite3`.

What `taskgate serve` over stdio needs to list the local operator's tools before its database is open
(entrypoints/mcp/front.py): SQLAlchemy alone takes longer to import than an MCP client waits for the tool list
(docs/decisions.md, "serve answers before its database is open"). It reads the one row, read-only, and never
creates, migrates or locks anything: in WAL mode a reader waits for no writer.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path


class CannotTell(Exception):
    """The roster could not be read here (not SQLite, a file that cannot be opened, an unexpected schema): the
    caller asks the opened database instead."""


def operator_grants(database_url: str, operator_id: str) -> tuple[list[str], list[str]] | None:
    """The stored (roles, permissions) of operator `operator_id`, or None when it is not registered (no database
    file yet counts: serve creates it without operators).

    Raises: CannotTell when the database is not a SQLite file or cannot be read as taskgate's.
    """
    path = sqlite_file(database_url)
    if not path.exists():
        return None
    try:
        uri = f"{path.resolve().as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=1.0)) as db:
            row = db.execute("SELECT roles, permissions FROM operators WHERE id = ?", (operator_id,)).fetchone()
    except (sqlite3.Error, OSError) as exc:
        raise CannotTell(f"{type(exc).__name__}: {exc}") from exc
    if row is None:
        return None
    try:
        roles, permissions = json.loads(row[0]), json.loads(row[1])
    except (TypeError, ValueError) as exc:
        raise CannotTell(f"operator {operator_id}: roles or permissions are not JSON lists") from exc
    if not (isinstance(roles, list) and isinstance(permissions, list)):
        raise CannotTell(f"operator {operator_id}: roles or permissions are not JSON lists")
    return [str(r) for r in roles], [str(p) for p in permissions]


def sqlite_file(database_url: str) -> Path:
    """The file of a `sqlite:///…` URL (any driver), as SQLAlchemy reads it: a relative path is relative to the
    working directory.

    Raises: CannotTell for another database, an in-memory one or a URL with a host.
    """
    scheme, sep, rest = database_url.partition("://")
    if not sep or scheme.split("+")[0] != "sqlite" or not rest.startswith("/"):
        raise CannotTell(f"not a SQLite file URL: {scheme}")
    path = rest[1:].partition("?")[0]
    if path in ("", ":memory:") or path.startswith("file:") or "%" in path:  # quoted: let SQLAlchemy read it
        raise CannotTell("not a plain SQLite file path")
    return Path(path)
