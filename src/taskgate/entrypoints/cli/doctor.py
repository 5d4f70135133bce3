"""`taskgate doctor`: one line per thing a set-up needs, each with the fix when it is missing."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass

import typer

from taskgate.bootstrap import (
    agent_types,
    bootstrap,
    build_notifier,
    database_report,
    dispatch_options,
    dispatch_report,
    find_config_file,
    load_settings,
    sandboxes,
)
from taskgate.domain.errors import TaskgateError
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.agents import readiness
from taskgate.entrypoints.cli.common import JsonOpt, command
from taskgate.entrypoints.cli.forge_checks import forge_checks, tracker_checks
from taskgate.entrypoints.render import console

_MARK = {"ok": "[green]ok  [/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]"}


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok, warn, fail
    detail: str
    fix: str = ""


@command("doctor")
def doctor(as_json: JsonOpt = False) -> None:
    """Check this set-up: git and its identity, the config file, the database, the project, every agent type in
    use (its CLI, version, credentials), and the MCP endpoint agents call back to. Exit 1 if a check fails."""
    checks = [*_git_checks()]
    try:
        settings = load_settings()
        checks.append(Check("config", "ok" if settings.config_file else "warn",
                            str(settings.config_file or find_config_file() or "none: built-in defaults"),
                            "" if settings.config_file else "taskgate init (in your repository)"))  # fmt: skip
        checks += asyncio.run(_service_checks(settings))
        checks += _agent_checks(settings)
        checks += _sandbox_checks(settings)
    except TaskgateError as exc:
        checks.append(Check("config", "fail", str(exc), "fix the file named above"))
    if as_json:
        render.print_json([asdict(c) for c in checks])
    else:
        for check in checks:
            fix = f"  (fix: {check.fix})" if check.fix and check.status != "ok" else ""
            console.print(f"{_MARK[check.status]} {check.name:<22} ", end="", highlight=False)
            console.print(f"{check.detail}{fix}", markup=False, highlight=False)
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _git_checks() -> list[Check]:
    version = _git("--version")
    if version is None:
        return [Check("git", "fail", "git is not installed", "install git (2.30 or newer)")]
    checks = [Check("git", "ok", version)]
    for key in ("user.name", "user.email"):
        value = _git("config", key)
        checks.append(Check(f"git {key}", "ok", value) if value else
                      Check(f"git {key}", "fail", f"{key} is not set: agents' commits need it",
                            f"git config --global {key} '...'"))  # fmt: skip
    return checks


async def _service_checks(settings) -> list[Check]:
    """The database (reachable, migrated), the project of this folder, and the agent endpoint (it answers)."""
    from taskgate.entrypoints.mcp.agent_endpoint import LoopbackEndpoint

    try:
        app_ = await bootstrap(settings)
    except TaskgateError as exc:
        return [Check("database", "fail", str(exc), "check database_url / data_dir in taskgate.toml")]
    try:
        report = await database_report(app_)
        at_head = report["schema_revision"] == report["head_revision"]
        checks = [Check("database", "ok" if at_head else "fail",
                        f"{report['database_url']} (schema {report['schema_revision']})")]  # fmt: skip
        project = None
        try:
            project = await app_.tracker.resolve_project(None, os.getcwd())
            checks.append(Check("project", "ok", f"{project.name} (key {project.key}) at {project.root_path}"))
        except TaskgateError as exc:
            checks.append(Check("project", "warn", str(exc), "taskgate init (in your repository)"))
        checks += [Check(*line) for line in await forge_checks(settings, app_, project)]
        checks += [Check(*line) for line in await tracker_checks(app_, project)]
        checks.append(await _dispatch_check(settings, app_))
        checks.append(await _audit_check(settings, app_))
        checks.append(await _notify_check(settings, app_))
        endpoint = LoopbackEndpoint(app_, settings.mcp.tool_names, grace_s=0)
        url = await endpoint.acquire()
        try:
            answered = await asyncio.to_thread(_refuses_without_token, url)
        finally:
            await endpoint.close()
        checks.append(Check("mcp endpoint", "ok" if answered else "fail",
                            f"agents get one like {url} while they run (agent tokens only)" if answered
                            else f"{url} did not answer", "check that 127.0.0.1 is reachable"))  # fmt: skip
        return checks
    finally:
        await app_.close()


async def _dispatch_check(settings, app_) -> Check:
    """Whether taskgate starts sessions by itself ([dispatch]): off is fine; on, its operator must exist, its
    projects too, and some trigger must start something."""
    line, problems = dispatch_report(settings)
    options = dispatch_options(settings)
    if options is None:
        return Check("dispatch", "ok", line)
    if options.operator_id not in {o.id for o in await app_.tracker.list_operators()}:
        fix = f"taskgate operator add {options.operator_id} --role developer, or set [dispatch] operator"
        return Check("dispatch", "fail", f"{line}; operator {options.operator_id} does not exist", fix)
    names = {p.name for p in await app_.tracker.list_projects()}
    unknown = [name for name in options.projects if name not in names]
    if unknown:
        return Check("dispatch", "fail", f"{line}; no project named {', '.join(unknown)}", "fix [dispatch] projects")
    if problems:
        hint = "see docs/workflows.md#triggers-and-dispatch"
        return Check("dispatch", "warn", f"{line}; {'; '.join(problems)}", hint)
    return Check("dispatch", "ok", line)


async def _notify_check(settings, app_) -> Check:
    """The notification channels ([notify], docs/notifications.md), masked: what waits and what was given up.
    Nothing is sent (`taskgate notify test` does that)."""
    notifier = build_notifier(settings, app_)
    if notifier is None:
        return Check("notify", "ok", "off: no [notify] channels (see docs/notifications.md)")
    rows = await notifier.status()
    listed = ", ".join(r.channel for r in rows)
    troubled = [r for r in rows if r.failed or r.last_error]
    if troubled:
        said = "; ".join(f"{r.channel}: {r.pending} pending, {r.failed} given up, last error {r.last_error}"
                         for r in troubled)  # fmt: skip
        return Check("notify", "warn", said, "taskgate notify status; taskgate notify test")
    return Check("notify", "ok", f"{len(rows)} channel(s): {listed}; nothing failed")


async def _audit_check(settings, app_) -> Check:
    """The audit signing key (docs/audit.md): present and readable, and what the newest checkpoint is."""
    path = settings.resolved_audit_key
    try:
        status = await app_.ledger.status()
    except TaskgateError as exc:
        return Check(
            "audit key", "fail", f"{path}: {exc}", "restore the key file, or move it aside and run taskgate init"
        )
    last = status["last_checkpoint"]
    newest = f"checkpoint #{last['number']} at {last['at']}" if last else "no checkpoint yet"
    if not status["can_sign"]:
        return Check("audit key", "warn", f"no signing key at {path}: checkpoints cannot be signed here ({newest})",
                     "taskgate init (creates it), or set [audit] key_file")  # fmt: skip
    return Check("audit key", "ok", f"key {status['key']} at {path}; {newest}")


def _refuses_without_token(url: str) -> bool:
    """Whether the endpoint answers (a request without a token must get the gate's 403)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, b"{}", method="POST"), timeout=5)
    except urllib.error.HTTPError as exc:
        return exc.code == 403
    except OSError:
        return False
    return False


def _agent_checks(settings) -> list[Check]:
    """Agent types the set-up uses (configured, default, or the CLI presets) must be installed, credentialed and
    have a complete model endpoint (`agents.readiness`); a CLI preset nobody configured is only a warning. What is
    checked: the program runs `--version`, a key (or the CLI's login) is there, the endpoint variable is a URL with
    a key for it, and that the endpoint accepts a connection (`_answers`). Not checked: that the key is valid."""
    kinds = agent_types(settings)
    used = set(settings.agents) | set(settings.execution.default_agents)
    checks = []
    for name in sorted(used | {"claude", "codex", "aider"}):
        ready = readiness(settings, kinds[name])
        missing = "fail" if name in used else "warn"
        if ready.installed is None:
            checks.append(Check(f"agent {name}", missing, f"'{ready.program}' not found on PATH",
                                ready.install or f"install it, or fix agents.{name}.command"))  # fmt: skip
        elif not ready.ready:
            checks.append(Check(f"agent {name}", missing, f"{ready.version or ready.installed}; {ready.problem}",
                                "export what it names, or set it in the agent's `env`"))  # fmt: skip
        else:
            creds = ", ".join(ready.credentials_set) or ("its own login" if ready.needs_one_of else "none needed")
            detail = f"{ready.version or ready.installed}; credentials: {creds}; endpoint: {ready.endpoint}"
            answered, said = _answers(ready.endpoint)
            checks.append(Check(f"agent {name}", "ok" if answered is not False else "warn", f"{detail}; {said}",
                                "start the model server, or fix the endpoint variable"))  # fmt: skip
    return checks


def _sandbox_checks(settings) -> list[Check]:
    """Whether agents run confined here (`[sandbox] mode`), what the network gate records, which limits hold."""
    from taskgate.infrastructure.sandbox import limits

    box = sandboxes(settings)
    mode, why = box.state()
    install = "apt-get install bubblewrap (or allow unprivileged user namespaces)"
    if mode == "bwrap":
        checks = [Check("sandbox", "ok", f"{why} (mode {settings.sandbox.mode})")]
    elif mode == "unavailable":
        return [Check("sandbox", "fail", f'required ([sandbox] mode = "bwrap") but unavailable: {why}', install)]
    elif settings.sandbox.mode == "off":
        return [Check("sandbox", "warn", why, 'remove [sandbox] mode = "off" to confine agents')]
    else:
        return [Check("sandbox", "warn", f"agents run unconfined: {why}", install)]
    caught = box.catch_all()
    checks.append(Check("sandbox network", "ok" if caught is None else "warn",
                        "allow-lists enforced; refused connects recorded, also to unlisted addresses"
                        if caught is None else f"allow-lists enforced; {caught}", "run the service as root with "
                        "nftables installed to record every refused connect"))  # fmt: skip
    support = limits.probe()
    per_agent = f"per agent: pids {settings.sandbox.pids}, memory {settings.sandbox.memory_mb} MiB"
    fix = "run the service as root or in a delegated cgroup"
    checks.append(Check("sandbox limits", "ok" if support.kind != "rlimit" else "warn",
                        f"{support.detail}; {per_agent}", fix))  # fmt: skip
    return checks


def _answers(endpoint: str) -> tuple[bool | None, str]:
    """Whether the endpoint URL at the start of `endpoint` (a readiness' description) takes a connection (None: it
    names no URL, a CLI's default endpoint, which is not contacted), and what doctor says of it: what it checked and
    what it did not (the key is never sent)."""
    url = urllib.parse.urlsplit(endpoint.split(" ", 1)[0].rstrip(","))
    if url.scheme not in ("http", "https") or not url.hostname:
        return None, "not contacted; the key is not tried"
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), 3):
            return True, "it takes a connection; the key and the model are not tried"
    except OSError as exc:
        return False, f"it does not answer ({exc.strerror or exc})"
