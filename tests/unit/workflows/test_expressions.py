"""The condition language of workflows: parsing, refusals, evaluation, and that nothing is ever executed."""

from __future__ import annotations

import ast
import builtins
import math
import os
import time
from pathlib import Path as FsPath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskgate.domain.errors import InvalidInput
from taskgate.domain.workflows import expressions
from taskgate.domain.workflows.expressions import (
    KEYWORDS,
    MAX_DEPTH,
    MAX_LENGTH,
    MAX_TOKENS,
    And,
    Compare,
    Condition,
    ExpressionError,
    Literal,
    Not,
    Or,
    Path,
    parse_condition,
    render,
)

CONTEXT = {
    "steps": {
        "review": {"status": "approved", "score": 7, "notes": ["ok", "nit"]},
        "tests": {"status": "failed", "output": "3 passed, 1 FAILED", "exit_code": 1, "ratio": 0.75},
        "run-tests": {"status": "passed"},
        "empty": {"output": "", "items": [], "meta": {}},
    },
    "context": {"skip_tests": False, "flags": {"fast": True}, "labels": ["urgent", "ui"], "n": None},
    "task": {"title": "Fix login", "priority": 1, "labels": ["urgent"], "matrix": [[1, 2], [3, 4]]},
}

VALID = [
    ('steps.review.status == "approved"', True),
    ("steps.review.status == 'approved'", True),
    ('steps.review.status != "approved"', False),
    ('steps.review.status == "approved" and not context.skip_tests', True),
    ('steps.tests.output contains "FAILED"', True),
    ('steps.tests.output contains "ERROR"', False),
    ('"urgent" in context.labels', True),
    ('"docs" in context.labels', False),
    ('context.labels contains "ui"', True),
    ('context.flags contains "fast"', True),
    ('"fast" in context.flags', True),
    ("steps.review.score >= 7", True),
    ("steps.review.score > 7", False),
    ("steps.review.score < 7.5", True),
    ("steps.review.score <= -1", False),
    ("steps.tests.ratio == 0.75", True),
    ("steps.tests.ratio > 7.5e-1", False),
    ("steps.tests.exit_code == 1.0", True),
    ("steps.tests.exit_code == true", False),  # booleans are not numbers
    ('steps.tests.exit_code == "1"', False),  # strings are not numbers
    ('steps.review.status < "b"', True),  # strings order lexicographically
    ('steps.review.score < "8"', False),  # incompatible types never order
    ("steps.review.score < null", False),
    ("steps.missing.status == null", True),  # a missing path is null
    ("steps.missing.status", False),
    ("not steps.missing", True),
    ("steps.review.notes[1] == 'nit'", True),
    ("steps.review.notes[5] == null", True),
    ("task.matrix[1][0] == 3", True),
    ("steps.run-tests.status == 'passed'", True),
    ("steps.review.status.length == null", True),  # no attribute access on strings
    ("steps.review.notes contains 'ok'", True),
    ("steps.empty.output or steps.empty.items or steps.empty.meta", False),
    ("steps.tests.output and steps.review.notes", True),
    ("context.n == null and not context.n", True),
    ("not not context.flags.fast", True),
    ("true", True),
    ("false", False),
    ("null", False),
    ("0", False),
    ("-0.0", False),
    ('""', False),
    ('"x"', True),
    ("(true or false) and false", False),
    ("true or false and false", True),  # and binds tighter than or
    ("not true or true", True),  # not binds tighter than or
    ("not steps.review.status == 'approved'", False),  # not applies to the comparison
    ("(steps.review.score > 5) == true", True),
    ('"a\\"b" == \'a"b\'', True),
    ('"line\\nbreak" contains "\\n"', True),
    ('"back\\\\slash" contains "\\\\"', True),
    ("steps.in == null", True),  # keywords are fine as later path segments
    ("task.priority <= 1 and task.title contains 'login'", True),
    ("  task . title  ==  'Fix login'  ", True),  # whitespace is free between tokens
]


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_valid_conditions_evaluate_as_documented(text, expected):
    condition = parse_condition(text)
    assert condition.evaluate(CONTEXT) is expected
    assert parse_condition(str(condition)) == condition  # the canonical text parses back to the same tree


