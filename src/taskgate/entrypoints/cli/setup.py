"""Setting a repository up and saying where everything is: `taskgate init`, `taskgate info`."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from taskgate import __version__
from taskgate.application.trackers.builtin import check_project_name
from taskgate.application.workspaces.hooks import Hooks
from taskgate.bootstrap import (
    App,
    Settings,
    config_dir,
    database_report,
    find_config_file,
    hook_book,
    load_settings,
    project_layout,
    workflow_catalogue,
)
from taskgate.domain.errors import TaskgateError
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import JsonOpt, _local_actor, command, fail, run, say
from taskgate.entrypoints.render import console, err_console

_WHAT = {
    ".taskgate/taskgate.toml": "the configuration: commit it",
    ".taskgate/.gitignore": "keeps .taskgate/data/, the database and session folders, out of git",
    ".taskgate/workflows/": "your team's workflows, over the built-in ones",
    ".taskgate/checklists/": "your team's checklists",
    ".taskgate/agents/": "scripts of your own agent types",
}


@command("init")
def init(
    path: Annotated[Path, typer.Argument(help="A folder inside the git repository to set up.")] = Path("."),
    name: Annotated[str | None, typer.Option(help="Project name (default: the repository folder's name).")] = None,
) -> None:
    """Set a git repository up for taskgate in one step: .taskgate/ with a commented taskgate.toml, a .gitignore
    that keeps the database and session folders (.taskgate/data/) out of git, and folders for the team's own
    workflows, checklists and agents; then register the project and the local operator, and create the audit log's
    signing key (its public key printed, to keep with the auditors). Running it again changes nothing. (When a
    config already applies here, e.g. --config or a checkout's config/taskgate.toml, the project is registered in
    that config's database and no .taskgate/ is written.)"""
    try:
        if name is not None:
            name = check_project_name(name)
        root = project_layout.repository_root(path)
        found = find_config_file()
    except TaskgateError as exc:
        fail(str(exc))
    own = root / ".taskgate" / "taskgate.toml"
    layout = None
    if found is None or found == own:
        existed = project_layout.has_layout(root)
        if not existed:  # the config (and with it the database's place) must exist before taskgate opens
            layout = project_layout.set_up(root)
        os.environ["TASKGATE_CONFIG"] = str(own)
    else:
        console.print(f"using the config that applies here: {escape(str(found))}", highlight=False)

    async def work(services: App):
        assert services.settings is not None and services.ledger is not None
        key = _audit_key(services.settings.resolved_audit_key)  # first: a broken key file stops init here
        project, created = await services.tracker.register_project(str(root), name, _local_actor(services))
        operator = await services.tracker.ensure_operator(services.settings.operator.default)
        # the first checkpoint: over a database migrated from before 0014, or this very init's records
        sealed = await services.ledger.seal_if_unsealed()
        return project, created, operator, services.settings, key, sealed

    project, created, operator, settings, key, sealed = run(work)
    if found == own or (found is None and layout is None):
        layout = project_layout.set_up(root)  # a re-run: only what went missing is created
    ignored = _keep_out_of_git(root, settings.resolved_audit_key)
    _say_what_init_did(layout, project, created, operator, settings)
    _say_audit_key(key, settings.resolved_audit_key, ignored, sealed)
    _say_next(layout, project, created or key.created)


@dataclass(frozen=True)
class _Key:
    """The audit key init found or made: its id and public line, whether it was created, and a warning."""

    key_id: str
    line: str
    created: bool
    warning: str | None = None


def _audit_key(private: Path) -> _Key:
    """The audit signing key at `private`, created (with its `.pub`) when there is none; a missing `.pub` is
    written again from it. Raises: InvalidInput when the key file is not a taskgate audit key."""
    from taskgate.infrastructure.audit.keys import create_key, load_public, public_path

    signer, created = create_key(private)
    line, public = signer.public.line(), public_path(private)
    if not public.exists():
        public.write_text(line + "\n", encoding="utf-8")  # derived from the private key: init restores it
    try:
        found = load_public(public).key_id
    except TaskgateError as exc:
        return _Key(signer.key_id, line, created, f"{exc}: verify with the auditors' copy (--public-key)")
    if found != signer.key_id:
        return _Key(signer.key_id, line, created, f"{public} holds key {found}, not the private key's "
                    f"{signer.key_id}: it was replaced, verify with the auditors' copy (--public-key)")  # fmt: skip
    return _Key(signer.key_id, line, created)


def _keep_out_of_git(root: Path, private: Path) -> Path | None:
    """When the private key lies inside the repository and git would not ignore it (an `[audit] key_file` there),
    add it to the `.gitignore` beside it: the private key must never be committed. The `.gitignore` written, if any.
    (The default place, `.taskgate/data/audit-key/`, is ignored already with the rest of `data/`.)"""
    private = private.resolve()
    if not private.is_relative_to(root):
        return None
    probe = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", "--", str(private)],
                           capture_output=True, timeout=30)  # fmt: skip
    if probe.returncode != 1:  # 0: ignored already; 128: git could not tell (nothing to add then)
        return None
    ignore = private.parent / ".gitignore"
    kept = ignore.read_text(encoding="utf-8").splitlines() if ignore.exists() else []
    missing = [p for p in (f"/{private.name}", f"/{private.name}.tmp") if p not in kept]
    head = "" if not kept or ignore.read_text(encoding="utf-8").endswith("\n") else "\n"
    with ignore.open("a", encoding="utf-8") as out:
        out.write(head + "# taskgate's audit signing key: never commit it\n" + "".join(m + "\n" for m in missing))
    return ignore


