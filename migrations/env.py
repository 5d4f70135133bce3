"""Alembic environment. taskgate passes an open connection in `config.attributes["connection"]` (it is already
inside an event loop, where the usual `asyncio.run()` of async env.py files would fail); the stand-alone
`alembic` CLI path builds its own async engine."""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from taskgate.infrastructure.db.tables import metadata

config = context.config


def run_with(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_standalone_async(url: str) -> None:
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(run_with)
    await engine.dispose()


def run_standalone() -> None:
    """The `alembic` command line: SQLite through the sync driver (as taskgate runs it), PostgreSQL via asyncpg."""
    url = os.environ.get("TASKGATE_DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    if url.startswith("sqlite"):
        engine = create_engine(url.replace("sqlite+aiosqlite", "sqlite"))
        with engine.begin() as conn:
            run_with(conn)
        engine.dispose()
    else:
        asyncio.run(run_standalone_async(url))


connection = config.attributes.get("connection")
if connection is not None:
    run_with(connection)
else:
    if config.config_file_name is not None:
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    run_standalone()
