"""A real `taskgate serve --http` deployment per backend for e2e tests, and reads of its database itself."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg


@contextmanager
def served_on(backend: str, make: Callable[[str | None], Any], titles: list[str]) -> Iterator[Any]:
    """`make(database_url)` (None: SQLite in its data dir; else a PostgreSQL database of its own), seeded with a
    task per title (DEMO-1 …) and serving until the block ends."""
    from tests.e2e.test_crash_points import _pg_database  # the e2e module owns the database helper

    databases = _pg_database() if backend == "postgresql" else iter([None])
    svc = make(next(databases))
    svc.seed(*titles)
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()
        for _ in databases:  # drops the PostgreSQL database
            pass


async def db_rows(deployment: Any, sql: str, session_id: str) -> list[tuple[Any, ...]]:
    """`sql` (one `{}` for the session id) on the deployment's own database, named by its `env` (a served
    deployment or a CLI workspace)."""
    url = deployment.env.get("TASKGATE_DATABASE_URL")
    if url is None:
        with sqlite3.connect(Path(deployment.env["TASKGATE_DATA_DIR"]) / "taskgate.db") as db:
            return [tuple(r) for r in db.execute(sql.format("?"), (session_id,))]
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
    try:
        return [tuple(r) for r in await conn.fetch(sql.format("$1"), session_id)]
    finally:
        await conn.close()
