"""A real git remote over smart HTTP for tests: bare repositories served by `git http-backend` behind Basic auth.

Each request runs `git http-backend` once as a CGI program (what Apache or nginx+fcgiwrap do in front of a real
forge), so clones, fetches, `ls-remote` and pushes speak git's own protocol to git's own server code, and the
credential flow is git's own too: a request without an `Authorization` header gets `401` with
`WWW-Authenticate: Basic realm="git"`, which makes git ask its credential helpers, and a wrong password gets `401`
again (git then reports "Authentication failed"). Both fetching and pushing need the token, like a private
repository on GitHub.

Every request is recorded (`requests`: method, path, status, the Basic user or None) and so is every password
presented (`seen_passwords`), so a test can say which server a token reached, and that it reached no other.
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

REALM = 'Basic realm="git"'


class GitHttpRemote:
    """Bare repositories under `root`, served by the real `git http-backend` (CGI) over HTTP with Basic auth."""

    def __init__(self, root: Path, token: str = "ghp_test", user: str = "x-access-token") -> None:
        self.root, self.token, self.user = Path(root), token, user
        self.requests: list[tuple[str, str, int, str | None]] = []
        self.seen_passwords: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self) -> GitHttpRemote:
        """Listen on 127.0.0.1:<free port> in a daemon thread; sets `url`."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="git-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> GitHttpRemote:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def repo_url(self, owner: str, name: str) -> str:
        """The clone URL of `owner/name`."""
        return f"{self.url}/{owner}/{name}.git"

    def create(self, owner: str, name: str, default_branch: str = "main") -> Path:
        """A new empty bare repository `owner/name.git` that accepts pushes over HTTP; returns its path."""
        path = self.root / owner / f"{name}.git"
        path.parent.mkdir(parents=True, exist_ok=True)
        _git("init", "--quiet", "--bare", f"--initial-branch={default_branch}", str(path))
        # http-backend refuses receive-pack for an unauthenticated REMOTE_USER unless told; we always pass one, but
        # say it outright so the repository accepts pushes whatever git's default
        _git("-C", str(path), "config", "http.receivepack", "true")
        return path

    def record(self, method: str, path: str, status: int, user: str | None, password: str | None) -> None:
        """Note one request (called by the handler threads)."""
        with self._lock:
            self.requests.append((method, path, status, user))
            if password is not None:
                self.seen_passwords.append(password)


def _git(*args: str) -> None:
    subprocess.run(["git", *args], check=True, capture_output=True, env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1"})


def _handler_for(remote: GitHttpRemote) -> type[BaseHTTPRequestHandler]:
    class Handler(_GitHandler):
        served = remote

    return Handler


class _GitHandler(BaseHTTPRequestHandler):
    """One HTTP request: check Basic auth, then hand it to `git http-backend` and relay what it prints."""

    # HTTP/1.1 so `Expect: 100-continue` is answered and connections are kept alive; every answer has a length
    protocol_version = "HTTP/1.1"
    served: GitHttpRemote

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the recorded requests say what happened

    def _serve(self) -> None:
        body = self._body()
        user, password = _basic(self.headers.get("Authorization"))
        if user is None or password != self.served.token:
            self.served.record(self.command, self.path, 401, user, password)
            denied = [("WWW-Authenticate", REALM), ("Content-Type", "text/plain")]
            self._answer(401, denied, b"authentication required\n")
            return
        status, headers, payload = self._backend(body, user)
        self.served.record(self.command, self.path, status, user, password)
        self._answer(status, headers, payload)

    def _body(self) -> bytes:
        """The request body, de-chunked: git sends large pushes with `Transfer-Encoding: chunked`."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return _read_chunked(self.rfile)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _backend(self, body: bytes, user: str) -> tuple[int, list[tuple[str, str]], bytes]:
        """Run `git http-backend` for this request; its (status, headers, body)."""
        parts = urlsplit(self.path)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_PROJECT_ROOT": str(self.served.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": unquote(parts.path),
            "QUERY_STRING": parts.query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": user,
            "REMOTE_ADDR": self.client_address[0],
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PROTOCOL": "HTTP/1.1",
        }
        # protocol v2 is negotiated through this header; http-backend reads it as HTTP_GIT_PROTOCOL (CGI's name)
        if protocol := self.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = env["HTTP_GIT_PROTOCOL"] = protocol
        if encoding := self.headers.get("Content-Encoding"):  # git gzips large fetch negotiations
            env["HTTP_CONTENT_ENCODING"] = encoding
        done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, timeout=60)
        return _parse_cgi(done.stdout)

    def _answer(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in ("content-length", "status", "transfer-encoding"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def _basic(header: str | None) -> tuple[str | None, str | None]:
    """(user, password) from a Basic `Authorization` header, or (None, None)."""
    if not header or not header.lower().startswith("basic "):
        return None, None
    try:
        user, _, password = base64.b64decode(header[6:].strip()).decode().partition(":")
    except ValueError:
        return None, None
    return user, password


def _read_chunked(stream: BinaryIO) -> bytes:
    """Decode a `Transfer-Encoding: chunked` body: hex size lines, each followed by that many bytes and CRLF."""
    out = bytearray()
    while True:
        size = int(stream.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while stream.readline() not in (b"\r\n", b"\n", b""):  # trailers, then the blank line
                pass
            return bytes(out)
        out += stream.read(size)
        stream.readline()  # the CRLF after each chunk


def _parse_cgi(output: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """Split CGI output into (status, headers, body); `Status: 404 Not Found` sets the status (200 without one)."""
    head, sep, body = output.partition(b"\r\n\r\n")
    if not sep:
        head, sep, body = output.partition(b"\n\n")
    if not sep:
        return 500, [("Content-Type", "text/plain")], b"http-backend printed no headers\n" + output
    status, headers = 200, []
    for line in head.decode("latin-1").splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() == "status":
            status = int(value.split()[0])
        elif name.strip():
            headers.append((name.strip(), value.strip()))
    return status, headers, body
