"""Fixtures shared by every test layer.

`backend` parametrises a test over the in-memory fakes, a real SQLite file and the real PostgreSQL server.
PostgreSQL is required, never skipped: an unreachable server fails the run (see `pg_url`).
Schemas always come from the Alembic migrations: SQLite migrates once into a template file that each test
copies; PostgreSQL migrates once per test process and each test truncates the tables.

Parallel runs (pytest-xdist, `make test`): each worker is a process of its own, with its own session fixtures, so
its own SQLite template and its own PostgreSQL database (named after the worker, see `pg_url`), created and
migrated by that worker. The one throwaway PostgreSQL server, when the run needs one, is started by the
controlling process before the workers and stopped after them (`pytest_configure`, `pytest_unconfigure`).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from taskgate.application.agents.outputs import OutputService
from taskgate.application.audit.queries import AuditService
from taskgate.application.operators.access import AccessService
from taskgate.application.operators.decisions import DecisionService
from taskgate.application.operators.review_queue import ReviewQueue
from taskgate.application.operators.roster import OperatorService
from taskgate.application.sessions.engine import SessionService
from taskgate.application.trackers.builtin import TrackerService
from taskgate.application.workspaces.context import ContextScout
from taskgate.application.workspaces.options import GitOptions
from taskgate.application.workspaces.worktrees import WorkspaceService
from taskgate.bootstrap import build_services, build_workspaces
from taskgate.domain.errors import StorageError
from taskgate.domain.policies.book import default_policies
from taskgate.infrastructure.db import migrations
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.tables import ALL_TABLES
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from taskgate.infrastructure.git import GitPythonVcs
from taskgate.infrastructure.session_folder import SessionFolderStore
from taskgate.infrastructure.system import SystemClock, UuidGenerator
from tests.fakes import InMemoryDatabase
from tests.support import pg_server
from tests.support.pg_server import server_url

BACKENDS = ["memory", "sqlite", "postgresql"]
SQL_BACKENDS = ["sqlite", "postgresql"]

_SHARED_PG = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """The controller of a parallel run starts the throwaway PostgreSQL server, if the run needs one, once for
    all its workers (they inherit its URL in TASKGATE_TEST_PG_URL) instead of each worker starting its own."""
    _as_in_a_serial_run(config)
    controller = not hasattr(config, "workerinput")
    distributed = config.getoption("dist", "no") != "no" and bool(config.getoption("tx", None))
    if controller and distributed and not config.getoption("collectonly"):
        url = pg_server.start_for_workers()
        if url is not None:
            config.stash[_SHARED_PG] = url


# pytest imports readline at start (capture's readline workaround), and GNU readline exports COLUMNS=80 and LINES=24
# into the process's C environment, which os.environ does not show but child processes inherit: so xdist's workers
# would start with COLUMNS=80 in os.environ where a serial run has none, and every CLI a test runs with a copy of
# os.environ would wrap its rich output at 80 columns instead of taskgate's 120 for pipes. The controller's
# os.environ (read before readline came) is what a serial run sees; the workers are given it for these two.
_TERMINAL_SIZE = {name: os.environ.get(name) for name in ("COLUMNS", "LINES")}


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(pytest-xdist, in the controller) What the worker's COLUMNS and LINES must be: see _TERMINAL_SIZE."""
    node.workerinput["taskgate_terminal_size"] = _TERMINAL_SIZE


def _as_in_a_serial_run(config: pytest.Config) -> None:
    """In an xdist worker: COLUMNS and LINES as the controller's os.environ has them (see _TERMINAL_SIZE)."""
    for name, value in getattr(config, "workerinput", {}).get("taskgate_terminal_size", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_unconfigure(config: pytest.Config) -> None:
    """After the last worker has exited: stop and delete the server `pytest_configure` started."""
    url = config.stash.get(_SHARED_PG, None)
    if url is not None:
        pg_server.stop_for_workers(url)


def worker_name() -> str:
    """This test process's name in database names: its pytest-xdist worker id (gw0, gw1, …) or `main`."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


@dataclass
class Services:
    """The use cases wired to one backend, plus what tests need to inspect it."""

    backend: str
    sessions: SessionService
    tracker: TrackerService
    audit: AuditService
    access: AccessService
    workspaces: WorkspaceService
    context: ContextScout
    operators: OperatorService
    decisions: DecisionService
    review_queue: ReviewQueue
    uow: object
    database: Database | InMemoryDatabase
    url: str | None = None
    outputs: OutputService | None = None

    async def snapshot(self) -> dict[str, list]:
        """Every row of every table (or the fake store), to prove a refused call wrote nothing."""
        if isinstance(self.database, InMemoryDatabase):
            store = self.database.store
            return {k: repr(v) for k, v in vars(store).items() if k != "next_id"}
        async with self.database.connect() as conn:
            return {tbl.name: [tuple(r) for r in (await conn.execute(tbl.select())).all()] for tbl in ALL_TABLES}


def run_in_fresh_loop(make_coro) -> None:
    """Run a coroutine to completion on its own loop in a worker thread.

    Session fixtures may be first requested from inside a running test loop (via getfixturevalue), where
    `asyncio.run` is not allowed.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(lambda: asyncio.run(make_coro())).result()


def make_git_repo(path: Path) -> Path:
    """A real git repository with one commit on `main`."""
    path.mkdir(parents=True, exist_ok=True)
    run = lambda *args: subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)  # noqa: E731
    run("init", "-q", "-b", "main")
    (path / "README.md").write_text("scratch\n")
    run("add", "README.md")
    run("-c", "user.name=taskgate", "-c", "user.email=taskgate@example.invalid", "commit", "-q", "-m", "init")
    return path


