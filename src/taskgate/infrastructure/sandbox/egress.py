"""The network gate, host side: the only way out of an agent's network namespace (docs/design/sandbox.md, §3).

The agent's sandbox has only a loopback interface. Its in-sandbox init (`inside`) relays the agent's connections
to one Unix socket, bound into the sandbox, on which an `EgressGate` listens outside it. Each connection on that
socket speaks one HTTP proxy request: `CONNECT host:port` (a tunnel) or an absolute-form plain HTTP request
(`GET http://host:port/path`). The gate opens a TCP connection from the host (names resolve on the host) only to
a target on the agent's allow-list, and records every refusal as one JSON line in the refusals file.

Standard library only: it runs in a thread of `agent_exec`, which must start fast.

How races are prevented: every connection is served by its own daemon thread and shares nothing mutable with
the others (the allow-list is parsed once, before the first connection, and never changes). A refusal is one
`os.write` of one whole line on a file descriptor opened with O_APPEND, so concurrent writers (other threads,
other agents' gates) never interleave within a line. The socket is created with mode 0600 before it is bound,
so there is no moment at which another user could connect to it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sys
import threading
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from taskgate.infrastructure.sandbox.relay import HeadError, read_head, splice

CONNECT_TIMEOUT = 10.0  # seconds to reach an allowed target before answering 502
_ACCEPT_POLL = 0.2  # how often the accept loop looks whether close() was called


def parse_allow(entries: Iterable[str]) -> list[tuple[str, str]]:
    """Parse `host:port` allow entries into (host, port) pairs, lower-cased.

    `host` may be `*.example.com` (any subdomain of example.com, not example.com itself) and `port` may be `*`
    (any port); an IPv6 address is written in brackets (`[::1]:443`). Raises ValueError naming the bad entry.
    """
    return [_parse_entry(entry) for entry in entries]


def _parse_entry(entry: str) -> tuple[str, str]:
    if not isinstance(entry, str):
        raise ValueError(f"network allow entry {entry!r} is not a 'host:port' string")
    host, sep, port = entry.strip().lower().rpartition(":")
    if not sep or not host:
        raise ValueError(f"network allow entry {entry!r} has no port: write it as 'host:port' (port may be '*')")
    host = _unbracket(host)
    if port != "*" and _port_number(port) is None:
        raise ValueError(f"network allow entry {entry!r}: port {port!r} is not '*' or a number from 1 to 65535")
    name = host[2:] if host.startswith("*.") else host
    if not name or "*" in name or any(c.isspace() or c in "/@?#[]" for c in name):
        raise ValueError(f"network allow entry {entry!r}: {host!r} is not a host name, an address or '*.domain'")
    return host, port


def _unbracket(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _port_number(text: str) -> int | None:
    """The port as a number, or None when it is not a decimal from 1 to 65535."""
    if not text.isascii() or not text.isdigit() or len(text) > 5:
        return None
    number = int(text)
    return number if 1 <= number <= 65535 else None


def is_allowed(allow: Sequence[tuple[str, str]], host: str, port: int) -> bool:
    """Whether host:port matches an entry of a parsed allow-list (`parse_allow`)."""
    host = host.lower().rstrip(".")
    for allowed_host, allowed_port in allow:
        if allowed_port != "*" and allowed_port != str(port):
            continue
        if (allowed_host.startswith("*.") and host.endswith(allowed_host[1:])) or host == allowed_host:
            return True
    return False


def _target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class BadRequest(Exception):
    """The client's request cannot be understood: it is answered 400."""


class ProxyRequest:
    """One parsed proxy request: where it goes and, for plain HTTP, the head to send there."""

    def __init__(self, kind: str, host: str, port: int, upstream_head: bytes = b"") -> None:
        self.kind = kind  # "connect", "http" or "refused" (a catch-all report from inside the sandbox)
        self.host = host
        self.port = port
        self.upstream_head = upstream_head

    @property
    def target(self) -> str:
        return _target(self.host, self.port)


