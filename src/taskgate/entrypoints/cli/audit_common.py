"""What the audit log's commands share (`audit_proofs.py`, `audit_upkeep.py`): their options, bad input as exit 2,
times that must carry a zone, the scope of a verify or export, and the public key file an auditor passes."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer

from taskgate.application.audit.ledger import Scope
from taskgate.application.timestamps import parse_timestamp
from taskgate.domain.errors import InvalidInput, NotFound
from taskgate.entrypoints.cli.common import JsonOpt, fail, run
from taskgate.entrypoints.render import err_console

if TYPE_CHECKING:
    from taskgate.application.audit.ports import PublicKey
    from taskgate.bootstrap import App

T = TypeVar("T")

BAD_INPUT = 2
"""The exit code of an audit command given something it cannot use (1 means, for `verify`, a broken log)."""

SessionOpt = Annotated[str | None, typer.Option("--session", help="One session's chain (id or prefix).")]
SinceOpt = Annotated[
    str | None, typer.Option("--since", help="Records written since then: ISO 8601 with a zone, e.g. …T10:00Z.")
]

__all__ = ["BAD_INPUT", "JsonOpt", "SessionOpt", "SinceOpt", "audit_run", "bad_input", "public_key_from",
           "scope_of", "timestamp"]  # fmt: skip


def bad_input(message: str) -> NoReturn:
    """One line on stderr naming what is wrong; exit 2. Nothing has been written."""
    fail(message, BAD_INPUT)
    raise AssertionError("unreachable")


def timestamp(text: str | None, option: str) -> datetime | None:
    """`text` read as `audit transitions` reads times, refused without a zone: a time an audit rests on is not
    guessed to be UTC. Exits 2 for a malformed or zoneless time, naming `option`."""
    if text is None:
        return None
    try:
        value = parse_timestamp(text)
    except InvalidInput as exc:
        bad_input(f"{option}: {exc}")
    if datetime.fromisoformat(text.strip()).tzinfo is None:
        bad_input(f"{option} '{text[:64]}' has no timezone: add one, e.g. 2026-11-21T10:00:00Z or +01:00")
    return value


@dataclass(frozen=True, slots=True)
class _Refused:
    message: str


def audit_run(work: Callable[[App], Awaitable[T]]) -> T:
    """`common.run`, with bad input (InvalidInput: a missing key, an ambiguous prefix; NotFound: an unknown
    session) exiting 2 rather than 1."""

    async def guarded(services: App) -> T | _Refused:
        try:
            return await work(services)
        except (InvalidInput, NotFound) as exc:
            return _Refused(str(exc))

    result = run(guarded)
    if isinstance(result, _Refused):
        bad_input(result.message)
    return result


async def scope_of(services: App, session: str | None, since: datetime | None) -> Scope:
    """The scope named by --session (an id or prefix of a session that exists) and --since.

    Raises: InvalidInput (too short or ambiguous a prefix), SessionNotFound."""
    if session is None:
        return Scope(None, since)
    session_id = await services.sessions.resolve_id(session)
    await services.sessions.get(session_id)  # a full id is not looked up by resolve_id: an unknown one is named here
    return Scope(session_id, since)


def public_key_from(path: Path) -> PublicKey:
    """The public key in the file at `path` (--public-key). Exits 2 when it is missing or not one."""
    from taskgate.infrastructure.audit.keys import load_public  # loads `cryptography`: only when a key is read

    try:
        return load_public(path)
    except InvalidInput as exc:
        bad_input(f"--public-key: {exc}")
    except OSError as exc:
        bad_input(f"--public-key {path} cannot be read ({exc.strerror or exc})")


@contextlib.contextmanager
def progress_line(what: str, unit: str, *, shown: bool = True) -> Iterator[Callable[[int], None]]:
    """A spinner on stderr while a long verify, export or prune runs, with how many `unit` it has been through
    once told, on a terminal only (pipes and logs get nothing); yields what the use case tells the count to."""
    if not (shown and err_console.is_terminal):
        yield _silent
        return
    with err_console.status(f"{what}…") as status:
        yield lambda done: status.update(f"{what}… {done:,} {unit}")


def _silent(_done: int) -> None:
    """Progress where nobody watches: a pipe or a log."""
