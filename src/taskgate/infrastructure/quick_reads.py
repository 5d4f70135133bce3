"""The CLI's everyday reads (`session list`, `session show`, `task ready`) without the engine: no settings models,
SQLAlchemy, asyncio or Alembic on the path, so they answer in about the time Python takes to start.

They read the embedded SQLite database read-only, with the statements the repositories run (compiled ahead of
time: db/read_sql.py), mapped by the repositories' own mappings (db/row_maps.py), and choose projects and
sessions by the services' own rules (application/trackers/project_choice.py, application/sessions/references.py).
The embedded SQLite file is read with sqlite3 (db/fast_reads.py), a PostgreSQL database with asyncpg alone
(db/pg_reads.py). Whenever this path cannot answer exactly as the full path would, it raises `Unavailable` and
the command runs the full way: no settings remembered for this configuration (settings_cache.py), a database
missing, unreachable or not at the schema head, a tracker read live, a PostgreSQL password that is not in
TASKGATE_DATABASE_URL, or any error (the full path reports it in its own words).

Passwords are never remembered: the database URL is written down without its password (`***` in its place).
When the password is needed, it is taken from TASKGATE_DATABASE_URL, the one place besides the config file the
full path takes the URL from, and only when that variable is the remembered URL but for its password (it is part
of the remembered configuration's key, so it is the very URL the full start checked). A password in the config
file leaves PostgreSQL reads to the full path; one in ~/.pgpass or PGPASSWORD is asyncpg's, as there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from taskgate.application.sessions import references
from taskgate.application.trackers.project_choice import choose_project, key_of, numeric_ref
from taskgate.domain.bounds import ROW_LIMITS
from taskgate.domain.entities import Agent, Project, Session, Task
from taskgate.domain.errors import TaskgateError
from taskgate.domain.questions import Question
from taskgate.domain.states import TERMINAL_STATES, SessionState
from taskgate.infrastructure import settings_cache
from taskgate.infrastructure.db import row_maps
from taskgate.infrastructure.db.fast_reads import SqliteReads, Unavailable

__all__ = ["QuickReads", "Unavailable", "remember"]

_SQLITE = "sqlite:///"
_HIDDEN = "***"
_ACTIVE = [s.value for s in SessionState if s not in TERMINAL_STATES]


def remember(settings: Any, cwd: Path | None = None) -> None:
    """After a full start on `settings`: write down what this path needs of them (settings_cache.py)."""
    settings_cache.remember(facts_of(settings), cwd)


def facts_of(settings: Any) -> dict[str, Any]:
    """What this path needs of `settings` (taskgate's Settings)."""
    trackers = [settings.tracker, *(p.tracker for p in settings.projects.values() if p.tracker is not None)]
    return {
        "database_url": without_password(settings.resolved_database_url),
        "busy_timeout_ms": settings.sqlite.busy_timeout_ms,
        "live_tracker": any(tracker.kind != "builtin" for tracker in trackers),
    }


def without_password(url: str) -> str:
    """`url` with its password, if any, replaced by `***`."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.partition(':')[0]}:{_HIDDEN}@{host}"))


def with_password(remembered: str) -> str:
    """The database URL whose password `remembered` hides: TASKGATE_DATABASE_URL when it is that URL.

    Raises: Unavailable when the password cannot be had here (it is in the config file).
    """
    if urlsplit(remembered).password != _HIDDEN:
        return remembered
    for name, value in os.environ.items():  # the settings read variable names regardless of case
        if name.upper() == "TASKGATE_DATABASE_URL" and without_password(value) == remembered:
            return value
    raise Unavailable("the database password is not in TASKGATE_DATABASE_URL")


class QuickReads:
    """One read-only snapshot of taskgate's database; `close()` it when done."""

    def __init__(self, facts: dict[str, Any]) -> None:
        """On the database `facts` name (what `remember` wrote down)."""
        url = facts["database_url"]
        self._facts = facts
        self._db: Any
        if url.startswith(_SQLITE):
            self._db = SqliteReads(Path(url.removeprefix(_SQLITE)), facts["busy_timeout_ms"])
        else:
            from taskgate.infrastructure.db.pg_reads import PgReads  # asyncpg: only for PostgreSQL

            self._db = PgReads(with_password(url))

    def close(self) -> None:
        """End the snapshot."""
        self._db.close()

    def project(self, ref: str | None, cwd: str) -> Project:
        """The project `ref` names (id, name or key), else the one `cwd` implies (BuiltinTracker.resolve_project)."""
        if ref is None:
            return choose_project([row_maps.project_of(r) for r in self._db.rows("projects")], cwd)
        if (ident := numeric_ref(ref)) is not None:
            rows = self._db.rows("project_by_id", id=ident)
        else:
            rows = self._db.rows("project_by_name", value=ref) or self._db.rows("project_by_key", value=key_of(ref))
        if not rows:
            raise Unavailable(f"no project {ref}")  # the full path says so in its words
        return row_maps.project_of(rows[0])

    def sessions(self, project_id: int, *, active: bool) -> list[Session]:
        """The project's sessions (only those not yet ended with `active`), oldest first."""
        if active:
            rows = self._db.rows("sessions_of_project_in", project_id=project_id, states=list(_ACTIVE))
        else:
            rows = self._db.rows("sessions_of_project", project_id=project_id)
        return [row_maps.session_of(r) for r in rows]

    def session(self, ref: str) -> tuple[Session, list[Agent], Any, list[Question]]:
        """The session `ref` names (its id or a prefix), its agents, its pull request and its open questions."""
        prefix = references.prefix_of(ref)
        if prefix is None:
            session_id = ref.strip().lower()
        else:
            found = self._db.rows(
                "session_ids_with_prefix", prefix=prefix, upper=references.upper_bound(prefix), limit=2
            )
            session_id = references.pick(prefix, [r["id"] for r in found])
        rows = self._db.rows("session_by_id", id=session_id)
        if not rows:
            raise Unavailable(f"no session {session_id}")
        agents = [row_maps.agent_of(r) for r in self._db.rows("agents_of_session", session_id=session_id)]
        pulls = self._db.rows("pull_request_of_session", session_id=session_id)
        asked = [row_maps.question_of(r) for r in self._db.rows("open_questions_of", session_ids=[session_id])]
        return row_maps.session_of(rows[0]), agents, row_maps.pull_request_of(pulls[0]) if pulls else None, asked

    def ready_tasks(self, project_id: int, limit: int | None) -> list[Task]:
        """The project's ready tasks, most urgent first (the first `limit`), as BuiltinTracker.ready_tasks reads
        them; a tracker read live (Beads) decides its own, so that is the full path's."""
        if self._facts["live_tracker"]:
            raise Unavailable("a tracker is read live")
        ROW_LIMITS.check("limit", limit)
        if limit is None:
            rows = self._db.rows("ready_tasks", project_id=project_id)
        else:
            rows = self._db.rows("ready_tasks_first", project_id=project_id, limit=limit)
        links = self._db.rows("blocker_ids", ids=[r["id"] for r in rows]) if rows else []
        return row_maps.with_blockers(rows, links)


def answering(work: Any) -> Any:
    """`work(reads)` on a fresh snapshot, closed after; any taskgate error becomes `Unavailable` (the full path
    reports it in its own words)."""
    facts = settings_cache.recall()
    if facts is None:
        raise Unavailable("no settings remembered for this configuration")
    reads = QuickReads(facts)
    try:
        return work(reads)
    except TaskgateError as exc:
        raise Unavailable(str(exc)) from None
    finally:
        reads.close()
