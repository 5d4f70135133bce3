"""The connections the repositories run on: an `InlineConnection` (SQLite's synchronous connection with the awaitable
surface of `AsyncConnection`, see engine.py for why) or PostgreSQL's `AsyncConnection`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy.engine import Connection

from taskgate.infrastructure.db.driver_statements import DriverStatements

if TYPE_CHECKING:  # the asyncio extension (and the ORM it pulls in) loads only for PostgreSQL: ~70 ms of start-up
    from sqlalchemy.ext.asyncio import AsyncConnection


class InlineConnection:
    """A synchronous SQLAlchemy connection with the awaitable surface of `AsyncConnection`.

    Inside a transaction, the hot statements (`statements.HOT`) run on the sqlite3 driver directly
    (driver_statements.py); everything else, and anything outside a transaction, through SQLAlchemy.
    """

    def __init__(self, sync_connection: Connection, driver: DriverStatements | None = None) -> None:
        self.sync_connection = sync_connection
        self._driver = driver

    async def execute(self, statement: Any, parameters: Any = None) -> Any:
        driver = self._driver
        if driver is not None and driver.runs(statement, parameters) and self.sync_connection.in_transaction():
            return driver.execute(self.sync_connection.connection.dbapi_connection, statement, parameters)
        return self.sync_connection.execute(statement, parameters)

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> Any:
        return self.sync_connection.exec_driver_sql(statement, parameters)

    async def run_sync(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.sync_connection, *args, **kwargs)

    async def begin(self) -> None:
        self.sync_connection.begin()

    async def commit(self) -> None:
        self.sync_connection.commit()

    async def rollback(self) -> None:
        self.sync_connection.rollback()

    async def close(self) -> None:
        self.sync_connection.close()

    def in_transaction(self) -> bool:
        return self.sync_connection.in_transaction()


AnyConnection: TypeAlias = "InlineConnection | AsyncConnection"
