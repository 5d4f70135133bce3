"""`SqlAlchemyUnitOfWork`: one connection, one transaction, the repositories bound to it."""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

from sqlalchemy.exc import DBAPIError, OperationalError

from taskgate.domain.errors import ConcurrentModification, StorageError
from taskgate.infrastructure.db.access_store import SqlAlchemyOperatorRepository, SqlAlchemyTokenRepository
from taskgate.infrastructure.db.agent_store import (
    SqlAlchemyAgentRepository,
    SqlAlchemyStepRunRepository,
    SqlAlchemyTestRunRepository,
)
from taskgate.infrastructure.db.audit_store import SqlAlchemyAuditRepository
from taskgate.infrastructure.db.commit_group import Member
from taskgate.infrastructure.db.connections import AnyConnection
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.forge_store import SqlAlchemyPullRequestRepository
from taskgate.infrastructure.db.node_store import SqlAlchemyLeaseRepository, SqlAlchemyNodeRepository
from taskgate.infrastructure.db.notification_store import SqlAlchemyNotificationRepository
from taskgate.infrastructure.db.outbox_store import SqlAlchemyDeliveryRepository, SqlAlchemyWritebackRepository
from taskgate.infrastructure.db.question_store import SqlAlchemyQuestionRepository
from taskgate.infrastructure.db.session_store import (
    SqlAlchemyDecisionRepository,
    SqlAlchemyEventLog,
    SqlAlchemySessionRepository,
    SqlAlchemySnapshotRepository,
    SqlAlchemyTransitionLog,
)
from taskgate.infrastructure.db.tracker_poll_store import SqlAlchemyTrackerPollRepository
from taskgate.infrastructure.db.work_store import (
    SqlAlchemyPlanRepository,
    SqlAlchemyProjectRepository,
    SqlAlchemyTaskRepository,
)

_CONFLICT_SQLSTATES = {"40001", "40P01", "55P03"}  # serialization failure, deadlock, lock not available


class SqlAlchemyUnitOfWork:
    """A transaction on `db`. Uncommitted work is rolled back on exit; database errors become taskgate errors.

    A SQLite write unit of work is a member of its process's commit group (commit_group.py): it runs on the
    group's connection, inside a savepoint of its own, and `commit()` returns once the shared COMMIT has.
    """

    def __init__(self, db: Database, *, write: bool) -> None:
        self._db, self._write = db, write
        self._conn: AnyConnection | None = None
        self._member: Member | None = None
        self._committed = False
        self._bound: AnyConnection | None = None  # the connection the repositories use, once entered
        self._repositories: dict[str, Any] = {}  # made on first use (`_Bound`); emptied by commit()
        self._done = False  # commit() ran (whether or not it succeeded): every repository is a `Committed`
        self._dialect = db.dialect or "sqlite"

    async def __aenter__(self) -> SqlAlchemyUnitOfWork:
        groups = self._db.groups if self._write else None
        try:
            if groups is not None:
                self._member = await groups.join()
                self._bind(self._member.conn)
                return self
            if self._write and not self._db.is_sqlite:  # the transaction on asyncpg (pg_writes.py)
                self._conn = await self._db.open_pg_writer()
            else:
                self._conn = await self._db.open(write=self._write)
        except DBAPIError as exc:
            raise _translate(exc) from exc
        self._bind(self._conn)
        return self

    def _finish(self) -> None:
        """After `commit()` nothing may go through this unit of work: a group member's connection is the next
        member's by then. Every repository becomes a `Committed` that refuses any use by name (`_Bound`)."""
        self._bound, self._done = None, True
        self._repositories.clear()

    def _bind(self, conn: AnyConnection) -> None:
        # The repositories are made on first use (`_Bound`): a transition uses 4–6 of the 22, and making all of
        # them per unit of work, then a `Committed` for each, cost ~30 µs of a ~900 µs transition (PostgreSQL).
        self._bound = conn

    async def commit(self) -> None:
        """Make the work durable; returns once it is (for a group member: once the group's COMMIT returned)."""
        member, self._member = self._member, None  # whatever happens, this member is done with the group
        try:
            if member is not None:
                assert self._db.groups is not None
                await self._db.groups.commit(member)
            else:
                assert self._conn is not None
                await self._conn.commit()
        except DBAPIError as exc:
            raise _translate(exc) from exc
        finally:
            self._finish()
        self._committed = True

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        member, self._member = self._member, None
        try:
            if member is not None:  # left without committing: only this member's work is undone
                assert self._db.groups is not None
                await self._db.groups.rollback(member)
            elif self._conn is not None:
                try:
                    if not self._committed and self._conn.in_transaction() and exc is None:
                        await self._conn.rollback()
                    elif not self._committed and self._conn.in_transaction():
                        # the unit ends on `exc` (a cancelled task, an error): a rollback that fails too (asyncpg
                        # closes a connection whose statement was cancelled) must not replace it; close() below
                        # invalidates a connection that could not roll back
                        with contextlib.suppress(DBAPIError):
                            await self._conn.rollback()
                finally:  # a rollback that failed (a connection lost, a cancelled statement) still gives it back
                    await self._conn.close()
        finally:
            self._conn = None
        if isinstance(exc, DBAPIError):
            raise _translate(exc) from exc


