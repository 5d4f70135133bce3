"""Notifications through Apprise (docs/notifications.md): one library for e-mail, Slack, Discord, ntfy, JSON
webhooks and many more, each a URL (docs/decisions.md says why Apprise).

Channel URLs carry secrets (passwords, tokens, webhook keys): they are shown only as Apprise's privacy form up to
the host (`mailto://user:****@host/…`), or, for a URL Apprise cannot read, as its scheme alone. Apprise's `notify`
is blocking (smtplib, requests): it runs in a thread. Apprise says why a send failed only in its log, with the
URL in it: its logger does not propagate into taskgate's; a handler keeps each send's warnings apart, so
channels sent side by side each get their own reason, scrubbed of the URL's secrets. Apprise is imported at the
first use, not when taskgate starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


_SAID: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("taskgate_apprise_said", default=None)


class _SendWarnings(logging.Handler):
    """Apprise's warnings, to the send that caused them: Apprise runs a service on its worker threads in a copy of
    the caller's context, so a context variable (not the thread) says whose send it is."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        lines = _SAID.get()
        if lines is not None:
            lines.append(record.getMessage())


_WARNINGS = _SendWarnings()


def _apprise() -> Any:
    import apprise

    apprise_log = logging.getLogger("apprise")
    if _WARNINGS not in apprise_log.handlers:
        apprise_log.propagate = False  # it logs the URLs it loads, secrets and all
        apprise_log.addHandler(_WARNINGS)
    return apprise


@contextlib.contextmanager
def _listening() -> Iterator[list[str]]:
    lines: list[str] = []
    token = _SAID.set(lines)
    try:
        yield lines
    finally:
        _SAID.reset(token)


def masked(url: str) -> str:
    """The URL as safe to print: Apprise's privacy form (passwords as ****) up to its host, the path as `/…` (a
    webhook's path is often its key, which Apprise does not count as private), a dotless host other than localhost
    as `t...c` (an ntfy topic is the host), no query; else `scheme://…`."""
    plugin = _instantiate(url)
    if plugin is None:
        found = _SCHEME.match(url)
        return f"{found.group(1)}://…" if found else "(not a URL)"
    private = str(plugin.url(privacy=True)).split("?")[0]
    scheme, _, rest = private.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}://{_host(host)}" + ("/…" if slash and path.strip("/") else "")


def _host(authority: str) -> str:
    """The host part as shown: a name with no dot that is not localhost is a service's key in the host's place
    (an ntfy topic, a webhook id), shown by its first and last characters as Apprise shows tokens."""
    credentials, at, hostport = authority.rpartition("@")
    host, colon, port = hostport.partition(":")
    if "." not in host and host not in ("localhost", "") and "..." not in host and not host.startswith("["):
        host = f"{host[0]}...{host[-1]}" if len(host) > 2 else "..."
    return f"{credentials}{at}{host}{colon}{port}"


def check_channel(url: str) -> str:
    """The masked form of a channel URL Apprise can send to. Raises: ValueError naming it masked, not in full."""
    if _instantiate(url) is None:
        raise ValueError(f"not a URL Apprise can send to: {masked(url)} (see https://appriseit.com/services/)")
    return masked(url)


def _instantiate(url: str) -> Any:
    return _apprise().Apprise.instantiate(url, suppress_exceptions=True)


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
        with _listening() as said:
            if not notifier.add(url):
                return "not a URL Apprise can send to"
            if notifier.notify(title=title, body=body, body_format=apprise.NotifyFormat.TEXT):
                return None
        return scrub(said[-1] if said else "the channel refused the message", url)


def scrub(text: str, url: str) -> str:
    """`text` without the URL's secrets: its user, password, path segments and query values (4 characters or more,
    so a port or a short word is left alone), at most 300 characters."""
    try:
        parts = urlsplit(url)
        secrets = [parts.username, parts.password, *parts.path.split("/"), *(v for _, v in parse_qsl(parts.query))]
    except ValueError:
        secrets = [url]
    for secret in sorted((s for s in secrets if s and len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, "****")
    return text[:300]
