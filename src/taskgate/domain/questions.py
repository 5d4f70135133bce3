"""An agent's question to the operator, and a permission prompt (pure): what is asked, what may answer it, and how
it ends.

An agent asks through taskgate's MCP tools on its endpoint: `ask_operator` (a question, optional choices) or, for
Claude Code, `permission_prompt` (its `--permission-prompt-tool`: a tool use its preset does not allow outright,
to be allowed or denied). The call blocks until an operator answers (CLI `session answer`, MCP `session_answer`, the
console) or the question times out by `[questions]` policy; meanwhile the session is in the sub-state
`waiting_for_operator` of the state its agent runs in (QUESTION_SUBSTATES, drawn with the transition table).

A question moves once, from `open` to `answered`, `timed_out` or `cancelled` (its agent ended first); the store
does it by compare-and-swap on `open`, so two answers racing (two operators, an answer and the time-out) leave one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from taskgate.domain.errors import InvalidInput

MAX_QUESTION = 4000  # characters of a question
MAX_CHOICES = 20
MAX_CHOICE = 200
MAX_ANSWER = 4000
MAX_INPUT_SHOWN = 4000  # characters of a permission prompt's tool input kept and shown (the rest is cut, marked)

ALLOW, DENY = "allow", "deny"
PERMISSION_CHOICES = (ALLOW, DENY)


class QuestionKind(StrEnum):
    QUESTION = "question"  # ask_operator: free text, or one of its choices
    PERMISSION = "permission"  # a permission prompt: allow or deny a tool use


class QuestionStatus(StrEnum):
    OPEN = "open"
    ANSWERED = "answered"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"  # its agent ended (or its session left the state) before an answer


QUESTION_SUBSTATES: tuple[tuple[str, str, str], ...] = (
    ("working", "waiting_for_operator", "an agent asks (ask_operator, a permission prompt)"),
    ("waiting_for_operator", "working", "answered, or timed out by [questions] policy"),
)
"""The sub-states of a state whose agents run (planning, executing, verifying): `waiting_for_operator` while a
question of one of its agents is open (session_fsm draws them under `executing`)."""

WAITING_SUBSTATE = "waiting_for_operator"


@dataclass(frozen=True, slots=True)
class Question:
    """One question of an agent to the operator, and how it ended."""

    id: str
    session_id: str
    kind: QuestionKind
    text: str
    asked_by: str  # the actor: agent:<token id>
    asked_at: datetime
    deadline: datetime
    agent_id: str | None = None
    choices: tuple[str, ...] = ()
    tool_name: str | None = None  # a permission prompt's tool (Bash, Edit, mcp__x__y)
    tool_input: str | None = None  # its input as JSON, cut at MAX_INPUT_SHOWN
    status: QuestionStatus = QuestionStatus.OPEN
    answer: str | None = None
    message: str | None = None  # the operator's words with a permission answer (a deny's reason, shown to the agent)
    answered_by: str | None = None  # operator:<id>, or "policy" for a time-out
    answered_at: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_open(self) -> bool:
        return self.status == QuestionStatus.OPEN

    def describe(self) -> str:
        """One line for a person: `Bash: {"command": "rm -rf build"}` or the question with its choices."""
        if self.kind == QuestionKind.PERMISSION:
            return f"may the agent use {self.tool_name}? {self.tool_input or ''}".rstrip()
        offered = f" [{' / '.join(self.choices)}]" if self.choices else ""
        return f"{self.text}{offered}"


def check_question(text: str, choices: list[str] | tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """The question and its choices, trimmed. Raises: InvalidInput naming what is wrong (nothing is written)."""
    text = text.strip()
    if not text:
        raise InvalidInput("question: say what you want to know (it is empty)")
    if len(text) > MAX_QUESTION:
        raise InvalidInput(f"question: {len(text)} characters, at most {MAX_QUESTION}")
    cleaned = tuple(c.strip() for c in choices)
    if len(cleaned) > MAX_CHOICES:
        raise InvalidInput(f"choices: {len(cleaned)} given, at most {MAX_CHOICES}")
    if any(not c or len(c) > MAX_CHOICE for c in cleaned):
        raise InvalidInput(f"choices: each must be 1 to {MAX_CHOICE} characters")
    if len(set(cleaned)) != len(cleaned):
        raise InvalidInput("choices: each must differ from the others")
    return text, cleaned


def shown_input(tool_input: Any) -> str:
    """A permission prompt's tool input as JSON for a person, cut at MAX_INPUT_SHOWN (marked when cut)."""
    shown = json.dumps(tool_input, sort_keys=True, ensure_ascii=False, default=str)
    if len(shown) > MAX_INPUT_SHOWN:
        return shown[:MAX_INPUT_SHOWN] + f"… ({len(shown) - MAX_INPUT_SHOWN} more characters)"
    return shown


def check_answer(question: Question, answer: str) -> str:
    """The answer as stored: a permission's `allow`/`deny` (also yes/no), one of the choices (matched ignoring
    case, or by its number from 1), or free text when there are no choices.

    Raises: InvalidInput naming what the question accepts (nothing is written).
    """
    given = answer.strip()
    if not given:
        raise InvalidInput("answer: it is empty")
    if len(given) > MAX_ANSWER:
        raise InvalidInput(f"answer: {len(given)} characters, at most {MAX_ANSWER}")
    if question.kind == QuestionKind.PERMISSION:
        word = {"yes": ALLOW, "y": ALLOW, "approve": ALLOW, "no": DENY, "n": DENY}.get(given.lower(), given.lower())
        if word not in PERMISSION_CHOICES:
            raise InvalidInput(f"answer: a permission prompt takes allow or deny, not {given!r}")
        return word
    if not question.choices:
        return given
    for number, choice in enumerate(question.choices, 1):
        if given.lower() == choice.lower() or given == str(number):
            return choice
    offered = ", ".join(repr(c) for c in question.choices)
    raise InvalidInput(f"answer: question {question.id} takes one of {offered} (or its number), not {given!r}")


def agent_reply(question: Question) -> str:
    """What the asking agent is told once the question has ended."""
    if question.status == QuestionStatus.ANSWERED:
        return question.answer or ""
    if question.status == QuestionStatus.TIMED_OUT:
        return "no answer: the operator did not answer in time; decide for yourself, and say so in your work"
    return "no answer: the question was withdrawn"


def permission_reply(question: Question, tool_input: Any) -> dict[str, Any]:
    """A permission prompt's result as Claude Code's `--permission-prompt-tool` reads it: `{"behavior": "allow",
    "updatedInput": …}` or `{"behavior": "deny", "message": …}`; a time-out or withdrawal denies."""
    if question.status == QuestionStatus.ANSWERED and question.answer == ALLOW:
        return {"behavior": "allow", "updatedInput": tool_input}
    if question.status == QuestionStatus.ANSWERED:
        why = question.message or "the operator denied it"
        return {"behavior": "deny", "message": f"{why} (denied by {question.answered_by})"}
    return {"behavior": "deny", "message": agent_reply(question)}
