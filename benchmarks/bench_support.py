"""What several benchmark scripts need alike (they run as `python benchmarks/NAME.py`, so this imports as
`bench_support`)."""

from __future__ import annotations

import subprocess
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
