"""The built-in policies by name, and building one from its configuration table (enabled, severity, priority, triggers
and its own settings), with errors that name the key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskgate.domain.errors import InvalidInput
from taskgate.domain.policies.facts import (
    Policy,
)
from taskgate.domain.policies.rules import (
    BranchNaming,
    CleanWorktree,
    CommitMessageFormat,
    OneActiveSessionPerTask,
    OperatorCapacity,
    PlanOpen,
    RequireTests,
    ReviewApproval,
    Rule,
    TaskUnblocked,
    TrackerInSync,
    WipLimit,
    _default,
)
from taskgate.domain.policies.violations import Severity
from taskgate.domain.states import Trigger

BUILTIN: dict[str, type[Rule]] = {
    _default(cls, "name"): cls
    for cls in (
        WipLimit,
        PlanOpen,
        TaskUnblocked,
        OperatorCapacity,
        RequireTests,
        ReviewApproval,
        CleanWorktree,
        BranchNaming,
        CommitMessageFormat,
        TrackerInSync,
    )
}


ENABLED_BY_DEFAULT = frozenset(BUILTIN) - {"commit_message_format", "tracker_in_sync"}


COMMON_KEYS = ("enabled", "severity", "priority", "triggers")


def build_policy(name: str, options: Mapping[str, Any], *, where: str = "policies") -> Rule:
    """The built-in policy `name` configured by `options` (severity, priority, triggers and its own settings;
    `enabled` is read by the caller).

    Raises: InvalidInput naming the offending key, e.g. `policies.review_approval.min_aprovals: unknown setting`.
    """
    cls = BUILTIN.get(name)
    if cls is None:
        raise InvalidInput(f"{where}.{name}: unknown policy; built-in policies: {', '.join(sorted(BUILTIN))}")
    kwargs: dict[str, Any] = {}
    for key, value in options.items():
        kwargs_key = _option(cls, name, key, value, f"{where}.{name}.{key}")
        if kwargs_key is not None:
            kwargs[key] = kwargs_key
    try:
        return cls(**kwargs)
    except InvalidInput as exc:
        raise InvalidInput(f"{where}.{name}.{exc}") from None


def _option(cls: type[Rule], name: str, key: str, value: Any, where: str) -> Any:
    if key == "enabled":
        _typed(where, value, bool)
        return None
    if key == "severity":
        try:
            return Severity(value)
        except ValueError:
            raise InvalidInput(f"{where}: must be error, warning or info, not {value!r}") from None
    if key == "priority":
        _typed(where, value, int)
        return value
    if key == "triggers":
        if not isinstance(value, list | tuple) or not value:
            raise InvalidInput(f"{where}: must be a non-empty list of trigger names")
        try:
            return frozenset(Trigger(t) for t in value)
        except ValueError:
            raise InvalidInput(f"{where}: unknown trigger in {list(value)}") from None
    if key not in cls.SETTINGS:
        takes = ", ".join([*COMMON_KEYS, *cls.SETTINGS])
        raise InvalidInput(f"{where}: unknown setting; {name} takes {takes}")
    _typed(where, value, type(_default(cls, key)))
    return value


def _typed(where: str, value: Any, kind: type) -> None:
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        article = "an" if kind is int else "a"
        raise InvalidInput(f"{where}: must be {article} {'boolean' if kind is bool else kind.__name__}, not {value!r}")


def default_policies(wip_limit: int = 3) -> list[Policy]:
    """The engine's original guards (start/create rules), in priority order: the lean set that tests and
    benchmarks of the bare engine use. The configured set comes from `application/sessions/policy_book.py`."""
    return sorted([WipLimit(limit=wip_limit), PlanOpen(), TaskUnblocked(), OneActiveSessionPerTask()], key=_priority)


def _priority(policy: Policy) -> int:
    return policy.priority
