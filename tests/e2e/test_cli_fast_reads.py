"""`session list`, `session show` and `task ready` through the real `taskgate` executable: the fast path (no engine)
prints exactly what the full path prints, answers without loading SQLAlchemy, and never answers from a
configuration it has not seen start: an edited config file, another environment or a new cache goes the full way.
Each on the embedded SQLite file and on PostgreSQL (TASKGATE_DATABASE_URL with a password, as a team sets it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.conftest import SQL_BACKENDS, make_git_repo, pg_admin, pg_database_url

TASKGATE = str(Path(sys.executable).with_name("taskgate"))
PASSWORD = "n0t-in-the-cache"  # the test server trusts local connections: asyncpg is given it, never asked for it


class Repo:
    """A fresh repository set up with `taskgate init`, and a private settings cache."""

    def __init__(self, root: Path, cache: Path) -> None:
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
        self.env |= {"XDG_CACHE_HOME": str(cache), "COLUMNS": "200", "TASKGATE_OPERATOR__DEFAULT": "alice"}

    def run(self, *args: str, full: bool = False, importtime: bool = False) -> subprocess.CompletedProcess[str]:
        env = self.env | ({"TASKGATE_FULL_READS": "1"} if full else {})
        argv = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "taskgate", *args]
        return subprocess.run(argv, cwd=self.root, env=env, capture_output=True, text=True, timeout=120)

    def ok(self, *args: str) -> str:
        done = self.run(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout


@pytest.fixture(params=SQL_BACKENDS)
def repo(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "sqlite":
        yield _filled(Repo(make_git_repo(tmp_path / "shop"), tmp_path / "cache"))
        return
    request.getfixturevalue("pg_url")  # the test server is up
    name = f"taskgate_fast_reads_{uuid.uuid4().hex[:8]}"
    pg_admin(f'CREATE DATABASE "{name}"')
    made = Repo(make_git_repo(tmp_path / "shop"), tmp_path / "cache")
    url = make_url(pg_database_url(name)).set(password=PASSWORD).render_as_string(hide_password=False)
    made.env["TASKGATE_DATABASE_URL"] = url
    try:
        yield _filled(made)
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_repo(tmp_path: Path) -> Repo:
    return _filled(Repo(make_git_repo(tmp_path / "shop"), tmp_path / "cache"))


def _filled(made: Repo) -> Repo:
    made.ok("init", ".")
    for title in ("paint the fence", "fix the gate", "oil the hinge"):
        made.ok("task", "add", title)
    made.ok("task", "add", "after the fence", "--blocked-by", "SHOP-1")
    made.ok("session", "start", "SHOP-2")
    started = made.ok("session", "start", "SHOP-3", "--json")
    made.session = started.split('"id": "', 1)[1][:36]  # type: ignore[attr-defined]
    return made


def _loaded(done: subprocess.CompletedProcess[str], module: str) -> bool:
    """Whether `-X importtime` says `module` was imported."""
    return any(line.rsplit("|", 1)[-1].strip() == module for line in done.stderr.splitlines())


def _loaded_sqlalchemy(done: subprocess.CompletedProcess[str]) -> bool:
    return any(line.rstrip().endswith(" sqlalchemy") for line in done.stderr.splitlines())


def test_fast_and_full_paths_print_the_same(repo: Repo) -> None:
    sid = repo.session  # type: ignore[attr-defined]
    commands = [
        ["session", "list"], ["session", "list", "--all", "--json"], ["session", "list", "-p", "SHOP"],
        ["session", "show", sid[:6]], ["session", "show", sid, "--json"], ["task", "ready"],
        ["task", "ready", "--json"], ["task", "ready", "-n", "1"], ["task", "ready", "--limit=0", "--project", "shop"],
        ["session", "show", "zz"], ["session", "show", "ffffffff"], ["session", "list", "-p", "NOPE"],
        ["task", "ready", "--limit", "-1"],
    ]  # fmt: skip
    for args in commands:
        fast, full = repo.run(*args), repo.run(*args, full=True)
        assert (fast.returncode, fast.stdout, fast.stderr) == (full.returncode, full.stdout, full.stderr), args
    assert "SHOP-1" in repo.ok("task", "ready") and "SHOP-4" not in repo.ok("task", "ready")  # blocked by SHOP-1
    assert sid in repo.ok("session", "show", sid[:6]) and "planning" in repo.ok("session", "list")
    remembered = [path.read_text() for path in (repo.root.parent / "cache").rglob("*.json")]
    assert remembered and not any(PASSWORD in text for text in remembered)


def test_the_fast_path_loads_no_engine_and_the_full_path_does(repo: Repo) -> None:
    for args in (["session", "list"], ["session", "show", repo.session[:8]], ["task", "ready"]):  # type: ignore[attr-defined]
        fast = repo.run(*args, importtime=True)
        assert fast.returncode == 0 and not _loaded_sqlalchemy(fast), args
        assert not _loaded(fast, "pydantic_settings") and not _loaded(fast, "alembic")
        on_postgresql = "TASKGATE_DATABASE_URL" in repo.env  # asyncpg (and so asyncio), alone
        assert _loaded(fast, "asyncio") == on_postgresql and _loaded(fast, "asyncpg") == on_postgresql
    assert _loaded_sqlalchemy(repo.run("session", "list", full=True, importtime=True))
    helped = repo.run("session", "list", "--help")  # not one of its options: Typer's help, as ever
    assert helped.returncode == 0 and "Usage:" in helped.stdout and "--all" in helped.stdout


def test_an_edited_config_or_environment_goes_the_full_way(repo: Repo) -> None:
    config = repo.root / ".taskgate" / "taskgate.toml"
    config.write_text(config.read_text() + '\n[sqlite]\nsynchronous = "SOMETIMES"\n')
    bad = repo.run("session", "list")
    assert bad.returncode != 0 and "synchronous" in bad.stderr  # not a stale answer from the last good config
    config.write_text(config.read_text().replace('"SOMETIMES"', '"NORMAL"'))
    assert _loaded_sqlalchemy(repo.run("session", "list", importtime=True))  # first run of the new config: full
    assert not _loaded_sqlalchemy(repo.run("session", "list", importtime=True))  # then it is remembered
    repo.env["TASKGATE_SQLITE__BUSY_TIMEOUT_MS"] = "1000"
    assert _loaded_sqlalchemy(repo.run("task", "ready", importtime=True))
    assert not _loaded_sqlalchemy(repo.run("task", "ready", importtime=True))


def test_another_database_in_the_environment_is_never_read_from_the_old_one(sqlite_repo: Repo, tmp_path: Path) -> None:
    repo = sqlite_repo
    assert "SHOP-2" in repo.ok("session", "list")
    repo.env["TASKGATE_DATA_DIR"] = str(tmp_path / "elsewhere")
    done = repo.run("session", "list")
    assert done.returncode != 0 and "none registered" in done.stderr  # the new database has no project