def parse_request(head: bytes) -> ProxyRequest:
    """Parse a proxy request head (without its blank line); raises BadRequest."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes every byte
        raise BadRequest("undecodable head") from exc
    request_line, *header_lines = text.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"not an HTTP/1.x request line: {request_line[:200]!r}")
    method, target, version = parts
    if method == "CONNECT":
        return ProxyRequest("connect", *_authority(target))
    if method == "REFUSED":
        return ProxyRequest("refused", *_authority(target))
    return _absolute_form(method, target, version, header_lines)


def _authority(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    number = _port_number(port)
    host = _unbracket(host)
    if not sep or not host or number is None or any(c.isspace() or c in "/@?#[]" for c in host):
        raise BadRequest(f"not a host:port target: {text[:200]!r}")
    return host, number


def _absolute_form(method: str, target: str, version: str, header_lines: list[str]) -> ProxyRequest:
    """A plain HTTP proxy request: rewritten to origin form, without Proxy-* headers, one request per connection."""
    try:
        url = urlsplit(target)
        host, port = url.hostname, url.port or 80
    except ValueError as exc:
        raise BadRequest(f"not a URL: {target[:200]!r}") from exc
    if url.scheme != "http" or not host or not 1 <= port <= 65535:
        raise BadRequest(f"a proxy request needs an absolute http:// URL, not {target[:200]!r}")
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    # Connection: close, so that the server ends the connection after one answer: a second request on the same
    # connection could name another host, and would not be checked against the allow-list.
    kept = [line for line in header_lines if not _dropped_header(line)]
    lines = [f"{method} {path} {version}", *kept, "Connection: close", "", ""]
    return ProxyRequest("http", host, port, "\r\n".join(lines).encode("latin-1"))


def _dropped_header(line: str) -> bool:
    name = line.partition(":")[0].strip().lower()
    return name.startswith("proxy-") or name == "connection"


class EgressGate:
    """Serves one agent's proxy requests on a Unix socket, allowing only the listed `host:port` targets."""

    def __init__(self, socket_path: str, allow: Sequence[str], refusals_path: str, agent: str = "") -> None:
        """`allow` as for `parse_allow` (ValueError on a bad entry); `refusals_path` gets one JSON line per refusal;
        `agent` names the agent in those lines."""
        self.socket_path = socket_path
        self.allow = parse_allow(allow)
        self.refusals_path = refusals_path
        self.agent = agent
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind the Unix socket (mode 0600) and serve each connection in a daemon thread."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        os.fchmod(listener.fileno(), 0o600)  # Linux gives the bound file the socket's mode: 0600 from the start
        listener.bind(self.socket_path)
        os.chmod(self.socket_path, 0o600)  # and again, for a kernel that does not
        listener.listen(64)
        listener.settimeout(_ACCEPT_POLL)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept_loop, name="egress-gate", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting and unlink the socket. Relays already running end with their connections."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            threading.Thread(target=self._serve, args=(client,), name="egress-connection", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        """Serve one connection: answer or refuse its one request, then relay it until it ends."""
        try:
            head, rest = read_head(client)
            request = parse_request(head)
        except (HeadError, BadRequest) as exc:
            _answer(client, 400, "Bad Request", f"taskgate network gate: {exc}\n")
            return
        except OSError:
            client.close()
            return
        if request.kind == "refused":
            self._refuse(client, request.target, "catch-all")
        elif not is_allowed(self.allow, request.host, request.port):
            self._refuse(client, request.target, "proxy")
        else:
            self._relay(client, request, rest)

    def _relay(self, client: socket.socket, request: ProxyRequest, rest: bytes) -> None:
        try:
            upstream = socket.create_connection((request.host, request.port), timeout=CONNECT_TIMEOUT)
        except OSError as exc:
            _answer(client, 502, "Bad Gateway", f"taskgate network gate: cannot reach {request.target}: {exc}\n")
            return
        upstream.settimeout(None)
        try:
            if request.kind == "connect":
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(request.upstream_head)
            if rest:
                upstream.sendall(rest)
        except OSError:
            client.close()
            upstream.close()
            return
        splice(client, upstream)

    def _refuse(self, client: socket.socket, target: str, source: str) -> None:
        try:
            self.record_refusal(target, source)
        except OSError as exc:  # the refusal still stands; say on the agent's output that it went unrecorded
            print(f"[taskgate sandbox] could not record the refusal of {target}: {exc}", file=sys.stderr, flush=True)
        body = f"taskgate network gate: {target} is not on this agent's network allow-list\n"
        _answer(client, 403, "Forbidden", body)

    def record_refusal(self, target: str, source: str) -> None:
        """Append one refusal as one JSON line: a single write on an O_APPEND descriptor, so lines never mix."""
        line = json.dumps(
            {
                "what": "connect",
                "target": target,
                "source": source,
                "agent": self.agent,
                "at": datetime.datetime.now(datetime.UTC).isoformat(),
                "reason": "not on the allow-list",
            }
        )
        fd = os.open(self.refusals_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def _answer(client: socket.socket, status: int, reason: str, body: str) -> None:
    """Send a short text answer and close the connection."""
    data = body.encode()
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(data)}\r\n"
    try:
        client.sendall(f"{head}Connection: close\r\n\r\n".encode() + data)
    except OSError:
        pass  # the client is gone: nothing to tell
    finally:
        client.close()
