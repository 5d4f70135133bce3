"""Runs the Alembic migration chain from inside the service (at every start; a no-op when already at head).

The upgrade runs in one transaction that also serialises concurrent migrators: SQLite takes `BEGIN IMMEDIATE`
(a second process waits, then finds the schema at head), PostgreSQL takes a transaction-scoped advisory lock.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from taskgate.domain.errors import StorageError
from taskgate.infrastructure.db.engine import Database, redact

if TYPE_CHECKING:
    from alembic.config import Config

_ADVISORY_LOCK_ID = 7_274_283  # arbitrary constant shared by every taskgate process

SCHEMA_HEAD = "0025"
"""The newest migration. Every CLI command checks the database against it before importing Alembic (which
costs ~0.5 s of start-up); a test keeps it equal to the head of the migration scripts."""


def migrations_dir() -> Path:
    """The migration scripts: shipped inside the wheel, or the repository's top-level `migrations/`."""
    packaged = Path(__file__).resolve().parents[2] / "_migrations"
    if packaged.is_dir():
        return packaged
    repo = Path(__file__).resolve().parents[4] / "migrations"
    if repo.is_dir():
        return repo
    raise StorageError(f"migration scripts not found (looked in {packaged} and {repo})")


def alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str | None:
    """The head of the migration scripts on disk."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _upgrade(connection: Connection, target: str) -> None:
    from alembic import command

    command.upgrade(alembic_config(connection), target)


def _current(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


async def _already_at_head(db: Database) -> bool:
    try:
        async with db.connect() as conn:
            return (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar() == SCHEMA_HEAD
    except DBAPIError:
        return False  # no alembic_version table yet: a new database


async def upgrade(db: Database, target: str = "head") -> None:
    """Bring the schema to `target` in one locked transaction.

    Raises: StorageError naming the (password-redacted) database when it cannot be reached or migrated.
    """
    try:
        if target == "head" and await _already_at_head(db):
            return
        await _upgrade_locked(db, target)
    except (OSError, DBAPIError) as exc:
        reason = str(getattr(exc, "orig", exc)).splitlines()[0] or type(exc).__name__
        raise StorageError(f"cannot open database {redact(db.url)}: {reason}") from exc


async def _upgrade_locked(db: Database, target: str) -> None:
    await _run_locked(db, _upgrade, target)


async def downgrade(db: Database, target: str) -> None:
    """Downgrade the schema to `target` (used by the migration tests)."""
    await _run_locked(db, _downgrade, target)


async def _run_locked(db: Database, step: Callable[[Connection, str], None], target: str) -> None:
    """Run an Alembic step in one write transaction that excludes every other migrator."""
    await db.acquire_writer()
    try:
        conn = await db.open(write=True)
        try:
            if not db.is_sqlite:
                await conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_ADVISORY_LOCK_ID})")
            await conn.run_sync(step, target)
            await conn.commit()
        finally:
            await conn.close()
    finally:
        db.release_writer()


def _downgrade(connection: Connection, target: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(connection), target)


async def current_revision(db: Database) -> str | None:
    """The revision the database is at (None for an empty database)."""
    async with db.connect() as conn:
        return await conn.run_sync(_current)
