"""The `taskgate` command line (Typer + Rich), one module per concept. Every command exits non-zero with a
one-line reason on error. Importing the modules registers their commands on `app`."""

from __future__ import annotations

from taskgate.entrypoints.cli import (  # noqa: F401
    access,
    agents,
    audit,
    doctor,
    logs,
    projects,
    service,
    sessions,
    setup,
    tracker,
    workflows,
)
from taskgate.entrypoints.cli.common import app


def main() -> None:
    """Console-script entry point."""
    app()


__all__ = ["app", "main"]
