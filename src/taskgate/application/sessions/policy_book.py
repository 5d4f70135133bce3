"""Which policies guard which project, with what settings: the policy book built from `config/taskgate.toml`.

Three layers, later ones winning key by key: the built-in defaults (`domain/policies/rules.py`), the global
`[policies.<name>]` tables, and a project's `[projects.<project name>.policies.<name>]` tables. Each table may
set `enabled`, `severity`, `priority`, `triggers` and the policy's own settings. Everything is built and
checked when the book is made (at start-up), so a typo fails the start with the key it is about, not a
transition later. A project's active set is built once and cached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from taskgate.domain.errors import InvalidInput
from taskgate.domain.policies.book import BUILTIN, ENABLED_BY_DEFAULT, build_policy
from taskgate.domain.policies.facts import Policy, triggers_of
from taskgate.domain.policies.rules import OneActiveSessionPerTask


@dataclass(frozen=True, slots=True)
class ProjectPolicies:
    """A project's `[projects.<name>]` table: how to run its tests, and its policy overrides."""

    test_command: tuple[str, ...] = ()
    test_timeout_s: float = 600.0
    policies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    """One line of `policies list`: a policy as configured for a project, enabled or not."""

    policy: Policy
    enabled: bool

    def as_dict(self) -> dict[str, Any]:
        triggers = triggers_of(self.policy)
        return {
            "name": self.policy.name,
            "description": self.policy.description,
            "priority": self.policy.priority,
            "severity": self.policy.severity.value,
            "triggers": sorted(t.value for t in triggers) if triggers is not None else [],
            "enabled": self.enabled,
            "settings": dict(getattr(self.policy, "settings", {})),
        }


class PolicyBook:
    """The configured policies, per project. Build with the config's tables, or `PolicyBook.fixed(policies)`."""

    def __init__(
        self,
        defaults: Mapping[str, Mapping[str, Any]] | None = None,
        projects: Mapping[str, ProjectPolicies] | None = None,
        *,
        branch_pattern: str | None = None,
        extra: Sequence[Policy] = (),
    ) -> None:
        """`branch_pattern`: the default regex of `branch_naming` (the shape of the configured git pattern);
        `extra`: policies every project has besides the built-in ones, configured elsewhere (`budget`, from
        `[budgets]`).

        Raises: InvalidInput naming the first unknown policy, unknown setting or invalid value.
        """
        self._defaults = {name: dict(options) for name, options in (defaults or {}).items()}
        self._projects = dict(projects or {})
        self._base = {"branch_naming": {"pattern": branch_pattern}} if branch_pattern else {}
        self._fixed: list[Policy] | None = None
        self._extra = list(extra)
        self._cache: dict[str | None, list[PolicyEntry]] = {}
        for name in self._defaults:
            _known(name, "policies")
        for project, config in self._projects.items():
            for name in config.policies:
                _known(name, f"projects.{project}.policies")
            if config.test_timeout_s <= 0:
                raise InvalidInput(f"projects.{project}.test_timeout_s: must be positive")
        for project in [None, *self._projects]:
            self.entries(project)  # build (and so check) every set now

    @classmethod
    def fixed(cls, policies: Sequence[Policy]) -> PolicyBook:
        """The same policies for every project, all enabled (engine tests, benchmarks, `default_policies`)."""
        book = cls()
        book._fixed = sorted(policies, key=lambda p: p.priority)
        book._cache.clear()
        return book

    @property
    def per_project(self) -> bool:
        """Whether some project has policies of its own (else every project shares the global set)."""
        return self._fixed is None and any(p.policies for p in self._projects.values())

    def entries(self, project: str | None = None) -> list[PolicyEntry]:
        """Every policy for `project` (None: the global set), enabled or not, in priority order."""
        key = project if project in self._projects else None
        if key not in self._cache:
            self._cache[key] = self._build(key)
        return self._cache[key]

    def active(self, project: str | None = None) -> list[Policy]:
        """The enabled policies of `project`, in priority order."""
        return [e.policy for e in self.entries(project) if e.enabled]

    def all_sets(self) -> list[list[Policy]]:
        """The active set of every configured project and the global one."""
        return [self.active(p) for p in [None, *self._projects]]

    def tests(self, project: str | None) -> ProjectPolicies:
        """How `project` runs its tests (no command when none is configured)."""
        return self._projects.get(project or "", ProjectPolicies())

    def _build(self, project: str | None) -> list[PolicyEntry]:
        if self._fixed is not None:
            return [PolicyEntry(p, True) for p in self._fixed]
        entries = [PolicyEntry(OneActiveSessionPerTask(), True), *(PolicyEntry(p, True) for p in self._extra)]
        own = self._projects[project].policies if project is not None else {}
        for name in BUILTIN:
            options = {**self._base.get(name, {}), **self._defaults.get(name, {}), **own.get(name, {})}
            where = f"projects.{project}.policies" if name in own else "policies"
            policy = build_policy(name, options, where=where)
            entries.append(PolicyEntry(policy, bool(options.get("enabled", name in ENABLED_BY_DEFAULT))))
        return sorted(entries, key=lambda e: e.policy.priority)


def _known(name: str, where: str) -> None:
    if name not in BUILTIN:
        hint = " (always on)" if name == "one_active_session_per_task" else ""
        raise InvalidInput(f"{where}.{name}: unknown policy{hint}; configurable: {', '.join(sorted(BUILTIN))}")
