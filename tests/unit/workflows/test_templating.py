"""Variables in workflow text: built-ins, nested variables, cycles, unknown names and expansion bombs."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskgate.domain.errors import InvalidInput
from taskgate.domain.workflows.templating import VariableError, references, resolve, resolve_all

BUILTINS = {"project-root": "/repo", "session_id": "s-1", "session-folder": "/repo/.taskgate/s-1"}


def test_builtins_use_single_braces_and_variables_double_braces():
    variables = {"task.title": "Fix login", "out": "{session-folder}/out.md"}
    assert resolve("{project-root}/docs/{{task.title}}.md", BUILTINS, variables) == "/repo/docs/Fix login.md"
    assert resolve("write to {{out}} for {session_id}", BUILTINS, variables) == (
        "write to /repo/.taskgate/s-1/out.md for s-1"
    )
    assert resolve("{{ task.title }} / {{\ttask.title}}", BUILTINS, variables) == "Fix login / Fix login"


def test_double_braces_fall_back_to_builtins_and_variables_shadow_them():
    assert resolve("{{session_id}}", BUILTINS, {}) == "s-1"
    assert resolve("{{session_id}} {session_id}", BUILTINS, {"session_id": "mine"}) == "mine s-1"


def test_unknown_single_braces_and_json_survive_untouched():
    template = '{"a": 1, "b": {"c": [1, 2]}} {x} {x-y} { project-root } {{ not a name }} {} {{}}'
    assert resolve(template, BUILTINS, {}) == template


def test_builtin_values_and_substituted_text_are_never_expanded_again():
    builtins = {"project-root": "/repo/{{a}}/{session_id}", "session_id": "s"}
    assert resolve("{project-root}", builtins, {"a": "A"}) == "/repo/{{a}}/{session_id}"
    assert resolve("{{a}}", {}, {"a": "{{"}) == "{{"
    assert resolve("{{a}}b}}", {}, {"a": "{{"}) == "{{b}}"  # built from pieces, not rescanned


def test_nested_variables_resolve_through_every_level():
    variables = {"a": "[{{b}}]", "b": "<{{c}} {project-root}>", "c": "{{d}}{{d}}", "d": "d"}
    assert resolve("{{a}}", BUILTINS, variables) == "[<dd /repo>]"
    assert resolve_all(variables, BUILTINS) == {"a": "[<dd /repo>]", "b": "<dd /repo>", "c": "dd", "d": "d"}


def test_numbers_and_booleans_are_written_as_text_and_other_values_refused():
    assert resolve("{{n}} {{f}} {{t}}", {}, {"n": 3, "f": 1.5, "t": True}) == "3 1.5 true"  # type: ignore[dict-item]
    with pytest.raises(VariableError, match="variable 'x' must be text"):
        resolve("", {}, {"x": ["a"]})  # type: ignore[dict-item]


def test_invalid_variable_names_are_refused():
    with pytest.raises(VariableError, match="variable name 'a b' is invalid"):
        resolve_all({"a b": "x"})


@pytest.mark.parametrize(
    ("variables", "cycle"),
    [
        ({"a": "x{{a}}"}, "a › a"),
        ({"a": "{{b}}", "b": "{{a}}"}, "a › b › a"),
        ({"a": "{{b}}", "b": "{{c}}", "c": "{{a}}"}, "a › b › c › a"),
        ({"start": "{{a}}", "a": "{{b}}", "b": "{{a}}"}, "a › b › a"),  # the cycle, not the path into it
    ],
)
def test_cycles_are_errors_naming_the_cycle(variables, cycle):
    with pytest.raises(VariableError) as caught:
        resolve_all(variables)
    assert str(caught.value) == f"variables refer to each other in a cycle: {cycle}"
    assert isinstance(caught.value, InvalidInput)
    with pytest.raises(VariableError, match=cycle):
        resolve("{{" + next(iter(variables)) + "}}", {}, variables)


def test_a_cycle_not_reached_by_the_template_does_not_matter_to_resolve():
    assert resolve("{{ok}}", {}, {"ok": "fine", "a": "{{a}}"}) == "fine"


def test_unknown_variables_are_errors_naming_them_and_the_known_ones():
    with pytest.raises(VariableError) as caught:
        resolve("{{nope}}", BUILTINS, {"b": "1", "a": "2"})
    assert str(caught.value) == (
        "unknown variable '{{nope}}'; known: a, b, {project-root}, {session-folder}, {session_id}"
    )
    with pytest.raises(VariableError, match=r"unknown variable '\{\{x\}\}' \(in the value of 'a'\); known: a$"):
        resolve_all({"a": "{{x}}"})


def test_unknown_variables_are_left_as_written_when_not_strict():
    variables = {"a": "<{{ x }}>"}
    assert resolve("{{a}} {{y}}", {}, variables, strict=False) == "<{{ x }}> {{y}}"
    assert resolve_all(variables, strict=False) == {"a": "<{{ x }}>"}


def test_nesting_deeper_than_max_passes_is_refused():
    chain = {f"v{i}": f"{{{{v{i + 1}}}}}" for i in range(12)} | {"v12": "end"}
    with pytest.raises(VariableError, match=r"nest deeper than 10 levels: v0 › v1 › .* › v10$"):
        resolve("{{v0}}", {}, chain)
    assert resolve("{{v0}}", {}, chain, max_passes=13) == "end"
    assert resolve("{{v3}}", {}, chain) == "end"  # v3 … v12 is ten levels
    with pytest.raises(VariableError, match="max_passes must be at least 1"):
        resolve("", {}, {}, max_passes=0)


def test_expansion_bombs_are_refused_quickly():
    levels = 60
    bomb = {f"v{i}": f"{{{{v{i + 1}}}}}{{{{v{i + 1}}}}}" for i in range(levels)} | {f"v{levels}": "boom"}
    started = time.perf_counter()
    with pytest.raises(VariableError, match=r"expands to more than 100000 characters"):
        resolve("{{v0}}", {}, bomb, max_passes=levels + 1)
    with pytest.raises(VariableError, match=r"expands to more than 100000 characters"):
        resolve_all(bomb, max_passes=levels + 1)
    assert time.perf_counter() - started < 1.0
    wide = {"a": "{{b}}" * 1000, "b": "x" * 1000}  # 1000 × 1000 characters
    with pytest.raises(VariableError, match="variable 'a' expands to more than 100000"):
        resolve("{{a}}", {}, wide)
    with pytest.raises(VariableError, match="the template expands to more than"):
        resolve("{{b}}" * 200, {}, {"b": "x" * 1000})


def test_a_long_template_without_growth_is_fine():
    template = "x" * 500_000 + "{{a}}"
    assert resolve(template, {}, {"a": "y"}) == "x" * 500_000 + "y"


def test_references_lists_double_brace_names_in_order():
    assert references("{{b}} {a} {{ a }} {{b}} {{task.title}}") == ("b", "a", "task.title")


# ---------------------------------------------------------------------------------- properties

_TEXT = st.text(alphabet="ab {}}x-", max_size=5).filter(lambda t: "{{" not in t and not t.endswith("{"))


@st.composite
def acyclic_variables(draw):
    """v0 … vn where each vi refers only to variables with a higher index: a DAG, so no cycles."""
    count = draw(st.integers(1, 7))
    variables, parts_of = {}, {}
    for i in reversed(range(count)):
        parts = [draw(_TEXT)]
        for target in draw(st.lists(st.integers(i + 1, count - 1), max_size=3)) if i + 1 < count else []:
            spaces = draw(st.sampled_from(["", " "]))
            parts += [("ref", f"v{target}", spaces), draw(_TEXT)]
        parts_of[f"v{i}"] = parts
        variables[f"v{i}"] = "".join(p if isinstance(p, str) else "{{" + p[2] + p[1] + p[2] + "}}" for p in parts)
    return variables, parts_of


def _expected(name, parts_of, memo):
    if name not in memo:
        memo[name] = "".join(p if isinstance(p, str) else _expected(p[1], parts_of, memo) for p in parts_of[name])
    return memo[name]


@settings(max_examples=300, deadline=None)
@given(acyclic_variables())
def test_acyclic_variables_always_resolve_completely(case):
    variables, parts_of = case
    resolved = resolve_all(variables, max_passes=len(variables))
    memo: dict[str, str] = {}
    for name, value in resolved.items():
        assert "{{" not in value
        assert value == _expected(name, parts_of, memo)
    assert resolve("{{v0}}", {}, variables, max_passes=len(variables)) == resolved["v0"]


def test_single_braces_name_variables_too_and_builtins_win_there():
    variables = {"installed_path": "{project-root}/flows", "file": "{installed_path}/a.md", "session_id": "mine"}
    assert resolve("{file}", BUILTINS, variables) == "/repo/flows/a.md"
    assert resolve("{session_id} {{session_id}}", BUILTINS, variables) == "s-1 mine"
    assert resolve("{unknown} {x-y}", BUILTINS, variables) == "{unknown} {x-y}"


def test_config_references_read_the_key_through_the_lookup_and_nothing_else():
    asked = []

    def lookup(path: str, key: str) -> str:
        asked.append((path, key))
        return {"out": "docs/out", "team.lead": "Ada"}[key]

    variables = {"config_source": "{project-root}/cfg.yaml", "out": "{config_source}:out"}
    assert resolve("{out} by {config_source}:team.lead", BUILTINS, variables, config=lookup) == "docs/out by Ada"
    assert asked == [("/repo/cfg.yaml", "out"), ("/repo/cfg.yaml", "team.lead")]
    # not a config file, or no lookup: the colon is plain text
    assert resolve("{project-root}:8080", BUILTINS, {}, config=lookup) == "/repo:8080"
    assert resolve("{config_source}:out", BUILTINS, variables) == "/repo/cfg.yaml:out"


def test_single_brace_cycles_are_named_like_double_brace_ones():
    with pytest.raises(VariableError, match="cycle: a › b › a"):
        resolve("{a}", {}, {"a": "{b}", "b": "{{a}}"})
