"""Variables in workflow text: built-ins and variables in single braces, variables in double braces, and
references into a YAML config file.

    {project-root}/docs/{{task.title}}.md       →  /repo/docs/Fix login.md
    {installed_path}/instructions.md            →  /repo/.taskgate/flows/review/instructions.md
    {config_source}:output_folder               →  the `output_folder` key of the file {config_source} names

* **Built-ins** are exactly the keys passed in `builtins` (taskgate passes `{project-root}`, `{session_id}`,
  `{session-folder}`). Their values are used literally, never expanded again.
* **Variables** (a workflow's `variables:`, the task's fields as `task.title`, ..., a run's `--context`) have
  names matching `[A-Za-z_][A-Za-z0-9_.-]*`. `{{name}}` (or `{{ name }}`) looks a name up in `variables` first,
  then in `builtins` (so `{{session_id}}` works too). `{name}` looks it up in `builtins` first, then in
  `variables` (the source design's single-brace form, `{installed_path}`). A variable's value may itself contain
  references; they are expanded recursively.
* **Single braces around anything that is neither** are left untouched, so JSON snippets and code in prompts
  (`{"a": 1}`, `{x}`) survive as written. An unknown `{{name}}` is an error (below).
* **Config references.** `{name}:key` where `name`'s value is the path of a `.yaml`, `.yml` or `.json` file is the
  value of `key` (dotted for nested mappings) in that file, read through the `config` lookup the caller passes
  (taskgate's reads only files inside the project). Without a lookup, or when the value is not such a path,
  `:key` stays as written after the value.
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
from collections.abc import Callable, Mapping

from taskgate.domain.errors import InvalidInput

BUILTINS = ("project-root", "session_id", "session-folder")
MAX_PASSES = 10
MAX_LENGTH = 100_000

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_REFERENCE = re.compile(
    r"\{\{[ \t]*(?P<var>[A-Za-z_][A-Za-z0-9_.-]*)[ \t]*\}\}"  # {{name}}
    r"|\{(?P<single>[A-Za-z_][A-Za-z0-9_.-]*)\}"  # {name}: replaced only when it is a known name
    r"(?::(?P<key>[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*))?"  # {name}:key, a config reference
)
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
ConfigLookup = Callable[[str, str], str]  # (file path, dotted key) → the value as text; raises VariableError


class VariableError(InvalidInput):
    """A template that cannot be resolved: unknown name, cycle, too deep or too long."""


def references(template: str) -> tuple[str, ...]:
    """The `{{name}}` names a template uses, in order of first use (for validating workflows: an unknown one is an
    error, where an unknown `{name}` is just text)."""
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
        config: ConfigLookup | None = None,
    ) -> None:
        if max_passes < 1:
            raise VariableError(f"max_passes must be at least 1, not {max_passes}")
        for name in variables:
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise VariableError(f"variable name {name!r} is invalid; names match {NAME.pattern}")
        self.builtins = {k: _as_text(k, v) for k, v in builtins.items()}
        self.raw = {k: _as_text(k, v) for k, v in variables.items()}
        self.max_passes, self.max_length, self.strict, self.config = max_passes, max_length, strict, config
        self.done: dict[str, str] = {}

    def known(self) -> str:
        names = sorted(self.raw) + [f"{{{b}}}" for b in sorted(self.builtins)]
        return ", ".join(names) if names else "none"

    def expand(self, text: str, stack: list[str], limit: int) -> str:
        """`text` with its references replaced; `stack` is the chain of variables being expanded."""
        pieces: list[str] = []
        size, last = 0, 0
        for m in _REFERENCE.finditer(text):
            value = self.reference(m, stack)
            if value is None:
                continue  # `{anything}` that is no known name stays as written (JSON, code)
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

    def reference(self, m: re.Match[str], stack: list[str]) -> str | None:
        """The text that replaces match `m`, or None to leave it as written."""
        var, single, key = m.group("var"), m.group("single"), m.group("key")
        if var is not None:
            if var in self.raw:
                return self.variable(var, stack)
            if var in self.builtins:
                return self.builtins[var]
            if self.strict:
                where = f" (in the value of '{stack[-1]}')" if stack else ""
                raise VariableError(f"unknown variable '{{{{{var}}}}}'{where}; known: {self.known()}")
            return m.group()
        if single in self.builtins:
            value = self.builtins[single]
        elif single in self.raw:
            value = self.variable(single, stack)
        else:
            return None
        if key is None:
            return value
        if self.config is None or not value.lower().endswith(CONFIG_SUFFIXES):
            return f"{value}:{key}"  # not a config file: the colon and what follows are plain text
        return self.config(value, key)

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
    config: ConfigLookup | None = None,
) -> str:
    """`template` with built-ins and variables substituted (rules in the module doc)."""
    resolver = _Resolver(builtins, variables, max_passes, max_length, strict, config)
    return resolver.expand(template, [], len(template) + max_length)


def resolve_all(
    variables: Mapping[str, str],
    builtins: Mapping[str, str] | None = None,
    max_passes: int = MAX_PASSES,
    *,
    strict: bool = True,
    max_length: int = MAX_LENGTH,
    config: ConfigLookup | None = None,
) -> dict[str, str]:
    """Every variable's fully resolved value, in the order given; raises on the first bad one."""
    resolver = _Resolver(builtins or {}, variables, max_passes, max_length, strict, config)
    return {name: resolver.variable(name, []) for name in variables}
