"""MCP tools for agents' questions to the operator (docs/questions.md).

Agents: `ask_operator` (a question, optional choices) and `permission_prompt` (Claude Code's
`--permission-prompt-tool`) block until an operator answers or the question times out by `[questions]` policy.
Operators: `question_list` (what waits for them) and `session_answer`. The CLI's `taskgate session answer` and the
console answer through the same use case (application/operators/questions.py).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from taskgate.application.operators.questions import OperatorQuestions
from taskgate.domain.access import Capability
from taskgate.domain.errors import InvalidInput, StorageError
from taskgate.domain.questions import (
    MAX_ANSWER,
    MAX_CHOICE,
    MAX_CHOICES,
    MAX_QUESTION,
    Question,
    agent_reply,
    permission_reply,
)
from taskgate.entrypoints.mcp.calls import Call, ProjectRef, call_of, session_id_of, tool_errors

QuestionId = Annotated[str | None, Field(description="The question's id (q-…); default: the session's one open "
                                                     "question.", max_length=32)]  # fmt: skip


_SHAPED = ("summary", "kind", "status", "choices")  # QuestionOut's fields not copied as they are


class QuestionOut(BaseModel):
    """One question of an agent to the operator, and how it stands."""

    summary: str
    id: str
    session_id: str
    kind: str = Field(description="question (ask_operator) or permission (a tool use to allow or deny).")
    text: str
    choices: list[str]
    tool_name: str | None
    tool_input: str | None = Field(description="A permission prompt's tool input as JSON (cut at 4,000 characters).")
    asked_by: str
    asked_at: datetime
    deadline: datetime
    status: str = Field(description="open, answered, timed_out or cancelled.")
    answer: str | None
    message: str | None
    answered_by: str | None
    answered_at: datetime | None

    @classmethod
    def of(cls, question: Question) -> QuestionOut:
        said = f"question {question.id} of session {question.session_id} is {question.status.value}"
        if question.answer is not None:
            said += f": {question.answer!r} by {question.answered_by}"
        plain = {name: getattr(question, name) for name in cls.model_fields if name not in _SHAPED}
        return cls(summary=said, kind=question.kind.value, status=question.status.value,
                   choices=list(question.choices), **plain)  # fmt: skip


class AnswerOut(BaseModel):
    """What the asking agent is told."""

    summary: str
    answer: str = Field(description="The operator's answer; on a time-out, a note that nobody answered.")
    status: str = Field(description="answered, timed_out or cancelled.")
    answered_by: str | None
    question_id: str


class QuestionList(BaseModel):
    summary: str
    questions: list[QuestionOut]


def _questions(call: Call) -> OperatorQuestions:
    if call.app.questions is None:
        raise StorageError("this server has no question service (it was not built by bootstrap)")
    return call.app.questions


def _own_session(call: Call) -> str:
    if call.principal.session_id is None:
        raise InvalidInput("only an agent asks the operator (its token names its session); operators answer with "
                           "session_answer")  # fmt: skip
    return call.principal.session_id


async def _wait(call: Call, question: Question) -> Question:
    """Wait for the answer, the agent's stall watch told it is waiting, not stuck."""
    questions = _questions(call)
    seen = (lambda: call.app.access.agent_seen(question.agent_id)) if question.agent_id else None
    return await questions.wait(question, seen)


