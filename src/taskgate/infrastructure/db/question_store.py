"""Agents' questions to the operator (0022, docs/questions.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update

from taskgate.domain.questions import Question, QuestionStatus
from taskgate.infrastructure.db import read_statements as reads
from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.repository_base import SqlRepository
from taskgate.infrastructure.db.row_maps import question_of

_Q = t.operator_questions
_COLUMNS = tuple(f.name for f in fields(Question) if f.name != "extra")
_OPEN = QuestionStatus.OPEN.value


def _row(question: Question) -> dict[str, Any]:
    values = {name: getattr(question, name) for name in _COLUMNS}
    return values | {"kind": question.kind.value, "status": question.status.value, "choices": list(question.choices)}


_question = question_of  # rows in, records out: shared with the engine-free read path (row_maps.py)


class SqlAlchemyQuestionRepository(SqlRepository):
    async def add(self, question: Question) -> None:
        await self._conn.execute(insert(_Q).values(_row(question)))

    async def get(self, question_id: str) -> Question | None:
        row = await self._one(select(_Q).where(_Q.c.id == question_id))
        return _question(row) if row is not None else None

    async def open(self, session_ids: Sequence[str] | None = None) -> list[Question]:
        if session_ids is None:
            return [_question(r) for r in await self._all(reads.OPEN_QUESTIONS)]
        return [_question(r) for r in await self._all(reads.OPEN_QUESTIONS_OF, {"session_ids": list(session_ids)})]

    async def of_session(self, session_id: str, limit: int = 50) -> list[Question]:
        stmt = select(_Q).where(_Q.c.session_id == session_id).order_by(_Q.c.asked_at.desc(), _Q.c.id.desc())
        return [_question(r) for r in await self._all(stmt.limit(limit))]

    async def settle(self, question: Question) -> bool:
        # compare-and-swap on 'open': of two racing ends (two answers, an answer and the time-out) one writes
        ended = {"status": question.status.value, "answer": question.answer, "message": question.message,
                 "answered_by": question.answered_by, "answered_at": question.answered_at}  # fmt: skip
        result = await self._conn.execute(update(_Q).where(_Q.c.id == question.id, _Q.c.status == _OPEN).values(ended))
        return result.rowcount == 1

    async def due(self, now: datetime) -> list[Question]:
        stmt = select(_Q).where(_Q.c.status == _OPEN, _Q.c.deadline <= now).order_by(_Q.c.deadline)
        return [_question(r) for r in await self._all(stmt)]
