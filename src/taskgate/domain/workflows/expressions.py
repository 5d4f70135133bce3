"""The small, safe condition language of workflows: parsed and evaluated by us, never by Python.

A workflow step may carry a condition such as

    steps.review.status == "approved" and not context.skip_tests
    steps.tests.output contains "FAILED"
    "urgent" in task.labels or task.priority <= 1

Grammar (keywords are lower case; whitespace is free between tokens)::

    expr  := or
    or    := and ('or' and)*
    and   := not ('and' not)*
    not   := 'not' not | cmp
    cmp   := value (('==' | '!=' | '<' | '<=' | '>' | '>=' | 'contains' | 'in') value)?
    value := NUMBER | STRING | 'true' | 'false' | 'null' | PATH | '(' expr ')'
    NUMBER:= '-'? [0-9]+ ('.' [0-9]+)? ([eE] [+-]? [0-9]+)?
    STRING:= '...' or "..." with the escapes \\\\ \\' \\" \\n \\t \\r
    PATH  := IDENT ('.' IDENT | '[' [0-9]+ ']')*
    IDENT := [A-Za-z][A-Za-z0-9_]* ('-' [A-Za-z0-9_]+)*      (so step ids like `run-tests` work)

Safety: the text is tokenized and parsed by hand into frozen dataclasses; nothing is ever handed to
`eval`, `exec`, `compile` or a template engine. There are no function calls, no attribute access and
no arithmetic. Names starting with `_` are refused at parse time, and paths only walk through
mappings and lists/tuples (never attributes of objects). Input is bounded: at most 2000 characters,
200 tokens and 32 levels of nesting (parentheses and `not`), so hostile text cannot exhaust the stack.

Evaluation never raises for any context:

* a path that does not resolve (missing key, index out of range, stepping into a string, a number or
  an object) is `null` (`None`); `steps.x.status == null` therefore tests for "absent";
* `[n]` indexes lists/tuples; on a mapping it looks up the key `n`, then the key `"n"`;
* `==`/`!=` are strict: numbers compare by value (`1 == 1.0`) but booleans are not numbers
  (`true != 1`), strings only equal strings, lists and mappings compare element by element;
* `<`, `<=`, `>`, `>=` are defined for two numbers or two strings; any other pair is simply false;
* `a contains b`: substring when both are strings, membership (strict `==`) when `a` is a list, key
  presence when `a` is a mapping, otherwise false; `b in a` is `a contains b`;
* a bare value is judged by truthiness: `null`, `false`, `0`, `""`, `[]`, `{}` are false; objects of
  other types are true (they are never asked, so no user code runs);
* `and`/`or` short-circuit and yield booleans.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from taskgate.domain.errors import InvalidInput

MAX_LENGTH = 2000
MAX_TOKENS = 200
MAX_DEPTH = 32

KEYWORDS = frozenset({"and", "or", "not", "contains", "in", "true", "false", "null"})
COMPARISONS = ("==", "!=", "<", "<=", ">", ">=", "contains", "in")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r"}
_HINTS = {
    "=": "use '==' to compare",
    "!": "use 'not' to negate (or '!=' to compare)",
    "&": "use 'and'",
    "|": "use 'or'",
    "{": "braces are not part of the condition language",
    "}": "braces are not part of the condition language",
    ";": "a condition is a single expression",
    "`": "backticks are not part of the condition language",
    "+": "there is no arithmetic",
    "*": "there is no arithmetic",
    "/": "there is no arithmetic",
    "%": "there is no arithmetic",
    ",": "there are no lists, tuples or function arguments",
    ":": "there are no lambdas, slices or mappings",
}
_PYTHONISMS = {"True": "true", "False": "false", "None": "null"}


class ExpressionError(InvalidInput):
    """A condition that does not parse; `column` is 1-based and points at the offending character."""

    def __init__(self, message: str, column: int) -> None:
        self.message, self.column = message, column
        super().__init__(f"invalid condition at column {column}: {message}")


# --------------------------------------------------------------------------------------------- AST


@dataclass(frozen=True)
class Literal:
    value: bool | int | float | str | None


@dataclass(frozen=True)
class Path:
    segments: tuple[str | int, ...]
    column: int = field(default=0, compare=False)

    @property
    def text(self) -> str:
        return render(self)


@dataclass(frozen=True)
class Not:
    operand: Node


@dataclass(frozen=True)
class And:
    operands: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    operands: tuple[Node, ...]


@dataclass(frozen=True)
class Compare:
    op: str
    left: Node
    right: Node


Node: TypeAlias = Literal | Path | Not | And | Or | Compare


@dataclass(frozen=True)
class Condition:
    """A parsed condition; equal when the trees are equal, whatever the spacing of the source."""

    root: Node
    source: str = field(default="", compare=False)

    def evaluate(self, context: Mapping[str, Any]) -> bool:
        """True when the condition holds for `context`; never raises (see the module doc)."""
        return _truthy(_eval(self.root, context))

    def paths(self) -> tuple[Path, ...]:
        """Every path the condition reads, in source order (a validator checks `steps.X` names a step)."""
        found: list[Path] = []
        stack: list[Node] = [self.root]
        while stack:
            node = stack.pop()
            if isinstance(node, Path):
                found.append(node)
            elif isinstance(node, Not):
                stack.append(node.operand)
            elif isinstance(node, And | Or):
                stack.extend(reversed(node.operands))
            elif isinstance(node, Compare):
                stack.extend((node.right, node.left))
        return tuple(found)

    def __str__(self) -> str:
        return render(self.root)


# ----------------------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class _Token:
    kind: str  # number, string, word, op, '(', ')', '[', ']', '.', '-', end
    text: str
    column: int
    value: Any = None


def _describe(token: _Token) -> str:
    if token.kind == "end":
        return "the end of the condition"
    if token.kind == "string":
        return f"the string {token.text}"
    if token.kind == "number":
        return f"the number {token.text}"
    if token.kind == "word":
        return f"'{token.text}'"
    return f"'{token.text}'"


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        col = i + 1
        if ch in " \t\r\n":
            i += 1
            continue
        if len(tokens) >= MAX_TOKENS:
            raise ExpressionError(f"too many tokens (a condition has at most {MAX_TOKENS})", col)
        if ch in "0123456789":
            m = _NUMBER.match(text, i)
            assert m is not None
            end = m.end()
            if end < n and (text[end].isalnum() or text[end] in "._"):
                raise ExpressionError(f"malformed number {text[i : end + 1]!r}", col)
            raw = m.group()
            value: int | float = float(raw) if ("." in raw or "e" in raw or "E" in raw) else int(raw)
            if isinstance(value, float) and not math.isfinite(value):
                raise ExpressionError(f"number {raw} is out of range", col)
            tokens.append(_Token("number", raw, col, value))
            i = end
        elif ch in "'\"":
            i = _string(text, i, tokens)
        elif ch.isascii() and (ch.isalpha() or ch == "_"):
            m = _IDENT.match(text, i)
            assert m is not None
            word = m.group()
            if word.startswith("_"):
                raise ExpressionError(f"names may not start with '_' (found {word!r})", col)
            if m.end() < n and text[m.end()] == "-":
                raise ExpressionError(f"a name may not end with '-' (after {word!r})", m.end() + 1)
            tokens.append(_Token("word", word, col))
            i = m.end()
        elif ch in "=!<>":
            two = text[i : i + 2]
            if two in ("==", "!=", "<=", ">="):
                tokens.append(_Token("op", two, col))
                i += 2
            elif ch in "<>":
                tokens.append(_Token("op", ch, col))
                i += 1
            else:
                raise ExpressionError(f"unexpected character {ch!r}: {_HINTS[ch]}", col)
        elif ch in "()[].-":
            tokens.append(_Token(ch, ch, col))
            i += 1
        else:
            hint = _HINTS.get(ch)
            shown = repr(ch)
            raise ExpressionError(f"unexpected character {shown}" + (f": {hint}" if hint else ""), col)
    tokens.append(_Token("end", "", n + 1))
    return tokens


def _string(text: str, start: int, tokens: list[_Token]) -> int:
    quote = text[start]
    out: list[str] = []
    i, n = start + 1, len(text)
    while i < n:
        ch = text[i]
        if ch == quote:
            tokens.append(_Token("string", text[start : i + 1], start + 1, "".join(out)))
            return i + 1
        if ch == "\\":
            if i + 1 >= n:
                break
            esc = text[i + 1]
            if esc not in _ESCAPES:
                raise ExpressionError(
                    f"unknown escape '\\{esc}' in a string (allowed: \\\\ \\' \\\" \\n \\t \\r)", i + 1
                )
            out.append(_ESCAPES[esc])
            i += 2
            continue
        out.append(ch)
        i += 1
    raise ExpressionError(f"unterminated string: no closing {quote} for the quote opened here", start + 1)


# ----------------------------------------------------------------------------------------- parser


_VALUE_EXPECTED = "a value (a number, a string, true, false, null, a path such as steps.x.status, or '(')"
_AFTER_VALUE = "'and', 'or', a comparison (== != < <= > >= contains in) or the end of the condition"


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens, self.pos = tokens, 0

    @property
    def tok(self) -> _Token:
        return self.tokens[self.pos]

    def advance(self) -> _Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def fail(self, expected: str, token: _Token | None = None) -> ExpressionError:
        token = token or self.tok
        extra = ""
        if token.kind == "(":
            extra = " (function calls are not supported)"
        elif token.kind == "-":
            extra = " (there is no arithmetic)"
        return ExpressionError(f"expected {expected}, found {_describe(token)}{extra}", token.column)

    def is_word(self, word: str) -> bool:
        return self.tok.kind == "word" and self.tok.text == word

    def parse(self) -> Node:
        node = self.or_(0)
        if self.tok.kind != "end":
            raise self.fail(_AFTER_VALUE)
        return node

    def or_(self, depth: int) -> Node:
        items = [self.and_(depth)]
        while self.is_word("or"):
            self.advance()
            items.append(self.and_(depth))
        return items[0] if len(items) == 1 else Or(tuple(items))

    def and_(self, depth: int) -> Node:
        items = [self.not_(depth)]
        while self.is_word("and"):
            self.advance()
            items.append(self.not_(depth))
        return items[0] if len(items) == 1 else And(tuple(items))

    def not_(self, depth: int) -> Node:
        if self.is_word("not"):
            token = self.advance()
            self.check_depth(depth + 1, token)
            return Not(self.not_(depth + 1))
        return self.cmp(depth)

    def cmp(self, depth: int) -> Node:
        left = self.value(depth)
        token = self.tok
        if (token.kind == "op") or (token.kind == "word" and token.text in ("contains", "in")):
            self.advance()
            right = self.value(depth)
            nxt = self.tok
            if nxt.kind == "op" or (nxt.kind == "word" and nxt.text in ("contains", "in")):
                raise ExpressionError(
                    f"comparisons do not chain: wrap one side in parentheses before {_describe(nxt)}", nxt.column
                )
            return Compare(token.text, left, right)
        return left

    def check_depth(self, depth: int, token: _Token) -> None:
        if depth > MAX_DEPTH:
            raise ExpressionError(f"nesting deeper than {MAX_DEPTH} levels (parentheses and 'not')", token.column)

    def value(self, depth: int) -> Node:
        token = self.tok
        if token.kind == "number":
            self.advance()
            return Literal(token.value)
        if token.kind == "-":
            self.advance()
            number = self.tok
            if number.kind != "number" or number.column != token.column + 1:
                raise self.fail("a number right after '-' (there is no arithmetic)", number)
            self.advance()
            return Literal(-number.value)
        if token.kind == "string":
            self.advance()
            return Literal(token.value)
        if token.kind == "(":
            self.advance()
            self.check_depth(depth + 1, token)
            inner = self.or_(depth + 1)
            if self.tok.kind != ")":
                raise self.fail(f"')' to close the '(' at column {token.column}")
            self.advance()
            return inner
        if token.kind == "word":
            if token.text in ("true", "false", "null"):
                self.advance()
                return Literal({"true": True, "false": False, "null": None}[token.text])
            if token.text in KEYWORDS:
                raise self.fail(_VALUE_EXPECTED)
            if token.text in _PYTHONISMS:
                raise ExpressionError(
                    f"{token.text!r} is not a value here; write {_PYTHONISMS[token.text]}", token.column
                )
            return self.path()
        raise self.fail(_VALUE_EXPECTED)

    def path(self) -> Path:
        first = self.advance()
        segments: list[str | int] = [first.text]
        while True:
            token = self.tok
            if token.kind == ".":
                self.advance()
                name = self.tok
                if name.kind != "word":
                    raise self.fail("a name after '.'", name)
                self.advance()
                segments.append(name.text)
            elif token.kind == "[":
                self.advance()
                index = self.tok
                if index.kind != "number" or not isinstance(index.value, int):
                    raise self.fail("a non-negative whole number inside '[ ]'", index)
                self.advance()
                if self.tok.kind != "]":
                    raise self.fail(f"']' to close the '[' at column {token.column}")
                self.advance()
                segments.append(index.value)
            else:
                return Path(tuple(segments), first.column)


def parse_condition(text: str) -> Condition:
    """Parse `text`; raises `ExpressionError` (an `InvalidInput`) naming the column and what was expected."""
    if not isinstance(text, str):
        raise ExpressionError(f"a condition must be text, not {type(text).__name__}", 1)
    if len(text) > MAX_LENGTH:
        raise ExpressionError(
            f"a condition is at most {MAX_LENGTH} characters (this one has {len(text)})", MAX_LENGTH + 1
        )
    tokens = _tokenize(text)
    if tokens[0].kind == "end":
        raise ExpressionError(f"the condition is empty; expected {_VALUE_EXPECTED}", 1)
    return Condition(_Parser(tokens).parse(), text)


# ---------------------------------------------------------------------------------------- render

_PRECEDENCE = {Or: 1, And: 2, Not: 3, Compare: 4, Literal: 5, Path: 5}


def _render_string(value: str) -> str:
    body = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return '"' + body.replace("\r", "\\r") + '"'


def render(node: Node) -> str:
    """Canonical text of a tree; `parse_condition(render(n)).root == n` for every tree the parser can build."""
    if isinstance(node, Literal):
        value = node.value
        if value is None:
            return "null"
        if value is True:
            return "true"
        if value is False:
            return "false"
        if isinstance(value, str):
            return _render_string(value)
        return repr(value)
    if isinstance(node, Path):
        out = []
        for i, seg in enumerate(node.segments):
            out.append(f"[{seg}]" if isinstance(seg, int) else (seg if i == 0 else "." + seg))
        return "".join(out)
    if isinstance(node, Not):
        return "not " + _wrap(node.operand, 3)
    if isinstance(node, And):
        return " and ".join(_wrap(op, 3) for op in node.operands)
    if isinstance(node, Or):
        return " or ".join(_wrap(op, 2) for op in node.operands)
    if isinstance(node, Compare):
        return f"{_wrap(node.left, 5)} {node.op} {_wrap(node.right, 5)}"
    raise TypeError(f"not a condition node: {node!r}")


def _wrap(node: Node, min_precedence: int) -> str:
    text = render(node)
    return text if _PRECEDENCE[type(node)] >= min_precedence else f"({text})"


# -------------------------------------------------------------------------------------- evaluate

_MAX_COMPARE_DEPTH = 64


def _eval(node: Node, context: Any) -> Any:
    if isinstance(node, Literal):
        return node.value
    if isinstance(node, Path):
        return _resolve(node.segments, context)
    if isinstance(node, Not):
        return not _truthy(_eval(node.operand, context))
    if isinstance(node, And):
        return all(_truthy(_eval(op, context)) for op in node.operands)
    if isinstance(node, Or):
        return any(_truthy(_eval(op, context)) for op in node.operands)
    if isinstance(node, Compare):
        return _compare(node.op, _eval(node.left, context), _eval(node.right, context))
    return None


def _resolve(segments: tuple[str | int, ...], context: Any) -> Any:
    current = context
    for seg in segments:
        try:
            if isinstance(current, Mapping):
                if isinstance(seg, int):
                    current = current[seg] if seg in current else current.get(str(seg))
                else:
                    current = current.get(seg)
            elif isinstance(current, list | tuple) and isinstance(seg, int):
                current = current[seg] if 0 <= seg < len(current) else None
            else:
                return None
        except Exception:  # a hostile Mapping in the context: the path simply does not resolve
            return None
        if current is None:
            return None
    return current


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, Mapping):
        return "map"
    return "other"


def _truthy(value: Any) -> bool:
    kind = _kind(value)
    if kind in ("null", "bool", "number", "string"):
        return bool(value)
    if kind in ("list", "map"):
        try:
            return len(value) > 0
        except Exception:
            return True
    return True


def _equal(a: Any, b: Any, depth: int = 0) -> bool:
    if depth > _MAX_COMPARE_DEPTH:
        return False
    kind = _kind(a)
    if kind != _kind(b):
        return False
    try:
        if kind in ("null", "bool", "number", "string"):
            return bool(a == b)
        if kind == "list":
            return len(a) == len(b) and all(_equal(x, y, depth + 1) for x, y in zip(a, b, strict=True))
        if kind == "map":
            if len(a) != len(b):
                return False
            return all(k in b and _equal(a[k], b[k], depth + 1) for k in a)
    except Exception:
        return False
    return a is b


def _contains(container: Any, item: Any) -> bool:
    kind = _kind(container)
    try:
        if kind == "string":
            return isinstance(item, str) and item in container
        if kind == "list":
            return any(_equal(x, item) for x in container)
        if kind == "map":
            return any(_equal(k, item) for k in container)
    except Exception:
        return False
    return False


def _compare(op: str, left: Any, right: Any) -> bool:
    if op == "==":
        return _equal(left, right)
    if op == "!=":
        return not _equal(left, right)
    if op == "contains":
        return _contains(left, right)
    if op == "in":
        return _contains(right, left)
    kind = _kind(left)
    if kind not in ("number", "string") or kind != _kind(right):
        return False
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    if op == ">=":
        return bool(left >= right)
    return False
