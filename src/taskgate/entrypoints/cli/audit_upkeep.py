"""Keeping the audit log's proofs: `audit checkpoint`, `audit status`, `audit key`, `audit prune` (docs/audit.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from taskgate.entrypoints import render
from taskgate.entrypoints.cli.audit_common import JsonOpt, audit_run, bad_input, progress_line, timestamp
from taskgate.entrypoints.cli.common import _local_actor, _or_fail, audit_app, fail, say
from taskgate.entrypoints.render import console

if TYPE_CHECKING:
    from taskgate.application.audit.ledger import PruneReport
    from taskgate.bootstrap import App


@audit_app.command("checkpoint")
def audit_checkpoint(as_json: JsonOpt = False) -> None:
    """Sign a checkpoint now over the heads of every chain that grew since it was last signed: from then on, no
    record it covers can be removed or changed unnoticed. Needs the private key ([audit] key_file)."""
    from taskgate.application.audit.ledger import checkpoint_summary

    async def work(services: App) -> dict[str, Any] | None:
        assert services.ledger is not None
        return checkpoint_summary(await services.ledger.checkpoint("demand", actor=_local_actor(services)))

    signed = audit_run(work)
    assert signed is not None  # not only_if_grown: a checkpoint is always signed
    if as_json:
        render.print_json(signed)
        return
    console.print(f"signed checkpoint [bold]#{signed['number']}[/bold] at {signed['at']} with key {signed['key']}: "
                  f"{signed['chains']} chain(s) grew since they were last signed", highlight=False)  # fmt: skip


@audit_app.command("status")
def audit_status(as_json: JsonOpt = False) -> None:
    """The audit log's proofs at a glance: the key, the newest checkpoint, how many chains hold records no
    checkpoint covers yet, and the last full verification."""

    async def work(services: App) -> dict[str, Any]:
        assert services.ledger is not None
        return await services.ledger.status()

    status = audit_run(work)
    if as_json:
        render.print_json(status)
        return
    for label, value in _status_lines(status):
        console.print(f"[bold]{label:>16}[/bold]  {escape(value)}", highlight=False)


def _status_lines(status: dict[str, Any]) -> list[tuple[str, str]]:
    key = status["key"] or "none: `taskgate init` creates one"
    last, verified = status["last_checkpoint"], status["last_verified"]
    unsigned = f"{status['unsigned_records']} record(s) in {status['unsigned_chains']} chain(s)"
    if status["unsigned_chains"]:
        unsigned += ": no checkpoint covers them yet, `taskgate audit checkpoint` signs them"
    cannot = f" (cannot sign here: {status['key_error'] or 'no private key'})" if not status["can_sign"] else ""
    return [
        ("key", f"{key}{cannot}"),
        ("records", f"{status['records']} in {status['chains']} chain(s)"),
        ("checkpoints", str(status["checkpoints"])),
        ("last checkpoint", _checkpoint_line(last)),
        ("not yet signed", unsigned),
        (
            "not yet linked",
            f"{status['pending_records']} record(s)"
            + (
                ": `taskgate serve` links them within a second; a checkpoint, verify or export links them first"
                if status["pending_records"]
                else ""
            ),
        ),
        ("last verified", _verified_line(verified)),
    ]


def _checkpoint_line(last: dict[str, Any] | None) -> str:
    return f"#{last['number']} at {last['at']} ({last['reason']}, by {last['by']})" if last else "none yet"


def _verified_line(verified: dict[str, Any] | None) -> str:
    if verified is None:
        return "never: `taskgate audit verify` checks everything"
    outcome = "ok" if verified["ok"] else f"BROKEN ({verified['findings']} finding(s); first: {verified['first']})"
    return f"{verified['at']}: {outcome}, {verified['records']} record(s), checkpoint #{verified['checkpoint']}"


@audit_app.command("key")
def audit_key(
    export: Annotated[Path | None, typer.Option("--export", help="Also write the public key to this file.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the audit public key (the line to give the auditors) and its id; --export FILE writes it. Opens no
    database."""
    from taskgate.bootstrap import load_settings
    from taskgate.infrastructure.audit.keyring import FileKeyRing
    from taskgate.infrastructure.audit.keys import public_path

    private = _or_fail(load_settings).resolved_audit_key
    public = _or_fail(FileKeyRing(private).public)
    if public is None:
        fail(f"no audit key at {private}: `taskgate init` creates one ([audit] key_file names it)")
        return
    if export is not None:
        _export_key(export, public.line())
    if as_json:
        files = {"private_key_file": str(private), "public_key_file": str(public_path(private))}
        render.print_json({"key": public.key_id, "public_key": public.line(), **files,
                           "exported_to": str(export) if export else None})  # fmt: skip
        return
    say(public.line())
    console.print(f"key id {public.key_id}; give this line to the auditors: `taskgate audit verify --public-key "
                  "FILE` checks the log against their copy", highlight=False, markup=False)  # fmt: skip
    if export is not None:
        console.print(f"wrote it to {export}", highlight=False, markup=False)


def _export_key(target: Path, line: str) -> None:
    """Write the public key line to `target`, through a temporary name. An existing file holding anything else is
    refused: it may be the auditors' copy of another key."""
    if target.is_dir():
        bad_input(f"--export {target} is a folder: name the file to write")
    if not target.parent.is_dir():
        bad_input(f"--export {target}: the folder {target.parent} does not exist")
    if target.exists() and target.read_text(errors="replace").strip() != line:
        bad_input(f"--export {target} exists and holds something else: remove it first, or name another file")
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temp.write_text(line + "\n", encoding="utf-8")
    os.replace(temp, target)


@audit_app.command("prune")
def audit_prune(
    before: Annotated[str, typer.Option("--before", help="Remove records written before this time (with a zone).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Remove them (without it, only say what would go).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove the records of finished (completed or cancelled) sessions written before --before, behind a signed
    anchor per chain: what is left still verifies. Take an export first if they must be kept. Without --yes (or with
    --dry-run) nothing is removed: it says what would be, and without --dry-run exits 1."""
    at = timestamp(before, "--before")
    assert at is not None

    async def work(services: App) -> PruneReport:
        assert services.ledger is not None
        return await services.ledger.prune(at, dry_run=dry_run or not yes, actor=_local_actor(services))

    with progress_line(f"finding{'' if dry_run or not yes else ' and removing'} records written before {before}", ""):
        report = audit_run(work)
    if as_json:
        render.print_json(report.as_dict())
    total = sum(report.records.values())
    what = f"{total} record(s) of {report.sessions} finished session(s) written before {before}"
    if report.sessions == 0:
        _said(as_json, f"nothing to prune: no finished session has records written before {before}")
    elif dry_run:
        _said(as_json, f"would remove {what} (--dry-run: nothing removed)")
    elif not yes:
        fail(f"would remove {what}: pass --yes to remove them, after `taskgate audit export --output FILE` if they "
             "must be kept (the export verifies on its own)")  # fmt: skip
    else:
        counts = ", ".join(f"{table} {n}" for table, n in report.records.items())
        _said(as_json, f"removed {what} ({counts}); checkpoint #{report.checkpoint} signs where their chains resume")


def _said(as_json: bool, line: str) -> None:
    if not as_json:
        console.print(line, highlight=False, markup=False)
