"""The checker every parser of a catalogue document reports to: each problem with its file, path in the document and a
fix, and typed reads of a mapping's keys that report what is wrong instead of raising."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from taskgate.domain.workflows.definitions import (
    ID_PATTERN,
    ITEM_KEYS,
    WHERE_KEY,
    ChecklistItem,
    Document,
    Path,
    WorkflowProblem,
)
from taskgate.domain.workflows.expressions import ExpressionError, parse_condition
from taskgate.domain.workflows.variables import (
    suggest,
)


def check_condition(text: str) -> tuple[str, int | None] | None:
    """The condition language's parser on `when` (domain/workflows/expressions.py): (message, column) if it does not
    parse."""
    try:
        parse_condition(text)
    except ExpressionError as exc:
        return exc.message, exc.column
    return None


class Checker:
    """Collects the problems of one document while building its model."""

    def __init__(self, doc: Document, agent_types: frozenset[str] | None, deaf: frozenset[str] = frozenset()) -> None:
        self.doc = doc
        self.agent_types = agent_types
        self.deaf = deaf  # agent types whose command has no {prompt}: a step's prompt would never reach them
        self.problems: list[WorkflowProblem] = []
        self.scope_of: dict[str, int] = {}  # step id -> its list (raw, so steps dropped while parsing count)
        self.incomplete_scopes: set[int] = set()
        self.scopes = 0
        self.owner = ""  # what a missing key belongs to ("agent step 'plan'"); the file when empty

    def problem(self, path: Path, message: str, hint: str = "") -> None:
        self.problems.append(WorkflowProblem(self.doc.file, self.doc.line(path), message, hint))

    def at(self, line: int, message: str, hint: str = "") -> None:
        self.problems.append(WorkflowProblem(self.doc.file, line, message, hint))

    def where(self, path: Path) -> str:
        return ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in path).replace(".[", "[")

    # -- scalars

    def keys(self, data: dict[str, Any], path: Path, allowed: Sequence[str], what: str, every: Sequence[str] = ()):
        for key in data:
            if not isinstance(key, str):
                self.problem(path, f"{what}: key {key!r} is not a text", "write keys as plain words")
            elif key not in allowed:
                if key in every and key in WHERE_KEY:
                    self.problem(
                        (*path, key),
                        f"{what}: '{key}' does not apply here",
                        f"'{key}' belongs to {WHERE_KEY[key]} steps; remove it or change the type",
                    )
                else:
                    self.problem(
                        (*path, key),
                        f"{what}: unknown key '{key}'",
                        suggest(key, allowed) or f"known keys: {', '.join(allowed)}",
                    )

    def text(self, data: dict[str, Any], key: str, path: Path, *, required: bool = False) -> str | None:
        value = data.get(key)
        if value is None:
            if required:
                self.problem(
                    path, f"{self.owner or self.where(path) or 'the file'}: '{key}' is missing", f"add '{key}: …'"
                )
            elif key in data:
                self.problem((*path, key), f"'{key}' is empty", f"give '{key}' a value or remove it")
            return None
        if not isinstance(value, str) or not value.strip():
            self.problem((*path, key), f"'{key}' must be a non-empty text, not {value!r}", f"write {key}: some text")
            return None
        return value

    def ident(self, data: dict[str, Any], key: str, path: Path, *, required: bool = False) -> str | None:
        value = self.text(data, key, path, required=required)
        if value is not None and not ID_PATTERN.match(value):
            self.problem(
                (*path, key),
                f"'{key}' {value!r} is not a valid id",
                "use letters, digits, '-' and '_' (at most 100), starting with a letter or digit",
            )
            return None
        return value

    def integer(self, data: dict[str, Any], key: str, path: Path, *, minimum: int, maximum: int | None = None):
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum else f"at least {minimum}"
            self.problem(
                (*path, key),
                f"'{key}' must be a whole number {bound}, not {value!r}",
                f"write {key}: {max(minimum, 1)}",
            )
            return None
        return value

    def listing(self, data: dict[str, Any], key: str, path: Path, *, required: bool = False) -> list[Any] | None:
        value = data.get(key)
        if value is None:
            if required:
                self.problem(
                    (*path, key) if key in data else path,
                    f"{self.owner or self.where(path) or 'the file'}: '{key}' is missing or empty",
                    f"add '{key}:' with at least one entry",
                )
            return None
        if not isinstance(value, list):
            self.problem(
                (*path, key),
                f"'{key}' must be a list, not {type(value).__name__}",
                f"write each entry of '{key}' on its own '- ' line",
            )
            return None
        if required and not value:
            self.problem((*path, key), f"'{key}' is empty", f"add at least one entry to '{key}'")
            return None
        return value

    def items(self, raw: list[Any], path: Path) -> tuple[ChecklistItem, ...]:
        out: list[ChecklistItem] = []
        seen: dict[str, int] = {}
        for n, item in enumerate(raw):
            at = (*path, n)
            if isinstance(item, str) and item.strip():
                out.append(ChecklistItem(f"item-{n + 1}", item))
                continue
            if not isinstance(item, dict):
                self.problem(
                    at,
                    f"checklist item {n + 1} must be a text or a mapping with id and text",
                    "write '- id: tests-pass' and 'text: …' under it",
                )
                continue
            outer, self.owner = self.owner, f"checklist item {n + 1}"
            self.keys(item, at, ITEM_KEYS, self.owner)
            ident, text = self.ident(item, "id", at, required=True), self.text(item, "text", at, required=True)
            self.owner = outer
            required = item.get("required", True)
            if not isinstance(required, bool):
                self.problem(
                    (*at, "required"),
                    f"'required' must be true or false, not {required!r}",
                    "write required: false for an optional item",
                )
                required = True
            if ident is not None and ident in seen:
                self.problem(
                    (*at, "id"),
                    f"duplicate checklist item id '{ident}' (also line {seen[ident]})",
                    "give every item its own id",
                )
            elif ident is not None and text is not None:
                seen[ident] = self.doc.line(at)
                out.append(ChecklistItem(ident, text, required))
        return tuple(out)
