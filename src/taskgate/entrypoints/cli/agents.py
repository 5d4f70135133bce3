"""Agent types as a user meets them: `taskgate agents list` and `agents show` (presets and configured types, which
are installed, which credentials each needs and which are set)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from taskgate.bootstrap import Settings, agent_types, load_settings
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.agents.presets import PRESETS
from taskgate.domain.errors import TaskgateError
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import JsonOpt, emit, fail, group
from taskgate.entrypoints.render import console

agents_app = group("agents", no_args_is_help=True)


@dataclass(frozen=True)
class AgentReadiness:
    """What `agents list` says about one agent type."""

    name: str
    source: str  # preset, config, preset+config
    program: str
    installed: str | None  # the path found on PATH
    version: str | None
    credentials_set: tuple[str, ...]  # names only, never values
    needs_one_of: tuple[str, ...]
    ready: bool  # installed, and a credential (or the CLI's own login) is there when one is needed
    mcp: str
    output_format: str
    summary: str
    install: str


def readiness(settings: Settings, kind: AgentType) -> AgentReadiness:
    """Whether `kind` can run here: its program on PATH (with its version), its credentials present."""
    preset = PRESETS.get(kind.name)
    table = settings.agents.get(kind.name)
    based_on = PRESETS.get(table.preset) if table is not None and table.preset else preset
    source = "preset" if table is None else ("preset+config" if based_on is not None else "config")
    program = kind.command[0]
    found = shutil.which(program) if "{" not in program else None
    present = tuple(name for name in kind.credentials if os.environ.get(name))
    needs = based_on.needs_one_of if based_on is not None else ()
    logged_in = any((Path.home() / login).exists() for login in (based_on.logins if based_on else ()))
    ready = found is not None and (not needs or logged_in or any(os.environ.get(n) for n in needs))
    return AgentReadiness(
        kind.name, source, program, found, _version(found) if found else None, present, needs, ready, kind.mcp,
        kind.output_format, based_on.summary if based_on else "", based_on.install if based_on else "",
    )  # fmt: skip


def _version(path: str) -> str | None:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (done.stdout or done.stderr).strip().splitlines()
    return text[0][:60] if text else None


def all_readiness() -> list[AgentReadiness]:
    """Every agent type (presets, then configured ones), with what it needs. Exits with a one-line error on a
    bad configuration."""
    try:
        settings = load_settings()
        return [readiness(settings, kind) for kind in agent_types(settings).values()]
    except TaskgateError as exc:
        fail(str(exc))
    raise AssertionError("unreachable")


@agents_app.command("list")
def agents_list(as_json: JsonOpt = False) -> None:
    """Presets and configured agent types: where each comes from, whether its program is installed (and its
    version), the credentials it needs and which of them are set (names only), its MCP wiring."""
    rows = all_readiness()

    def table():
        shown = [(r.name, r.source, "yes" if r.ready else "no", r.version or ("-" if r.installed else "not found"),
                  ", ".join(r.credentials_set) or "-",
                  " or ".join(r.needs_one_of) or "-", r.mcp, r.summary or " ".join(r.program.split()[:1]))
                 for r in rows]  # fmt: skip
        columns = ["name", "source", "ready", "installed", "credentials set", "needs one of", "mcp", "what"]
        return render.table("Agent types", columns, shown, markup=False)

    emit([r.__dict__ for r in rows], as_json, table)


@agents_app.command("show")
def agents_show(name: Annotated[str, typer.Argument(help="The agent type.")], as_json: JsonOpt = False) -> None:
    """One agent type in full: its resolved command, environment, credentials, MCP wiring and output format."""
    try:
        settings = load_settings()
        kinds = agent_types(settings)
    except TaskgateError as exc:
        fail(str(exc))
    if name not in kinds:
        fail(f"unknown agent type '{name}'; known: {', '.join(sorted(kinds))}")
    kind = kinds[name]
    ready = readiness(settings, kind)
    shown = {**ready.__dict__, "command": list(kind.command), "env": dict(kind.env),
             "credentials": list(kind.credentials), "timeout_s": kind.timeout_s}  # fmt: skip
    if as_json:
        render.print_json(shown)
        return
    for key, value in shown.items():
        console.print(f"{key:>16}  {value if value not in (None, '', (), [], {}) else '-'}", markup=False,
                      highlight=False)  # fmt: skip
    if not ready.installed and ready.install:
        console.print(f"{'to install':>16}  {ready.install}", markup=False, highlight=False)
