"""The console's plumbing: the services of the running server, the templates, sign-in checks, CSRF and security
headers, and the turning of taskgate's errors into pages. The pages and actions live in `pages.py` and
`actions.py`; each calls the same use cases, with the same permission checks, as the MCP tools.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from taskgate.application.board import BoardQuery
from taskgate.bootstrap import App
from taskgate.domain.access import Capability, Principal
from taskgate.domain.errors import (
    Forbidden,
    InvalidInput,
    NotFound,
    PolicyViolation,
    TaskgateError,
    Unauthenticated,
)
from taskgate.entrypoints.console.live import ChangeFeed
from taskgate.entrypoints.console.signins import COOKIE, SignIn, SignIns, check_csrf

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",  # no-referrer would make browsers send `Origin: null` on our own forms
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}
FLASH_ON_CARD_S = 30.0
_CONTROL = {c: 0x2400 + c for c in range(0x20)} | {0x7F: 0x2421}  # control characters as their visible symbols


def visible(text: Any) -> str:
    """User text with control characters (an ANSI escape's ESC included) shown as symbols, never acted on."""
    return "" if text is None else str(text).translate(_CONTROL | {0x0A: 0x0A, 0x09: 0x09})


def ago(at: datetime | None, now: datetime) -> str:
    """'3m', '2h 5m', '4d': how long ago `at` was."""
    if at is None:
        return ""
    seconds = max(0, int((now - at).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m" if hours < 24 else f"{hours // 24}d"


class Console:
    """What every console request needs: the running services, the sign-ins, the live feed, the templates."""

    def __init__(self, runtime_app: Callable[[], App | None]) -> None:
        self._runtime_app = runtime_app
        self.sign_ins = SignIns()
        self.feed = ChangeFeed(self._high_water)
        self.templates = Environment(
            loader=PackageLoader("taskgate.entrypoints.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["visible"] = visible
        self.templates.globals["ago"] = ago

    def services(self) -> App:
        app = self._runtime_app()
        if app is None:
            raise Unavailable("taskgate is starting; reload in a moment")
        return app

    def board_query(self) -> BoardQuery:
        app = self.services()
        assert app.uow is not None and app.clock is not None
        return BoardQuery(app.uow, app.sessions, app.clock)

    def render(self, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        html = self.templates.get_template(name).render(**values)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    async def _high_water(self) -> int:
        return await self.board_query().high_water()


class Unavailable(TaskgateError):
    """The services are not open (yet)."""


@dataclass(slots=True)
class Visit:
    """A signed-in request: the services, who is calling (checked again now), their sign-in."""

    console: Console
    request: Request
    app: App
    principal: Principal
    sign_in: SignIn

    async def may(self, capability: Capability, session_id: str | None = None) -> bool:
        """Whether the operator holds `capability` (for showing a control enabled; the action checks again)."""
        try:
            await self.app.operators.authorize(self.principal, capability, session_id=session_id)
        except Forbidden:
            return False
        return True

    def page(self, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        # a message about a card stays with it a while: the live part is re-rendered as things move, and the
        # refusal must not vanish with the first update; page-wide messages show once
        # A live refresh (a fetch of the live part) shows only the card messages: a page-wide message waits for
        # the next whole page, else a refresh racing the redirect after a POST would swallow it.
        now = time.monotonic()
        flash = [f for f in self.sign_in.flash if f.get("until", now) >= now]
        live = bool(self.request.headers.get("x-console-live"))
        self.sign_in.flash = [f for f in flash if f["target"] or live]
        flash = [f for f in flash if f["target"]] if live else flash
        return self.console.render(
            name, status, me=self.sign_in.operator_id, csrf=self.sign_in.csrf, flash=flash, path=self.request.url.path,
            **values,
        )  # fmt: skip

    def back(self, fallback: str, message: str | None = None, *, error: bool = False, target: str = "") -> Response:
        """303 to the form's `next` (a path of this console only) or `fallback`, with a message shown there."""
        if message:
            self.sign_in.flash.append({"text": message, "error": error, "target": target,
                                       "until": time.monotonic() + FLASH_ON_CARD_S})  # fmt: skip
        return RedirectResponse(_local(self.request.query_params.get("next"), fallback), status_code=303)


def _local(target: str | None, fallback: str) -> str:
    """`target` when it is a path on this console (never another host: no open redirect), else `fallback`."""
    if not target:
        return fallback
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return fallback
    return target


async def visit(console: Console, request: Request) -> Visit:
    """The signed-in operator of this request. Raises: Unauthenticated (no, expired or revoked sign-in)."""
    sign_in = console.sign_ins.find(request.cookies.get(COOKIE))
    if sign_in is None:
        raise Unauthenticated("sign in first")
    app = console.services()
    try:
        principal = await app.access.authenticate(sign_in.token)  # revoked since sign-in: out
    except Unauthenticated:
        console.sign_ins.close(request.cookies.get(COOKIE))
        raise
    return Visit(console, request, app, principal, sign_in)


_STATUS = ((Unauthenticated, 401), (Forbidden, 403), (NotFound, 404), (PolicyViolation, 409), (InvalidInput, 400),
           (Unavailable, 503))  # fmt: skip


def status_of(exc: TaskgateError) -> int:
    return next((code for kind, code in _STATUS if isinstance(exc, kind)), 409)


Handler = Callable[[Visit], Awaitable[Response]]


def page(console: Console) -> Callable[[Handler], Callable[[Request], Awaitable[Response]]]:
    """A GET handler that needs a sign-in: without one it redirects to the sign-in page; errors become a page."""

    def wrap(fn: Handler) -> Callable[[Request], Awaitable[Response]]:
        @functools.wraps(fn)
        async def endpoint(request: Request) -> Response:
            try:
                current = await visit(console, request)
            except Unauthenticated:
                return RedirectResponse(f"/signin?next={request.url.path}", status_code=303)
            try:
                return await fn(current)
            except TaskgateError as exc:
                return current.page("error.html", status_of(exc), error=f"{type(exc).__name__}: {exc}")

        return endpoint

    return wrap


def action(console: Console) -> Callable[[Handler], Callable[[Request], Awaitable[Response]]]:
    """A POST handler: needs a sign-in, a same-origin request and the sign-in's CSRF token, else 403 and nothing
    is done. A refusal by a use case comes back to the page it was sent from, with the reason shown there."""

    def wrap(fn: Handler) -> Callable[[Request], Awaitable[Response]]:
        @functools.wraps(fn)
        async def endpoint(request: Request) -> Response:
            try:
                current = await visit(console, request)
            except Unauthenticated as exc:
                return _forbidden(console, str(exc), 401)
            form = await request.form()
            if not _same_origin(request) or not check_csrf(current.sign_in, _text(form.get("csrf"))):
                return _forbidden(console, "this request did not come from a console page (CSRF check failed)")
            try:
                return await fn(current)
            except Forbidden as exc:
                return _forbidden(console, str(exc))
            except TaskgateError as exc:
                return current.back(_sent_from(request), f"{type(exc).__name__}: {exc}", error=True,
                                    target=_text(form.get("target")) or "")  # fmt: skip

        return endpoint

    return wrap


def _sent_from(request: Request) -> str:
    """The console page a form was sent from (its Referer, when it is this console's), else the board."""
    referer = urlsplit(request.headers.get("referer", ""))
    if referer.netloc != request.headers.get("host", "") or not referer.path.startswith("/"):
        return "/"
    return referer.path + (f"?{referer.query}" if referer.query else "")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _forbidden(console: Console, message: str, status: int = 403) -> HTMLResponse:
    return console.render("error.html", status, error=message, me=None, csrf="", flash=[], path="")


def _same_origin(request: Request) -> bool:
    """A browser sends Origin on every POST; when it does, it must be this console's own."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return urlsplit(origin).netloc == host
