"""HTTP plumbing: a threaded HTTP/1.1 server that hands each request to a handler and writes its Reply."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit


@dataclass
class Request:
    """One HTTP request, decoded."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    body: bytes


@dataclass
class Reply:
    """One HTTP answer: `body` is JSON-able (sent as JSON), bytes or str (sent as is), or None (empty)."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json; charset=utf-8"

    def encoded(self) -> bytes:
        """The body's bytes (JSON compact, as GitHub sends it)."""
        if self.body is None:
            return b""
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode()
        return json.dumps(self.body, separators=(",", ":")).encode()


class HttpServer:
    """Serve `handle(Request) -> Reply` on 127.0.0.1:<free port>, a thread per connection."""

    def __init__(self, handle: Callable[[Request], Reply]) -> None:
        self._handle = handle
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """http://127.0.0.1:PORT (once started)."""
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Bind and serve in a background thread."""
        handler = type("Handler", (_Handler,), {"handle_request": staticmethod(self._handle)})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        assert self._thread is not None
        self._thread.join(timeout=5)
        self._server = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as clients pool connections
    server_version = "GitHub.com"
    sys_version = ""
    handle_request: Callable[[Request], Reply]

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        request = Request(
            method=self.command,
            path=unquote(parts.path),  # branch names with slashes arrive %-encoded
            query=dict(parse_qsl(parts.query)),
            headers={k.lower(): v for k, v in self.headers.items()},
            body=self.rfile.read(length) if length else b"",
        )
        reply = self.handle_request(request)
        body = reply.encoded()
        self.send_response(reply.status)
        if body or reply.status not in (204, 304):
            self.send_header("Content-Type", reply.content_type)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = do_HEAD = _serve

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the stand-in records calls itself."""