def test_the_tree_is_plain_frozen_data():
    condition = parse_condition('steps.review.status == "approved" and not context.skip_tests')
    assert condition.root == And(
        (
            Compare("==", Path(("steps", "review", "status")), Literal("approved")),
            Not(Path(("context", "skip_tests"))),
        )
    )
    assert parse_condition("a or b or c").root == Or((Path(("a",)), Path(("b",)), Path(("c",))))
    assert parse_condition("x[0][12].y").root == Path(("x", 0, 12, "y"))
    with pytest.raises(AttributeError):
        condition.root.operands = ()  # type: ignore[misc]


def test_paths_lists_every_path_read_in_source_order_with_its_column():
    condition = parse_condition("steps.a.status == 'ok' or (not steps.b.output contains x and steps.c)")
    assert [p.segments for p in condition.paths()] == [
        ("steps", "a", "status"),
        ("steps", "b", "output"),
        ("x",),
        ("steps", "c"),
    ]
    assert [p.column for p in condition.paths()] == [1, 32, 56, 62]
    assert condition.paths()[0].text == "steps.a.status"
    assert parse_condition("true == 1").paths() == ()


def test_and_or_short_circuit():
    class Exploding(dict):
        def get(self, key, default=None):
            raise AssertionError("evaluated the right-hand side")

    assert parse_condition("false and boom.x").evaluate({"boom": Exploding()}) is False
    assert parse_condition("true or boom.x").evaluate({"boom": Exploding()}) is True


def test_paths_walk_only_mappings_and_lists_never_attributes():
    class Secret:
        password = "hunter2"

        def __bool__(self):
            raise AssertionError("user code ran")

        def __eq__(self, other):
            raise AssertionError("user code ran")

        __hash__ = object.__hash__

    context = {"obj": Secret(), "t": ("a", "b"), "d": {0: "int-key", "1": "str-key"}}
    assert parse_condition("obj.password == null").evaluate(context)
    assert parse_condition("obj").evaluate(context) is True  # present objects are true, never asked
    assert parse_condition("obj == 1").evaluate(context) is False
    assert parse_condition("t[1] == 'b'").evaluate(context)
    assert parse_condition("d[0] == 'int-key' and d[1] == 'str-key'").evaluate(context)
    assert parse_condition("steps.x").evaluate({"steps": "a string"}) is False


def test_a_hostile_mapping_in_the_context_cannot_make_evaluation_raise():
    from collections.abc import Mapping

    class Hostile(Mapping):
        def __getitem__(self, key):
            raise RuntimeError("boom")

        def __iter__(self):
            raise RuntimeError("boom")

        def __len__(self):
            raise RuntimeError("boom")

    context = {"h": Hostile()}
    for text in ("h.x == 1", "h == h", "h contains 'a'", "'a' in h", "h", "not h", "h[0]"):
        assert isinstance(parse_condition(text).evaluate(context), bool)


def test_equality_is_strict_and_structural():
    ctx = {"l": [1, "a", [True]], "m": {"k": [1.0]}, "f": float("nan")}
    assert parse_condition("l == l and m == m").evaluate(ctx)
    assert not parse_condition("f == f").evaluate(ctx)  # NaN equals nothing, as in JSON tools
    assert parse_condition("true != 1 and false != 0 and null != false and '' != null").evaluate(ctx)
    assert parse_condition("l contains 'a' and not (l contains true) and l contains 1.0").evaluate(ctx)
    assert not parse_condition("m contains 1").evaluate(ctx)  # keys only
    assert not parse_condition("l.x contains 'a'").evaluate(ctx)
    assert not parse_condition("5 contains 5 or 'abc' contains 1").evaluate(ctx)


# ------------------------------------------------------------------------------------ refusals

