"""Agents' questions to the operator: asked, waited on, answered, timed out (docs/questions.md).

An agent's `ask_operator` (or Claude Code's permission prompt) writes an open question and a `question.asked` event
in one transaction, then waits in the endpoint that serves the agent's MCP call: it re-reads the question every
`poll_s` (an answer may come from any process: the CLI, another `serve`, the console), and is woken at once by an
answer given in its own process. The answer is written by a compare-and-swap on `open` with a `question.answered`
event naming who answered, in one transaction; a time-out the same way (`question.timed_out`, by "policy"). So two
operators answering at once, or an answer racing the deadline, leave exactly one ending, and the loser is told.

Who ends a question past its deadline: the waiter itself, and the sweeper (`expire_due`) for a waiter that is gone
(its process died). `[questions] on_timeout = "fail"` also fails the session for manual review (work kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from taskgate.application.ports import Clock, UnitOfWork, UnitOfWorkFactory
from taskgate.domain.access import Capability, Principal, PrincipalKind, authorize, authorize_operator
from taskgate.domain.entities import AgentStatus
from taskgate.domain.errors import ConflictError, InvalidInput
from taskgate.domain.questions import (
    Question,
    QuestionKind,
    QuestionStatus,
    check_answer,
    check_question,
    shown_input,
)
from taskgate.domain.states import SessionState

ASKED, ANSWERED = "question.asked", "question.answered"
TIMED_OUT, CANCELLED = "question.timed_out", "question.cancelled"
ASKING_STATES = frozenset({SessionState.PLANNING, SessionState.EXECUTING, SessionState.VERIFYING})
"""The states whose agents run, so may ask."""
_ENDED = frozenset({AgentStatus.COMPLETED, AgentStatus.FAILED, AgentStatus.CANCELLED})


@dataclass(frozen=True, slots=True)
class QuestionOptions:
    """`[questions]`: how long a question waits for its answer, and what a time-out does to the session."""

    timeout_s: float = 1800.0
    on_timeout: str = "continue"  # continue (the agent is told and decides) | fail (also fail the session)
    poll_s: float = 0.5  # how often a waiting call re-reads its question (answers from other processes)


class OperatorQuestions:
    """Questions of agents to operators, and their answers."""

    def __init__(self, uow: UnitOfWorkFactory, clock: Clock, options: QuestionOptions | None = None) -> None:
        self._uow, self._clock = uow, clock
        self.options = options or QuestionOptions()
        self._answered: dict[str, asyncio.Event] = {}  # waiters in this process, woken by an answer given here
        self._on_timeout_fail: Callable[[Question], Any] | None = None

    def when_timeout_fails(self, fail: Callable[[Question], Any]) -> None:
        """What `on_timeout = "fail"` does with a timed-out question's session (bootstrap wires the session engine)."""
        self._on_timeout_fail = fail

    async def ask(
        self, principal: Principal, session_id: str, text: str, choices: Sequence[str] = (), *,
        tool_name: str | None = None, tool_input: Any = None,
    ) -> Question:  # fmt: skip
        """Write an open question (a permission prompt when `tool_name` is given) of the calling agent.

        Raises: Forbidden (not an agent of the session), InvalidInput (empty, too long, the session not running
        agents), SessionNotFound. Nothing is written on a refusal."""
        if principal.kind != PrincipalKind.AGENT:
            raise InvalidInput("only an agent asks the operator (its token names its session); operators answer")
        authorize(principal, Capability.ASK, session_id=session_id)
        kind = QuestionKind.PERMISSION if tool_name is not None else QuestionKind.QUESTION
        if kind == QuestionKind.PERMISSION:
            text, offered = f"permission for {tool_name}", ()
            shown: str | None = shown_input(tool_input)
        else:
            text, offered = check_question(text, list(choices))
            shown = None
        now = self._clock.now()
        async with self._uow(write=True) as uow:
            session = await uow.sessions.get(session_id)
            if session.state not in ASKING_STATES:
                raise InvalidInput(f"session {session_id} is {session.state.value}: only a session whose agents "
                                   "run (planning, executing, verifying) can wait for an answer")  # fmt: skip
            token = await uow.tokens.get(principal.subject)
            question = Question(
                id=f"q-{secrets.token_hex(6)}", session_id=session_id, kind=kind, text=text, choices=offered,
                tool_name=tool_name, tool_input=shown, asked_by=principal.actor, asked_at=now,
                deadline=now + timedelta(seconds=self.options.timeout_s),
                agent_id=token.agent_id if token is not None else None,
            )  # fmt: skip
            await uow.questions.add(question)
            await uow.events.append(ASKED, now, _payload(question), session_id)
            await uow.commit()
        return question

    async def wait(self, question: Question, on_tick: Callable[[], None] | None = None) -> Question:
        """Block until `question` has ended (answered anywhere, or its deadline passed: then it is timed out here).
        `on_tick` runs at every re-read (the agent's stall watch counts its waiting as progress). A cancelled wait
        (the agent's call went away) withdraws the question."""
        woken = self._answered.setdefault(question.id, asyncio.Event())
        try:
            while True:
                current, agent_ended = await self._read(question)
                if not current.is_open:
                    return current
                if agent_ended:  # its agent ended (stopped, killed) while the call still waited: nobody to tell
                    return (await self._end(current, QuestionStatus.CANCELLED, "agent", CANCELLED))[0]
                if self._clock.now() >= current.deadline:
                    return await self._time_out(current)
                if on_tick is not None:
                    on_tick()
                left = (current.deadline - self._clock.now()).total_seconds()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), timeout=max(0.0, min(self.options.poll_s, left)))
        except asyncio.CancelledError:
            await asyncio.shield(self._end(question, QuestionStatus.CANCELLED, "agent", CANCELLED))
            raise
        finally:
            self._answered.pop(question.id, None)

    async def _read(self, question: Question) -> tuple[Question, bool]:
        """The question as stored, and whether its agent has ended (one read)."""
        async with self._uow(write=False) as uow:
            current = await uow.questions.get(question.id)
            agents = await uow.agents.many([question.agent_id]) if question.agent_id else []
        assert current is not None
        return current, any(a.status in _ENDED for a in agents)

    async def answer(
        self, principal: Principal, question_id: str | None, session_id: str | None, answer: str,
        message: str | None = None,
    ) -> Question:  # fmt: skip
        """Answer a question: by its id, or the one open question of `session_id`. The same answer again by the same
        operator returns the first (idempotent); any other answer to an ended question is refused, naming how it
        ended.

        Raises: InvalidInput (no such question, several open, the answer not one the question takes), Forbidden,
        ConflictError (it ended otherwise). Nothing is written on a refusal."""
        if principal.operator_id is None:
            raise InvalidInput("agents do not answer questions; an operator does")
        if message is not None and len(message) > 4000:
            raise InvalidInput(f"message: {len(message)} characters, at most 4000")
        now = self._clock.now()
        async with self._uow(write=True) as uow:
            operator = await uow.operators.get(principal.operator_id)
            authorize_operator(operator, Capability.DECIDE)
            question = await self._find(uow, question_id, session_id)
            given = check_answer(question, answer)
            if not question.is_open:
                return _replayed(question, given, principal.actor)
            ended = replace(question, status=QuestionStatus.ANSWERED, answer=given, message=message,
                            answered_by=principal.actor, answered_at=now)  # fmt: skip
            if not await uow.questions.settle(ended):  # ended by a racer since our read (PostgreSQL: not locked)
                latest = await uow.questions.get(question.id)
                assert latest is not None
                return _replayed(latest, given, principal.actor)
            await uow.events.append(ANSWERED, now, _payload(ended), ended.session_id)
            await uow.commit()
        if (woken := self._answered.get(ended.id)) is not None:
            woken.set()
        return ended

    async def get(self, question_id: str) -> Question:
        """Raises: InvalidInput when there is no such question."""
        async with self._uow(write=False) as uow:
            found = await uow.questions.get(question_id)
        if found is None:
            raise InvalidInput(f"no question {question_id}")
        return found

    async def open(self, session_ids: Sequence[str] | None = None) -> list[Question]:
        """The open questions (of these sessions), oldest first."""
        async with self._uow(write=False) as uow:
            return await uow.questions.open(session_ids)

    async def of_session(self, session_id: str, limit: int = 50) -> list[Question]:
        """The session's questions, newest first."""
        async with self._uow(write=False) as uow:
            return await uow.questions.of_session(session_id, limit)

    async def expire_due(self) -> list[Question]:
        """Time out the open questions past their deadline whose waiter is gone (the sweeper's pass)."""
        async with self._uow(write=False) as uow:
            due = await uow.questions.due(self._clock.now())
        ended = [await self._time_out(q) for q in due]
        return [q for q in ended if q.status == QuestionStatus.TIMED_OUT]

    async def _time_out(self, question: Question) -> Question:
        ended, won = await self._end(question, QuestionStatus.TIMED_OUT, "policy", TIMED_OUT)
        # only the one that timed it out fails the session: the waiter and the sweeper may both try
        if won and self.options.on_timeout == "fail" and self._on_timeout_fail is not None:
            await self._on_timeout_fail(ended)
        return ended

    async def _end(self, question: Question, status: QuestionStatus, by: str, kind: str) -> tuple[Question, bool]:
        """End an open question (compare-and-swap): the question as it stands after, and whether this call ended
        it (False: someone else's end came first, and that is what is returned)."""
        now = self._clock.now()
        ended = replace(question, status=status, answered_by=by, answered_at=now)
        async with self._uow(write=True) as uow:
            if not await uow.questions.settle(ended):
                latest = await uow.questions.get(question.id)
                assert latest is not None
                return latest, False
            await uow.events.append(kind, now, _payload(ended), ended.session_id)
            await uow.commit()
        return ended, True

    @staticmethod
    async def _find(uow: UnitOfWork, question_id: str | None, session_id: str | None) -> Question:
        if question_id is not None:
            found = await uow.questions.get(question_id)
            if found is None or (session_id is not None and found.session_id != session_id):
                raise InvalidInput(f"no question {question_id}" + (f" in session {session_id}" if session_id else ""))
            return found
        if session_id is None:
            raise InvalidInput("name the question (its id) or its session")
        waiting = await uow.questions.open([session_id])
        if not waiting:
            raise InvalidInput(f"session {session_id} has no open question")
        if len(waiting) > 1:
            ids = ", ".join(q.id for q in waiting)
            raise InvalidInput(f"session {session_id} has {len(waiting)} open questions ({ids}): name one")
        return waiting[0]


