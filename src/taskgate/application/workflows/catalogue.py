"""The engine's view of the workflow files: the validated catalogue, read once and again when a name is missing,
and the steps of a frame looked up in it."""

from __future__ import annotations

from collections.abc import Callable

from taskgate.domain.errors import InvalidInput, TaskgateError
from taskgate.domain.workflows.definitions import (
    Catalogue,
    Checklist,
    ChecklistNotFound,
    Step,
    Workflow,
    WorkflowNotFound,
    matches_pattern,
)
from taskgate.domain.workflows.run import Frame, FrameKind, find_group, find_step


class CatalogueLookup:
    """Workflows and checklists by id (a mixin of WorkflowEngine). The catalogue is parsed and validated once,
    not per step: a step finds its workflow in the cached catalogue, and only a name missing from it makes the
    files be read again (a workflow added while `serve` runs)."""

    _load_catalogue: Callable[[], Catalogue]
    _catalogue: Catalogue | None

    def catalogue(self, *, refresh: bool = False) -> Catalogue:
        """The validated catalogue, read once and again on `refresh` (or when a name is missing)."""
        if self._catalogue is None or refresh:
            self._catalogue = self._load_catalogue()
        return self._catalogue

    def workflow(self, name: str) -> Workflow:
        """A valid workflow by id. Raises: WorkflowNotFound (naming the ones there are), InvalidInput (its file has
        problems: the first one is named)."""
        found = self.catalogue().workflows.get(name) or self.catalogue(refresh=True).workflows.get(name)
        if found is None:
            catalogue = self.catalogue()
            if name in catalogue.invalid:
                raise InvalidInput(f"workflow {name} has problems: {catalogue.invalid[name]} (`taskgate workflow "
                                   "validate` lists them all)")  # fmt: skip
            raise WorkflowNotFound(f"{name} (known: {', '.join(sorted(catalogue.workflows)) or 'none'})")
        return found

    def checklist(self, name: str) -> Checklist:
        """A valid checklist by id. Raises: ChecklistNotFound (naming the ones there are)."""
        found = self.catalogue().checklists.get(name) or self.catalogue(refresh=True).checklists.get(name)
        if found is None:
            raise ChecklistNotFound(f"{name} (known: {', '.join(sorted(self.catalogue().checklists)) or 'none'})")
        return found

    def query_workflows(self, pattern: str | None = None, category: str | None = None) -> list[Workflow]:
        """Valid workflows whose id or description matches `pattern` (a glob, or a substring), by category, id."""
        found = self.catalogue(refresh=True).workflows.values()
        out = [w for w in found if matches_pattern(pattern, w.id, w.description) and category in (None, w.category)]
        return sorted(out, key=lambda w: (w.category or "", w.id))

    def query_checklists(self, pattern: str | None = None) -> list[Checklist]:
        """Valid checklists whose id or description matches `pattern`, by id."""
        found = self.catalogue(refresh=True).checklists.values()
        return sorted((c for c in found if matches_pattern(pattern, c.id, c.description)), key=lambda c: c.id)

    def _steps(self, frame: Frame) -> tuple[Step, ...]:
        """The steps `frame` runs: its workflow's, or its group's. Raises: WorkflowNotFound (gone from the files)."""
        workflow = self.workflow(frame.workflow or frame.name)
        if frame.kind is FrameKind.workflow:
            return workflow.steps
        group = find_group(workflow.steps, frame.name)
        if group is None:
            raise WorkflowNotFound(f"{workflow.id}/{frame.name} (the group is gone from the file)")
        return group.steps

    def _find(self, frame: Frame, step_id: str) -> Step | None:
        """Step `step_id` of `frame`, or None when it (or its workflow) is gone from the files."""
        try:
            return find_step(self._steps(frame), step_id)
        except TaskgateError:
            return None