HOSTILE = [
    ("__import__('os')", 1, "may not start with '_'"),
    ("__import__('os').system('rm -rf /')", 1, "may not start with '_'"),
    ("().__class__", 4, "may not start with '_'"),
    ("()", 2, "expected a value"),
    ("a.__dict__", 3, "may not start with '_'"),
    ("a._private", 3, "may not start with '_'"),
    ("_", 1, "may not start with '_'"),
    ('eval("1")', 5, "function calls are not supported"),
    ('exec("import os")', 5, "function calls are not supported"),
    ("open('x')", 5, "function calls are not supported"),
    ("steps.x.read()", 13, "function calls are not supported"),
    ("1 +", 3, "no arithmetic"),
    ("1 + 1 == 2", 3, "no arithmetic"),
    ("a - b", 3, "no arithmetic"),
    ("a * 2", 3, "no arithmetic"),
    ("(a == 1", 8, "')' to close the '(' at column 1"),
    ("a == 1)", 7, "expected 'and', 'or'"),
    ("((a)", 5, "')' to close"),
    ("'unterminated", 1, "unterminated string"),
    ('"unterminated \\"', 1, "unterminated string"),
    ("'\\x41'", 2, "unknown escape"),
    ("lambda: 1", 7, "no lambdas"),
    ("a == 1; b", 7, "single expression"),
    ("`id`", 1, "backticks"),
    ('f"{x}"', 2, "expected 'and', 'or'"),
    ("{}", 1, "braces"),
    ("{'a': 1}", 1, "braces"),
    ("[1, 2]", 3, "no lists"),
    ("a = 1", 3, "use '=='"),
    ("!a", 1, "use 'not'"),
    ("a && b", 3, "use 'and'"),
    ("a || b", 3, "use 'or'"),
    ("a == 1 == 1", 8, "do not chain"),
    ("a < b < c", 7, "do not chain"),
    ("", 1, "empty"),
    ("   ", 1, "empty"),
    ("a and", 6, "expected a value"),
    ("or a", 1, "expected a value"),
    ("not", 4, "expected a value"),
    ("a.", 3, "a name after '.'"),
    ("a.1", 3, "a name after '.'"),
    ("a.[0]", 3, "a name after '.'"),
    ("a[", 3, "whole number"),
    ("a[x]", 3, "whole number"),
    ("a[1.5]", 3, "whole number"),
    ("a[-1]", 3, "whole number"),
    ("a[0", 4, "']' to close"),
    ("1.2.3", 1, "malformed number"),
    ("12abc", 1, "malformed number"),
    ("1e999", 1, "out of range"),
    ("- 1", 3, "a number right after '-'"),
    ("a-", 2, "may not end with '-'"),
    ("True", 1, "write true"),
    ("x == None", 6, "write null"),
    ("a if b else c", 3, "expected 'and', 'or'"),
    ("[x for x in y]", 1, "expected a value"),
    ("a\x00", 2, "unexpected character '\\x00'"),
    ("é == 1", 1, "unexpected character"),
    ("a == ١", 6, "unexpected character"),  # non-ASCII digits are not numbers
    ("x @ y", 3, "unexpected character '@'"),
    ("a\\b", 2, "unexpected character"),
    ("'a' 'b'", 5, "expected 'and', 'or'"),
    ("import os", 8, "expected 'and', 'or'"),
    ("steps.x.status == 'ok' #comment", 24, "unexpected character '#'"),
    ("(" * 10_000, MAX_LENGTH + 1, "at most 2000 characters"),
    ("(" * 500 + "a" + ")" * 500, MAX_TOKENS + 1, "too many tokens"),
    ("(" * 40 + "a" + ")" * 40, MAX_DEPTH + 1, "nesting deeper than 32"),
    ("not " * 40 + "a", 4 * MAX_DEPTH + 1, "nesting deeper than 32"),
]


@pytest.mark.parametrize(("text", "column", "fragment"), HOSTILE, ids=[repr(h[0][:30]) for h in HOSTILE])
def test_hostile_and_invalid_conditions_are_refused_at_the_offending_column(text, column, fragment, monkeypatch):
    ran: list[str] = []

    def tripwire(name):
        def call(*args, **kwargs):
            ran.append(name)
            raise AssertionError(f"{name} was called")

        return call

    for name in ("eval", "exec", "compile", "open"):
        monkeypatch.setattr(builtins, name, tripwire(name))
    monkeypatch.setattr(os, "system", tripwire("os.system"))
    started = time.perf_counter()
    try:
        parse_condition(text)
    except ExpressionError as refused:
        error = refused
    else:
        error = None
    finally:
        monkeypatch.undo()  # before any assertion: pytest itself needs compile() to report failures
    assert time.perf_counter() - started < 0.5
    assert ran == []
    assert error is not None, f"{text!r} was accepted"
    assert isinstance(error, InvalidInput)
    assert (error.column, fragment in error.message) == (column, True), str(error)
    assert str(error).startswith(f"invalid condition at column {column}: ")


