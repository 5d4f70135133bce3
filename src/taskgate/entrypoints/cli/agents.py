"""Agent types as a user meets them: `taskgate agents list` and `agents show` (presets and configured types, which
are installed, which credentials each needs and which are set, and the model endpoint each would use)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Group
from rich.text import Text

from taskgate.bootstrap import Settings, agent_types, load_settings, sandboxes
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.agents.presets import PRESETS
from taskgate.domain.agents.setups import CODEX_KEY, endpoint_of, endpoint_problem
from taskgate.domain.errors import TaskgateError
from taskgate.domain.sandbox import network_of
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
    ready: bool  # installed, a credential (or the CLI's own login) there when one is needed, its endpoint complete
    endpoint: str  # the model endpoint it would use, and from which variable (or the CLI's default)
    problem: str | None  # why it is not ready, when installed: no credential, or an incomplete endpoint
    mcp: str
    output_format: str
    summary: str
    install: str
    sandbox: str = ""  # "bwrap; network: …" or "off: why" (docs/agents.md)


def readiness(settings: Settings, kind: AgentType) -> AgentReadiness:
    """Whether `kind` can run here: its program on PATH (with its version), its credentials present, and the model
    endpoint it would use complete (an endpoint variable set with a key for it; for Codex, the provider taskgate
    writes into its private CODEX_HOME). The same rules as a launch (`check_installed`); nothing is contacted."""
    preset = PRESETS.get(kind.name)
    table = settings.agents.get(kind.name)
    based_on = PRESETS.get(table.preset) if table is not None and table.preset else preset
    source = "preset" if table is None else ("preset+config" if based_on is not None else "config")
    program = kind.command[0]
    found = shutil.which(program) if "{" not in program else None
    present = tuple(name for name in kind.credentials if os.environ.get(name))
    env = {name: os.environ[name] for name in present} | {k: v for k, v in kind.env.items() if v}
    needs = kind.needs_one_of
    logged_in = any((Path.home() / login).exists() for login in kind.logins)
    problem = None
    if needs and not logged_in and not any(os.environ.get(n) for n in needs):
        problem = f"no credential: export {' or '.join(needs)}" + (" (or log in with the CLI)" if kind.logins else "")
    problem = problem or endpoint_problem(kind.endpoint, kind.endpoint_keys, env)
    return AgentReadiness(
        kind.name, source, program, found, _version(found) if found else None, present, needs,
        found is not None and problem is None, _endpoint(kind, env), problem, kind.mcp, kind.output_format,
        based_on.summary if based_on else "", based_on.install if based_on else "",
    )  # fmt: skip


def _endpoint(kind: AgentType, env: dict[str, str]) -> str:
    shown = endpoint_of(kind.endpoint, env, setup=kind.setup, model=bool(kind.needs_one_of))
    if kind.setup != "codex":
        return shown
    if env.get(CODEX_KEY):
        return f"{shown}, as the model provider taskgate writes into the agent's own CODEX_HOME (key {CODEX_KEY})"
    return "OpenAI's API with Codex's own login (auth.json, copied into the agent's own CODEX_HOME)"


def _version(path: str) -> str | None:
    """The CLI's `--version`, run with a throwaway HOME and CODEX_HOME: a probe writes nothing into the user's home
    (Codex makes `~/.codex/tmp/arg0-linux` helpers at every start when bubblewrap is installed)."""
    with tempfile.TemporaryDirectory(prefix="taskgate-probe-") as home:
        env = {**os.environ, "HOME": home, "CODEX_HOME": home}
        try:
            done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5,
                                  stdin=subprocess.DEVNULL, env=env)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
    text = (done.stdout or done.stderr).strip().splitlines()
    return text[0][:60] if text else None


def all_readiness() -> list[AgentReadiness]:
    """Every agent type (presets, then configured ones), with what it needs. Exits with a one-line error on a
    bad configuration."""
    try:
        settings = load_settings()
        mode, why = sandboxes(settings).state()
        return [replace(readiness(settings, kind), sandbox=sandbox_of(settings, kind, mode, why))
                for kind in agent_types(settings).values()]  # fmt: skip
    except TaskgateError as exc:
        fail(str(exc))
    raise AssertionError("unreachable")


def sandbox_of(settings: Settings, kind: AgentType, mode: str, why: str) -> str:
    """How an agent of `kind` would run: confined, with which network (taskgate's MCP endpoint and its model endpoint
    as the service's environment names them now), or unconfined and why."""
    if mode != "bwrap":
        return f"{'OFF' if mode == 'off' else 'UNAVAILABLE'}: {why}"
    env = {name: os.environ[name] for name in kind.endpoint if os.environ.get(name)}
    endpoint = next(iter(env.values()), None)
    mcp = f"http://{settings.mcp.host}:{settings.mcp.port}/mcp"
    try:
        network = network_of(kind.network, [endpoint] if endpoint else kind.hosts, mcp)
    except TaskgateError as exc:
        return f"bwrap; network: {exc}"
    return f"bwrap; network {network if isinstance(network, str) else ', '.join(network)}"


@agents_app.command("list")
def agents_list(as_json: JsonOpt = False) -> None:
    """Presets and configured agent types: where each comes from, whether its program is installed (and its
    version), the credentials it needs and which of them are set (names only), the model endpoint it would use,
    its MCP wiring; not ready says why."""
    rows = all_readiness()

    def table():
        shown = [(r.name, r.source, "yes" if r.ready else "no", r.version or ("-" if r.installed else "not found"),
                  ", ".join(r.credentials_set) or "-", " or ".join(r.needs_one_of) or "-", r.endpoint, r.mcp,
                  r.sandbox, r.summary or " ".join(r.program.split()[:1])) for r in rows]  # fmt: skip
        columns = ["name", "source", "ready", "installed", "credentials set", "needs one of", "endpoint", "mcp",
                   "sandbox", "what"]  # fmt: skip
        why = [Text(f"{r.name}: not ready: {r.problem}") for r in rows if r.installed and r.problem]
        return Group(render.table("Agent types", columns, shown, markup=False), *why)

    emit([r.__dict__ for r in rows], as_json, table)


@agents_app.command("show")
def agents_show(name: Annotated[str, typer.Argument(help="The agent type.")], as_json: JsonOpt = False) -> None:
    """One agent type in full: its resolved command, environment, credentials, MCP wiring, output format, model
    endpoint, what taskgate sets up for it (Codex's own CODEX_HOME; folders made ignored in the worktree), and how it
    continues its own conversation on a rerun (`resume`; empty: it runs afresh)."""
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
             "credentials": list(kind.credentials), "timeout_s": kind.timeout_s, "setup": kind.setup,
             "ignored": list(kind.ignored), "resume": list(kind.resume)}  # fmt: skip
    if as_json:
        render.print_json(shown)
        return
    for key, value in shown.items():
        console.print(f"{key:>16}  {value if value not in (None, '', (), [], {}) else '-'}", markup=False,
                      highlight=False)  # fmt: skip
    if not ready.installed and ready.install:
        console.print(f"{'to install':>16}  {ready.install}", markup=False, highlight=False)