def _replayed(question: Question, given: str, actor: str) -> Question:
    """An ended question answered again: the same answer by the same operator is the first answer returned;
    anything else is refused naming how it ended."""
    if question.status == QuestionStatus.ANSWERED and question.answer == given and question.answered_by == actor:
        return question
    how = {QuestionStatus.ANSWERED: f"answered {question.answer!r} by {question.answered_by}",
           QuestionStatus.TIMED_OUT: "timed out", QuestionStatus.CANCELLED: "withdrawn (its agent ended)"}  # fmt: skip
    raise ConflictError(f"question {question.id} was already {how.get(question.status, question.status.value)}")


def _payload(question: Question) -> dict[str, Any]:
    """The event's payload: what was asked and how it ended, never the tool input beyond its cut (no secrets of the
    agent's environment are in it: it is what the agent itself proposed to run)."""
    payload: dict[str, Any] = {"question_id": question.id, "session_id": question.session_id,
                               "kind": question.kind.value, "text": question.text, "asked_by": question.asked_by,
                               "agent_id": question.agent_id, "status": question.status.value}  # fmt: skip
    if question.choices:
        payload["choices"] = list(question.choices)
    if question.tool_name is not None:
        payload["tool_name"] = question.tool_name
        payload["tool_input"] = question.tool_input
    if not question.is_open:
        payload |= {"answer": question.answer, "answered_by": question.answered_by, "actor": question.answered_by}
        if question.message:
            payload["message"] = question.message
    else:
        payload["actor"] = question.asked_by
        payload["deadline"] = question.deadline.isoformat()
    return payload