class _Bound:
    """A repository of the unit of work: made on first use with the unit's connection and kept until commit, then a
    `Committed` standing for it. Before the unit is entered there is none (AttributeError), as before."""

    def __init__(self, name: str, repository: type) -> None:
        self._name, self._repository = name, repository

    def __get__(self, uow: SqlAlchemyUnitOfWork | None, owner: type) -> Any:
        if uow is None:
            return self
        found = uow._repositories.get(self._name)
        if found is not None:
            return found
        if uow._bound is None:
            if uow._done:
                return Committed(self._name)
            raise AttributeError(self._name)
        found = uow._repositories[self._name] = self._repository(uow._bound, uow._dialect)
        return found


_REPOSITORY_CLASSES: dict[str, type] = {
    "projects": SqlAlchemyProjectRepository,
    "plans": SqlAlchemyPlanRepository,
    "tasks": SqlAlchemyTaskRepository,
    "operators": SqlAlchemyOperatorRepository,
    "sessions": SqlAlchemySessionRepository,
    "transitions": SqlAlchemyTransitionLog,
    "events": SqlAlchemyEventLog,
    "tokens": SqlAlchemyTokenRepository,
    "snapshots": SqlAlchemySnapshotRepository,
    "decisions": SqlAlchemyDecisionRepository,
    "test_runs": SqlAlchemyTestRunRepository,
    "agents": SqlAlchemyAgentRepository,
    "deliveries": SqlAlchemyDeliveryRepository,
    "step_runs": SqlAlchemyStepRunRepository,
    "writebacks": SqlAlchemyWritebackRepository,
    "nodes": SqlAlchemyNodeRepository,
    "leases": SqlAlchemyLeaseRepository,
    "pull_requests": SqlAlchemyPullRequestRepository,
    "tracker_polls": SqlAlchemyTrackerPollRepository,
    "questions": SqlAlchemyQuestionRepository,
    "notifications": SqlAlchemyNotificationRepository,
}
REPOSITORIES = tuple(_REPOSITORY_CLASSES)  # the port's repositories (UnitOfWork): bound, and refused after commit
# The AuditUnitOfWork port's one more (application/audit/ports.py): only the SQL units have the audit chains.
_BOUND_CLASSES = {**_REPOSITORY_CLASSES, "audit": SqlAlchemyAuditRepository}
for _name, _repository in _BOUND_CLASSES.items():
    setattr(SqlAlchemyUnitOfWork, _name, _Bound(_name, _repository))


class Committed:
    """Stands for a repository of a committed unit of work: any use is a programming error, named."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> None:
        raise StorageError(f"uow.{self._name}.{attr} used after commit(); read before committing, or open a new unit")


def _translate(exc: BaseException) -> Exception:
    """Map a driver error to the taskgate error a caller can act on (STYLE: translate at the adapter edge)."""
    sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
    if sqlstate in _CONFLICT_SQLSTATES:
        return ConcurrentModification(f"the database refused a conflicting concurrent change ({sqlstate}); retry")
    if isinstance(exc, OperationalError) and "locked" in str(exc):
        return ConcurrentModification("the SQLite database is locked by another process; retry")
    first_line = str(getattr(exc, "orig", exc)).splitlines()[0] if str(exc) else type(exc).__name__
    return StorageError(f"database error: {first_line}")
