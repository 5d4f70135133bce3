"""Rows in, domain records out: the mappings the repositories and the engine-free read path share.

Nothing here imports SQLAlchemy: a row is anything indexable by column name (SQLAlchemy's `RowMapping`, or the
dicts `fast_reads.py` builds from sqlite3), its values already converted to Python (aware datetimes, parsed JSON).
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from taskgate.domain.entities import Agent, AgentStatus, Project, Session, Task, TaskStatus
from taskgate.domain.questions import Question, QuestionKind, QuestionStatus
from taskgate.domain.states import SessionState

if TYPE_CHECKING:
    from taskgate.application.forge.ports import PullRequestRecord

SESSION_FIELDS = tuple(f.name for f in fields(Session) if f.name not in {"state", "prior_state"})
PROJECT_FIELDS = ("id", "name", "key", "root_path", "created_at", "archived_at")
TASK_COLUMNS = tuple(f.name for f in fields(Task) if f.name != "blockers")  # blockers live in task_dependencies
AGENT_FIELDS = tuple(f.name for f in fields(Agent))
QUESTION_COLUMNS = tuple(f.name for f in fields(Question) if f.name != "extra")


def session_of(row: Any) -> Session:
    """A `sessions` row as a Session."""
    values = {name: row[name] for name in SESSION_FIELDS}
    prior = row["prior_state"]
    return Session(state=SessionState(row["state"]), prior_state=SessionState(prior) if prior else None, **values)


def project_of(row: Any) -> Project:
    """A `projects` row as a Project."""
    values = {name: row[name] for name in PROJECT_FIELDS}
    return Project(**values, config=row["config"] or {})


def task_of(row: Any, blockers: list[str]) -> Task:
    """A `tasks` row as a Task, with the ids of the tasks blocking it."""
    return Task(**{**row, "status": TaskStatus(row["status"]), "blockers": blockers})


def with_blockers(rows: list[Any], links: list[Any]) -> list[Task]:
    """Task rows as Tasks, each with its blockers from `links` (`task_dependencies` rows), sorted."""
    blockers: dict[str, list[str]] = {}
    for link in links:
        blockers.setdefault(link["task_id"], []).append(link["depends_on_id"])
    return [task_of(r, sorted(blockers.get(r["id"], []))) for r in rows]


def agent_of(row: Any) -> Agent:
    """An `agents` row as an Agent."""
    return Agent(**{**{name: row[name] for name in AGENT_FIELDS}, "status": AgentStatus(row["status"])})


def question_of(row: Any) -> Question:
    """An `operator_questions` row as a Question."""
    values = {name: row[name] for name in QUESTION_COLUMNS}
    return Question(**values | {"kind": QuestionKind(row["kind"]), "status": QuestionStatus(row["status"]),
                                "choices": tuple(row["choices"] or ())})  # fmt: skip


def pull_request_of(row: Any) -> PullRequestRecord:
    """A `pull_requests` row as a PullRequestRecord."""
    from taskgate.application.forge.ports import PullRequestRecord  # here: the forge's models only when one is read

    return PullRequestRecord(**{f.name: row[f.name] for f in fields(PullRequestRecord)})