def _say_audit_key(key: _Key, private: Path, ignored: Path | None, sealed) -> None:
    from taskgate.infrastructure.audit.keys import public_path

    done = "created" if key.created else "kept (it exists)"
    console.print(f"audit key [bold]{key.key_id}[/bold] {done}:", highlight=False)
    console.print(f"  private {private}  (never commit it; keep it from the database's writers)", highlight=False,
                  markup=False)  # fmt: skip
    console.print(f"  public  {public_path(private)}", highlight=False, markup=False)
    say(key.line)
    console.print("keep a copy of this public key with your auditors (`taskgate audit verify --public-key FILE`)",
                  highlight=False, markup=False)  # fmt: skip
    if key.warning:
        err_console.print(f"warning: {key.warning}", highlight=False, markup=False)
    if ignored is not None:
        console.print(f"added the private key to {ignored}: git ignores it", highlight=False, markup=False)
    if sealed is not None:
        console.print(f"signed audit checkpoint #{sealed.number} over {len(sealed.heads)} chain(s) no checkpoint "
                      "covered yet", highlight=False, markup=False)  # fmt: skip


def _say_what_init_did(layout, project, created: bool, operator, settings) -> None:
    if layout is not None:
        made = {item.replace(os.sep, "/") for item in layout.created}
        for item, what in _WHAT.items():
            if item in made:
                console.print(f"created {escape(item)}  ({what})", highlight=False, markup=False)
    where = f"{escape(project.name)} (id {project.id}, key {project.key}) at {escape(project.root_path)}"
    if created:
        console.print(f"project [bold]{where}[/bold] registered", highlight=False)
    else:
        console.print(f"project [bold]{where}[/bold] was registered already", highlight=False)
    console.print(f"database {escape(settings.resolved_database_url)}", highlight=False)
    console.print(f"operator [bold]{escape(operator.id)}[/bold] ready; task ids look like {project.key}-1")


def _say_next(layout, project, created: bool) -> None:
    if layout is not None and not layout.created and not created:
        console.print("already set up: nothing changed")
    elif layout is not None:
        console.print(
            "next: commit .taskgate/, then `taskgate agents list` (agent CLIs found), `taskgate doctor`, "
            '`taskgate task add "..."`, `taskgate workflow run feature-development --task ' + f"{project.key}-1`",
            highlight=False,
            markup=False,
        )


@command("info")
def info(as_json: JsonOpt = False) -> None:
    """Say where everything is: config file, data directory, database (and its schema revision), session folders,
    worktrees, the built-in catalogue and the project's own workflows, checklists and agents, and this node's id."""

    async def work(services: App) -> dict[str, object]:
        settings = services.settings
        assert settings is not None
        folders = workflow_catalogue(settings).source.folders()  # type: ignore[attr-defined]
        return {
            "version": __version__,
            "config_file": str(settings.config_file) if settings.config_file else None,
            "data_dir": str(settings.data_dir),
            **await database_report(services),
            "session_folders": str(settings.data_dir / "agent-outputs"),
            "worktrees": _worktrees_where(settings.git.worktrees_dir),
            "hooks": _hooks_shown(settings),
            **folders,
            "project_agents": str(config_dir(settings) / "agents"),
            "default_operator": settings.operator.default,
            "wip_limit": settings.policies.wip_limit.limit,
            "node_id": settings.resolved_node_id,
        }

    report = run(work)
    if as_json:
        render.print_json(report)
        return
    for key, value in report.items():
        shown = value if value is not None else "(none: built-in defaults)" if key == "config_file" else "-"
        console.print(f"[bold]{key:>18}[/bold]  {escape(str(shown))}", highlight=False)


__all__ = ["info", "init", "load_settings"]


def _hooks_shown(settings: Settings) -> str | None:
    """The configured worktree hooks in a line (`[hooks]`, then each project's own table), or None."""
    book = hook_book(settings)
    shown = [_hooks_line("", book.default)] + [_hooks_line(f"{name}: ", h) for name, h in book.projects.items()]
    return " | ".join(line for line in shown if line) or None


def _hooks_line(prefix: str, hooks: Hooks) -> str:
    configured = hooks.configured()
    if not configured:
        return ""
    listed = "; ".join(f"{name} `{command}`" for name, command in configured.items())
    return f"{prefix}{listed} (timeout {hooks.timeout_s:g} s)"


def _worktrees_where(folder: str) -> str:
    """Where session worktrees go, as `taskgate info` says it (see GitOptions.worktrees_of)."""
    if folder.startswith(("/", "~")):
        return f"{folder}/<project name>/<session id>"
    return f"<project root>/{folder}/<session id>"
