"""PostgreSQL write units' connections kept between units (infrastructure/db/pg_kept.py): the next write unit takes a
clean one, never one with a transaction open or one lost (in its unit or while kept); no more than the bound are kept;
`dispose` gives them back to the pool."""

from __future__ import annotations

import asyncio

import pytest

from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.pg_kept import KEEP
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork


@pytest.fixture
async def db(pg_url: str):
    database = Database(pg_url)
    yield database
    await database.dispose()


async def _unit_driver(db: Database, *, commit: bool = True) -> object:
    async with SqlAlchemyUnitOfWork(db, write=True) as unit:
        raw = unit._conn._raw
        assert await unit.events.high_water() >= 0
        if commit:
            await unit.commit()
    return raw


async def test_the_next_write_unit_runs_on_the_connection_a_clean_unit_left(db: Database) -> None:
    first = await _unit_driver(db)
    assert await _unit_driver(db) is first
    assert await _unit_driver(db, commit=False) is first  # rolled back on exit: clean again
    assert not first.is_in_transaction()


async def test_a_statement_through_sqlalchemy_leaves_nothing_open_on_the_kept_connection(db: Database) -> None:
    async with SqlAlchemyUnitOfWork(db, write=True) as unit:
        await unit._conn.exec_driver_sql("SELECT 1")  # SQLAlchemy's path, inside asyncpg's transaction
        await unit.commit()
        conn, raw = unit._conn._conn, unit._conn._raw
    assert not conn.in_transaction() and not raw.is_in_transaction()
    assert await _unit_driver(db) is raw


async def test_a_lost_connection_is_not_kept(db: Database) -> None:
    unit = SqlAlchemyUnitOfWork(db, write=True)
    with pytest.raises(Exception):  # noqa: B017 - whatever the lost connection raises; what is kept is checked
        async with unit:
            lost = unit._conn._raw
            lost.terminate()
    assert db._pg_writers.drivers() == []
    assert await _unit_driver(db) is not lost


async def test_a_connection_lost_while_kept_is_not_handed_out(db: Database) -> None:
    kept = await _unit_driver(db)
    kept.terminate()  # as when the server goes away while no unit uses it
    assert await _unit_driver(db) is not kept


async def test_no_more_than_the_bound_are_kept_and_dispose_gives_them_back(db: Database) -> None:
    async def hold(release: asyncio.Event) -> None:
        async with SqlAlchemyUnitOfWork(db, write=True) as unit:
            await release.wait()
            await unit.commit()

    release = asyncio.Event()
    holders = [asyncio.create_task(hold(release)) for _ in range(KEEP + 2)]
    await asyncio.sleep(0.2)  # every unit has its connection
    release.set()
    await asyncio.gather(*holders)
    assert len(db._pg_writers.drivers()) == KEEP
    assert db.engine.pool.checkedout() == KEEP
    await db.dispose()
    assert db.engine.pool.checkedout() == 0
