"""Webhook deliveries signed and sent the way GitHub's Hookshot sends them."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import queue
import threading
import uuid
from collections.abc import Callable

import httpx

HOOK_ID = 424_242_424


def signature_256(secret: str, body: bytes) -> str:
    """X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signature_1(secret: str, body: bytes) -> str:
    """X-Hub-Signature (legacy, still sent by GitHub): sha1=<hex HMAC-SHA1>."""
    return "sha1=" + hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()


class Deliverer:
    """Sends deliveries: `send` in the caller's thread, `enqueue` from one background thread (in order)."""

    def __init__(self, target: Callable[[], tuple[str | None, str | None]], repo_id: int) -> None:
        self._target = target  # () -> (webhook_url, webhook_secret), read at send time
        self._repo_id = repo_id
        self.deliveries: list[tuple[str, str, int]] = []
        self._queue: queue.Queue[tuple[str, dict]] = queue.Queue()
        self._thread = threading.Thread(target=self._work, daemon=True, name="github-standin-hooks")
        self._thread.start()

    def send(self, event: str, payload: dict) -> int:
        """POST one delivery now; the receiver's status (0 when it could not be reached). Never raises."""
        url, secret = self._target()
        if not url:
            raise RuntimeError("webhook_url is not set")
        body = json.dumps(payload, separators=(",", ":")).encode()
        delivery = str(uuid.uuid4())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/5f3a1b2",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery,
            "X-GitHub-Hook-ID": str(HOOK_ID),
            "X-GitHub-Hook-Installation-Target-Type": "repository",
            "X-GitHub-Hook-Installation-Target-ID": str(self._repo_id),
        }
        if secret:
            headers["X-Hub-Signature"] = signature_1(secret, body)
            headers["X-Hub-Signature-256"] = signature_256(secret, body)
        try:
            status = httpx.post(url, content=body, headers=headers, timeout=10).status_code
        except httpx.HTTPError:
            status = 0  # GitHub records a failed delivery and moves on
        self.deliveries.append((event, delivery, status))
        return status

    def enqueue(self, event: str, payload: dict) -> None:
        """Deliver later from the background thread (the control call or request does not wait)."""
        self._queue.put((event, payload))

    def flush(self, timeout: float = 10) -> None:
        """Wait until every enqueued delivery has been sent."""
        done = threading.Event()
        self._queue.put(("__flush__", {"event": done}))
        if not done.wait(timeout):
            raise TimeoutError("webhook deliveries still pending")

    def close(self) -> None:
        """Stop the background thread after what is queued."""
        self._queue.put(("__stop__", {}))
        self._thread.join(timeout=10)

    def _work(self) -> None:
        while True:
            event, payload = self._queue.get()
            if event == "__flush__":
                payload["event"].set()
            elif event == "__stop__":
                return
            else:
                with contextlib.suppress(RuntimeError):  # the url was unset after the event: nowhere to send
                    self.send(event, payload)