def test_the_hostile_corpus_is_large_enough():
    assert len(HOSTILE) >= 30


def test_limits_are_inclusive():
    assert parse_condition("a" * MAX_LENGTH).evaluate({"a" * MAX_LENGTH: 1})
    assert parse_condition("(" * MAX_DEPTH + "a" + ")" * MAX_DEPTH).root == Path(("a",))
    assert parse_condition("not " * MAX_DEPTH + "a").evaluate({}) is False  # an even number of nots
    tokens = " or ".join(["a"] * ((MAX_TOKENS + 1) // 2))  # 100 names + 99 'or' = 199 tokens
    parse_condition(tokens)
    with pytest.raises(ExpressionError, match="too many tokens"):
        parse_condition(tokens + " or b")
    with pytest.raises(ExpressionError, match="must be text"):
        parse_condition(None)  # type: ignore[arg-type]


def test_the_module_never_calls_eval_exec_compile_or_imports_dynamically():
    source = FsPath(expressions.__file__).read_text(encoding="utf-8")
    tree = ast.parse(source)
    forbidden = {"eval", "exec", "compile", "__import__", "getattr", "setattr", "open", "globals", "locals", "vars"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in forbidden, f"line {node.lineno} calls {node.func.id}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            assert set(modules) <= {"__future__", "math", "re", "collections.abc", "dataclasses", "typing"} | {
                "taskgate.domain.errors"
            }
        if isinstance(node, ast.Attribute):
            assert not node.attr.startswith("__") or node.attr in ("__name__", "__init__"), (
                f"line {node.lineno}: {node.attr}"
            )


# ---------------------------------------------------------------------------------- properties

_NAMES = ["steps", "a", "b", "status", "output", "x-y", "in", "z9"]
first_names = st.one_of(
    st.sampled_from([n for n in _NAMES if n not in KEYWORDS]),
    st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,5}(-[A-Za-z0-9_]{1,3})?", fullmatch=True).filter(
        lambda s: s not in KEYWORDS and s not in ("True", "False", "None")
    ),
)
later_segments = st.one_of(
    st.sampled_from(_NAMES),
    st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,5}", fullmatch=True),
    st.integers(0, 12),
)
paths = st.builds(lambda head, rest: Path((head, *rest)), first_names, st.lists(later_segments, max_size=3))
literals = st.builds(
    Literal,
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**20), 10**20),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=12),
    ),
)


def _extend(children):
    pairs = st.lists(children, min_size=2, max_size=3).map(tuple)
    return st.one_of(
        st.builds(Not, children),
        st.builds(And, pairs),
        st.builds(Or, pairs),
        st.builds(Compare, st.sampled_from(expressions.COMPARISONS), children, children),
    )


trees = st.recursive(st.one_of(literals, paths), _extend, max_leaves=8)

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=5),
        st.sampled_from(["status", "ok", "", "a"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from(_NAMES), inner, max_size=4),
        st.dictionaries(st.integers(0, 3), inner, max_size=2),
    ),
    max_leaves=15,
)
contexts = st.dictionaries(st.sampled_from(_NAMES), json_values, max_size=6)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees)
def test_rendered_trees_parse_back_to_the_same_tree(tree):
    text = render(tree)
    parsed = parse_condition(text)
    assert parsed.root == tree
    assert render(parsed.root) == text  # also tells 1 from true and 1 from 1.0, which == does not


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees, contexts)
def test_evaluation_never_raises_and_always_yields_a_bool(tree, context):
    result = Condition(tree).evaluate(context)
    assert isinstance(result, bool)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_text_either_parses_or_is_refused_with_a_column_inside_it(text):
    try:
        condition = parse_condition(text)
    except ExpressionError as error:
        assert 1 <= error.column <= len(text) + 1
    else:
        assert parse_condition(str(condition)) == condition
        assert isinstance(condition.evaluate({}), bool)


@given(st.floats(allow_nan=False, allow_infinity=False), st.floats(allow_nan=False, allow_infinity=False))
def test_number_ordering_matches_python(x, y):
    condition = Condition(Compare("<", Literal(x), Literal(y)))
    assert condition.evaluate({}) is (x < y)
    assert math.isfinite(x)
