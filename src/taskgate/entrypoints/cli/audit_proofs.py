"""The audit log's proofs: `audit verify` (the database, or an export file offline) and `audit export`.

Exit codes of `audit verify`: 0 when everything checks, 1 when something is broken (its findings, the first one
first), 2 for bad input (an option, a file, a key that is not one). `verify --file` opens no database and reads no
configuration: it runs on any machine with taskgate installed, from any folder (docs/audit.md).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from taskgate.application.audit.ledger import VerifyReport
from taskgate.domain.errors import InvalidInput
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.audit_common import (
    JsonOpt,
    SessionOpt,
    SinceOpt,
    audit_run,
    bad_input,
    progress_line,
    public_key_from,
    scope_of,
    timestamp,
)
from taskgate.entrypoints.cli.common import ReaderGone, _local_actor, audit_app
from taskgate.entrypoints.render import console, err_console

if TYPE_CHECKING:
    from taskgate.bootstrap import App

_SHOWN_FINDINGS = 20  # after the first; --json lists up to the ledger's cap (100)


@audit_app.command("verify")
def audit_verify(
    session: SessionOpt = None,
    since: SinceOpt = None,
    public_key: Annotated[
        Path | None, typer.Option("--public-key", help="Verify with this public key file (the auditors' copy).")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", help="Verify an export file instead, offline (needs --public-key).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-compute the audit chains and check the signed checkpoints; name the first broken record. Exits 0 when
    everything checks, 1 when something is broken, 2 for bad input. With --file, verify an export (`taskgate audit
    export`) without any database or configuration: only the export and the public key."""
    if file is not None:
        if session is not None or since is not None:
            bad_input("--session and --since do not apply to --file: an export is verified whole, in its own scope")
        report = _verify_export(file, public_key)
    else:
        report = _verify_database(session, timestamp(since, "--since"), public_key)
    if as_json:
        render.print_json(report.as_dict())
    else:
        _print_report(report, source=str(file) if file else None)
    if not report.ok:
        raise typer.Exit(1)


def _verify_database(session: str | None, since: datetime | None, public_key: Path | None) -> VerifyReport:
    key = public_key_from(public_key) if public_key is not None else None

    async def work(services: App) -> VerifyReport:
        assert services.ledger is not None
        scope = await scope_of(services, session, since)
        # Every scope checks the whole checkpoint chain: its audit.verified event (with the scope) is the last
        # verification whatever the scope, as from the MCP tool.
        return await services.ledger.verify(scope, key, actor=_local_actor(services), progress=progress)

    with progress_line("verifying the audit chains", "records") as progress:
        return audit_run(work)


def _verify_export(file: Path, public_key: Path | None) -> VerifyReport:
    if public_key is None:
        bad_input("--file needs --public-key KEY: the public key file (the auditors' copy) to check its signatures")
    from taskgate.application.audit.export import verify_export

    key = public_key_from(public_key)
    try:
        with file.open(encoding="utf-8") as lines, progress_line(f"verifying {file}", "lines") as progress:
            return verify_export(lines, key, str(file), progress)
    except InvalidInput as exc:
        bad_input(str(exc))
    except FileNotFoundError:
        bad_input(f"--file {file}: no such file")
    except UnicodeDecodeError:
        bad_input(f"--file {file} is not a taskgate audit export (not UTF-8 text)")
    except OSError as exc:
        bad_input(f"--file {file} cannot be read ({exc.strerror or exc})")


def _print_report(report: VerifyReport, source: str | None) -> None:
    what = source or "audit log"
    if report.ok:
        console.print(f"[green bold]OK[/green bold]  {escape(what)}: nothing was changed", highlight=False)
    else:
        first, *others = report.findings
        console.print(f"[red bold]BROKEN[/red bold]  {escape(first.describe())}", highlight=False)
        for finding in others[:_SHOWN_FINDINGS]:
            console.print(f"  also: {finding.describe()}", highlight=False, markup=False)
        if len(others) > _SHOWN_FINDINGS:
            console.print(f"  … and {len(others) - _SHOWN_FINDINGS} more (--json lists them)", highlight=False)
    for label, value in _summary(report, signs_now=source is None):
        console.print(f"  {label:>15}  {value}", highlight=False, markup=False)


