"""`taskgate [--config PATH] serve`: MCP over stdio, started without Typer, Rich or the services.

An MCP client waits only so long for the tool list (Codex about 1.1 s), so `main()` comes here straight from the
command line; the rest of `serve` (`--http`, `--help`) is the Typer command of `service.py`. Typer and Rich load
only to say what failed, as every command says it (`common.fail`). The settings load before the first answer only
when the last serve of this configuration did not remember what the front needs (front.serve_stdio_remembered).
"""

from __future__ import annotations

import os
from typing import Any

from taskgate.domain.errors import TaskgateError


def serve_stdio(config: str | None) -> None:
    """Serve MCP over stdin/stdout with the config file `config` (else the usual lookup); exits 1 with a one-line
    reason when the config is invalid or the services could not be opened."""
    from taskgate.entrypoints.mcp.front import serve_stdio_remembered

    if config is not None:
        os.environ["TASKGATE_CONFIG"] = config  # as the Typer app's root option does
    try:
        serve_stdio_remembered(_load_settings)
    except TaskgateError as exc:
        import typer

        from taskgate.entrypoints.cli.common import fail

        try:
            fail(str(exc))
        except typer.Exit as done:
            raise SystemExit(done.exit_code) from None


def _load_settings() -> Any:
    """The settings (pydantic-settings and the settings' models: imported only when serve needs them)."""
    from taskgate.infrastructure.settings import load_settings

    return load_settings()
