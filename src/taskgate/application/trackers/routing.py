"""Which tracker each project reads: `[tracker]`, or `[projects.<name>.tracker]` in its place for that project.

Providers are built when first used, not at start-up: a project whose tracker needs a token that is not set must not
stop every other command, and the error (naming the variable) reaches the command that needed the tracker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from taskgate.application.trackers.ports import TrackerProvider
from taskgate.domain.entities import Project


@dataclass(frozen=True, slots=True)
class TrackerSpec:
    """One configured external tracker: its kind (the `source` of its tasks), whether it is written back to, and how
    to build it (raises TrackerError, e.g. for a token variable that is not set)."""

    kind: str
    write_back: bool
    build: Callable[[], TrackerProvider]


class Trackers:
    """The external tracker of each project, or None for the built-in one."""

    def __init__(self, default: TrackerSpec | None, projects: Mapping[str, TrackerSpec | None] | None = None) -> None:
        self._default, self._projects = default, dict(projects or {})
        self._built: dict[int, TrackerProvider] = {}  # by id() of the spec: one provider per configured tracker

    @classmethod
    def single(cls, provider: TrackerProvider | None) -> Trackers:
        """Every project reads `provider` (None: the built-in tracker); for tests and one-tracker set-ups."""
        if provider is None:
            return cls(None)
        return cls(TrackerSpec(provider.name, provider.writes_back, lambda: provider))

    def spec(self, project: Project) -> TrackerSpec | None:
        """The project's tracker as configured (nothing is built)."""
        return self._projects.get(project.name, self._default) if project.name in self._projects else self._default

    def of(self, project: Project) -> TrackerProvider | None:
        """The project's tracker, built on first use. Raises: TrackerError when it cannot be built."""
        spec = self.spec(project)
        if spec is None:
            return None
        if id(spec) not in self._built:
            self._built[id(spec)] = spec.build()
        return self._built[id(spec)]

    def configured(self) -> bool:
        """Whether any project reads an external tracker."""
        return self._default is not None or any(s is not None for s in self._projects.values())

    def kinds(self) -> tuple[str, ...]:
        """Every external tracker kind configured (the `source` of the tasks mirrored from them)."""
        specs = [self._default, *self._projects.values()]
        return tuple(sorted({s.kind for s in specs if s is not None}))

    def written_back(self) -> tuple[str, ...]:
        """The kinds whose tasks owe their status changes back (write-back on)."""
        specs = [self._default, *self._projects.values()]
        return tuple(sorted({s.kind for s in specs if s is not None and s.write_back}))


def polled(provider: TrackerProvider) -> bool:
    """Whether the provider is read over an HTTP API (GitHub Issues, Linear): its `list` is the candidates with why
    each is held, and its cost is counted (`PolledTracker`)."""
    return callable(getattr(provider, "describe", None))