def _summary(report: VerifyReport, signs_now: bool) -> list[tuple[str, str]]:
    scope = report.scope
    shown = [("records checked", f"{report.records} in {report.chains} chain(s)")]
    if scope.session_id or scope.since:
        parts = [
            f"session {scope.session_id}" if scope.session_id else "",
            f"since {scope.since}" if scope.since else "",
        ]
        shown.append(("scope", ", ".join(p for p in parts if p)))
    shown.append(("checkpoints", str(report.checkpoints)))
    last = report.last_checkpoint
    if last:
        shown.append(("last checkpoint", f"#{last['number']} at {last['at']} ({last['reason']}, by {last['by']}, "
                                         f"{last['chains']} chain(s), key {last['key']})"))  # fmt: skip
    unsigned = f"{report.unsigned} record(s)"
    if report.unsigned and signs_now:
        unsigned += " (chained, not yet signed: `taskgate audit checkpoint` signs them now)"
    elif report.unsigned:
        unsigned += " (written after the export's newest checkpoint: checked against their chain only)"
    shown += [("not yet signed", unsigned), ("verifying key", report.key_id), ("took", f"{report.seconds:.2f} s")]
    return shown


@audit_app.command("export")
def audit_export(
    fmt: Annotated[str, typer.Option("--format", help="The export format: jsonl (the only one).")] = "jsonl",
    session: SessionOpt = None,
    since: SinceOpt = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file (default: stdout).")] = None,
) -> None:
    """Export the audit records in scope with their proofs and every signed checkpoint, one JSON object per line,
    verifiable anywhere with `taskgate audit verify --file EXPORT --public-key KEY`. With --output the file appears
    only once complete; the counts go to stderr."""
    if fmt != "jsonl":
        bad_input(f"--format {fmt!r} is not an export format: the only one is jsonl")
    since_at = timestamp(since, "--since")
    if output is not None:
        _check_output(output)

    async def work(services: App) -> dict[str, int]:
        from taskgate.application.audit.export import export

        assert services.ledger is not None and services.uow is not None and services.clock is not None
        scope = await scope_of(services, session, since_at)
        key = services.ledger.public_key
        with _lines_to(output) as write:
            return await export(services.uow, services.clock, scope, key.key_id if key else None, write, progress)

    # No spinner over records written to this very terminal: the two would garble each other.
    shown = output is not None or not sys.stdout.isatty()
    with progress_line(f"exporting to {output}" if output else "exporting", "records", shown=shown) as progress:
        counts = audit_run(work)
    where = f" to {output}" if output else ""
    err_console.print(f"exported {counts['records']} record(s) and {counts['checkpoints']} checkpoint(s){where}",
                      highlight=False, markup=False)  # fmt: skip


def _check_output(output: Path) -> None:
    if output.is_dir():
        bad_input(f"--output {output} is a folder: name the file to write")
    if not output.parent.is_dir():
        bad_input(f"--output {output}: the folder {output.parent} does not exist")


@contextlib.contextmanager
def _lines_to(output: Path | None) -> Iterator[Callable[[str], None]]:
    """A writer of lines: to stdout, or to a temporary file beside `output` renamed onto it once all is written
    (an export that fails leaves no half file, and an older export at that name stays until the new one is whole)."""
    if output is None:
        try:
            yield lambda line: sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except BrokenPipeError as exc:  # `taskgate audit export | head`: the reader has all it wanted
            raise ReaderGone(exc) from exc
        return
    temp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    out = temp.open("w", encoding="utf-8")
    try:
        yield lambda line: out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())
        out.close()
        os.replace(temp, output)
    except BaseException:
        out.close()
        temp.unlink(missing_ok=True)
        raise