def pg_admin(sql: str) -> None:
    """Run one statement (CREATE/DROP DATABASE) on the PostgreSQL server's admin connection."""
    dsn = make_url(server_url()).set(drivername="postgresql").render_as_string(hide_password=False)

    async def run() -> None:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    run_in_fresh_loop(run)


def pg_database_url(name: str) -> str:
    """The URL of database `name` on the test server."""
    return make_url(server_url()).set(database=name).render_as_string(hide_password=False)


def migrate_pg(url: str) -> None:
    """Migrate the PostgreSQL database at `url` to the schema head with the real migrations."""

    async def migrate() -> None:
        db = Database(url)
        try:
            await migrations.upgrade(db)
        finally:
            await db.dispose()

    run_in_fresh_loop(migrate)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A throwaway PostgreSQL database for this test process, migrated once, dropped at the end.

    Each run, and each worker of a parallel run, gets its own database (named after the worker, its pid and a
    random suffix) so concurrent runs (developers, CI) and workers never truncate each other's tables.
    The server: tests/support/pg_server.py (TASKGATE_TEST_PG_URL, the local default, or a throwaway one). Fails,
    never skips, when no server can be had: PostgreSQL is required.
    """
    name = f"taskgate_test_{worker_name()}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        url = pg_database_url(name)
    except RuntimeError as exc:
        pytest.fail(f"PostgreSQL is required for the test suite: {exc}")

    try:
        pg_admin(f'CREATE DATABASE "{name}"')
        migrate_pg(url)
    except (OSError, StorageError, asyncpg.PostgresError) as exc:
        pytest.fail(f"PostgreSQL is required for the test suite and is unreachable at {server_url()}: {exc}")
    yield url
    pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file brought to head by the real migrations; tests copy it."""
    path = tmp_path_factory.mktemp("template") / "template.db"

    async def prepare() -> None:
        db = Database(f"sqlite:///{path}")
        try:
            await migrations.upgrade(db)
            async with db.connect() as conn:
                await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            await db.dispose()

    run_in_fresh_loop(prepare)
    return path


async def _truncate_pg(db: Database) -> None:
    names = ", ".join(t.name for t in ALL_TABLES if t.name != "audit_marks")
    async with db.connect() as conn:
        await conn.begin()
        await conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
        await conn.execute(text("UPDATE audit_marks SET linked_upto = 0"))  # its rows are the migration's (0016)
        await conn.commit()


async def open_database(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> tuple[object, str | None]:
    """A clean database of `backend`: the fake, a copy of the SQLite template, or truncated PostgreSQL."""
    if backend == "memory":
        return InMemoryDatabase(), None
    if backend == "sqlite":
        target = tmp_path / "taskgate.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), target)
        url = f"sqlite:///{target}"
        return Database(url, synchronous="NORMAL"), url
    url = request.getfixturevalue("pg_url")
    db = Database(url)
    await _truncate_pg(db)
    return db, url


def wire(
    backend: str,
    database: object,
    url: str | None,
    *,
    clock=None,
    ids=None,
    vcs=None,
    wip_limit: int = 3,
    git: GitOptions | None = None,
    policies=None,
    tests=None,
    outputs_root: Path | None = None,
) -> Services:
    """`policies`: a list or a `PolicyBook` (default: `default_policies(wip_limit)`); `tests`: the TestRunner;
    `outputs_root`: where the session folders go (default: a folder of this test process, see `outputs_root`)."""
    if isinstance(database, InMemoryDatabase):
        uow = database.unit_of_work
    else:

        def uow(*, write: bool) -> SqlAlchemyUnitOfWork:
            return SqlAlchemyUnitOfWork(database, write=write)

    clock, vcs = clock or SystemClock(), vcs or GitPythonVcs()
    sessions, tracker, audit, access = build_services(
        uow,
        clock=clock,
        ids=ids or UuidGenerator(),
        vcs=vcs,
        policies=default_policies(wip_limit) if policies is None else policies,
        tests=tests,
    )
    workspaces, context = build_workspaces(sessions, uow, clock=clock, vcs=vcs, git=git or GitOptions())
    people = OperatorService(uow, clock), DecisionService(uow, sessions, clock), ReviewQueue(uow, sessions, workspaces)
    outputs = OutputService(uow, SessionFolderStore(outputs_root or default_outputs_root()), clock)
    return Services(
        backend, sessions, tracker, audit, access, workspaces, context, *people, uow, database, url, outputs
    )


def default_outputs_root() -> Path:
    """One folder for the session folders of this test process, removed at exit (session ids are UUIDs, so
    tests sharing it never meet)."""
    global _OUTPUTS_ROOT
    if _OUTPUTS_ROOT is None:
        _OUTPUTS_ROOT = Path(tempfile.mkdtemp(prefix="taskgate-outputs-"))
        atexit.register(shutil.rmtree, _OUTPUTS_ROOT, ignore_errors=True)
    return _OUTPUTS_ROOT


_OUTPUTS_ROOT: Path | None = None


@pytest.fixture(params=BACKENDS)
async def services(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Services]:
    database, url = await open_database(request.param, request, tmp_path)
    yield wire(request.param, database, url)
    if isinstance(database, Database):
        await database.dispose()


@pytest.fixture(params=SQL_BACKENDS)
async def sql_services(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Services]:
    database, url = await open_database(request.param, request, tmp_path)
    yield wire(request.param, database, url)
    await database.dispose()


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    return make_git_repo(tmp_path / "repo")
