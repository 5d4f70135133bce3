"""What the workflow runtime needs stored and read (ports the unit of work carries): its step runs, and the files of a
project's tree that workflows name. Apart from ports.py, which needs the unit of work's type (a step's claim), so that
the shared ports can import these without a circle."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from taskgate.domain.entities import (
    StepRun,
    StepStatus,
)


class StepRunRepository(Protocol):
    """Workflow step runs (attempts), per session in the order they started."""

    async def add(self, run: StepRun) -> int:
        """Store a new run; returns its id."""

    async def update(self, run: StepRun) -> None:
        """Overwrite the run with `run.id` (status, ended_at, output_summary, agent_ids, error).

        Raises: StepRunNotFound when no run has that id."""

    async def get(self, run_id: int) -> StepRun:
        """Raises: StepRunNotFound."""

    async def finish(self, run_id: int, status: StepStatus, ended_at: datetime, output: str, error: str | None) -> bool:
        """Close the run if it is still open (running or waiting), in one statement; False when it was closed
        already or no run has that id (a closed run keeps its first outcome)."""

    async def of_session(self, session_id: str, limit: int = 200) -> list[StepRun]:
        """The newest `limit` runs of the session, oldest first (by id)."""

    async def open_runs(self, session_id: str) -> list[StepRun]:
        """The session's runs still running or waiting, oldest first."""


class ProjectFiles(Protocol):
    """Files of a project's tree that workflows name (`load:` files, `{config_source}:key` configs). Reads stay
    inside the project's root: a path that leaves it (`..`, an absolute path elsewhere, a symbolic link pointing
    out) is refused, as are files that are not UTF-8 text or are larger than the limit."""

    def read_text(self, root: str, path: str) -> str:
        """The text of `path` (absolute, or relative to `root`). Raises: InvalidInput (missing, not a file, too
        big, not text), Forbidden (outside `root`)."""
        ...

    def config_value(self, root: str, path: str, key: str) -> str:
        """The value of dotted `key` in the YAML or JSON file `path`, as text. Raises: VariableError (no such key,
        not a scalar), and what `read_text` raises."""
        ...
