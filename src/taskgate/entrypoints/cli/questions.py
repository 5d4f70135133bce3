"""`session answer` and `session questions`: agents' questions to the operator, answered from a terminal
(docs/questions.md). The waiting agent, in whichever process serves its MCP call, gets the answer within
`[questions] poll_s`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from taskgate.domain.access import Principal
from taskgate.domain.questions import Question
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import JsonOpt, _operator_actor, emit, run, session_app
from taskgate.entrypoints.render import console

if TYPE_CHECKING:
    from taskgate.bootstrap import App


question_json, question_line = render.question_json, render.question_line  # where callers found them


@session_app.command("answer")
def session_answer(
    session_id: Annotated[str, typer.Argument(help="Session id or a unique prefix of it.")],
    answer: Annotated[
        str,
        typer.Argument(
            help="One of the question's choices (or its number), free text, or allow / deny for a permission prompt."
        ),
    ],
    question: Annotated[
        str | None, typer.Option("--question", help="The question's id (default: the session's one open question).")
    ] = None,
    message: Annotated[str | None, typer.Option("--message", help="Words for the agent (why you denied it).")] = None,
    operator: Annotated[
        str | None, typer.Option("--operator", help="Answer as this operator (default: the local one).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Answer the question an agent of the session is waiting on. The agent gets the answer at once; the answer
    and who gave it are on the audit log (`question.answered`). Answering again with the same answer is a no-op."""

    async def work(services: App) -> Question:
        assert services.questions is not None, "the app was not built by bootstrap()"
        full_id = await services.sessions.resolve_id(session_id)
        operator_id, _actor = _operator_actor(services, operator)
        return await services.questions.answer(Principal.operator(operator_id), question, full_id, answer, message)

    ended = run(work)
    said = f"{ended.id}: answered {ended.answer!r} as {ended.answered_by}"
    emit(question_json(ended), as_json, lambda: escape(said))


@session_app.command("questions")
def session_questions(
    session_id: Annotated[str | None, typer.Argument(help="Only this session's (answered ones too).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The agents' questions waiting for an answer (every session's), or one session's questions, newest first."""

    async def work(services: App) -> list[Question]:
        assert services.questions is not None, "the app was not built by bootstrap()"
        if session_id is None:
            return await services.questions.open()
        return await services.questions.of_session(await services.sessions.resolve_id(session_id))

    found = run(work)
    if as_json:
        render.print_json([question_json(q) for q in found])
        return
    if not found:
        console.print("no question waits for an operator" if session_id is None else "no question", highlight=False)
        return
    for q in found:
        ended = "" if q.is_open else f" → {q.status.value}: {q.answer or '-'} ({q.answered_by})"
        console.print(escape(question_line(q) + ended), highlight=False)
    if session_id is None:
        console.print("answer with: taskgate session answer <session> <answer>", highlight=False)
