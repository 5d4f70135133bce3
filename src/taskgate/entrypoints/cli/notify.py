"""`taskgate notify`: the notification channels of `[notify]` (docs/notifications.md): what each has sent, what waits
and why, and a test message to each."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from taskgate.domain.errors import InvalidInput
from taskgate.entrypoints import render
from taskgate.entrypoints.cli.common import JsonOpt, emit, group, run
from taskgate.entrypoints.render import console

if TYPE_CHECKING:
    from taskgate.application.notifications.notifier import ChannelStatus, Notifier
    from taskgate.bootstrap import App

notify_app = group("notify", no_args_is_help=True)


def _notifier(services: App) -> Notifier:
    """The configured notifier. Raises: InvalidInput when `[notify]` has no channel."""
    from taskgate.bootstrap import build_notifier, load_settings

    notifier = build_notifier(services.settings or load_settings(), services)
    if notifier is None:
        raise InvalidInput("no notification channels: add [notify] channels = [...] (see docs/notifications.md)")
    return notifier


@notify_app.command("status")
def notify_status(as_json: JsonOpt = False) -> None:
    """Per channel (masked): notices pending, sent and given up, and the last error with the next try. Exits 4
    while a channel has notices it gave up on or is retrying, so scripts notice."""

    async def work(services: App):
        return await _notifier(services).status()

    rows = run(work)
    emit(
        rows,
        as_json,
        lambda: render.table(
            "Notification channels",
            ["channel", "scope", "kinds", "pending", "sent", "failed", "next try", "last error"],
            (
                [
                    s.channel,
                    s.scope,
                    ", ".join(s.kinds),
                    s.pending,
                    s.sent,
                    s.failed,
                    s.next_attempt_at.isoformat(timespec="seconds") if s.next_attempt_at else "",
                    s.last_error or "",
                ]
                for s in rows
            ),
            markup=False,
        ),
    )
    if any(s.failed or s.last_error for s in rows):
        raise typer.Exit(4)


def _when(status: ChannelStatus) -> str:
    return status.next_attempt_at.isoformat(timespec="seconds") if status.next_attempt_at else ""


@notify_app.command("test")
def notify_test() -> None:
    """Send a test message to every channel now (nothing is queued) and say which ones took it. Exits 4 when one
    did not."""

    async def work(services: App):
        return await _notifier(services).test()

    results = run(work)
    for shown, error in results:
        console.print(f"{shown}: {'sent' if error is None else f'failed: {error}'}", highlight=False, markup=False)
    if any(error is not None for _, error in results):
        raise typer.Exit(4)
