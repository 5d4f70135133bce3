"""The statements of the CLI's everyday read commands (`session list`, `session show`, `task ready`), named.

One source of truth for their SQL: the repositories run these Core statements through SQLAlchemy, and the
engine-free read path (`fast_reads.py` on SQLite, `pg_reads.py` on PostgreSQL) runs the very same statements
compiled for each dialect ahead of time into `read_sql.py`. `python -m taskgate.infrastructure.db.read_statements`
rewrites that file; a test fails when it differs from what these statements compile to (docs/decisions.md, "Read
commands without the engine").
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, Boolean, Integer, and_, bindparam, exists, or_, select
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql import asyncpg

from taskgate.domain.beads import WAITS_FOR_ANY
from taskgate.domain.entities import PlanStatus, TaskStatus
from taskgate.domain.questions import QuestionStatus
from taskgate.infrastructure.db import statements as sql
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.migrations import SCHEMA_HEAD
from taskgate.infrastructure.db.repository_base import TERMINAL

_s, _tk, _q = t.sessions.c, t.tasks.c, t.operator_questions.c

PROJECTS = select(t.projects).order_by(t.projects.c.id)
PROJECT_BY_NAME = select(t.projects).where(t.projects.c.name == bindparam("value"))
PROJECT_BY_KEY = select(t.projects).where(t.projects.c.key == bindparam("value"))
PROJECT_BY_ROOT = select(t.projects).where(t.projects.c.root_path == bindparam("value"))

SESSIONS_OF_PROJECT = select(t.sessions).where(_s.project_id == bindparam("project_id")).order_by(_s.created_at, _s.id)
SESSIONS_OF_PROJECT_IN = (
    select(t.sessions)
    .where(_s.project_id == bindparam("project_id"), _s.state.in_(bindparam("states", expanding=True)))
    .order_by(_s.created_at, _s.id)
)
# A range scan on the primary key instead of LIKE (no wildcard escaping): `upper` is the prefix + U+FFFF.
SESSION_IDS_WITH_PREFIX = (
    select(_s.id)
    .where(_s.id >= bindparam("prefix"), _s.id < bindparam("upper"))
    .order_by(_s.id)
    .limit(bindparam("limit", type_=Integer))
)

AGENTS_OF_SESSION = select(t.agents).where(t.agents.c.session_id == bindparam("session_id")).order_by(t.agents.c.id)
PULL_REQUEST_OF_SESSION = select(t.pull_requests).where(t.pull_requests.c.session_id == bindparam("session_id"))
OPEN_QUESTIONS = select(t.operator_questions).where(_q.status == QuestionStatus.OPEN.value).order_by(_q.asked_at, _q.id)
OPEN_QUESTIONS_OF = (
    select(t.operator_questions)
    .where(_q.status == QuestionStatus.OPEN.value, _q.session_id.in_(bindparam("session_ids", expanding=True)))
    .order_by(_q.asked_at, _q.id)
)


def _ready_tasks() -> Any:
    """Open tasks without an active session whose blockers are all completed, not held by the tracker and not in
    a closed plan; most urgent first (priority, then age). The project is `:project_id`."""
    tk, dep, s, pl = t.tasks, t.task_dependencies, t.sessions, t.plans
    blocker = t.tasks.alias("blocker")
    has_active_session = exists().where(and_(s.c.task_id == tk.c.id, s.c.state.not_in(TERMINAL)))
    in_closed_plan = exists().where(and_(pl.c.id == tk.c.plan_id, pl.c.status == PlanStatus.CLOSED.value))
    # An any-children gate (Beads' waits-for with gate any-children) opens once one of its children is done:
    # its rows block only while none of them is completed. Every other row blocks while its task is open.
    dep_any, done_any = t.task_dependencies.alias("dep_any"), t.tasks.alias("done_any")
    gate_open = exists().where(
        and_(
            dep_any.c.task_id == tk.c.id,
            dep_any.c.type == WAITS_FOR_ANY,
            dep_any.c.depends_on_id == done_any.c.id,
            done_any.c.status == TaskStatus.COMPLETED.value,
        )
    )
    has_open_blocker = exists().where(
        and_(
            dep.c.task_id == tk.c.id,
            dep.c.depends_on_id == blocker.c.id,
            blocker.c.status != TaskStatus.COMPLETED.value,
            or_(dep.c.type != WAITS_FOR_ANY, ~gate_open),
        )
    )
    return (
        select(tk)
        .where(
            tk.c.project_id == bindparam("project_id"),
            tk.c.status == TaskStatus.OPEN.value,
            tk.c.hold.is_(None),  # the tracker keeps it out of its ready set (hooked, pinned, an epic, …)
            ~has_active_session,
            ~has_open_blocker,
            ~in_closed_plan,  # plan_open refuses to start them
        )
        .order_by(tk.c.priority, tk.c.created_at, tk.c.id)
    )


READY_TASKS = _ready_tasks()
# A top-N sort in the database: the first page of 80,000 issues stays fast.
READY_TASKS_FIRST = READY_TASKS.limit(bindparam("limit", type_=Integer))

# What the engine-free read path may run, by name.
FAST_READS: dict[str, Any] = {
    "projects": PROJECTS,
    "project_by_id": sql.PROJECT_BY_ID,
    "project_by_name": PROJECT_BY_NAME,
    "project_by_key": PROJECT_BY_KEY,
    "sessions_of_project": SESSIONS_OF_PROJECT,
    "sessions_of_project_in": SESSIONS_OF_PROJECT_IN,
    "session_ids_with_prefix": SESSION_IDS_WITH_PREFIX,
    "session_by_id": sql.SESSION_BY_ID,
    "agents_of_session": AGENTS_OF_SESSION,
    "pull_request_of_session": PULL_REQUEST_OF_SESSION,
    "open_questions_of": OPEN_QUESTIONS_OF,
    "ready_tasks": READY_TASKS,
    "ready_tasks_first": READY_TASKS_FIRST,
    "blocker_ids": sql.BLOCKER_IDS,
}


def _kind(column: Any) -> str:
    """How the read path turns a column's sqlite3 value into what SQLAlchemy's result would hold."""
    if isinstance(column.type, t.UtcDateTime):
        return "utc"
    if isinstance(column.type, JSON):
        return "json"
    if isinstance(column.type, Boolean):
        return "bool"
    return ""


Compiled = dict[str, tuple[str, tuple[tuple[str, str], ...], dict[str, Any]]]


def compile_for_sqlite() -> Compiled:
    """Each of FAST_READS as SQLite runs it (see `compile_for`)."""
    return compile_for(sqlite.dialect(paramstyle="named"))


def compile_for_postgresql() -> Compiled:
    """Each of FAST_READS as PostgreSQL runs it (see `compile_for`), `:name` parameters included: the read path
    numbers them `$1, $2, …` for asyncpg (pg_reads.py)."""
    # the dialect the engine runs (asyncpg's: each parameter cast to its column's type, as SQLAlchemy sends it)
    compiled = compile_for(asyncpg.dialect(paramstyle="named"))
    for name, (text, _columns, _fixed) in compiled.items():
        # the renumbering is a plain text rewrite (`:name` → `$n`, `::TYPE` left alone): exact while no literal
        # string can hold a colon
        if "'" in text:
            raise ValueError(f"{name}: a literal in the SQL; pg_reads.py cannot renumber it")
    return compiled


def compile_for(dialect: Any) -> Compiled:
    """Each of FAST_READS compiled for `dialect`: its SQL with `:name` parameters (`__[POSTCOMPILE_name]` where a
    list expands), its result columns with their kinds, and the values of the parameters the statement carries
    itself (the literal lists and constants of its WHERE clause)."""
    compiled = {}
    for name, stmt in FAST_READS.items():
        done = stmt.compile(dialect=dialect)
        columns = tuple((c.key, _kind(c)) for c in stmt.selected_columns)
        # sorted: a list built from a set (the terminal states) comes in the hash seed's order; IN does not care
        fixed = {key: sorted(v) if isinstance(v, list) else v for key, v in done.params.items() if v is not None}
        compiled[name] = (str(done), columns, fixed)
    return compiled


def module_text() -> str:
    """The text of `read_sql.py`, from the statements as they are now."""
    lines = [
        '"""Generated by `python -m taskgate.infrastructure.db.read_statements` from read_statements.py: do not edit.',
        "",
        "The SQLite and PostgreSQL text of the CLI's read statements, for the engine-free read path (fast_reads.py,",
        "pg_reads.py).",
        '"""',
        "# ruff: noqa: E501",
        "",
        f'SCHEMA_HEAD = "{SCHEMA_HEAD}"  # the schema these statements read (migrations.py)',
        "",
        "# fmt: off",
    ]
    for label, compiled in (("SQLITE", compile_for_sqlite()), ("POSTGRESQL", compile_for_postgresql())):
        lines.append(f"{label} = {{")
        for name, (text, columns, fixed) in compiled.items():
            lines.append(f"    {name!r}: ({text!r}, {columns!r}, {fixed!r}),")
        lines += ["}", ""]
    return "\n".join(lines)


READ_SQL = Path(__file__).with_name("read_sql.py")

if __name__ == "__main__":  # rewrite read_sql.py
    READ_SQL.write_text(module_text())
    sys.stdout.write(f"wrote {READ_SQL}\n")