@tool_errors
async def ask_operator(
    question: Annotated[
        str, Field(description="What you need the operator to decide or tell you.", max_length=MAX_QUESTION)
    ],
    ctx: Context,
    choices: Annotated[
        list[Annotated[str, Field(max_length=MAX_CHOICE)]],
        Field(
            description="The answers to offer (the operator picks one); empty: a free-text answer.",
            max_length=MAX_CHOICES,
        ),
    ] = [],  # noqa: B006 (pydantic copies)
) -> AnswerOut:
    """Ask the operator a question and wait for the answer (agents only, on their own session). Use it when you
    cannot decide something yourself: the session shows waiting_for_operator with your question, the operator is
    notified, and this call returns their answer. If nobody answers in time ([questions] timeout_s), it returns
    status timed_out: decide for yourself, and say so in your work."""
    call = call_of(ctx)
    session_id = _own_session(call)
    asked = await _questions(call).ask(call.principal, session_id, question, choices)
    ended = await _wait(call, asked)
    return AnswerOut(summary=f"question {ended.id}: {ended.status.value}", answer=agent_reply(ended),
                     status=ended.status.value, answered_by=ended.answered_by, question_id=ended.id)  # fmt: skip


@tool_errors
async def permission_prompt(
    tool_name: Annotated[str, Field(description="The tool the agent wants to use.", max_length=200)],
    input: Annotated[dict[str, Any], Field(description="The tool's input.")],
    ctx: Context,
    tool_use_id: Annotated[str | None, Field(description="The tool use's id.", max_length=200)] = None,
) -> str:
    """Claude Code's permission prompt (--permission-prompt-tool): a tool use the agent's preset does not allow
    outright becomes an allow/deny question to the operator, with the tool and its input shown. Returns Claude
    Code's JSON: {"behavior": "allow", "updatedInput": …} or {"behavior": "deny", "message": …}; a time-out
    denies."""
    call = call_of(ctx)
    session_id = _own_session(call)
    asked = await _questions(call).ask(call.principal, session_id, "", tool_name=tool_name, tool_input=input)
    ended = await _wait(call, asked)
    return json.dumps(permission_reply(ended, input))


@tool_errors
async def question_list(
    ctx: Context,
    project: ProjectRef = None,
    session_id: Annotated[
        str | None,
        Field(
            description="Only this session's questions (id or 4+ character prefix), answered ones too.", max_length=64
        ),
    ] = None,
) -> QuestionList:
    """The agents' questions waiting for an operator (of one project, or every project), oldest first; with
    session_id, that session's questions, newest first, answered ones too."""
    call = call_of(ctx)
    questions = _questions(call)
    if session_id is not None:
        sid = await session_id_of(call, session_id)
        found = await questions.of_session(sid)
        return QuestionList(summary=f"{len(found)} question(s) of session {sid}",
                            questions=[QuestionOut.of(q) for q in found])  # fmt: skip
    await call.app.operators.authorize(call.principal, Capability.READ)
    scope = None
    if project is not None:
        found_project = await call.app.tracker.resolve_project(project)
        scope = [s.id for s in await call.app.sessions.list_sessions(found_project.id)]
    waiting = await questions.open(scope)
    return QuestionList(summary=f"{len(waiting)} question(s) waiting for an operator",
                        questions=[QuestionOut.of(q) for q in waiting])  # fmt: skip


@tool_errors
async def session_answer(
    session_id: Annotated[str, Field(description="The session (id or 4+ character prefix).", max_length=64)],
    answer: Annotated[
        str,
        Field(
            description="The answer: one of the question's choices (or its number), free "
            "text, or allow/deny for a permission prompt.",
            max_length=MAX_ANSWER,
        ),
    ],
    ctx: Context,
    question_id: QuestionId = None,
    message: Annotated[
        str | None,
        Field(description="Words for the agent with a permission answer (why you denied it).", max_length=MAX_ANSWER),
    ] = None,
) -> QuestionOut:
    """Answer an agent's question (needs the approve permission). The waiting agent gets the answer at once; the
    answer and who gave it are on the audit log. The same answer again is a no-op; a different answer to a
    question already answered or timed out is refused, naming how it ended."""
    call = call_of(ctx)
    sid = await session_id_of(call, session_id, Capability.DECIDE)
    ended = await _questions(call).answer(call.principal, question_id, sid, answer, message)
    return QuestionOut.of(ended)


QUESTION_TOOLS = [ask_operator, permission_prompt, question_list, session_answer]
