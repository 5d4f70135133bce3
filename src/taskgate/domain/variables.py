"""Variables in workflow text: built-ins in single braces, workflow/task variables in double braces.

    {project-root}/docs/{{task.title}}.md       →  /repo/docs/Fix login.md

* **Built-ins** use single braces and are exactly the keys passed in `builtins` (taskgate passes
  `{project-root}`, `{session_id}`, `{session-folder}`). Their values are used literally, never
  expanded again. Single braces around anything that is not a known built-in are left untouched, so
  JSON snippets and code in prompts (`{"a": 1}`, `{x}`) survive as written.
* **Variables** use double braces, `{{name}}` or `{{ name }}`, with names matching
  `[A-Za-z_][A-Za-z0-9_.-]*` (the task's fields arrive as `task.title`, `task.id`, ...). A name is
  looked up in `variables` first, then in `builtins` (so `{{session_id}}` works too). A variable's
  value may itself contain references; they are expanded recursively.
* **Bounds.** References may nest at most `max_passes` levels deep (the template referencing `a`
  whose value references `b` is two levels); each resolved variable and the growth of the template
  are capped at `max_length` characters, so an expansion bomb (`a: {{b}}{{b}}`, `b: {{c}}{{c}}`, ...)
  is refused quickly: every variable is expanded once and memoised, and sizes are checked before any
  text is built.
* **Cycles** (`a → b → a`) raise `VariableError` naming the cycle: `a › b › a`.
* **Unknown names** raise `VariableError` naming the variable and the known ones (`strict=True`, the
  default). With `strict=False` an unknown `{{name}}` is left in the text exactly as written.
* Substituted text is never scanned again, so a value containing `{{` after expansion (e.g. from a
  built-in) stays literal; no code of any kind runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from taskgate.domain.errors import InvalidInput

BUILTINS = ("project-root", "session_id", "session-folder")
MAX_PASSES = 10
MAX_LENGTH = 100_000

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_REFERENCE = re.compile(
    r"\{\{[ \t]*(?P<var>[A-Za-z_][A-Za-z0-9_.-]*)[ \t]*\}\}"  # {{name}}
    r"|\{(?P<builtin>[A-Za-z_][A-Za-z0-9_-]*)\}"  # {name}, replaced only when it is a known built-in
)


class VariableError(InvalidInput):
    """A template that cannot be resolved: unknown name, cycle, too deep or too long."""


def references(template: str) -> tuple[str, ...]:
    """The `{{name}}` names a template uses, in order of first use (for validating workflows)."""
    seen: dict[str, None] = {}
    for m in _REFERENCE.finditer(template):
        if m.group("var"):
            seen.setdefault(m.group("var"), None)
    return tuple(seen)


def _as_text(name: str, value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise VariableError(f"variable '{name}' must be text (or a number/boolean), not {type(value).__name__}")


class _Resolver:
    def __init__(
        self,
        builtins: Mapping[str, str],
        variables: Mapping[str, object],
        max_passes: int,
        max_length: int,
        strict: bool,
    ) -> None:
        if max_passes < 1:
            raise VariableError(f"max_passes must be at least 1, not {max_passes}")
        for name in variables:
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise VariableError(f"variable name {name!r} is invalid; names match {NAME.pattern}")
        self.builtins = {k: _as_text(k, v) for k, v in builtins.items()}
        self.raw = {k: _as_text(k, v) for k, v in variables.items()}
        self.max_passes, self.max_length, self.strict = max_passes, max_length, strict
        self.done: dict[str, str] = {}

    def known(self) -> str:
        names = sorted(self.raw) + [f"{{{b}}}" for b in sorted(self.builtins)]
        return ", ".join(names) if names else "none"

    def expand(self, text: str, stack: list[str], limit: int) -> str:
        """`text` with its references replaced; `stack` is the chain of variables being expanded."""
        pieces: list[str] = []
        size, last = 0, 0
        for m in _REFERENCE.finditer(text):
            var, builtin = m.group("var"), m.group("builtin")
            if var is not None:
                if var in self.raw:
                    value = self.variable(var, stack)
                elif var in self.builtins:
                    value = self.builtins[var]
                elif self.strict:
                    where = f" (in the value of '{stack[-1]}')" if stack else ""
                    raise VariableError(f"unknown variable '{{{{{var}}}}}'{where}; known: {self.known()}")
                else:
                    value = m.group()
            elif builtin in self.builtins:
                value = self.builtins[builtin]
            else:
                continue  # `{anything}` that is not a built-in stays as written (JSON, code)
            literal = text[last : m.start()]
            size += len(literal) + len(value)
            if size > limit:
                self.too_long(stack, limit)
            pieces += (literal, value)
            last = m.end()
        size += len(text) - last
        if size > limit:
            self.too_long(stack, limit)
        pieces.append(text[last:])
        return "".join(pieces)

    def variable(self, name: str, stack: list[str]) -> str:
        if name in self.done:
            return self.done[name]
        if name in stack:
            cycle = [*stack[stack.index(name) :], name]
            raise VariableError(f"variables refer to each other in a cycle: {' › '.join(cycle)}")
        if len(stack) >= self.max_passes:
            chain = " › ".join([*stack, name])
            raise VariableError(f"variables nest deeper than {self.max_passes} levels: {chain}")
        stack.append(name)
        try:
            value = self.expand(self.raw[name], stack, self.max_length)
        finally:
            stack.pop()
        self.done[name] = value
        return value

    def too_long(self, stack: list[str], limit: int) -> None:
        where = f"variable '{stack[-1]}'" if stack else "the template"
        chain = f" (via {' › '.join(stack)})" if len(stack) > 1 else ""
        raise VariableError(
            f"{where} expands to more than {limit} characters{chain}; "
            "a variable is probably repeated inside another one too often"
        )


def resolve(
    template: str,
    builtins: Mapping[str, str],
    variables: Mapping[str, str],
    max_passes: int = MAX_PASSES,
    *,
    strict: bool = True,
    max_length: int = MAX_LENGTH,
) -> str:
    """`template` with built-ins and variables substituted (rules in the module doc)."""
    resolver = _Resolver(builtins, variables, max_passes, max_length, strict)
    return resolver.expand(template, [], len(template) + max_length)


def resolve_all(
    variables: Mapping[str, str],
    builtins: Mapping[str, str] | None = None,
    max_passes: int = MAX_PASSES,
    *,
    strict: bool = True,
    max_length: int = MAX_LENGTH,
) -> dict[str, str]:
    """Every variable's fully resolved value, in the order given; raises on the first bad one."""
    resolver = _Resolver(builtins or {}, variables, max_passes, max_length, strict)
    return {name: resolver.variable(name, []) for name in variables}
