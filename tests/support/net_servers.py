"""Tiny threaded TCP servers for the sandbox network tests: an echo server and an HTTP server that records heads."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def tcp_server(handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """Serve 127.0.0.1:<free port> with `handle(connection)` in a thread per connection; yields the port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stopping = threading.Event()

    def accept_loop() -> None:
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            threading.Thread(target=_handle_and_close, args=(handle, conn), daemon=True).start()

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stopping.set()
        thread.join()
        listener.close()


def _handle_and_close(handle: Callable[[socket.socket], None], conn: socket.socket) -> None:
    try:
        handle(conn)
    except OSError:
        pass
    finally:
        conn.close()


def echo(conn: socket.socket) -> None:
    """Send back every byte until the peer closes."""
    while data := conn.recv(65536):
        conn.sendall(data)


class RecordingHttp:
    """An HTTP handler that records each request head it gets and answers `hello from <port>`."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []

    def __call__(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        self.heads.append(data.partition(b"\r\n\r\n")[0])
        body = f"hello from {conn.getsockname()[1]}".encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))


def recv_all(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def recv_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """An HTTP head (without its blank line) and the bytes received after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before the end of the head: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest
