"""Notifications through Apprise (docs/notifications.md): one library for e-mail, Slack, Discord, ntfy, JSON
webhooks and a hundred more, each a URL (docs/decisions.md says why Apprise).

Channel URLs carry secrets (passwords, tokens, webhook keys): they are shown only as Apprise's privacy form
(`mailto://user:****@host`), or, for a URL Apprise cannot read, as its scheme alone. Apprise's `notify` is blocking
(smtplib, requests): it runs in a thread. Apprise is imported at the first use, not when taskgate starts.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from typing import Any

_CAPTURE = threading.Lock()  # Apprise's log capture is process-wide: one send at a time, so its error is its own
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _apprise() -> Any:
    import apprise

    # Apprise logs the URLs it loads (secrets and all) at DEBUG: its records stay out of taskgate's log; a failed
    # send's reason is captured (`LogCapture`) and scrubbed instead
    logging.getLogger("apprise").propagate = False
    return apprise


def masked(url: str) -> str:
    """The URL as safe to print: Apprise's privacy form (passwords as ****) up to its host, the path as `/…` (a
    webhook's path is often its key, which Apprise does not count as private), no query; else `scheme://…`."""
    plugin = _instantiate(url)
    if plugin is None:
        found = _SCHEME.match(url)
        return f"{found.group(1)}://…" if found else "(not a URL)"
    private = str(plugin.url(privacy=True)).split("?")[0]
    scheme, _, rest = private.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host}" + ("/…" if slash and path.strip("/") else "")


def check_channel(url: str) -> str:
    """The masked form of a channel URL Apprise can send to. Raises: ValueError naming it masked, not in full."""
    if _instantiate(url) is None:
        raise ValueError(f"not a URL Apprise can send to: {masked(url)} (see https://appriseit.com/services/)")
    return masked(url)


def _instantiate(url: str) -> Any:
    apprise = _apprise()
    # Apprise logs why it refuses a URL, with the URL in it: keep that out of taskgate's log
    with apprise.LogCapture(level=logging.DEBUG):
        return apprise.Apprise.instantiate(url, suppress_exceptions=True)


class AppriseSender:
    """Sends one message to one Apprise URL; a failure comes back as a reason, never raised."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self._timeout_s = timeout_s

    async def send(self, url: str, title: str, body: str) -> str | None:
        try:
            return await asyncio.wait_for(asyncio.to_thread(self._send, url, title, body), self._timeout_s)
        except TimeoutError:
            return f"no answer within {self._timeout_s:g} s"

    @staticmethod
    def _send(url: str, title: str, body: str) -> str | None:
        apprise = _apprise()
        notifier = apprise.Apprise()
        if not notifier.add(url):
            return "not a URL Apprise can send to"
        with _CAPTURE, apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as captured:
            ok = bool(notifier.notify(title=title, body=body, body_format=apprise.NotifyFormat.TEXT))
        if ok:
            return None
        said = [line.strip() for line in captured.getvalue().splitlines() if line.strip()]
        return _scrub(said[-1] if said else "the channel refused the message", url)


def _scrub(text: str, url: str) -> str:
    """Apprise's error line without the URL's secrets (its password and path may appear in it)."""
    found = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://(?:([^:@/]*)(?::([^@/]*))?@)?[^/?]*(/[^?]*)?", url)
    if found:
        for secret in found.groups():
            for part in (secret or "").strip("/").split("/"):
                if len(part) >= 4:
                    text = text.replace(part, "****")
    return text[:300]
