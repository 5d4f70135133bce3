"""Agents' questions to the operator (application/operators/questions.py) on the fake, SQLite and PostgreSQL:
asked, answered from another process's service, raced, refused, timed out."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from taskgate.application.operators.questions import OperatorQuestions, QuestionOptions
from taskgate.domain.access import Principal
from taskgate.domain.errors import ConflictError, Forbidden, InvalidInput
from taskgate.domain.questions import QuestionStatus
from taskgate.infrastructure.system import SystemClock
from tests.builders import OPERATOR, seed, start

FAST = QuestionOptions(timeout_s=30, poll_s=0.05)


async def _asking(services, git_repo: Path):
    """A session in planning, and a principal for an agent token of it."""
    seeded = await seed(services, git_repo, tasks=2)
    session = await start(services, seeded.tasks[0])
    issued = await services.access.create_agent_token(session.id, "agent")
    return session, Principal.agent(issued.token.id, session.id)


def _questions(services, options: QuestionOptions = FAST) -> OperatorQuestions:
    return OperatorQuestions(services.uow, SystemClock(), options)


async def _events(services, kind: str) -> list[dict]:
    async with services.uow(write=False) as uow:
        return await uow.events.list(kind=kind)


async def test_an_answer_given_through_another_service_reaches_the_waiting_agent(services, git_repo: Path):
    session, agent = await _asking(services, git_repo)
    asker, answerer = _questions(services), _questions(services)  # two processes' services on one database
    asked = await asker.ask(agent, session.id, "Which colour?", ["red", "blue"])
    assert asked.is_open and asked.choices == ("red", "blue")
    assert [q.id for q in await answerer.open([session.id])] == [asked.id]

    waiting = asyncio.create_task(asker.wait(asked))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    answered = await answerer.answer(Principal.operator(OPERATOR), None, session.id, "2")  # by its number
    ended = await asyncio.wait_for(waiting, 5)
    assert (ended.status, ended.answer, ended.answered_by) == (QuestionStatus.ANSWERED, "blue", f"operator:{OPERATOR}")
    assert answered.answer == "blue"
    asked_events, answered_events = (
        await _events(services, "question.asked"),
        await _events(services, "question.answered"),
    )
    assert [e["payload"]["question_id"] for e in asked_events] == [asked.id]
    assert [(e["payload"]["answer"], e["payload"]["actor"]) for e in answered_events] == [
        ("blue", f"operator:{OPERATOR}")
    ]
    assert await answerer.open() == []
    # the same answer again is the first one; another is refused naming it
    assert (
        await answerer.answer(Principal.operator(OPERATOR), asked.id, None, "blue")
    ).answered_at == ended.answered_at
    with pytest.raises(ConflictError, match="already answered 'blue'"):
        await answerer.answer(Principal.operator(OPERATOR), asked.id, None, "red")
    assert len(await _events(services, "question.answered")) == 1


async def test_bad_questions_and_answers_are_refused_and_write_nothing(services, git_repo: Path):
    session, agent = await _asking(services, git_repo)
    questions = _questions(services)
    with pytest.raises(InvalidInput, match="empty"):
        await questions.ask(agent, session.id, "   ")
    with pytest.raises(InvalidInput, match="differ"):
        await questions.ask(agent, session.id, "Which?", ["a", "a"])
    with pytest.raises(InvalidInput, match="only an agent"):
        await questions.ask(Principal.operator(OPERATOR), session.id, "Which?")
    other = await start(services, (await services.tracker.list_tasks(session.project_id))[1])
    with pytest.raises(Forbidden, match="scoped to session"):
        await questions.ask(agent, other.id, "Which?")
    with pytest.raises(InvalidInput, match="no open question"):
        await questions.answer(Principal.operator(OPERATOR), None, session.id, "yes")
    asked = await questions.ask(agent, session.id, "Which colour?", ["red", "blue"])
    before = await services.snapshot()
    with pytest.raises(InvalidInput, match="takes one of 'red', 'blue'"):
        await questions.answer(Principal.operator(OPERATOR), asked.id, None, "green")
    with pytest.raises(InvalidInput, match="agents do not answer"):
        await questions.answer(agent, asked.id, None, "red")
    assert await services.snapshot() == before


async def test_many_operators_answering_at_once_leave_exactly_one_answer(services, git_repo: Path):
    session, agent = await _asking(services, git_repo)
    names = [f"op{i}" for i in range(12)]
    for name in names:
        await services.tracker.ensure_operator(name)  # an admin, allowed to answer
    asked = await _questions(services).ask(agent, session.id, "Ship it?", ["yes", "no"])
    racers = [_questions(services) for _ in names]  # each its own service, as separate processes would be

    async def answer(service: OperatorQuestions, name: str, i: int):
        try:
            return await service.answer(Principal.operator(name), asked.id, None, "yes" if i % 2 else "no")
        except ConflictError as exc:
            return exc

    results = await asyncio.gather(*(answer(s, n, i) for i, (s, n) in enumerate(zip(racers, names, strict=True))))
    won = [r for r in results if not isinstance(r, Exception)]
    assert len(won) == 1, results
    assert all(isinstance(r, ConflictError) for r in results if r is not won[0])
    assert len(await _events(services, "question.answered")) == 1
    stored = await racers[0].get(asked.id)
    assert (stored.answer, stored.answered_by) == (won[0].answer, won[0].answered_by)


async def test_an_unanswered_question_times_out_by_policy_and_the_sweeper_ends_orphans(services, git_repo: Path):
    session, agent = await _asking(services, git_repo)
    questions = _questions(services, QuestionOptions(timeout_s=0.3, poll_s=0.05))
    asked = await questions.ask(agent, session.id, "Anyone there?")
    ended = await asyncio.wait_for(questions.wait(asked), 5)
    assert (ended.status, ended.answered_by) == (QuestionStatus.TIMED_OUT, "policy")
    with pytest.raises(ConflictError, match="timed out"):
        await questions.answer(Principal.operator(OPERATOR), asked.id, None, "late")
    orphan = await questions.ask(agent, session.id, "Is the asker still there?")  # nobody waits on it
    await asyncio.sleep(0.4)
    assert [q.id for q in await questions.expire_due()] == [orphan.id]
    assert await questions.expire_due() == []
    assert len(await _events(services, "question.timed_out")) == 2


async def test_on_timeout_fail_fails_the_session_once(services, git_repo: Path):
    session, agent = await _asking(services, git_repo)
    questions = _questions(services, QuestionOptions(timeout_s=0.2, on_timeout="fail", poll_s=0.05))
    failed: list[str] = []

    async def fail(question):
        failed.append(question.id)

    questions.when_timeout_fails(fail)
    asked = await questions.ask(agent, session.id, "Anyone?")
    await asyncio.sleep(0.3)
    await asyncio.gather(questions.wait(asked), questions.expire_due(), questions.expire_due())
    assert failed == [asked.id]  # the waiter and two sweeps raced: one of them timed it out, once


async def test_a_cancelled_wait_withdraws_the_question(services, git_repo: Path):
    session, agent = await _asking(services, git_repo)
    questions = _questions(services)
    asked = await questions.ask(agent, session.id, "Still there?")
    waiting = asyncio.create_task(questions.wait(asked))
    await asyncio.sleep(0.1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert (await questions.get(asked.id)).status == QuestionStatus.CANCELLED
    assert len(await _events(services, "question.cancelled")) == 1
