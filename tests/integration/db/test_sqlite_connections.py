"""Every SQLite connection taskgate opens is set up alike: WAL, foreign keys, the durability asked for, and a page
cache large enough for the audit linker's b-trees on a long history (engine.py)."""

from __future__ import annotations

import pytest

from taskgate.infrastructure.db.engine import Database

pytestmark = pytest.mark.asyncio


async def test_each_connection_gets_wal_foreign_keys_its_synchronous_and_a_16_mib_page_cache(tmp_path):
    database = Database(f"sqlite:///{tmp_path / 'a.db'}", synchronous="FULL")
    try:
        for write in (False, True):
            conn = await database.open(write=write)
            try:
                found = {}
                for pragma in ("journal_mode", "foreign_keys", "synchronous", "cache_size"):
                    found[pragma] = (await conn.exec_driver_sql(f"PRAGMA {pragma}")).scalar()
                await conn.rollback()
            finally:
                await conn.close()
            # synchronous FULL is 2; a negative cache_size is KiB
            assert found == {"journal_mode": "wal", "foreign_keys": 1, "synchronous": 2, "cache_size": -16384}
    finally:
        await database.dispose()
