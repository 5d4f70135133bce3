"""Which project a command means: by its id, name or key, else the only one, else the one holding the current folder.

Pure rules over the projects read, shared by the tracker service (`BuiltinTracker.resolve_project`) and the CLI's
engine-free reads, so both choose alike.
"""

from __future__ import annotations

from pathlib import Path

from taskgate.domain.entities import Project
from taskgate.domain.errors import InvalidInput, ProjectNotFound


def numeric_ref(ref: str) -> int | None:
    """`ref` as a project id, when it is one (ASCII digits only: '²' is a digit to str.isdigit, not to int)."""
    return int(ref) if ref.isascii() and ref.isdigit() else None


def key_of(ref: str) -> str:
    """`ref` as a project key is looked up (keys are upper case)."""
    return ref.upper()


def choose_project(projects: list[Project], cwd: str | None) -> Project:
    """Without a reference: the only project, else the one whose root holds `cwd`.

    Raises: ProjectNotFound when none is registered; InvalidInput when several are and `cwd` picks none.
    """
    if len(projects) == 1:
        return projects[0]
    here = Path(cwd).resolve() if cwd else None
    holding = [p for p in projects if here and (here == Path(p.root_path) or Path(p.root_path) in here.parents)]
    if len(holding) == 1:
        return holding[0]
    if not projects:
        raise ProjectNotFound("(none registered; run `taskgate init PATH`)")
    raise InvalidInput(f"{len(projects)} projects exist; choose one with --project NAME")
