"""What several benchmark scripts need alike (they run as `python benchmarks/NAME.py`, so this imports as
`bench_support`)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path


def git_repo(root: Path) -> Path:
    """A fresh git repository at `root/repo` with one empty commit on `main`, as a user's repository would be."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.name", "Bench"],
        ["config", "user.email", "bench@example.invalid"],
        ["commit", "-q", "--allow-empty", "-m", "init"],
    ):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


def emit_row(name: str, ours: float, baseline: float, unit: str, goal: str) -> None:
    """One machine-readable line for `benchmarks/hot_path.py`: a measure of issue 20's table, ours, the baseline
    measured in the same run, and the goal (`≤ 1.5×`, `≥ 2×`, optionally `; ≤ 2 ms` on ours itself)."""
    print(f"ROW|{name}|{ours:.4g}|{baseline:.4g}|{unit}|{ours / baseline:.3f}|{goal}", flush=True)


PG_BENCH_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/taskgate_bench"
"""The database the benchmarks reset and use on PostgreSQL (created on first use, from the server's `postgres`
database). Its schema `public` is dropped and recreated: never point it at a database you care about."""


def reset_pg_schema(url: str) -> None:
    """Drop and recreate schema `public` of `url` (a PostgreSQL URL), so taskgate migrates it from empty."""
    import asyncio

    asyncio.run(reset_pg_schema_async(url))


async def reset_pg_schema_async(url: str) -> None:
    """`reset_pg_schema` for a caller already inside an event loop; creates the database on a fresh server."""
    import asyncpg

    dsn = url.replace("+asyncpg", "")
    try:
        conn = await asyncpg.connect(dsn)
    except asyncpg.InvalidCatalogNameError:  # a fresh server: create the database, once
        base, _, name = dsn.rpartition("/")
        admin = await asyncpg.connect(f"{base}/postgres")
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DROP SCHEMA IF EXISTS public CASCADE; CREATE SCHEMA public")
    finally:
        await conn.close()


def run_on_one_store(postgres: str | None, prefix: str, run: Callable[[str, str], Awaitable[None]]) -> None:
    """`run(url, store)` on PostgreSQL at `postgres` (its public schema reset first) or, when None, on a scratch
    SQLite file in a temporary folder named after `prefix`; with the load average before and after."""
    started = time.monotonic()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    if postgres:
        reset_pg_schema(postgres)
        asyncio.run(run(postgres, "PostgreSQL"))
    else:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            asyncio.run(run(f"sqlite:///{Path(tmp) / 'bench.db'}", "SQLite FULL"))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average after: {load}; total {time.monotonic() - started:.1f} s")
