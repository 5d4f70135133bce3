"""`HttpWebhookSender`: one signed JSON POST per delivery attempt (stdlib urllib, in a worker thread).

httpx is not a dependency of taskgate, and a POST a second is nothing a thread cannot carry. The thread's
socket timeout bounds each connect/read; `asyncio.wait_for` bounds the whole request as seen by the caller.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import urllib.error
import urllib.request

from taskgate import __version__
from taskgate.application.webhooks.ports import OutboxEvent, SendResult

__all__ = ["HttpWebhookSender", "sign"]

_ERROR_BODY_CHARS = 200  # how much of a refusing receiver's answer goes into last_error


def sign(secret: str, body: bytes) -> str:
    """The `X-Taskgate-Signature` value: `sha256=` and the hex HMAC-SHA256 of the raw body with the secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class HttpWebhookSender:
    """POSTs `{"id", "kind", "session_id", "at", "payload"}` with the event, delivery and signature headers."""

    async def send(self, url: str, secret: str, event: OutboxEvent, *, timeout_s: float, attempt: int) -> SendResult:
        body = json.dumps(event.as_json(), separators=(",", ":"), sort_keys=True, default=str).encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"taskgate/{__version__}",
            "X-Taskgate-Event": event.kind,
            "X-Taskgate-Delivery": str(event.id),
            "X-Taskgate-Attempt": str(attempt),
            "X-Taskgate-Signature": sign(secret, body),
        }
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            return await asyncio.wait_for(asyncio.to_thread(_post, request, timeout_s), timeout_s + 1)
        except TimeoutError:
            return SendResult(None, f"timed out after {timeout_s:g}s")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is a failed delivery: urllib would turn a redirected POST into a GET without the body."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _post(request: urllib.request.Request, timeout_s: float) -> SendResult:
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            response.read()
            return _result(response.status, b"")
    except urllib.error.HTTPError as exc:  # any answer outside 2xx, redirects included
        with exc:
            return _result(exc.code, exc.read(_ERROR_BODY_CHARS))
    except TimeoutError:
        return SendResult(None, f"timed out after {timeout_s:g}s")
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            return SendResult(None, f"timed out after {timeout_s:g}s")
        return SendResult(None, f"connection failed: {reason}")
    except (OSError, ValueError) as exc:  # connection reset mid-answer, a malformed URL
        return SendResult(None, f"connection failed: {type(exc).__name__}: {exc}")


def _result(status: int, answer: bytes) -> SendResult:
    if 200 <= status < 300:
        return SendResult(status)
    text = answer.decode("utf-8", "replace").strip().replace("\n", " ")
    return SendResult(status, f"HTTP {status}" + (f": {text}" if text else ""))
