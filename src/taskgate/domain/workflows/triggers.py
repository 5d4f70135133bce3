"""Workflow triggers and task labels: what may start a workflow by itself, and which workflow a ready task gets.

A workflow's `triggers` list (docs/workflows.md#triggers-and-dispatch) holds these forms only:

- `manual`: a person starts it (`session start --workflow`, `workflow run`). Every workflow can be started by hand;
  the word says that this is how it is meant to run.
- `task_ready`: with dispatch on (`[dispatch] auto_start`, application/trackers/dispatch.py), a task that is ready gets
  a session running this workflow.
- `label:<name>`: the same, for a ready task carrying label `<name>` (a task label, `LABEL`).

Which workflow a ready task gets (`TriggerRoutes.route`): the more specific match wins, so a `label:` trigger
naming one of the task's labels beats `task_ready`; of several labels, the task's first one that a trigger names
decides (the task's own order, as written by whoever labelled it). A trigger that several workflows of one layer
declare is a validation problem (`contested`), and a task it would decide is left alone rather than guessed at.
A project workflow's trigger replaces a built-in workflow's same trigger, as a project file replaces a built-in
file with the same id (`resolve_routes`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from taskgate.domain.errors import InvalidInput

MANUAL = "manual"
TASK_READY = "task_ready"
LABEL_PREFIX = "label:"
VALID_FORMS = f"{MANUAL}, {TASK_READY}, {LABEL_PREFIX}<name>"

# A task label: what `task add --label`, the Beads import and the Beads mirror keep, and what `label:<name>` names.
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,49}$")
LABEL_RULE = "1-50 letters, digits and . _ : / - starting with a letter or digit"
MAX_LABELS = 20


def label_problem(label: object) -> str | None:
    """Why `label` is no task label, or None when it is one."""
    if not isinstance(label, str) or not LABEL.match(label):
        return f"label {label!r} is invalid: {LABEL_RULE}"
    return None


def check_labels(labels: Iterable[str]) -> tuple[str, ...]:
    """The labels, each once, in the order given. Raises: InvalidInput for a bad label or more than MAX_LABELS."""
    found = tuple(dict.fromkeys(labels))
    for label in found:
        problem = label_problem(label)
        if problem is not None:
            raise InvalidInput(problem)
    if len(found) > MAX_LABELS:
        raise InvalidInput(f"a task has at most {MAX_LABELS} labels, got {len(found)}")
    return found


def usable_labels(labels: Iterable[object]) -> tuple[str, ...]:
    """What an external tracker's labels keep here: those that are task labels, each once, at most MAX_LABELS.
    A label that breaks the rule could never be named by a `label:` trigger, so dropping it loses nothing."""
    return tuple(dict.fromkeys(s for s in labels if isinstance(s, str) and LABEL.match(s)))[:MAX_LABELS]


def trigger_problem(trigger: object) -> tuple[str, str] | None:
    """(what is wrong, hint) when `trigger` is none of the valid forms (the message goes after "trigger N "); None
    when it is one."""
    hint = f"a trigger is one of: {VALID_FORMS} (e.g. '- task_ready' or '- \"label:bug\"')"
    if not isinstance(trigger, str) or not trigger.strip():
        return f"must be a non-empty text, not {trigger!r}", hint
    if trigger in (MANUAL, TASK_READY):
        return None
    if trigger.startswith(LABEL_PREFIX):
        problem = label_problem(trigger.removeprefix(LABEL_PREFIX))
        if problem is None:
            return None
        return f"{trigger!r}: {problem}", f"name a task label after '{LABEL_PREFIX}', e.g. '{LABEL_PREFIX}bug'"
    return f"{trigger!r} is not a trigger", hint


def starts_sessions(trigger: str) -> bool:
    """Whether the trigger makes the dispatcher start sessions (task_ready and label:…; not manual)."""
    return trigger == TASK_READY or trigger.startswith(LABEL_PREFIX)


@dataclass(frozen=True, slots=True)
class Route:
    """The workflow a ready task gets, and the trigger that chose it (`task_ready`, `label:bug`)."""

    workflow: str
    trigger: str


@dataclass(frozen=True, slots=True)
class Declared:
    """A valid workflow's triggers, and whether it is the project's own (it then replaces built-in ones)."""

    workflow: str
    triggers: Sequence[str]
    own: bool = True


@dataclass(frozen=True, slots=True)
class TriggerRoutes:
    """Starting trigger → the workflow it starts; `contested`: triggers several workflows of one layer declare
    (→ those workflows), which start nothing; `replaced`: built-in workflows whose trigger a project one took."""

    workflows: Mapping[str, str] = field(default_factory=dict)
    contested: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    replaced: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.workflows or self.contested)

    def route(self, labels: Sequence[str]) -> Route | str | None:
        """The workflow for a ready task with `labels`: a Route; a text saying why it is left alone (its trigger
        is contested); None when no trigger takes it."""
        for label in labels:  # the task's first label that a trigger names decides
            key = LABEL_PREFIX + label
            if key in self.contested:
                return _contested(key, self.contested[key])
            if key in self.workflows:
                return Route(self.workflows[key], key)
        if TASK_READY in self.contested:
            return _contested(TASK_READY, self.contested[TASK_READY])
        if TASK_READY in self.workflows:
            return Route(self.workflows[TASK_READY], TASK_READY)
        return None


def _contested(key: str, workflows: tuple[str, ...]) -> str:
    return f"trigger {key} is declared by several workflows ({', '.join(workflows)}); see `taskgate workflow validate`"


def resolve_routes(declared: Iterable[Declared]) -> TriggerRoutes:
    """Each starting trigger to its workflow: the project's own workflows declaring it, else the built-in ones;
    exactly one, or the trigger is contested. Triggers that start nothing (`manual`) are left out."""
    claims: dict[str, list[Declared]] = {}
    for entry in declared:
        for trigger in dict.fromkeys(entry.triggers):
            if starts_sessions(trigger):
                claims.setdefault(trigger, []).append(entry)
    workflows: dict[str, str] = {}
    contested: dict[str, tuple[str, ...]] = {}
    replaced: dict[str, tuple[str, ...]] = {}
    for trigger, entries in sorted(claims.items()):
        own = [e for e in entries if e.own]
        winners = sorted({e.workflow for e in (own or entries)})
        if own and len(own) < len(entries):
            replaced[trigger] = tuple(sorted({e.workflow for e in entries if not e.own}))
        if len(winners) == 1:
            workflows[trigger] = winners[0]
        else:
            contested[trigger] = tuple(winners)
    return TriggerRoutes(workflows, contested, replaced)
