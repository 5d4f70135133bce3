"""Who is signed in to the console: server-side sign-ins behind an HttpOnly, SameSite=Strict cookie, and their CSRF
tokens.

An operator signs in with an operator token (agent tokens are refused). The cookie holds only a random sign-in id;
the token stays in this process's memory and is authenticated again on every request through the same
`AccessService.authenticate` as the MCP gate, so a revoked token ends its console sign-ins at once. A restart of
the service signs everyone out (nothing of a sign-in is written anywhere). Each sign-in has its own CSRF token,
which every form carries and every state-changing request must echo (`check_csrf`).
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from taskgate.domain.access import Principal
from taskgate.domain.errors import Unauthenticated

COOKIE = "taskgate_console"
LIFETIME_S = 12 * 3600
LINK_TTL_S = 600


@dataclass(slots=True)
class SignIn:
    token: str
    csrf: str
    operator_id: str
    expires: float
    flash: list[dict[str, Any]] = field(default_factory=list)  # messages for the next page shown


class SignIns:
    """The console's sign-ins, in memory. All methods run on the event loop thread, so no lock is needed."""

    def __init__(self, lifetime_s: float = LIFETIME_S) -> None:
        self._by_id: dict[str, SignIn] = {}
        self._links: dict[str, tuple[str, float]] = {}  # one-time code → (token, expiry)
        self._lifetime = lifetime_s

    def link(self, token: str, ttl_s: float = LINK_TTL_S) -> str:
        """A one-time sign-in code for `token` (`taskgate console` prints it in a URL: the code, never the token).
        It works once, within `ttl_s` seconds."""
        code = secrets.token_urlsafe(24)
        self._links[code] = (token, time.monotonic() + ttl_s)
        return code

    def redeem(self, code: str | None) -> str | None:
        """The token of a live one-time code, which is spent by this call; None for a spent, expired or unknown one."""
        token, expires = self._links.pop(code or "", ("", 0.0))
        return token if token and expires >= time.monotonic() else None

    def open(self, token: str, principal: Principal) -> tuple[str, SignIn]:
        """A new sign-in for an operator's token; returns the cookie value and the sign-in.

        Raises: Unauthenticated for an agent's token (agents use MCP, never the console)."""
        if principal.operator_id is None:
            raise Unauthenticated("agent tokens cannot sign in to the console; use an operator token")
        self._forget_expired()
        sign_in = SignIn(token, secrets.token_urlsafe(32), principal.operator_id, time.monotonic() + self._lifetime)
        cookie = secrets.token_urlsafe(32)
        self._by_id[cookie] = sign_in
        return cookie, sign_in

    def find(self, cookie: str | None) -> SignIn | None:
        """The live sign-in a cookie names, or None."""
        sign_in = self._by_id.get(cookie or "")
        if sign_in is None or sign_in.expires < time.monotonic():
            return None
        return sign_in

    def close(self, cookie: str | None) -> None:
        self._by_id.pop(cookie or "", None)

    def __len__(self) -> int:
        return len(self._by_id)

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for cookie in [c for c, s in self._by_id.items() if s.expires < now]:
            del self._by_id[cookie]


def check_csrf(sign_in: SignIn, sent: str | None) -> bool:
    """Whether a request echoed its sign-in's CSRF token (compared in constant time)."""
    return bool(sent) and hmac.compare_digest(sign_in.csrf.encode(), (sent or "").encode())
